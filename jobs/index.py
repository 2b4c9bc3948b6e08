"""Build or refresh a GraphRAG index in Delta tables: spark-submit jobs/index.py --config conf/local.yaml [--full]

On a root that already holds an index the job refreshes it: only new, changed and deleted documents
cost work, and the result is published atomically (index_runs). A second job on the same root exits.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cli import base_parser, job_config, user_errors  # noqa: E402


SECTIONS = ["storage", "input", "chunking", "extraction", "graph", "communities", "reports", "llm", "embeddings",
            "prompts", "refresh", "spark"]


def build_parser():
    parser = base_parser(__doc__, SECTIONS)
    parser.add_argument("--dry-run", action="store_true",
                        help="print the LLM calls and tokens extraction would spend, without calling anything")
    parser.add_argument("--full", action="store_true",
                        help="rebuild every table from the input instead of refreshing the published index "
                             "(cached LLM results are still reused)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    # Imported after parsing, so --help and argument mistakes cost no Spark import.
    from graphrag_spark.index.documents import check_local_input
    from graphrag_spark.index.pipeline import estimate_extraction, run_index
    from graphrag_spark.progress import console_progress
    from graphrag_spark.session import build_spark, plain_paths_are_local

    with user_errors():
        cfg = job_config(args)
        check_local_input(cfg.input, plain_paths_are_local(cfg.spark, args.master))
        spark = build_spark(cfg.spark, master=args.master)
        if args.dry_run:
            for key, value in estimate_extraction(spark, cfg).items():
                print(f"{key:<30} {value}")
            return
        with console_progress(spark):
            summary = run_index(spark, cfg, full=args.full)
        print(summary.render())


if __name__ == "__main__":
    main()
