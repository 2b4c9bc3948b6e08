"""Build a GraphRAG index into Delta tables: spark-submit jobs/index.py --config conf/local.yaml"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cli import base_parser, user_errors  # noqa: E402

from graphrag_spark.config import load_config  # noqa: E402
from graphrag_spark.index.pipeline import run_index  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__)
    args = parser.parse_args(argv)
    with user_errors():
        cfg = load_config(args.config, args.set)
        spark = build_spark(cfg.spark, master=args.master)
        summary = run_index(spark, cfg)
        print(summary.render())


if __name__ == "__main__":
    main()
