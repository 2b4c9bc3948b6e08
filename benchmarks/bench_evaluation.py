"""Wall time and cost of the paper's evaluation through the local LLM server at a fixed request rate.

    python benchmarks/bench_evaluation.py --root /tmp/bench_eval --rpm 6000 --latency 0.05

Indexes ``--corpus`` offline once (unless ``--reuse``), then runs the whole evaluation: K personas x
N tasks x M questions (default 5 x 5 x 5 = 125), every ``--conditions`` answering (LLM answers),
every pair plus the A/A pair judged on four criteria in two orders ``--repeats`` times, claims
extracted from every answer. The server admits ``--rpm`` requests per minute (429 + Retry-After
beyond) after ``--latency`` seconds per answer; the client is configured to the same rpm. Prints
the wall time per step and the calls and tokens per question per condition pair, then reruns the
evaluation to show that a rerun pays for nothing.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from graphrag_spark.config import load_config  # noqa: E402
from graphrag_spark.evaluation.run import Evaluation  # noqa: E402
from graphrag_spark.index.pipeline import run_index  # noqa: E402
from graphrag_spark.llm.server import start_server  # noqa: E402
from graphrag_spark.query.api import GraphRagIndex  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(REPO / "data" / "sample"))
    parser.add_argument("--root", default="/tmp/bench_eval")
    parser.add_argument("--reuse", action="store_true", help="evaluate the index already under --root/index")
    parser.add_argument("--conditions", default="C0,C1,TS,SS")
    parser.add_argument("--personas", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=5)
    parser.add_argument("--questions", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rpm", type=int, default=6000, help="server and client requests per minute")
    parser.add_argument("--latency", type=float, default=0.05, help="server seconds per answer")
    parser.add_argument("--concurrency", type=int, default=16, help="in-flight calls per Spark task")
    parser.add_argument("--items-per-commit", type=int, default=4096)
    parser.add_argument("--no-claims", action="store_true")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    root = Path(args.root)
    overrides = [f"storage.root={root / 'index'}", f"input.path={args.corpus}", f"spark.ivy_cache={REPO / '.cache' / 'ivy'}"]
    cfg = load_config(REPO / "conf" / "local.yaml", overrides)
    spark = build_spark(cfg.spark, master=args.master)
    if not args.reuse:
        started = time.perf_counter()
        run_index(spark, cfg)
        print(f"offline index of {args.corpus}: {time.perf_counter() - started:.0f}s")
    conditions = args.conditions.split(",")
    with start_server(latency_s=args.latency, requests_per_minute=args.rpm) as server:
        cfg = load_config(REPO / "conf" / "local.yaml", overrides + [
            "query.llm=true", f"llm.chat.api_base={server.base_url}", f"llm.chat.requests_per_minute={args.rpm}",
            "llm.chat.tokens_per_minute=100000000", f"llm.chat.concurrency={args.concurrency}",
            f"llm.items_per_commit={args.items_per_commit}", f"evaluation.root={root / 'evaluation'}",
            f"evaluation.conditions=[{', '.join(conditions)}]", f"evaluation.personas={args.personas}",
            f"evaluation.tasks_per_persona={args.tasks}", f"evaluation.questions_per_task={args.questions}",
            f"evaluation.repeats={args.repeats}", f"evaluation.claims={not args.no_claims}"])
        index = GraphRagIndex(spark, cfg)
        for attempt in ("first run", "rerun"):
            server.reset()
            evaluation = Evaluation(index)
            marks = {}
            started = time.perf_counter()
            questions = evaluation.generate_questions()
            marks["questions"] = time.perf_counter()
            evaluation.answer(questions)
            marks["answers"] = time.perf_counter()
            judgements = evaluation.judge(questions)
            marks["judging"] = time.perf_counter()
            if not args.no_claims:
                evaluation.extract_claims(questions)
                marks["claims"] = time.perf_counter()
            stats = server.stats()
            print(f"--- {attempt}: {len(questions)} questions, {len(conditions)} conditions, "
                  f"{len(evaluation.pairs)} pairs (A/A included), {len(judgements)} judgements, "
                  f"{stats['served']['chat']} chat calls served, {stats['rate_limited']} 429s ---")
            previous = started
            for step, at in marks.items():
                print(f"{step:<10} {at - previous:8.1f}s")
                previous = at
            print(f"{'total':<10} {previous - started:8.1f}s  (server rpm {args.rpm}, latency {args.latency}s)")
            for usage in evaluation.usage:
                print(usage.render())
            cost = evaluation.answer_cost
            print(f"answers: {cost.items} answers, {cost.calls} calls, {cost.prompt_tokens:,}+{cost.completion_tokens:,} tokens")
            judge = next(u for u in evaluation.usage if u.stage == "eval_judge")
            per = len(questions) * len(evaluation.pairs)
            if judge.calls:
                print(f"judging per question per condition pair: {judge.calls / per:.1f} calls, "
                      f"{judge.prompt_tokens / per:,.0f} prompt + {judge.completion_tokens / per:,.0f} completion tokens")
    spark.stop()


if __name__ == "__main__":
    main()
