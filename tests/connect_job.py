"""The notebook API and the offline index job on a Spark Connect session, in their own process.

pyspark routes ``pyspark.sql.functions`` to Connect for the whole process once a Connect session
exists, so a classic and a Connect session cannot share the test process: this script runs the
Connect side and writes what a user would see as JSON; the test computes the same with
``api_answers`` on the classic session and compares.

    python tests/connect_job.py --remote sc://127.0.0.1:PORT --root DIR --input DIR --out FILE [--llm URL [--llm-root DIR]]

With ``--llm-root`` it also indexes ``LLM_CORPUS_FILE`` with the LLM method (extraction with claims,
summaries, reports, endpoint embeddings) through the local server at ``--llm``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from graphrag_spark import tables as T
from graphrag_spark.compat import is_connect
from graphrag_spark.config import load_config
from graphrag_spark.query.api import GraphRagIndex
from llm_budget import UNTHROTTLED

REPO = Path(__file__).resolve().parent.parent
QUESTIONS = ["Who opposes the harbour dredging near the estuary?", "What did the election decide?"]
INDEX_TABLES = (T.DOCUMENTS, T.INPUT_REJECTS, T.TEXT_UNITS, T.ENTITIES, T.RELATIONSHIPS, T.COMMUNITIES,
                T.COMMUNITY_REPORTS, T.TEXT_UNIT_EMBEDDINGS, T.ENTITY_EMBEDDINGS)


# One document keeps the LLM index cheap; results in waves of two items (and endpoint embeddings in waves of two
# batches of two texts) exercise the Connect commit paths: a wave time far below one call at the test's
# unthrottled limits keeps every wave at its floor, llm.items_per_commit.
LLM_CORPUS_FILE = "lumen_cells_factory.txt"
LLM_KEY_ENV = "GRAPHRAG_CONNECT_TEST_KEY"


def config(root: str, input_path: str, *overrides: str):
    return load_config(REPO / "conf" / "local.yaml", [f"storage.root={root}", f"input.path={input_path}",
                                                      "spark.shuffle_partitions=2", *overrides])


def llm_config(root: str, input_path: str, llm_base_url: str, *overrides: str):
    return config(root, input_path, "extraction.method=llm", "extraction.claims=true", "chunking.size=200",
                  "chunking.overlap=30", "embeddings.provider=openai", "embeddings.batch_size=2", "llm.items_per_commit=2",
                  "llm.connect_wave_s=0.00000001",
                  f"llm.chat.api_base={llm_base_url}", f"llm.embedding.api_base={llm_base_url}",
                  f"llm.chat.api_key_env={LLM_KEY_ENV}", f"llm.embedding.api_key_env={LLM_KEY_ENV}", *UNTHROTTLED, *overrides)


def index_rows(spark, cfg) -> dict:
    """Rows of every index table and of the LLM result cache, per stage."""
    store = T.TableStore(spark, cfg.storage)
    rows = {name: store.read(name).count() for name in (*INDEX_TABLES, T.CLAIMS)}
    rows.update({f"llm_results {r.stage}": r["count"] for r in store.read(T.LLM_RESULTS).groupBy("stage").count().collect()})
    return rows


def plain(value):
    """JSON for what json cannot write: a numpy scalar as its Python value (a pyspark 3.5 Connect client's
    ``DataFrame.count()`` returns numpy.int64), anything else as its text."""
    return value.item() if hasattr(value, "item") else str(value)


def _answer(result) -> dict:
    return {"answer": result.answer, "level": result.level, "context_units": result.context_units,
            "context_tokens": result.context_tokens, "llm_calls": result.llm_calls}


def api_answers(index: GraphRagIndex, llm_base_url: str | None = None) -> dict:
    """What the notebooks show: table sizes, the exploring and drill-down helpers, every search method
    (one question and a batch), and with ``llm_base_url`` global and basic search through the chat model."""
    root = index.reports(level=0).first().community
    out = {
        "rows": {name: index.table(name).count() for name in INDEX_TABLES},
        "levels": index.levels(),
        "reports_per_level": [list(r) for r in index.reports_per_level().collect()],
        "top_entities": [r.title for r in index.top_entities(10).collect()],
        "root_community": root,
        "sub_communities": sorted(r.community for r in index.sub_communities(root).collect()),
        "source_text": sorted(r.id for r in index.source_text(root).collect()),
        "context_sizes": index.context_sizes().to_dict("records"),
        "global": {str(level): _answer(index.global_search(QUESTIONS[0], level=level)) for level in index.levels()},
        "local": _answer(index.local_search(QUESTIONS[0])),
        "basic": _answer(index.basic_search(QUESTIONS[0])),
        "ts": _answer(index.text_summary_search(QUESTIONS[0])),
        "batch_global": [_answer(r) for r in index.search("global", QUESTIONS)],
        "batch_local": [_answer(r) for r in index.search("local", QUESTIONS)],
        "global_context": index.global_search(QUESTIONS[0]).as_spark(index.spark).count(),
    }
    if index.store.exists(T.RAPTOR_NODES):
        out["raptor"] = _answer(index.raptor_search(QUESTIONS[0]))
    if llm_base_url:
        cfg = index.cfg.model_copy(deep=True)
        cfg.query.llm = True
        cfg.llm.chat.api_base = llm_base_url
        llm = GraphRagIndex.load(index.spark, cfg)
        out["llm_global"] = _answer(llm.global_search(QUESTIONS[0], level=0))
        out["llm_basic"] = _answer(llm.basic_search(QUESTIONS[0]))
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    for name in ("--remote", "--root", "--input", "--out"):
        parser.add_argument(name, required=True)
    parser.add_argument("--llm", default=None, help="base URL of the local OpenAI-compatible server")
    parser.add_argument("--llm-root", default=None, help="also build an LLM-method index of LLM_CORPUS_FILE here")
    args = parser.parse_args(argv)

    from graphrag_spark.index import embed
    from graphrag_spark.index.pipeline import run_index
    from graphrag_spark.raptor.build import build_raptor
    from graphrag_spark.session import build_spark

    cfg = config(args.root, args.input, f"spark.master={args.remote}")
    spark = build_spark(cfg.spark)
    assert is_connect(spark), type(spark)
    summary = run_index(spark, cfg)
    raptor = build_raptor(spark, cfg)
    verdict = {"summary_counts": {k: str(v) for k, v in summary.counts.items()},
               "raptor_nodes_per_layer": raptor.shape.nodes_per_layer,
               **api_answers(GraphRagIndex.load(spark, cfg), args.llm)}
    if args.llm_root:
        llm_input = Path(args.llm_root).parent / "llm_input"
        llm_input.mkdir(parents=True, exist_ok=True)
        (llm_input / LLM_CORPUS_FILE).write_bytes((Path(args.input) / LLM_CORPUS_FILE).read_bytes())
        llm_cfg = llm_config(args.llm_root, str(llm_input), args.llm, f"spark.master={args.remote}")
        embed.DRIVER_EMBED_ROWS = 0  # the executor path of endpoint embeddings, whatever the tables' size
        llm_summary = run_index(spark, llm_cfg)
        verdict["llm_index"] = {"summary_counts": {k: str(v) for k, v in llm_summary.counts.items()},
                                "rows": index_rows(spark, llm_cfg),
                                "embedding_cache_commits": T.TableStore(spark, llm_cfg.storage).version(T.EMBEDDING_CACHE) + 1,
                                "calls": {u.stage: u.calls for u in llm_summary.usage}}
    Path(args.out).write_text(json.dumps(verdict, indent=1, default=plain))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
