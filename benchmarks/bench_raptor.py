"""RAPTOR tree shape, build cost and retrieval mix on the shared corpora, through the local LLM server.

    python benchmarks/bench_raptor.py --root /tmp/bench_raptor [--corpus PATH ...] [--rerun]

Per corpus: builds one tree with ``raptor.method=llm`` (summaries from the project's local
OpenAI-compatible server over HTTP; embeddings from ``--embeddings``, the offline MiniLM by
default) and prints nodes per layer, mean children per parent, the summary/child token ratio,
build time and LLM calls (``--rerun`` builds again to show that a rerun pays no summary call).
Then it answers broad and narrow questions with the ``raptor`` method (collapsed tree, 2000
tokens, answers through the server) and prints the share of retrieved nodes that are summaries
(paper: 18-57% non-leaf nodes). The server's summaries are extractive stand-ins (at most 120
words), so token ratios are not the paper's; the tree's shape and retrieval mix are the figures.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pandas as pd  # noqa: E402

from graphrag_spark.config import load_config  # noqa: E402
from graphrag_spark.llm.server import start_server  # noqa: E402
from graphrag_spark.query.api import GraphRagIndex  # noqa: E402
from graphrag_spark.raptor.build import build_raptor  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CORPORA = REPO.parent / "shared" / "corpora"
QUESTIONS = {
    "a_christmas_carol": {
        "broad": [
            "What is the story about overall?",
            "What are the main themes of the story?",
            "How does Scrooge change over the course of the story?",
            "What do the three spirits show Scrooge, and why?",
            "How is Christmas celebrated by the different families in the story?",
        ],
        "narrow": [
            "What was the name of Scrooge's dead business partner?",
            "What did Scrooge see in the knocker of his door?",
            "Who was Fezziwig?",
            "What did Scrooge send to the Cratchits on Christmas morning?",
            "What does Tiny Tim say at the Christmas dinner?",
        ],
    },
    "operation_dulce": {
        "broad": [
            "What is Operation Dulce about?",
            "How do the relationships between the team members develop?",
            "What are the main themes of the story?",
            "What is the nature of the alien communication and how does the team respond to it?",
            "How does the mission change from the briefing to the end?",
        ],
        "narrow": [
            "Who is Taylor Cruz?",
            "What is Sam Rivera's role on the team?",
            "What did Jordan Hayes find in the transmission logs?",
            "What is in the briefing room at the start of the operation?",
            "What does Alex Mercer think about compliance and protocol?",
        ],
    },
}


def bench(corpus: Path, root: Path, server, embeddings: str, rerun: bool) -> list[dict]:
    cfg = load_config(REPO / "conf" / "local.yaml", [
        f"storage.root={root / corpus.stem}", f"input.path={corpus}", f"spark.ivy_cache={REPO / '.cache' / 'ivy'}",
        "spark.shuffle_partitions=2", "raptor.method=llm", f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model",
        f"embeddings.provider={embeddings}", f"llm.embedding.api_base={server.base_url}", "llm.embedding.model=local-embedding",
        "query.llm=true"])
    spark = build_spark(cfg.spark, master="local[2]")
    build = build_raptor(spark, cfg)
    print(f"\n=== {corpus.name}\n{build.render()}", flush=True)
    if rerun:
        again = build_raptor(spark, cfg)
        print(f"rerun: {again.seconds:.1f}s, {again.llm_calls} LLM calls, "
              f"{sum(u.cache_hits for u in again.usage)} summaries from cache", flush=True)
    index = GraphRagIndex(spark, cfg)
    rows = []
    for kind, questions in QUESTIONS.get(corpus.stem, {}).items():
        started = time.perf_counter()
        results = index.search("raptor", questions)
        seconds = (time.perf_counter() - started) / len(questions)
        for question, result in zip(questions, results):
            layers = result.context["layer"]
            rows.append({"corpus": corpus.stem, "kind": kind, "question": question, "nodes": len(layers),
                         "summaries": int((layers > 0).sum()), "tokens": result.context_tokens,
                         "layers": dict(sorted(layers.value_counts().items())), "llm_calls": result.llm_calls,
                         "s_per_question": round(seconds, 2)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", action="append", type=Path,
                        help="corpus file (repeatable; default: A Christmas Carol and Operation Dulce)")
    parser.add_argument("--root", type=Path, default=Path("/tmp/bench_raptor"), help="where the Delta tables go")
    parser.add_argument("--embeddings", choices=["offline", "openai"], default="offline",
                        help="offline = bundled MiniLM; openai = the local server's hashed-trigram vectors")
    parser.add_argument("--rerun", action="store_true", help="build each tree a second time (0 new summary calls)")
    args = parser.parse_args()
    corpora = args.corpus or [CORPORA / "a_christmas_carol.txt", CORPORA / "operation_dulce.md"]
    rows = []
    with start_server(seed=1) as server:
        for corpus in corpora:
            rows += bench(corpus, args.root, server, args.embeddings, args.rerun)
    if rows:
        frame = pd.DataFrame(rows)
        pd.set_option("display.width", 200)
        pd.set_option("display.max_colwidth", 60)
        print("\nRetrieved nodes per question (collapsed tree, 2000 tokens)")
        print(frame.drop(columns=["corpus"]).to_string(index=False))
        share = frame.groupby(["corpus", "kind"])[["summaries", "nodes"]].sum()
        share["summary share"] = (share["summaries"] / share["nodes"]).round(3)
        print("\nShare of retrieved nodes that are summaries (paper: 18-57%)")
        print(share.to_string())


if __name__ == "__main__":
    main()
