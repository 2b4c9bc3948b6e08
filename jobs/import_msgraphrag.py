"""Import a microsoft/graphrag index (its parquet output folder) into this project's Delta tables:

    spark-submit jobs/import_msgraphrag.py --config conf/local.yaml --from path/to/graphrag/output

Writes documents, text units, entities, relationships, claims, communities and community
reports under storage.root (overwriting them) and embeds text units and entities with the
configured embedder, so every query method works without paying for extraction again.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cli import base_parser, job_config, user_errors  # noqa: E402


SECTIONS = ["storage", "embeddings", "llm", "spark"]


def build_parser():
    parser = base_parser(__doc__, SECTIONS)
    parser.add_argument("--from", dest="source", required=True,
                        help="the output folder of a microsoft/graphrag 1.0+ index (entities.parquet, ...)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    # Imported after parsing, so --help and argument mistakes cost no Spark import.
    from graphrag_spark import tables as T
    from graphrag_spark.interop.msgraphrag import import_msgraphrag
    from graphrag_spark.session import build_spark

    with user_errors():
        cfg = job_config(args)
        spark = build_spark(cfg.spark, master=args.master)
        counts = import_msgraphrag(spark, T.TableStore(spark, cfg.storage), args.source, cfg)
        print(f"Imported {args.source} into {cfg.storage.root}")
        for name, count in counts.items():
            print(f"{name:<34} {count}")


if __name__ == "__main__":
    main()
