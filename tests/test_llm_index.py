"""The LLM extraction method end to end, over real HTTP to the project's local OpenAI-compatible server."""

from __future__ import annotations

import logging
import shutil

import pytest
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.errors import StageFailed
from graphrag_spark.index.pipeline import estimate_extraction, run_index
from graphrag_spark.llm.server import start_server

from conftest import SAMPLE_CORPUS

pytestmark = pytest.mark.spark

SECRET = "sk-test-THIS-KEY-MUST-NEVER-LEAK-0123456789abcdef"


@pytest.fixture(scope="module")
def mini_corpus(tmp_path_factory):
    """Three sample files (5 documents): enough for several batches and communities, cheap on 2 cores."""
    folder = tmp_path_factory.mktemp("mini")
    for name in ("lumen_cells_factory.txt", "seals_report.md", "business_briefs.csv"):
        shutil.copy(SAMPLE_CORPUS / name, folder / name)
    return folder


@pytest.fixture
def llm_config(make_config, mini_corpus):
    def make(server, *extra):
        return make_config("extraction.method=llm", f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model",
                           "llm.chat.api_key_env=GRAPHRAG_TEST_KEY", "llm.chat.max_retries=8", "llm.chat.timeout_s=5",
                           "llm.items_per_commit=2", "extraction.claims=true", "llm.chat.price_per_1k_prompt=0.5",
                           "llm.chat.price_per_1k_completion=1.5", "chunking.size=200", "chunking.overlap=30", *extra,
                           input_path=mini_corpus)
    return make


@pytest.fixture
def server():
    with start_server(seed=3) as handle:
        yield handle


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("GRAPHRAG_TEST_KEY", SECRET)


def _served(server) -> int:
    return server.stats()["served"]["chat"]


def test_llm_index_pays_each_call_once_and_a_rerun_pays_nothing(spark, llm_config, server, caplog, capsys):
    for logger in ("graphrag_spark", "openai", "httpx"):
        caplog.set_level(logging.DEBUG, logger=logger)
    cfg = llm_config(server)
    dry = estimate_extraction(spark, cfg)
    assert _served(server) == 0, "a dry run calls nothing"
    assert dry["extraction calls (at most)"] == dry["chunks to extract"] * (1 + 2 * cfg.extraction.max_gleanings + 1)
    summary = run_index(spark, cfg)
    store = T.TableStore(spark, cfg.storage)
    assert dry["chunks to extract"] == store.read(T.TEXT_UNITS).count()
    assert estimate_extraction(spark, cfg)["chunks to extract"] == 0
    stats = server.stats()
    assert stats["served"]["chat"] > 0
    assert max(stats["served_hashes"].values()) == 1, "no call was repeated"
    assert summary.counts["entities"] > 10 and summary.counts["relationships"] > 5 and summary.counts["claims"] > 0
    assert store.read(T.ENTITY_INSTANCES).where(F.col("method") == "llm").count() > 0
    usage = {u.stage: u for u in summary.usage}
    extract = usage["extract"]
    assert extract.items == store.read(T.TEXT_UNITS).count() and extract.cache_hits == 0 and extract.failures == 0
    kinds = stats["by_kind"]  # per chunk: the first pass, one gleaning check, a continuation when it said Y
    assert kinds["entity_extraction"] == kinds["gleaning_loop_check"] == extract.items
    assert 0 < kinds["gleaning_continue"] <= extract.items
    assert extract.calls == extract.items * 2 + kinds["gleaning_continue"]
    assert sum(u.calls for u in summary.usage) == stats["served"]["chat"]
    assert extract.est_cost_usd > 0 and "LLM usage" in summary.render()
    assert store.read(T.LLM_USAGE).where(F.col("stage") == "extract").count() == 1
    summarized = store.read(T.ENTITIES).where(F.col("description").contains("\n")).count()
    assert summarized == 0, "multi-description entities were summarized"

    served_before = _served(server)
    assert run_index(spark, cfg).counts["nothing changed"], "a refresh of the same input skips every stage"
    rerun = run_index(spark, cfg, full=True)
    assert _served(server) == served_before, "a full rebuild makes zero calls for work already in Delta"
    assert {u.stage: u.cache_hits for u in rerun.usage}["extract"] == extract.items
    assert rerun.counts["entities"] == summary.counts["entities"]

    # Secrets: not in logs, printed output, config dumps or any Delta table.
    assert SECRET not in caplog.text and SECRET not in capsys.readouterr().out
    assert SECRET not in cfg.model_dump_json()
    for name in (T.LLM_RESULTS, T.LLM_USAGE, T.ENTITIES, T.RELATIONSHIPS, T.CLAIMS, T.COMMUNITY_REPORTS):
        table = store.read(name)
        as_text = table.select(F.to_json(F.struct(*table.columns)).alias("j"))
        assert as_text.where(F.col("j").contains(SECRET)).count() == 0, name


