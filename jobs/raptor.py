"""Build the RAPTOR tree index into Delta tables: spark-submit jobs/raptor.py --config conf/local.yaml

Documents come from the index's `documents` table when storage.root has one (shared with the
GraphRAG index), else from input.path. Summaries are offline extractive unless raptor.method=llm.
Ask questions with: jobs/query.py --method raptor "..."
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cli import base_parser, job_config, user_errors  # noqa: E402


SECTIONS = ["storage", "input", "raptor", "llm", "embeddings", "prompts", "spark"]


def build_parser():
    return base_parser(__doc__, SECTIONS)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    # Imported after parsing, so --help and argument mistakes cost no Spark import.
    from graphrag_spark.progress import console_progress, stage
    from graphrag_spark.raptor.build import build_raptor
    from graphrag_spark.session import build_spark

    with user_errors():
        cfg = job_config(args)
        spark = build_spark(cfg.spark, master=args.master)
        with console_progress(spark), stage("raptor tree"):
            built = build_raptor(spark, cfg)
        print(built.render())


if __name__ == "__main__":
    main()
