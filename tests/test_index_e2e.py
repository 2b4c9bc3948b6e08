"""End to end: the index job over the sample corpus, asserted on its Delta tables."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.index import runs
from graphrag_spark.index.pipeline import run_index
from graphrag_spark.query.global_search import offline_global_search

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def index(spark, sample_index):
    cfg, summary = sample_index
    return cfg, T.TableStore(spark, cfg.storage), summary


def _snapshot(store):
    return {name: sorted(r[0] for r in store.read(name).select("id").collect())
            for name in (T.DOCUMENTS, T.TEXT_UNITS, T.ENTITIES, T.RELATIONSHIPS, T.COMMUNITIES, T.COMMUNITY_REPORTS)}


def test_every_table_is_delta_with_the_declared_schema(index):
    _, store, _ = index
    for name in (T.DOCUMENTS, T.INPUT_REJECTS, T.TEXT_UNITS, T.ENTITY_INSTANCES, T.RELATIONSHIP_INSTANCES,
                 T.ENTITIES, T.RELATIONSHIPS, T.COMMUNITIES, T.COMMUNITY_REPORTS):
        assert store.exists(name), name
        assert [f.name for f in store.read(name).schema.fields] == [f.name for f in T.SCHEMAS[name].fields]


def test_the_run_publishes_every_table_at_its_latest_version(index):
    # Versions are read as each table's last writing stage ends, while other stages run: none is
    # written after that.
    _, store, _ = index
    assert dict(runs.published_run(store)["table_versions"]) == runs.current_versions(store)


def test_every_table_is_created_with_the_project_checkpoint_interval(spark, index):
    _, store, _ = index
    for name in (T.DOCUMENTS, T.INPUT_REJECTS, T.ENTITIES, T.COMMUNITY_REPORTS, T.INDEX_RUNS, T.INDEX_LOCK):
        properties = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES {store.sql_name(name)}").collect()}
        assert {k: properties.get(k) for k in T.TABLE_PROPERTIES} == T.TABLE_PROPERTIES, name


def test_documents_dedupe_and_rejects_are_counted(index):
    _, store, summary = index
    docs = store.read(T.DOCUMENTS)
    assert summary.counts["documents"] == docs.count() == 9
    assert summary.counts["duplicate documents"] == 1
    [dup] = docs.where(F.size("duplicate_sources") > 0).collect()
    assert dup.source.endswith("harbour_expansion.md") and dup.duplicate_sources[0].endswith("harbour_expansion_copy.md")
    [reject] = store.read(T.INPUT_REJECTS).collect()
    assert "election.jsonl#L4" in reject.source and "empty document" in reject.reason


def test_provenance_links_resolve(index):
    _, store, _ = index
    units = {r.id for r in store.read(T.TEXT_UNITS).select("id").collect()}
    docs = {r.id for r in store.read(T.DOCUMENTS).select("id").collect()}
    assert {r.document_id for r in store.read(T.TEXT_UNITS).collect()} <= docs
    for name in (T.ENTITY_INSTANCES, T.RELATIONSHIP_INSTANCES):
        assert {r.text_unit_id for r in store.read(name).select("text_unit_id").collect()} <= units
    entities = store.read(T.ENTITIES).collect()
    titles = {e.title for e in entities}
    assert "ELENA VOSS" in titles and "PORT ALDER" in titles
    for e in entities:
        assert set(e.text_unit_ids) <= units
    for r in store.read(T.RELATIONSHIPS).collect():
        assert r.source in titles and r.target in titles and r.source < r.target
        assert r.weight >= 1 and set(r.text_unit_ids) <= units


def test_every_clustered_entity_is_in_exactly_one_community_per_level(index):
    _, store, summary = index
    communities = store.read(T.COMMUNITIES)
    clustered = {r.id for r in store.read(T.ENTITIES).where("degree > 0").select("id").collect()}
    levels = sorted(r.level for r in communities.select("level").distinct().collect())
    assert levels == list(range(len(levels))) and levels
    for level in levels:
        members = [e for r in communities.where(F.col("level") == level).collect() for e in r.entity_ids]
        assert len(members) == len(set(members))
        assert set(members) == clustered
    by_number = {r.community: r for r in communities.collect()}
    for c in by_number.values():
        if c.level > 0:
            assert by_number[c.parent].level == c.level - 1 and c.community in by_number[c.parent].children
            assert set(c.entity_ids) <= set(by_number[c.parent].entity_ids)


def test_one_report_per_community_with_references(index):
    _, store, summary = index
    reports = store.read(T.COMMUNITY_REPORTS).collect()
    communities = store.read(T.COMMUNITIES).collect()
    assert sorted((r.community, r.level) for r in reports) == sorted((c.community, c.level) for c in communities)
    for r in reports:
        assert r.title and r.summary and 0 <= r.rating <= 10 and r.method == "extractive"
        assert r.full_content.startswith(f"# {r.title}")
        for finding in r.findings:
            assert "[Data: Entities (" in finding.explanation and "Relationships (" in finding.explanation


def test_rerun_gives_identical_ids_and_counts(spark, index):
    cfg, store, _ = index
    before = _snapshot(store)
    run_index(spark, cfg)
    assert _snapshot(store) == before


def test_offline_global_search_cites_reports(spark, index):
    cfg, store, _ = index
    result = offline_global_search(spark, store.read(T.COMMUNITY_REPORTS), "Who opposes the harbour dredging near the estuary?",
                                   level=1, batch_tokens=800, reduce_tokens=2000, seed=1, max_points=5)
    assert "[Data: Reports (" in result.answer
    assert result.context_units == store.read(T.COMMUNITY_REPORTS).where(F.col("level") == result.level).count()
    assert (result.points["score"] > 0).all()


def test_isolated_entities_and_dropped_relationships_are_counted(index):
    _, store, summary = index
    isolated = store.read(T.ENTITIES).where(F.col("degree") == 0).count()
    assert summary.counts["isolated entities (no relationship)"] == isolated
    assert summary.counts["relationships dropped (endpoint not an entity)"] > 0  # phrases pruned as too rare
    embedded = store.read(T.ENTITY_EMBEDDINGS).select("id")
    assert store.read(T.ENTITIES).select("id").subtract(embedded).count() == 0, "every entity can be matched"