def test_a_crash_between_commits_repeats_at_most_the_batch_in_flight(spark, llm_config, server, monkeypatch):
    cfg = llm_config(server, "extraction.summarize_descriptions=false", "reports.method=extractive")
    appends = {"n": 0}
    original = T.TableStore.write

    def crashing_write(self, df, name, mode="overwrite"):
        if name == T.LLM_RESULTS:
            appends["n"] += 1
            if appends["n"] == 3:  # the third batch's calls are paid, then the driver dies before committing
                df.collect()
                raise KeyboardInterrupt("simulated driver crash")
        return original(self, df, name, mode)

    monkeypatch.setattr(T.TableStore, "write", crashing_write)
    with pytest.raises(KeyboardInterrupt):
        run_index(spark, cfg)
    monkeypatch.setattr(T.TableStore, "write", original)
    store = T.TableStore(spark, cfg.storage)
    committed = store.read(T.LLM_RESULTS).agg(F.sum("n_calls"), F.count("*")).collect()[0]
    calls_before_crash = _served(server)
    in_flight = calls_before_crash - committed[0]
    assert committed[1] == 2 * cfg.llm.items_per_commit and in_flight > 0

    server.reset()
    run_index(spark, cfg)
    # The crash hit the extraction stage; the claims stage (its own items) runs after it.
    total = (store.read(T.LLM_RESULTS).where(F.col("stage").isin("extract", "extract_claims"))
             .agg(F.sum("n_calls")).collect()[0][0])
    assert _served(server) == total - committed[0], "the rerun paid only for work not committed before the crash"
    assert _served(server) - (total - calls_before_crash) == in_flight


def test_injected_faults_still_extract_every_chunk(spark, llm_config):
    with start_server(seed=5, error_rate=0.1, rate_429=0.05, timeout_rate=0.05, retry_after_s=0.2) as faulty:
        cfg = llm_config(faulty, "extraction.summarize_descriptions=false", "reports.method=extractive",
                         "llm.items_per_commit=50")
        summary = run_index(spark, cfg)
        injected = faulty.stats()["injected"]
    extract = {u.stage: u for u in summary.usage}["extract"]
    assert sum(injected[k] for k in ("500", "429", "timeout")) > 0
    assert extract.failures == 0 and extract.retries > 0
    store = T.TableStore(spark, cfg.storage)
    extracted = store.read(T.ENTITY_INSTANCES).select("text_unit_id").distinct().count()
    assert extracted == store.read(T.TEXT_UNITS).count(), "every chunk extracted"


def test_failures_become_rows_and_fail_the_stage_above_the_threshold(spark, llm_config):
    with start_server(error_rate=1.0) as broken:
        cfg = llm_config(broken, "llm.chat.max_retries=1")
        with pytest.raises(StageFailed, match=r"items failed .*llm_results"):
            run_index(spark, cfg)
    failed = T.TableStore(spark, cfg.storage).read(T.LLM_RESULTS).collect()
    assert failed and all(r.error and r.stage == "extract" and r.item_id and r.attempts >= 2 for r in failed)
    assert SECRET not in " ".join(r.error for r in failed)


def test_higher_levels_substitute_finished_sub_reports_when_the_context_overflows(spark, llm_config, server):
    from graphrag_spark.index import reports

    cfg = llm_config(server, "communities.max_cluster_size=4", "reports.max_input_tokens=1000",
                     "extraction.summarize_descriptions=false")
    summary = run_index(spark, cfg)
    substituted = summary.counts["contexts with substituted sub-reports"]
    assert sum(substituted.values()) > 0, substituted
    level = min(lv for lv, n in substituted.items() if n)
    store = T.TableStore(spark, cfg.storage)
    communities, finished = store.read(T.COMMUNITIES), store.read(T.COMMUNITY_REPORTS)
    contexts = reports.community_contexts(
        communities.where(F.col("level") == level), store.read(T.ENTITIES), store.read(T.RELATIONSHIPS),
        finished.where(F.col("level") == level + 1), store.read(T.CLAIMS), communities.where(F.col("level") == level + 1))
    built = [r for r in reports.report_contexts(contexts, cfg.reports.max_input_tokens).collect() if r.substituted]
    assert built
    finer = {r.community: r.full_content for r in finished.where(F.col("level") == level + 1).collect()}
    for row in built:
        assert "-----Reports-----" in row.context
        for child in row.substituted:
            assert finer[child].replace('"', '""') in row.context, "the finer level's finished report is in the context"
