"""Ask questions of an index with one method: global (one level), local, basic (SS), ts or raptor (jobs/raptor.py's tree).

One question:  spark-submit jobs/query.py --config conf/local.yaml --method global --level 1 "What are the main themes?"
A batch:       spark-submit jobs/query.py --method basic --questions questions.txt --output /path/to/answers
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cli import base_parser, job_config, user_errors  # noqa: E402

from graphrag_spark.errors import UserError  # noqa: E402
from graphrag_spark.query.api import METHODS, GraphRagIndex  # noqa: E402
from graphrag_spark.query.batch import answer_batch  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402


SECTIONS = ["storage", "query", "llm", "embeddings", "raptor", "prompts", "spark"]


def build_parser():
    parser = base_parser(__doc__, SECTIONS)
    parser.add_argument("--method", choices=METHODS, default="global", help="query method (default: global)")
    parser.add_argument("--level", type=int, default=None,
                        help="community level for global and local search (default: query.level)")
    parser.add_argument("--questions", help="batch mode: a text (one per line), .jsonl or .csv file, a Delta path "
                                            "or a table, with a 'question' column")
    parser.add_argument("--output", help="batch mode: Delta path (or db.table) the answers are written to")
    parser.add_argument("--mode", choices=["append", "overwrite"], default="append", help="batch output write mode")
    parser.add_argument("question", nargs="?", help="the question (single-question mode)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    with user_errors():
        if (args.question is None) == (args.questions is None) or (args.questions and not args.output):
            raise UserError("Give either one question, or --questions FILE_OR_DELTA together with --output DELTA_PATH.")
        cfg = job_config(args)
        index = GraphRagIndex(build_spark(cfg.spark, master=args.master), cfg)
        if args.question is not None:
            result = index.search(args.method, [args.question], args.level)[0]
            print(result.answer)
            print(f"\n[{result.method} search{'' if result.level is None else f', level {result.level}'}: "
                  f"{result.context_units} context units, {result.context_tokens} context tokens, "
                  f"{result.llm_calls} LLM calls, {result.latency_s:.1f}s]")
            return
        done = answer_batch(index, args.questions, args.output, args.method, args.level, args.mode)
        print(f"{done.questions} answers ({args.method}) written to {args.output} in {done.seconds:.1f}s "
              f"({done.questions / done.seconds:.2f} questions/s, {done.llm_calls} LLM calls, {done.llm_tokens:,} tokens)")


if __name__ == "__main__":
    main()
