"""The LLM extraction method end to end, over real HTTP to the project's local OpenAI-compatible server."""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.config import load_config
from graphrag_spark.errors import StageFailed
from graphrag_spark.index import graph, runs
from graphrag_spark.index.chunks import build_text_units
from graphrag_spark.index.documents import build_documents
from graphrag_spark.index.embed import embedding_input, text_hash
from graphrag_spark.index.extraction import extract_llm_instances
from graphrag_spark.index.pipeline import estimate_extraction, run_index
from graphrag_spark.llm.server import start_server
from graphrag_spark.llm.stage import new_run_id

from conftest import REPO, SAMPLE_CORPUS, table_rows
from llm_budget import UNTHROTTLED

pytestmark = pytest.mark.spark

SECRET = "sk-test-THIS-KEY-MUST-NEVER-LEAK-0123456789abcdef"


@pytest.fixture(scope="module")
def mini_corpus(tmp_path_factory):
    """Three sample files (5 documents): enough for several tasks and communities, cheap on 2 cores."""
    folder = tmp_path_factory.mktemp("mini")
    for name in ("lumen_cells_factory.txt", "seals_report.md", "business_briefs.csv"):
        shutil.copy(SAMPLE_CORPUS / name, folder / name)
    return folder


def _llm_config(root, corpus, server, *extra):
    return load_config(REPO / "conf" / "local.yaml", [
        f"storage.root={root}", f"input.path={corpus}", f"spark.ivy_cache={REPO / '.cache' / 'ivy'}",
        "extraction.method=llm", f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model",
        "llm.chat.api_key_env=GRAPHRAG_TEST_KEY", "llm.chat.max_retries=8", "llm.chat.timeout_s=5",
        "extraction.claims=true", "llm.chat.price_per_1k_prompt=0.5", "llm.chat.price_per_1k_completion=1.5",
        "chunking.size=200", "chunking.overlap=30", *UNTHROTTLED, *extra])


@pytest.fixture
def llm_config(tmp_path, mini_corpus):
    def make(server, *extra):
        return _llm_config(tmp_path / "index", mini_corpus, server, *extra)
    return make


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("GRAPHRAG_TEST_KEY", SECRET)


@dataclass
class BuiltIndex:
    cfg: object
    dry: dict
    summary: object
    stats: dict
    nothing_changed: object
    published: dict[str, list[tuple]]  # the graph's tables before the rebuild (table_rows)
    rerun: object
    rerun_served: int
    logs: str
    printed: str


@pytest.fixture(scope="module")
def llm_index(spark, tmp_path_factory, mini_corpus):
    """One LLM index for the module (the costly part): dry run, full run, warm rerun, with its logs
    and printed output captured. Small communities and a small report budget, so that higher
    levels substitute finished sub-reports."""
    logs, printed = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(logs)
    loggers = [logging.getLogger(name) for name in ("graphrag_spark", "openai", "httpx")]
    levels = [logger.level for logger in loggers]
    with pytest.MonkeyPatch.context() as patch, start_server(seed=3) as server:
        patch.setenv("GRAPHRAG_TEST_KEY", SECRET)
        for logger in loggers:
            logger.addHandler(handler)
            logger.setLevel(logging.DEBUG)
        try:
            settings = ("communities.max_cluster_size=4", "reports.max_input_tokens=1000",
                        "embeddings.provider=openai", f"llm.embedding.api_base={server.base_url}",
                        "llm.embedding.api_key_env=GRAPHRAG_TEST_KEY")
            cfg = _llm_config(tmp_path_factory.mktemp("llm_index") / "index", mini_corpus, server, *settings)
            with contextlib.redirect_stdout(printed):
                dry = estimate_extraction(spark, cfg)
                assert _served(server) == 0, "a dry run calls nothing"
                summary = run_index(spark, cfg)
                stats = server.stats()
                nothing_changed = run_index(spark, cfg).counts["nothing changed"]
                store = T.TableStore(spark, cfg.storage)
                published = {name: table_rows(store, name) for name in
                             (T.ENTITIES, T.RELATIONSHIPS, T.COMMUNITIES, T.COMMUNITY_REPORTS)}
                # The rebuild takes the graph stage's Spark SQL path (a corpus over graph.driver_max_instances):
                # the description lists its summaries are asked from are those the driver built.
                rerun = run_index(spark, _llm_config(cfg.storage.root, mini_corpus, server, *settings,
                                                     "graph.driver_max_instances=0"), full=True)
            rerun_served = _served(server)
        finally:
            for logger, level in zip(loggers, levels):
                logger.removeHandler(handler)
                logger.setLevel(level)
    return BuiltIndex(cfg, dry, summary, stats, nothing_changed, published, rerun, rerun_served, logs.getvalue(),
                      printed.getvalue())


