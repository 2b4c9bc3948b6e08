"""Build the RAPTOR tree index into Delta tables: spark-submit jobs/raptor.py --config conf/local.yaml

Documents come from the index's `documents` table when storage.root has one (shared with the
GraphRAG index), else from input.path. Summaries are offline extractive unless raptor.method=llm.
Ask questions with: jobs/query.py --method raptor "..."
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cli import base_parser, user_errors  # noqa: E402

from graphrag_spark.config import load_config  # noqa: E402
from graphrag_spark.raptor.build import build_raptor  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__)
    args = parser.parse_args(argv)
    with user_errors():
        cfg = load_config(args.config, args.set)
        print(build_raptor(build_spark(cfg.spark, master=args.master), cfg).render())


if __name__ == "__main__":
    main()
