"""Spark Connect, as Databricks serverless and shared clusters run PySpark: the offline index job and
the whole notebook API on a Connect session give the classic session's index and answers."""

from __future__ import annotations

import json
import os
import sys

import pytest

from graphrag_spark import tables as T
from graphrag_spark.index.pipeline import run_index
from graphrag_spark.llm.server import start_server
from graphrag_spark.query.api import GraphRagIndex

from conftest import REPO, SAMPLE_CORPUS, run_process
from connect_job import INDEX_TABLES, LLM_CORPUS_FILE, LLM_KEY_ENV, QUESTIONS, api_answers, config, index_rows, llm_config, plain

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def llm_server():
    with start_server() as server:
        yield server


def EARLY_JOB(workdir):
    """The Connect side, once, while other tests run (see conftest): a Connect server, and in a client
    process the index of data/sample, its RAPTOR tree, the notebook API's answers and an LLM index."""
    from connect_server import connect_server
    from tiny_data import TINY_DATA_CONF

    root, out = workdir / "index", workdir / "verdict.json"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "tests"), LLM_KEY_ENV: "sk-connect-test"}
    env.pop("SPARK_REMOTE", None)
    with start_server() as llm, connect_server(REPO / ".cache" / "ivy", workdir / "server.log", conf=TINY_DATA_CONF) as url:
        done = run_process([sys.executable, str(REPO / "tests" / "connect_job.py"), "--remote", url,
                            "--root", str(root), "--input", str(SAMPLE_CORPUS), "--out", str(out),
                            "--llm", llm.base_url, "--llm-root", str(workdir / "llm_index")],
                           timeout=1800, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return root, json.loads(out.read_text())


@pytest.fixture(scope="module")
def connect_run(early_result):
    return early_result


def test_the_index_job_on_connect_writes_the_classic_index(spark, sample_index, connect_run):
    classic_cfg, classic_summary = sample_index
    connect_root, verdict = connect_run
    assert verdict["summary_counts"] == {k: str(v) for k, v in classic_summary.counts.items()}
    classic = T.TableStore(spark, classic_cfg.storage)
    written = T.TableStore(spark, config(connect_root, SAMPLE_CORPUS).storage)
    rows = {name: classic.read(name).count() for name in INDEX_TABLES}
    assert verdict["rows"] == rows and all(rows.values())
    for name, key in ((T.ENTITIES, "id"), (T.RELATIONSHIPS, "id"), (T.COMMUNITY_REPORTS, "id"), (T.TEXT_UNITS, "id")):
        assert {r[0] for r in written.read(name).select(key).collect()} == {r[0] for r in classic.read(name).select(key).collect()}, name


def test_the_notebook_api_on_connect_answers_as_the_classic_session(spark, sample_index, connect_run, llm_server):
    connect_root, verdict = connect_run
    classic = json.loads(json.dumps(api_answers(GraphRagIndex.load(spark, sample_index[0]), llm_server.base_url), default=plain))
    for key, expected in classic.items():
        assert verdict[key] == expected, key
    assert verdict["llm_global"]["llm_calls"] >= 2 and "[Data: " in verdict["llm_global"]["answer"]
    assert len(verdict["batch_global"]) == len(QUESTIONS) and verdict["global_context"] > 0


def test_raptor_built_and_searched_on_connect_matches_classic_search(spark, connect_run):
    connect_root, verdict = connect_run
    tree = GraphRagIndex.load(spark, config(connect_root, SAMPLE_CORPUS))
    assert verdict["raptor_nodes_per_layer"]["0"] > 0 and len(verdict["raptor_nodes_per_layer"]) > 1
    raptor = tree.raptor_search(QUESTIONS[0])
    assert verdict["raptor"]["answer"] == raptor.answer and raptor.context_units > 0


def test_the_llm_method_on_connect_writes_the_classic_index(spark, connect_run, llm_server, tmp_path, monkeypatch):
    """Extraction with gleaning and claims, summaries, reports and endpoint embeddings: on Connect
    (no coordinator, results committed in waves) the same tables, rows and calls as on the classic session."""
    monkeypatch.setenv(LLM_KEY_ENV, "sk-connect-test")
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / LLM_CORPUS_FILE).write_bytes((SAMPLE_CORPUS / LLM_CORPUS_FILE).read_bytes())
    cfg = llm_config(str(tmp_path / "index"), str(tmp_path / "input"), llm_server.base_url)
    summary = run_index(spark, cfg)
    on_connect = connect_run[1]["llm_index"]
    classic = {k: str(v) for k, v in summary.counts.items()}
    # The classic session builds report contexts and embeds entity texts beside the summaries, as each
    # summary comes (Connect waits for them): the same texts, counted in two figures there.
    assert int(classic.pop("report contexts built as their summaries came")) > 0
    beside = int(classic.pop("entity texts embedded beside the summaries"))
    classic["entity_embeddings texts embedded"] = str(beside + int(classic["entity_embeddings texts embedded"]))
    assert on_connect["summary_counts"] == classic
    assert on_connect["rows"] == index_rows(spark, cfg)
    connect_calls, classic_calls = dict(on_connect["calls"]), {u.stage: u.calls for u in summary.usage}
    for name in (T.TEXT_UNIT_EMBEDDINGS, T.ENTITY_EMBEDDINGS):
        # Endpoint batches of two texts, observed in the executors' jobs; how texts fall into batches
        # differs by path (tasks of a wave, rounds beside the summaries), not what they cost.
        texts = int(on_connect["summary_counts"][f"{name} texts embedded"])
        assert 0 < texts / 2 <= connect_calls.pop(name) <= texts and classic_calls.pop(name) > 0, name
    assert connect_calls == classic_calls
    # more entity summaries than llm.items_per_commit: the Connect stage ran (and committed) several waves
    assert on_connect["rows"][T.COMMUNITY_REPORTS] > 0 and on_connect["rows"]["llm_results summarize_entities"] > 2
    # Connect's embeddings in executors: waves of two batches of two texts (the last up to half a wave more),
    # each appended to the cache when it returns
    waves = sum(on_connect["rows"][name] // 4 for name in (T.TEXT_UNIT_EMBEDDINGS, T.ENTITY_EMBEDDINGS))
    assert on_connect["embedding_cache_commits"] >= waves > 2
