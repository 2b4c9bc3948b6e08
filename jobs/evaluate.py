"""Evaluate an index the paper's way: generated questions, every condition's answers, pairwise LLM judging
(comprehensiveness, diversity, empowerment, directness) with Wilcoxon + Holm, claim-based metrics, one report.

    spark-submit jobs/evaluate.py --config conf/local.yaml --set llm.chat.api_base=http://127.0.0.1:8800/v1 \
        --set query.llm=true --set evaluation.conditions='[C0, C1, TS, SS]'

Settings: the `evaluation` section of the config (graphrag_spark/config.py). Tables go under evaluation.root,
the report (report.md, win_rates.png) to <evaluation.root>/report. A rerun pays for nothing already done.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cli import base_parser, user_errors  # noqa: E402

from graphrag_spark.config import load_config  # noqa: E402
from graphrag_spark.evaluation.run import run_evaluation  # noqa: E402
from graphrag_spark.query.api import GraphRagIndex  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    args = base_parser(__doc__).parse_args(argv)
    with user_errors():
        cfg = load_config(args.config, args.set)
        index = GraphRagIndex(build_spark(cfg.spark, master=args.master), cfg)
        result = run_evaluation(index)
        for usage in result.usage:
            print(usage.render())
        print(f"{len(result.questions)} questions, {len(cfg.evaluation.conditions)} conditions, "
              f"{len(result.judgements)} judgements, {result.llm_calls} LLM calls paid in {result.wall_s:.1f}s")
        print(f"report: {result.report_path}\nheatmap: {result.heatmap_path}")


if __name__ == "__main__":
    main()