def _served(server) -> int:
    return server.stats()["served"]["chat"]


def test_llm_index_pays_each_call_once_and_a_rerun_pays_nothing(spark, llm_index):
    cfg, dry, summary, stats = llm_index.cfg, llm_index.dry, llm_index.summary, llm_index.stats
    assert cfg.extraction.max_gleanings == 1 and cfg.extraction.gleaning_check == "between"
    assert dry["extraction calls (at most)"] == dry["chunks to extract"] * (2 + 1)  # extraction, gleaning, claims
    store = T.TableStore(spark, cfg.storage)
    assert dry["chunks to extract"] == store.read(T.TEXT_UNITS).count()
    assert estimate_extraction(spark, cfg)["chunks to extract"] == 0
    assert stats["served"]["chat"] > 0
    assert max(stats["served_hashes"].values()) == 1, "no call was repeated"
    assert not (Path(cfg.storage.root) / T.SCRATCH).exists(), "the run's checkpoint tables are removed after it succeeds"
    # Each table published at its latest version (read as its last writing stage ends: the graph's
    # tables after the summaries rewrote them).
    assert dict(runs.published_run(store)["table_versions"]) == runs.current_versions(store)
    assert summary.counts["entities"] > 10 and summary.counts["relationships"] > 5 and summary.counts["claims"] > 0
    assert store.read(T.ENTITY_INSTANCES).where(F.col("method") == "llm").count() > 0
    usage = {u.stage: u for u in summary.usage}
    extract = usage["extract"]
    assert extract.items == store.read(T.TEXT_UNITS).count() and extract.cache_hits == 0 and extract.failures == 0
    kinds = stats["by_kind"]  # per chunk: the first pass and the one gleaning, no check before it
    assert kinds["entity_extraction"] == kinds["gleaning_continue"] == extract.items
    assert kinds.get("gleaning_loop_check", 0) == 0 and extract.calls == extract.items * 2
    embedding_stages = {T.TEXT_UNIT_EMBEDDINGS, T.ENTITY_EMBEDDINGS}  # their batches are usage rows too
    assert sum(u.calls for u in summary.usage if u.stage not in embedding_stages) == stats["served"]["chat"]
    assert sum(usage[name].calls for name in embedding_stages) == stats["served"]["embeddings"]
    assert extract.est_cost_usd > 0 and "LLM usage" in summary.render()
    assert extract.latency_p50_s > 0 and extract.queue_p95_s >= 0
    assert store.read(T.LLM_USAGE).where(F.col("stage") == "extract").count() == 2, "one row per run and stage"
    # Exactly the entities with two or more distinct descriptions were summarized, each replaced.
    described = graph.build_entities(store.read(T.ENTITY_INSTANCES), cfg.graph, 1, store.read(T.TEXT_UNITS))
    several = described.where(F.size("descriptions") >= 2).select("title", F.col("description").alias("joined"))
    assert usage["summarize_entities"].items == several.count() > 0
    assert store.read(T.ENTITIES).join(several, "title").where(F.col("description") == F.col("joined")).count() == 0
    assert kinds["summarize_descriptions"] == usage["summarize_entities"].calls + usage["summarize_relationships"].calls
    # The reports ran beside the summaries: contexts that waited for summaries were built as they came
    # (the same contexts as from the summarized tables: test_reports_built_on_the_driver_equal_the_spark_path).
    assert summary.counts["report contexts built as their summaries came"] > 0
    # So did the entity embeddings: every entity text, summarized or not, was embedded beside the summaries,
    # each once, so the stage found them all cached once the summaries ended.
    entity_texts = embedding_input(store, T.ENTITY_EMBEDDINGS).select("text").distinct().count()
    assert summary.counts["entity texts embedded beside the summaries"] == entity_texts
    assert summary.counts["entity_embeddings texts embedded"] == 0 and summary.counts["entity_embeddings failed"] == 0
    assert store.read(T.ENTITY_EMBEDDINGS).where(F.col("vector").isNull()).count() == 0
    # Its table was built from the texts the summaries' answers make, in memory: each entity holds the cached
    # vector of its text as the summarized entities table gives it.
    cached = store.read(T.EMBEDDING_CACHE).dropDuplicates(["text_hash"]).select("text_hash", F.col("vector").alias("cached"))
    expected = (embedding_input(store, T.ENTITY_EMBEDDINGS).select("id", text_hash(F.col("text")).alias("text_hash"))
                .join(cached, "text_hash"))
    table = store.read(T.ENTITY_EMBEDDINGS)
    assert table.count() == expected.count() == table.join(expected, "id").where(F.col("vector") == F.col("cached")).count()
    assert stats["served"]["embeddings"] > 0

    assert llm_index.nothing_changed, "a refresh of the same input skips every stage"
    rerun = llm_index.rerun
    assert llm_index.rerun_served == stats["served"]["chat"], "a full rebuild makes zero calls for work already in Delta"
    assert {u.stage: u.cache_hits for u in rerun.usage}["extract"] == extract.items
    assert (rerun.counts["graph aggregated"], summary.counts["graph aggregated"]) == ("in Spark SQL", "on the driver")
    assert rerun.counts["entities"] == summary.counts["entities"]
    for name, before in llm_index.published.items():  # the same summaries, communities and reports
        assert table_rows(store, name) == before, name

    # Secrets: not in logs, printed output, config dumps or any Delta table.
    assert llm_index.logs, "the debug logs were captured"
    assert SECRET not in llm_index.logs and SECRET not in llm_index.printed
    assert SECRET not in cfg.model_dump_json()
    for name in (T.LLM_RESULTS, T.LLM_USAGE, T.ENTITIES, T.RELATIONSHIPS, T.CLAIMS, T.COMMUNITY_REPORTS):
        table = store.read(name)
        as_text = table.select(F.to_json(F.struct(*table.columns)).alias("j"))
        assert as_text.where(F.col("j").contains(SECRET)).count() == 0, name


