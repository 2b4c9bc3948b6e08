"""Ask a question of an index: spark-submit jobs/query.py --config conf/local.yaml --level 1 "What are the main themes?" """

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cli import base_parser, user_errors  # noqa: E402

from graphrag_spark import tables as T  # noqa: E402
from graphrag_spark.config import load_config  # noqa: E402
from graphrag_spark.query.global_search import offline_global_search  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--level", type=int, default=None, help="community level for global search (default: query.level)")
    parser.add_argument("question", help="the question")
    args = parser.parse_args(argv)
    with user_errors():
        cfg = load_config(args.config, args.set)
        spark = build_spark(cfg.spark, master=args.master)
        store = T.TableStore(spark, cfg.storage)
        q = cfg.query
        result = offline_global_search(spark, store.read(T.COMMUNITY_REPORTS), args.question,
                                       q.level if args.level is None else args.level, q.batch_tokens,
                                       q.reduce_tokens, q.seed, q.max_answer_points)
        print(result.answer)
        print(f"\n[global search, level {result.level}: {result.context_units} reports, "
              f"{result.context_tokens} context tokens, {result.latency_s:.1f}s]")


if __name__ == "__main__":
    main()
