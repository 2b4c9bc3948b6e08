"""The RAPTOR tree built as Spark jobs over Delta, and answered through the query API.

Inputs are tiny (a handful of one-sentence chunks with raptor.chunk_tokens=24), so layers hold
at most 11 nodes and clustering needs no UMAP; the LLM path runs over real HTTP against the
project's local OpenAI-compatible server.
"""

from __future__ import annotations

import importlib.util
from collections import Counter

import numpy as np
import pytest
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.config import RaptorConfig
from graphrag_spark.embeddings import OfflineMiniLM
from graphrag_spark.errors import UserError
from graphrag_spark.llm.server import start_server
from graphrag_spark.query.api import GraphRagIndex
from graphrag_spark.raptor.build import build_raptor, leaf_rows, raptor_params
from graphrag_spark.raptor.nodes import FAILED, OK
from graphrag_spark.raptor.params import RaptorParams
from graphrag_spark.raptor.retrieval import collapsed_tree

from conftest import REPO

LIGHTHOUSE = "The lighthouse keeper polished the great brass lens every evening before sunset."
BAKERY = ("The village bakery sold rye bread, seed cakes and honey buns every morning. "
          "On Sundays the baker gave the stale loaves to the harbour gulls and the poorer families.")
SEALS = ("The estuary trust counted four hundred grey seal pups on the sandbanks this winter. "
         "Most of the pups were born in November, a month earlier than in the previous survey. "
         "The trust blamed the new harbour dredging for the loss of two breeding beaches.")
SEAL_QUESTION = "How many grey seal pups did the estuary trust count?"
TINY = ["raptor.chunk_tokens=24", "spark.shuffle_partitions=2"]


def write_corpus(folder, **docs: str):
    folder.mkdir()
    for name, text in docs.items():
        (folder / f"{name}.txt").write_text(text)
    return folder


def read_tree(spark, cfg):
    store = T.TableStore(spark, cfg.storage)
    return store.read(T.RAPTOR_NODES).toPandas(), store.read(T.RAPTOR_EDGES).toPandas()


def as_rows(nodes, edges):
    """A tree in a comparable form: node rows (embedding included) and edge rows, sorted."""
    node_rows = sorted((r.tree_id, r.id, r.layer, r.text, r.n_tokens, r.status,
                        None if r.embedding is None else tuple(np.round(r.embedding, 6))) for r in nodes.itertuples())
    return node_rows, sorted(map(tuple, edges[["tree_id", "parent", "child", "probability"]].to_numpy().tolist()))


def test_raptor_config_mirrors_the_core_parameters_and_rejects_bad_values(make_config):
    assert raptor_params(RaptorConfig()) == RaptorParams()
    assert raptor_params(make_config("raptor.threshold=0.2", "raptor.max_layers=2").raptor) == RaptorParams(threshold=0.2, max_layers=2)
    with pytest.raises(UserError, match="raptor.threshold"):
        make_config("raptor.threshold=1.5")
    with pytest.raises(UserError, match="raptor.method"):
        make_config("raptor.method=abstractive")


