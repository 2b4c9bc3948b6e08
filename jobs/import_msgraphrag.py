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

from _cli import base_parser, user_errors  # noqa: E402

from graphrag_spark import tables as T  # noqa: E402
from graphrag_spark.config import load_config  # noqa: E402
from graphrag_spark.interop.msgraphrag import import_msgraphrag  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--from", dest="source", required=True,
                        help="the output folder of a microsoft/graphrag 1.0+ index (entities.parquet, ...)")
    args = parser.parse_args(argv)
    with user_errors():
        cfg = load_config(args.config, args.set)
        spark = build_spark(cfg.spark, master=args.master)
        counts = import_msgraphrag(spark, T.TableStore(spark, cfg.storage), args.source, cfg)
        print(f"Imported {args.source} into {cfg.storage.root}")
        for name, count in counts.items():
            print(f"{name:<34} {count}")


if __name__ == "__main__":
    main()
