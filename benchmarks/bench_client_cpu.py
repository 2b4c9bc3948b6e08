"""The LLM client's own CPU a call, against the local server in another process (so that its CPU is not counted).

    python benchmarks/bench_client_cpu.py --calls 2000 --in-flight 500 --latency 2

Sends ``--calls`` chat calls of about 600 tokens of War and Peace each (or of ``--corpus``) through
``run_batch`` with at most ``--in-flight`` calls in flight and no rate limit, and prints the calls per second
and the client process's CPU milliseconds a call. One Python process carries a whole Spark Connect stage's
budget (one task), so its CPU a call bounds the rate it can keep: at 10 ms a call, 100 calls a second.
With fewer calls in flight than calls, the rest wait for a slot (as a Connect task's items do).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from graphrag_spark.config import LlmModelConfig  # noqa: E402
from graphrag_spark.llm.client import ChatRequest, run_batch  # noqa: E402

KEY_ENV = "BENCH_CLIENT_CPU_KEY"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=500)
    parser.add_argument("--latency", type=float, default=2.0, help="the server's seconds an answer")
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpora" / "war_and_peace.txt"))
    args = parser.parse_args()
    text = Path(args.corpus).read_text(encoding="utf-8")
    requests = [ChatRequest(messages=[{"role": "system", "content": "Extract the entities of the text."},
                                      {"role": "user", "content": text[i * 2400:(i + 1) * 2400]}],
                            item_id=str(i), stage="extract") for i in range(args.calls)]
    server = subprocess.Popen([sys.executable, "-m", "graphrag_spark.llm.server", "--latency", str(args.latency)],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        base_url = server.stdout.readline().strip()
        os.environ[KEY_ENV] = "sk-local"
        cfg = LlmModelConfig(model="local-model", api_base=base_url, api_key_env=KEY_ENV,
                             requests_per_minute=10**7, tokens_per_minute=10**10, concurrency=args.in_flight,
                             max_retries=2, timeout_s=120.0)
        started, cpu = time.monotonic(), time.process_time()
        results = run_batch(requests, cfg)
        wall, cpu = time.monotonic() - started, time.process_time() - cpu
    finally:
        server.terminate()
        server.wait()
    failed = sum(not r.ok for r in results)
    print(f"calls={args.calls}, in_flight={args.in_flight}, latency_s={args.latency}, failed={failed}, "
          f"wall_s={wall:.1f}, calls_per_s={args.calls / wall:.0f}, client_cpu_ms_per_call={cpu / args.calls * 1000:.2f}")


if __name__ == "__main__":
    main()
