"""Query cost per condition (C0..Cn, TS, SS, local) and batch throughput, through the local LLM server.

    python benchmarks/bench_query.py --corpus ../shared/corpora/a_christmas_carol.txt --root /tmp/bench_query

Builds the index once (``--extraction llm`` extracts through the local server; ``nlp`` is the
offline method) unless ``--reuse``; prints the paper's Table 2 for it; asks ``--questions``
questions one at a time per condition (context units and tokens, LLM calls, wall time per
query); then answers ``--batch`` questions in batch mode into a Delta table (throughput).
Wall times include Spark job overhead, the server's answer time (``--latency`` adds a
simulated model latency per call) and client-side throttling to ``llm.chat`` requests/tokens
per minute (``--rpm`` / ``--tpm``; the config defaults, 500 / 200k, bound batch throughput).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pandas as pd  # noqa: E402

from graphrag_spark.config import load_config  # noqa: E402
from graphrag_spark.index.pipeline import run_index  # noqa: E402
from graphrag_spark.llm.server import start_server  # noqa: E402
from graphrag_spark.query.api import GraphRagIndex  # noqa: E402
from graphrag_spark.query.batch import answer_batch  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
QUESTIONS = [
    "What are the main themes of the story and how do they develop?",
    "How does Scrooge change over the course of the story, and what causes the change?",
    "What role do the spirits play in Scrooge's redemption?",
]
TOPICS = ["Scrooge", "Marley", "Bob Cratchit", "Tiny Tim", "Fred", "Fezziwig", "Belle", "the Ghost of Christmas Past",
          "the Ghost of Christmas Present", "the Ghost of Christmas Yet to Come", "Christmas", "poverty", "charity",
          "money", "death", "family", "memory", "London", "the counting-house", "redemption"]
FRAMES = ["What does the story say about {}?", "How is {} portrayed?", "Why does {} matter to the story?",
          "What changes for {} by the end?", "Which scenes involve {}?"]


def batch_questions(n: int) -> list[str]:
    questions = [frame.format(topic) for frame in FRAMES for topic in TOPICS]
    return (questions * (n // len(questions) + 1))[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpora" / "a_christmas_carol.txt"))
    parser.add_argument("--root", default="/tmp/bench_query")
    parser.add_argument("--extraction", choices=["llm", "nlp"], default="llm")
    parser.add_argument("--reuse", action="store_true", help="query an index already under --root")
    parser.add_argument("--questions", type=int, default=3, help="single questions per condition")
    parser.add_argument("--batch", type=int, default=100, help="questions in the batch-mode run")
    parser.add_argument("--batch-method", default="global")
    parser.add_argument("--batch-level", type=int, default=1)
    parser.add_argument("--latency", type=float, default=0.0, help="simulated seconds per LLM answer")
    parser.add_argument("--rpm", type=int, default=None, help="llm.chat.requests_per_minute (default: the config's)")
    parser.add_argument("--tpm", type=int, default=None, help="llm.chat.tokens_per_minute (default: the config's)")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    with start_server(latency_s=args.latency) as server:
        overrides = [f"storage.root={args.root}/index", f"input.path={args.corpus}", f"extraction.method={args.extraction}", "extraction.claims=true",
                     f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model", "spark.shuffle_partitions=2",
                     f"spark.ivy_cache={REPO / '.cache' / 'ivy'}"]
        overrides += [f"llm.chat.requests_per_minute={args.rpm}"] if args.rpm else []
        overrides += [f"llm.chat.tokens_per_minute={args.tpm}"] if args.tpm else []
        cfg = load_config(REPO / "conf" / "local.yaml", overrides)
        spark = build_spark(cfg.spark, master=args.master)
        if not args.reuse:
            started = time.perf_counter()
            summary = run_index(spark, cfg)
            print(summary.render())
            print(f"index built in {time.perf_counter() - started:.0f}s ({args.extraction} extraction)\n")

        index = GraphRagIndex.load(spark, load_config(REPO / "conf" / "local.yaml", [*overrides, "query.llm=true"]))
        print("Context size per condition (paper Table 2)")
        print(index.context_sizes().to_string(index=False), "\n")

        conditions = [(f"C{level}", "global", level) for level in index.levels()]
        conditions += [("TS", "ts", None), ("SS", "basic", None), ("local", "local", None)]
        rows = []
        for name, method, level in conditions:
            results, walls = [], []
            for question in QUESTIONS[: args.questions]:
                started = time.perf_counter()
                results += index.search(method, [question], level)
                walls.append(time.perf_counter() - started)
            rows.append({"condition": name, "context_units": results[0].context_units,
                         "context_tokens": results[0].context_tokens,
                         "llm_calls_per_query": statistics.mean(r.llm_calls for r in results),
                         "prompt_tokens_per_query": round(statistics.mean(r.prompt_tokens for r in results)),
                         "wall_s_per_query": round(statistics.mean(walls), 2), "wall_s_min": round(min(walls), 2),
                         "malformed": sum(r.malformed_map_answers for r in results),
                         "failed": sum(r.failed_llm_calls for r in results)})
        print(f"Per query ({args.questions} questions each, one at a time)")
        print(pd.DataFrame(rows).to_string(index=False), "\n")

        questions_file = Path(args.root) / "batch_questions.txt"
        questions_file.write_text("\n".join(batch_questions(args.batch)) + "\n")
        done = answer_batch(index, str(questions_file), f"{args.root}/answers", args.batch_method, args.batch_level,
                            mode="overwrite")
        print(f"Batch mode: {done.questions} questions ({args.batch_method}, level {args.batch_level}) in "
              f"{done.seconds:.1f}s = {done.questions / done.seconds:.2f} questions/s, {done.llm_calls} LLM calls "
              f"({done.llm_calls / done.seconds:.1f} calls/s), {done.llm_tokens:,} tokens = "
              f"{done.llm_tokens / done.seconds * 60:,.0f} tokens/min (budget llm.chat.tokens_per_minute = "
              f"{index.cfg.llm.chat.tokens_per_minute:,}, requests_per_minute = {index.cfg.llm.chat.requests_per_minute:,})")
        print(f"server: {server.stats()['by_kind']}")


if __name__ == "__main__":
    main()
