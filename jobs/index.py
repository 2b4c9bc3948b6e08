"""Build a GraphRAG index into Delta tables: spark-submit jobs/index.py --config conf/local.yaml"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cli import base_parser, user_errors  # noqa: E402

from graphrag_spark.config import load_config  # noqa: E402
from graphrag_spark.index.pipeline import estimate_extraction, run_index  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--dry-run", action="store_true",
                        help="print the LLM calls and tokens extraction would spend, without calling anything")
    args = parser.parse_args(argv)
    with user_errors():
        cfg = load_config(args.config, args.set)
        spark = build_spark(cfg.spark, master=args.master)
        if args.dry_run:
            for key, value in estimate_extraction(spark, cfg).items():
                print(f"{key:<30} {value}")
            return
        summary = run_index(spark, cfg)
        print(summary.render())


if __name__ == "__main__":
    main()
