"""Every query method end to end on one small index of data/sample: offline, and with the LLM through the
local OpenAI-compatible server over real HTTP; embeddings; batch mode; the context size report."""

from __future__ import annotations

import importlib.util
import os
import re

import pytest
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.errors import UserError
from graphrag_spark.index.embed import embed_texts
from graphrag_spark.llm.server import start_server
from graphrag_spark.query.api import GraphRagIndex
from graphrag_spark.query.context import NO_ANSWER
from graphrag_spark.query.global_search import cited_ids
from graphrag_spark.tokens import count_tokens

from conftest import REPO

pytestmark = pytest.mark.spark

# The offline embedder's BLAS must not start a thread per core in every Python worker; test modules are
# imported before the shared SparkSession starts, so its workers inherit this.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

QUESTION = "Who opposes the harbour dredging near the estuary?"
UNRELATED = "Xylophone quantum zebra?"


@pytest.fixture(scope="module")
def index_root(sample_index):
    return sample_index[0].storage.root


@pytest.fixture(scope="module")
def server():
    with start_server() as handle:
        yield handle


@pytest.fixture
def open_index(spark, index_root, make_config):
    def make(*overrides: str, llm_base: str | None = None) -> GraphRagIndex:
        llm = ["query.llm=true", f"llm.chat.api_base={llm_base}", "llm.chat.max_retries=0"] if llm_base else []
        return GraphRagIndex.load(spark, make_config(f"storage.root={index_root}", *llm, *overrides))

    return make


def test_embeddings_are_stored_for_every_text_unit_and_entity(open_index):
    index = open_index()
    for table, source in ((T.TEXT_UNIT_EMBEDDINGS, T.TEXT_UNITS), (T.ENTITY_EMBEDDINGS, T.ENTITIES)):
        rows = index.table(table).collect()
        assert sorted(r.id for r in rows) == sorted(r.id for r in index.table(source).select("id").collect())
        assert {len(r.vector) for r in rows} == {384}
        assert {r.model_name for r in rows} == {"sentence-transformers/all-MiniLM-L6-v2"}


def test_openai_embeddings_through_the_endpoint_and_failures_kept_as_null(spark, make_config, server):
    frame = spark.createDataFrame([("a", "Scrooge counts coal."), ("b", "Marley's ghost"), ("c", "")], "id string, text string")
    cfg = make_config("embeddings.provider=openai", "embeddings.batch_size=2", "llm.embedding.model=text-embedding-3-small",
                      f"llm.embedding.api_base={server.base_url}")
    rows = {r.id: r for r in embed_texts(frame, cfg, partitions=2).collect()}
    assert {len(r.vector) for r in rows.values()} == {384} and {r.model_name for r in rows.values()} == {"text-embedding-3-small"}
    with start_server(error_rate=1.0) as failing:
        cfg = make_config("embeddings.provider=openai", f"llm.embedding.api_base={failing.base_url}", "llm.embedding.max_retries=0")
        assert all(r.vector is None for r in embed_texts(frame, cfg, partitions=1).collect())


def test_global_search_maps_exactly_one_level(open_index, server):
    index = open_index("query.batch_tokens=1", llm_base=server.base_url)  # one report per map call
    levels = index.levels()
    all_reports = {r.community for r in index.reports().select("community").collect()}
    for level in levels:
        server.reset()
        result = index.global_search(QUESTION, level=level)
        level_ids = {r.community for r in index.reports(level).collect()}
        assert result.level == level and set(result.context["community"]) == level_ids
        assert server.stats()["by_kind"]["global_map"] == result.context_units == len(level_ids)
        assert result.llm_calls == len(level_ids) + 1 and result.failed_llm_calls == 0
        # Reports cite their sub-communities' reports, so an answer may cite a finer level's too.
        cited = cited_ids(result.answer, "Reports")
        assert cited and set(cited) <= all_reports
        assert (result.points[result.points["selected"]]["score"] > 0).all()
    deeper = index.global_search(QUESTION, level=levels[-1] + 5)
    assert deeper.level == levels[-1], "a level finer than the deepest uses the deepest (projected) communities"


def test_nothing_relevant_drops_every_zero_point_and_says_so(open_index, server):
    result = open_index(llm_base=server.base_url).global_search(UNRELATED, level=0)
    assert result.answer == NO_ANSWER
    assert len(result.points) and (result.points["score"] == 0).all() and not result.points["selected"].any()
    assert result.llm_calls == result.points["batch"].nunique(), "no reduce call when no point is left"


def test_malformed_map_answers_are_counted_not_dropped(open_index):
    with start_server(malformed_rate=1.0) as garbling:
        result = open_index("query.batch_tokens=1", llm_base=garbling.base_url).global_search(QUESTION, level=1)
    assert result.malformed_map_answers == result.context_units == result.llm_calls - (result.answer != NO_ANSWER)
    assert result.failed_llm_calls == 0