@pytest.fixture(scope="module")
def mini_units(spark, mini_corpus):
    """The mini corpus's text units as the index cuts them (no LLM needed), for the extraction-only tests."""
    with start_server() as server:
        cfg = _llm_config("unused", mini_corpus, server)
    return build_text_units(build_documents(spark, cfg.input).documents, cfg.chunking).persist()


def test_injected_faults_still_extract_every_chunk(spark, llm_config, mini_units):
    units = mini_units
    with start_server(seed=5, error_rate=0.15, rate_429=0.1, timeout_rate=0.05, retry_after_s=0.2) as faulty:
        cfg = llm_config(faulty, "extraction.claims=false")
        store = T.TableStore(spark, cfg.storage)
        found = extract_llm_instances(spark, store, units, cfg.extraction, cfg.llm, new_run_id())
        entities, usages = found.entities, found.usages
        extracted = entities.select("text_unit_id").distinct().count()
        injected = faulty.stats()["injected"]
    extract = {u.stage: u for u in usages}["extract"]
    assert sum(injected[k] for k in ("500", "429", "timeout")) > 0
    assert extract.failures == 0 and extract.retries > 0
    assert extracted == units.count(), "every chunk extracted"


def test_failures_become_rows_and_fail_the_stage_above_the_threshold(spark, llm_config, mini_units):
    units = mini_units
    with start_server(error_rate=1.0) as broken:
        cfg = llm_config(broken, "llm.chat.max_retries=1")
        store = T.TableStore(spark, cfg.storage)
        with pytest.raises(StageFailed, match=r"items failed .*llm_results"):
            extract_llm_instances(spark, store, units, cfg.extraction, cfg.llm, new_run_id())
    failed = store.read(T.LLM_RESULTS).collect()
    assert failed and all(r.error and r.stage == "extract" and r.item_id and r.attempts >= 2 for r in failed)
    assert SECRET not in " ".join(r.error for r in failed)


