"""Spark tasks that each keep a share of the limits, against a provider that enforces them over a short interval.

    .venv/bin/python benchmarks/bench_task_shares.py --tasks 16 --rpm 600 --window 10 --calls 600 --latency 1

A query's map step and endpoint embeddings in executors (and Spark Connect's waves) call from tasks that each
throttle to 1 / tasks of the budget (``RateLimiter``). ``--calls`` chat calls go the way ``chat_in_executors``
sends them (``--tasks`` partitions on ``local[--tasks]``, ``run_batch`` at its share in each) to the local server,
which enforces ``--rpm`` over a sliding ``--window`` seconds at that part of it (Azure OpenAI: "typically 1 or 10
seconds"; the job is told so: ``llm.chat.limit_interval_s``). Two runs, one after the other in one session: each
task's budget holding one call at its start (how every task started before ``throttle.staggered_start``), then the
tasks' starts spread by their partition. Prints, for each, the 429s, the fullest window the server saw (a share of
what it allows in one) and the wall time against the floor (calls / limit).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from graphrag_spark.config import LlmModelConfig, SparkConfig  # noqa: E402
from graphrag_spark.llm.server import start_server  # noqa: E402
from graphrag_spark.query.executors import chat_calls, decode_call, run_in_executors  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402

KEY_ENV = "BENCH_TASK_SHARES_KEY"


def run(spark, cfg: LlmModelConfig, calls: int, tasks: int, start_with_a_call: bool) -> tuple[float, list]:
    share = 1.0 / tasks

    def in_task(batch: list[str]) -> list[str]:
        from graphrag_spark.llm import throttle

        spread = throttle.staggered_start
        if start_with_a_call:  # the start before staggered_start; restored, as the Python worker is reused
            throttle.staggered_start = lambda share, task_index: 1.0
        try:
            return chat_calls(batch, cfg, share, stage="bench", max_tokens=64, max_in_flight=4096)
        finally:
            throttle.staggered_start = spread

    prompts = [f"Question {i}: name one thing a harbour needs." for i in range(calls)]
    started = time.monotonic()
    results = [decode_call(text) for text in run_in_executors(spark, prompts, in_task)]
    return time.monotonic() - started, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--rpm", type=float, default=600.0)
    parser.add_argument("--window", type=float, default=10.0, help="the server's sliding window, seconds")
    parser.add_argument("--calls", type=int, default=600)
    parser.add_argument("--latency", type=float, default=1.0, help="the server's seconds an answer")
    args = parser.parse_args()
    os.environ[KEY_ENV] = "sk-local"
    spark = build_spark(SparkConfig(ivy_cache=str(REPO / ".cache" / "ivy"), conf={"spark.ui.enabled": "false"}),
                        master=f"local[{args.tasks}]")
    run_in_executors(spark, [""] * args.tasks, lambda batch: batch)  # the tasks' Python workers, before timing
    allowed = args.rpm * args.window / 60
    for start_with_a_call in (True, False):
        with start_server(latency_s=args.latency, requests_per_minute=args.rpm, window_s=args.window) as server:
            cfg = LlmModelConfig(model="local-model", api_base=server.base_url, api_key_env=KEY_ENV,
                                 requests_per_minute=args.rpm, tokens_per_minute=10**9,
                                 limit_interval_s=args.window, max_retries=8)
            wall, results = run(spark, cfg, args.calls, args.tasks, start_with_a_call)
            stats = server.stats()
        floor = args.calls / args.rpm * 60
        print(json.dumps({
            "start": "a call per task" if start_with_a_call else "spread by partition",
            "tasks": args.tasks, "calls": args.calls, "failed": sum(not r.ok for r in results),
            "429s": stats["rate_limited"], "busiest_window_share": round(stats["busiest_window"].get("requests", 0) / allowed, 3),
            "wall_s": round(wall, 1), "floor_s": round(floor, 1), "wall_over_floor": round(wall / floor, 3)}))
    spark.stop()


if __name__ == "__main__":
    main()
