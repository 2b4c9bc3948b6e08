"""LLM extraction throughput against a rate limit, through the local OpenAI-compatible server.

    python benchmarks/bench_llm.py --corpus ../shared/corpora/a_christmas_carol.txt --rpm 300 --latency 1.0

Prints requests/min sustained while calls were being served (first to last answer, measured by
the server) and over the whole stage (including Spark scheduling and Delta commits), each as a
share of the limit; wall time against the theoretical minimum (calls / limit); calls per chunk;
and the 429s received. The server enforces
the limit itself (sliding 60 s window, 429 + Retry-After), so overshooting shows up as 429s.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from graphrag_spark import tables as T  # noqa: E402
from graphrag_spark.config import load_config  # noqa: E402
from graphrag_spark.index.chunks import build_text_units  # noqa: E402
from graphrag_spark.index.documents import build_documents  # noqa: E402
from graphrag_spark.index.extraction import extract_llm_instances  # noqa: E402
from graphrag_spark.llm.server import start_server  # noqa: E402
from graphrag_spark.llm.stage import new_run_id  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def run(corpus: str, rpm: int, latency: float, chunk_size: int, gleanings: int, max_chunks: int | None) -> dict:
    root = tempfile.mkdtemp(prefix="bench_llm_")
    with start_server(latency_s=latency, requests_per_minute=rpm, seed=1) as server:
        cfg = load_config(REPO / "conf" / "local.yaml", [
            f"input.path={corpus}", f"storage.root={root}", "extraction.method=llm", f"chunking.size={chunk_size}",
            f"chunking.overlap={min(100, chunk_size // 6)}", f"extraction.max_gleanings={gleanings}",
            f"llm.chat.api_base={server.base_url}", f"llm.chat.requests_per_minute={rpm}",
            "llm.chat.tokens_per_minute=100000000", "llm.items_per_commit=1000",
            f"spark.ivy_cache={REPO / '.cache' / 'ivy'}"])
        spark = build_spark(cfg.spark)
        store = T.TableStore(spark, cfg.storage)
        documents, _, _ = build_documents(spark, cfg.input)
        units = build_text_units(documents, cfg.chunking)
        if max_chunks:
            units = units.orderBy("id").limit(max_chunks)
        store.write(units, T.TEXT_UNITS)
        units = store.read(T.TEXT_UNITS)
        n_chunks = units.count()
        server.reset()
        started = time.perf_counter()
        _, _, _, usages = extract_llm_instances(spark, store, units, cfg.extraction, cfg.llm, new_run_id())
        wall = time.perf_counter() - started
        stats = server.stats()
    calls = stats["served"]["chat"]
    minimum_s = calls / rpm * 60
    sustained_rpm = calls / stats["served_span_s"] * 60 if stats["served_span_s"] else 0.0
    return {"chunks": n_chunks, "calls": calls, "calls_per_chunk": round(calls / n_chunks, 2), "wall_s": round(wall, 1),
            "theoretical_min_s": round(minimum_s, 1), "achieved_rpm": round(calls / wall * 60, 1), "limit_rpm": rpm,
            "share_of_limit": round(calls / wall * 60 / rpm, 3),
            "sustained_rpm_during_calls": round(sustained_rpm, 1), "sustained_share": round(sustained_rpm / rpm, 3), "server_429s": stats["rate_limited"],
            "client_429s_seen": sum(u.n_429 for u in usages), "share_429": round(stats["rate_limited"] / max(1, calls), 4),
            "failures": sum(u.failures for u in usages),
            "service_latency_p50_s": usages[0].latency_p50_s, "service_latency_p95_s": usages[0].latency_p95_s,
            "queue_wait_p50_s": usages[0].queue_p50_s, "queue_wait_p95_s": usages[0].queue_p95_s,
            # Little's law: calls in flight on average while calls were being served.
            "mean_in_flight": round(calls * usages[0].latency_p50_s / stats["served_span_s"], 1) if stats["served_span_s"] else 0.0,
            "goal_95pct_inside_stage": sustained_rpm / rpm >= 0.95, "goal_429s_le_1pct": stats["rate_limited"] <= 0.01 * calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", action="append", required=True, help="file or folder; repeat for several sizes")
    parser.add_argument("--rpm", type=int, default=300)
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--chunk-size", type=int, default=600)
    parser.add_argument("--gleanings", type=int, default=1)
    parser.add_argument("--max-chunks", type=int, default=None)
    args = parser.parse_args()
    for corpus in args.corpus:
        result = run(corpus, args.rpm, args.latency, args.chunk_size, args.gleanings, args.max_chunks)
        print(f"{corpus}: " + ", ".join(f"{k}={v}" for k, v in result.items()), flush=True)


if __name__ == "__main__":
    main()