def test_higher_levels_substitute_finished_sub_reports_when_the_context_overflows(spark, llm_index):
    from graphrag_spark.index import reports

    cfg, summary = llm_index.cfg, llm_index.summary
    substituted = summary.counts["contexts with substituted sub-reports"]
    assert sum(substituted.values()) > 0, substituted
    # The contexts that waited for their sub-reports were called in the reports' one LLM stage, as soon as
    # those sub-reports were written, not in a stage of their own after it.
    assert len([u for u in summary.usage if u.stage == "community_reports"]) == 1
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


@pytest.mark.parametrize("answers", ["cached", "failing"])
def test_reports_built_on_the_driver_equal_the_spark_path(spark, llm_index, mini_corpus, tmp_path, monkeypatch, request,
                                                          answers):
    """A small graph's reports are built on the driver; the Spark path (any size) writes the same rows,
    counts and calls, from cached answers and from failed calls alike (extractive stand-ins, which
    name their sub-communities). The server answers every call with an error: a call either path makes fails."""
    from graphrag_spark.index import reports

    root = tmp_path / "index"
    shutil.copytree(llm_index.cfg.storage.root, root)
    extra = ("llm.chat.max_retries=0", "llm.max_failed_share=1.0", "communities.max_cluster_size=4",
             "reports.max_input_tokens=1000")
    if answers == "failing":
        extra += ("llm.chat.model=model-without-answers",)
    server = start_server(error_rate=1.0)
    request.addfinalizer(server.stop)
    cfg = _llm_config(root, mini_corpus, server, *extra)
    store = T.TableStore(spark, cfg.storage)
    claims = store.read(T.CLAIMS)
    columns = ["community", "level", "id", "title", "summary", "rating", "findings", "full_content", "method"]
    as_indexed = [tuple(r) for r in store.read(T.COMMUNITY_REPORTS).select(*columns).orderBy("community").collect()]

    def build(max_members: int):
        monkeypatch.setattr(reports, "DRIVER_REPORT_MEMBERS", max_members)
        counts, usages = reports.build_llm_reports(spark, store, cfg, new_run_id(), claims)
        written = [tuple(r) for r in store.read(T.COMMUNITY_REPORTS).select(*columns).orderBy("community").collect()]
        # The driver calls the contexts that wait for sub-reports in its first stage where it can (their
        # sub-reports answered), the Spark path in a stage after it: the same items and calls in all.
        totals = [sum(getattr(u, name) for u in usages) for name in ("items", "cache_hits", "calls", "failures")]
        return counts, totals, written

    on_driver, in_spark = build(reports.DRIVER_REPORT_MEMBERS), build(0)
    assert on_driver == in_spark
    counts, totals, written = on_driver
    assert len(written) == sum(counts["reports per level"].values())
    if answers == "cached":
        assert sum(counts["contexts with substituted sub-reports"].values()) > 0
        assert totals[2] == 0  # no call
        assert written == as_indexed
    else:
        assert counts["reports failed (extractive stand-in, retried next run)"] > 0
        assert {row[-1] for row in written} == {reports.FALLBACK_METHOD}
        assert any("[Data: Reports (" in row[4] for row in written), "a stand-in names its sub-communities"


def test_a_community_carried_down_unchanged_pays_no_report_of_its_own(spark, llm_index):
    from graphrag_spark.index.reports import reused_reports

    cfg, summary = llm_index.cfg, llm_index.summary
    store = T.TableStore(spark, cfg.storage)
    shape = store.read(T.COMMUNITIES).select("community", "level", "size", "children").toPandas()
    reused = reused_reports(shape)
    assert reused and summary.counts["reports reused (same members as a sub-community)"] == len(reused)
    report_items = sum(u.items for u in summary.usage if u.stage == "community_reports")
    assert report_items == len(shape) - len(reused), "one report item per distinct community, none per copy"
    content = {r.community: r.full_content for r in store.read(T.COMMUNITY_REPORTS).collect()}
    assert len(content) == len(shape)
    assert all(content[community] == content[child] for community, child in reused.items())