@pytest.mark.spark
def test_one_tree_per_document_from_one_two_and_three_chunks(spark, tmp_path, capsys):
    """jobs/raptor.py end to end: the offline extractive method, per-document trees, answers from the API."""
    corpus = write_corpus(tmp_path / "docs", one=LIGHTHOUSE, two=BAKERY, three=SEALS)
    root = tmp_path / "index"
    spec = importlib.util.spec_from_file_location("raptor_job", REPO / "jobs" / "raptor.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    overrides = [f"storage.root={root}", f"input.path={corpus}", f"spark.ivy_cache={REPO / '.cache' / 'ivy'}",
                 "raptor.scope=document", *TINY]
    job.main(["--config", str(REPO / "conf" / "local.yaml"), *[arg for o in overrides for arg in ("--set", o)]])
    printed = capsys.readouterr().out
    assert "nodes in layer 0                 6" in printed and "nodes in layer 1                 1" in printed
    assert not (root / T.SCRATCH).exists(), "the build's checkpoint tables are removed once the tree is written"

    from graphrag_spark.config import load_config

    cfg = load_config(REPO / "conf" / "local.yaml", overrides)
    nodes, edges = read_tree(spark, cfg)
    documents = T.TableStore(spark, cfg.storage).read(T.DOCUMENTS).toPandas().set_index("title")["id"]
    shapes = {title: Counter(nodes[nodes["tree_id"] == doc_id]["layer"]) for title, doc_id in documents.items()}
    assert shapes == {"one": Counter({0: 1}), "two": Counter({0: 2}), "three": Counter({0: 3, 1: 1})}
    leaves = nodes[nodes["layer"] == 0]
    assert (leaves["document_id"] == leaves["tree_id"]).all() and leaves["chunk_id"].notna().all()
    assert all(text.endswith(".") for text in leaves["text"])  # a chunk never ends inside a sentence
    assert {len(v) for v in nodes["embedding"]} == {OfflineMiniLM.dim} and (nodes["status"] == OK).all()
    [root_id] = nodes[nodes["layer"] == 1]["id"]
    seal_leaves = set(leaves[leaves["tree_id"] == documents["three"]]["id"])
    assert set(edges["parent"]) == {root_id} and set(edges["child"]) == seal_leaves
    assert (edges["probability"] == 1.0).all()

    index = GraphRagIndex(spark, cfg)  # a root with only a RAPTOR tree
    with pytest.raises(UserError, match="use method 'raptor'"):
        index.basic_search(SEAL_QUESTION)

    index.cfg.raptor.max_context_tokens = 40
    result = index.raptor_search(SEAL_QUESTION)
    assert result.method == "raptor" and result.llm_calls == 0 and "four hundred grey seal pups" in result.answer
    assert 0 < result.context_tokens <= 40 and result.context_tokens == result.context["n_tokens"].sum()
    assert list(result.context.columns) == ["short_id", "id", "tree_id", "layer", "score", "n_tokens"]
    question = OfflineMiniLM().embed([SEAL_QUESTION])[0]
    used, chosen = 0, set(result.context["id"])
    for node in collapsed_tree(nodes, question, max_tokens=10**9).itertuples():  # every node, best first
        if node.id in chosen:
            used += node.n_tokens
        else:  # skipped only because it would overflow what the better nodes left
            assert used + node.n_tokens > 40

    index.cfg.raptor.retrieval = "tree_traversal"
    index.cfg.raptor.traversal_top_k = 1
    descended = index.raptor_search(SEAL_QUESTION).context
    assert list(descended["layer"]) == [1, 0]
    assert descended["id"].iloc[0] == root_id and descended["id"].iloc[1] in seal_leaves


@pytest.fixture
def servers():
    """A healthy server, and one that answers every request with HTTP 500."""
    with start_server(seed=5) as healthy, start_server(seed=5, error_rate=1.0) as failing:
        yield healthy, failing


def llm_config(make_config, corpus, chat, embed, *extra):
    return make_config("raptor.method=llm", f"llm.chat.api_base={chat.base_url}", "llm.chat.model=local-model",
                       "llm.chat.timeout_s=5", "embeddings.provider=openai", f"llm.embedding.api_base={embed.base_url}",
                       "llm.embedding.model=local-embedding", *TINY, *extra, input_path=corpus)


@pytest.mark.spark
def test_llm_summaries_over_http_are_paid_once_and_a_rebuild_gives_the_same_tree(spark, make_config, tmp_path, servers):
    server, _ = servers
    corpus = write_corpus(tmp_path / "docs", two=BAKERY, three=SEALS)
    # 5 leaves of ~15 tokens under a 40-token summarizer budget: cut into 3 clusters.
    cfg = llm_config(make_config, corpus, server, server, "raptor.max_cluster_tokens=40")
    first = build_raptor(spark, cfg)
    summaries = first.shape.nodes_per_layer[1]
    assert first.shape.nodes_per_layer == {0: 5, 1: 3}
    assert server.stats()["served"]["chat"] == first.llm_calls == summaries
    tree = as_rows(*read_tree(spark, cfg))

    rebuilt = build_raptor(spark, cfg)
    assert server.stats()["served"]["chat"] == summaries, "a rebuild makes no new summary calls"
    assert rebuilt.llm_calls == 0 and rebuilt.usage[0].cache_hits == summaries
    assert as_rows(*read_tree(spark, cfg)) == tree, "same input, same tree"

    cfg.query.llm = True
    result = GraphRagIndex(spark, cfg).raptor_search(SEAL_QUESTION)
    assert result.llm_calls == 1 and result.failed_llm_calls == 0 and result.embedding_calls == 1
    assert "[Data: Sources" in result.answer
    assert set(result.context["layer"]) == {0, 1}  # collapsed tree: leaves and summaries together
    assert server.stats()["by_kind"]["basic_search"] == 1