def test_failed_map_calls_are_reported_not_answered_as_irrelevant(open_index):
    with start_server(error_rate=1.0) as failing:
        result = open_index(llm_base=failing.base_url).global_search(QUESTION, level=0)
    assert result.answer.startswith("The answer could not be generated: all") and "map calls failed" in result.answer
    assert result.failed_llm_calls == result.llm_calls > 0


def test_ts_maps_over_the_text_units(open_index, server):
    index = open_index("query.batch_tokens=400", llm_base=server.base_url)
    result = index.text_summary_search(QUESTION)
    n_units = index.table(T.TEXT_UNITS).count()
    assert result.method == "ts" and result.context_units == n_units
    assert result.context_tokens == index.table(T.TEXT_UNITS).agg(F.sum("n_tokens")).first()[0]
    assert result.llm_calls == result.points["batch"].nunique() + 1 > 2
    assert set(cited_ids(result.answer, "Sources")) <= set(range(1, n_units + 1)) and "[Data: Sources (" in result.answer


def test_basic_search_fills_the_context_by_similarity_within_its_budget(open_index, server):
    result = open_index("query.context_tokens=300", llm_base=server.base_url).basic_search(QUESTION)
    assert 0 < result.context_tokens <= 300 and count_tokens(result.context_text) <= 300
    assert list(result.context["similarity"]) == sorted(result.context["similarity"], reverse=True)
    assert result.llm_calls == 1
    assert set(cited_ids(result.answer, "Sources")) <= set(result.context["short_id"])


def test_local_search_context_keeps_each_share_of_its_budget(open_index, server):
    result = open_index("query.context_tokens=1000", llm_base=server.base_url).local_search(QUESTION)
    sections = re.split(r"(?m)^-----(\w+)-----\n", result.context_text)[1:]
    tokens = {name: count_tokens(f"-----{name}-----\n{body}") for name, body in zip(sections[::2], sections[1::2])}
    assert {"Entities", "Sources"} <= set(tokens)
    assert tokens["Sources"] <= 500 and tokens.get("Reports", 0) <= 150
    assert tokens["Entities"] + tokens.get("Relationships", 0) + tokens.get("Claims", 0) <= 350
    assert result.context_tokens <= 1000 and result.llm_calls == 1
    assert "[Data: " in result.answer


def test_offline_methods_answer_with_citations_and_no_llm(open_index):
    index = open_index()
    for method, kind in (("global", "Reports"), ("ts", "Sources"), ("basic", "Sources"), ("local", None)):
        [result] = index.search(method, [QUESTION], level=1)
        assert result.llm_calls == 0 and result.context_units > 0
        assert "[Data: " + (kind or "") in result.answer, method


def test_batch_mode_writes_one_delta_row_per_answer(spark, index_root, server, tmp_path):
    spec = importlib.util.spec_from_file_location("query_job", REPO / "jobs" / "query.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    questions = tmp_path / "questions.txt"
    questions.write_text(f"{QUESTION}\nWhat does Lumen Cells build?\n{UNRELATED}\n")
    output = tmp_path / "answers"
    common = ["--config", str(REPO / "conf" / "local.yaml"), "--set", f"storage.root={index_root}",
              "--set", "spark.shuffle_partitions=2", "--set", "query.llm=true", "--set", f"llm.chat.api_base={server.base_url}",
              "--questions", str(questions), "--output", str(output)]
    job.main([*common, "--method", "global", "--level", "0"])
    job.main([*common, "--method", "basic"])
    rows = spark.read.format("delta").load(str(output)).collect()
    assert [f.name for f in spark.read.format("delta").load(str(output)).schema] == [f.name for f in T.SCHEMAS[T.QUERY_ANSWERS]]
    assert sorted((r.method, r.question) for r in rows) == sorted((m, q) for m in ("global", "basic")
                                                                   for q in questions.read_text().splitlines())
    assert {r.level for r in rows if r.method == "global"} == {0}
    unrelated = [r for r in rows if r.question == UNRELATED and r.method == "global"][0]
    assert unrelated.answer == NO_ANSWER and unrelated.llm_calls > 0 and unrelated.latency_s > 0


def test_context_sizes_per_level_and_ts(open_index):
    index = open_index()
    sizes = index.context_sizes().set_index("condition")
    levels = index.levels()
    assert list(sizes.index) == [f"C{level}" for level in levels] + ["TS"]
    for level in levels:
        contents = [r.full_content for r in index.table(T.COMMUNITY_REPORTS).where(F.col("level") == level).collect()]
        assert sizes.loc[f"C{level}", "units"] == len(contents)
        assert sizes.loc[f"C{level}", "tokens"] == sum(count_tokens(c) for c in contents)
    assert sizes.loc["TS", "units"] == index.table(T.TEXT_UNITS).count()
    assert sizes["pct_of_max"].max() == 100.0


def test_a_missing_index_is_one_clear_error(spark, tmp_path):
    with pytest.raises(UserError, match="No GraphRAG index"):
        GraphRagIndex.load(spark, tmp_path / "nothing-here")