@pytest.mark.spark
def test_failed_summaries_are_recorded_not_dropped(spark, make_config, tmp_path, servers):
    healthy, failing = servers
    corpus = write_corpus(tmp_path / "docs", three=SEALS)
    cfg = llm_config(make_config, corpus, failing, healthy, "llm.chat.max_retries=1", "llm.max_failed_share=1.0")
    build = build_raptor(spark, cfg)
    assert build.shape.failed_summaries == 1 and build.shape.nodes_per_layer == {0: 3, 1: 1}
    nodes, edges = read_tree(spark, cfg)
    [failed] = nodes[nodes["layer"] == 1].itertuples()
    assert failed.status == FAILED and "500" in failed.error and failed.text == "" and failed.embedding is None
    assert sorted(edges["child"]) == sorted(nodes[nodes["layer"] == 0]["id"])  # its edges are kept
    # The failure is in the LLM results table, where the next build finds it and retries it.
    results = T.TableStore(spark, cfg.storage).read(T.LLM_RESULTS).where(F.col("stage") == "raptor_summary").collect()
    assert [(r.item_id, r.result) for r in results] == [(failed.id, None)] and "500" in results[0].error
    retrieved = GraphRagIndex(spark, cfg).raptor_search(SEAL_QUESTION).context
    assert set(retrieved["layer"]) == {0}  # a failed summary is never retrieved


@pytest.mark.bench
def test_the_distributed_build_gives_the_tree_of_the_single_process_core(spark, make_config):
    """Clustering with UMAP in the driver and in executors (reduction_dim=2: UMAP runs for any cluster of
    more than 3 nodes) gives the tree ``tree.build_tree`` builds in one process. In the benchmark run
    (-m bench): UMAP's numba compilation costs ~20 s in every fresh Python worker."""
    from graphrag_spark.raptor.summaries import extractive_summary
    from graphrag_spark.raptor.tree import build_tree
    from graphrag_spark.tokens import count_tokens

    cfg = make_config("raptor.reduction_dim=2", "raptor.chunk_tokens=40", "spark.shuffle_partitions=2")
    build = build_raptor(spark, cfg)
    nodes, edges = read_tree(spark, cfg)
    assert build.shape.nodes_per_layer[1] >= 3
    stored = {text: vector for text, vector in zip(nodes["text"], nodes["embedding"])}
    documents = T.TableStore(spark, cfg.storage).read(T.DOCUMENTS).toPandas().sort_values("id")
    leaves = [row for doc in documents.itertuples()  # the distributed build's leaf order: by document, then position
              for row in leaf_rows(doc.id, doc.text, "corpus", cfg.raptor.chunk_tokens, count_tokens)]
    params = raptor_params(cfg.raptor)
    single = build_tree(
        [leaf["text"] for leaf in leaves], lambda texts: np.stack([stored[t] for t in texts]),
        lambda texts: extractive_summary(texts, params.summary_tokens, count_tokens), count_tokens, params,
        chunk_ids=[leaf["chunk_id"] for leaf in leaves])
    assert sorted((n.id, n.layer, n.text) for n in single.nodes) == sorted(zip(nodes["id"], nodes["layer"], nodes["text"]))
    assert sorted((e.parent, e.child, round(e.probability, 9)) for e in single.edges) == sorted(
        zip(edges["parent"], edges["child"], edges["probability"].round(9)))
