"""Importing a real microsoft/graphrag index (Operation Dulce) into our table schemas."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import pytest
from conftest import SHARED, shared_path

from graphrag_spark.errors import UserError
from graphrag_spark.index.report_context import build_leaf_context
from graphrag_spark.index.report_json import parse_report
from graphrag_spark.interop.msgraphrag import load_msgraphrag
from graphrag_spark.tables import (
    CLAIMS,
    COMMUNITIES,
    COMMUNITY_REPORTS,
    DOCUMENTS,
    ENTITIES,
    RELATIONSHIPS,
    SCHEMAS,
    TEXT_UNITS,
)
from graphrag_spark.tokens import count_tokens

FIXTURE = SHARED / "fixtures" / "graphrag-operation-dulce"
# Their relationships name two endpoints that have no entity row; the import adds them as stubs.
DANGLING_ENDPOINTS = ["CONCRETE HALLWAY", "ELEVATOR"]
# Their hierarchy: 7 roots at level 0, one of them split into 3 at level 1; the 6 unsplit roots
# are projected down to level 1.
PROJECTED = 6


@pytest.fixture(scope="module")
def tables() -> dict[str, pd.DataFrame]:
    shared_path("fixtures/graphrag-operation-dulce")
    return load_msgraphrag(FIXTURE)


def test_counts(tables):
    counts = {name: len(df) for name, df in tables.items()}
    assert counts == {
        DOCUMENTS: 1,
        TEXT_UNITS: 5,
        ENTITIES: 39 + len(DANGLING_ENDPOINTS),
        RELATIONSHIPS: 107,
        CLAIMS: 41,
        COMMUNITIES: 10 + PROJECTED,
        COMMUNITY_REPORTS: 10 + PROJECTED,
    }


def test_columns_are_exactly_our_schemas(tables):
    for name, df in tables.items():
        assert list(df.columns) == SCHEMAS[name].fieldNames(), name


def test_every_relationship_endpoint_is_an_entity(tables):
    entities, relationships = tables[ENTITIES], tables[RELATIONSHIPS]
    assert set(relationships["source"]) | set(relationships["target"]) <= set(entities["title"])
    stubs = entities[entities["description"].isna()]
    assert sorted(stubs["title"]) == DANGLING_ENDPOINTS
    assert list(stubs["degree"]) == [1, 1]
    assert entities["id"].is_unique and entities["human_readable_id"].is_unique


def test_stub_entities_are_logged(caplog):
    shared_path("fixtures/graphrag-operation-dulce")
    with caplog.at_level(logging.WARNING):
        load_msgraphrag(FIXTURE)
    assert "CONCRETE HALLWAY, ELEVATOR" in caplog.text


def test_community_hierarchy_keeps_their_levels_with_c0_as_root(tables):
    communities = tables[COMMUNITIES].set_index("community")
    roots = communities[communities["parent"].isna()]
    assert set(roots["level"]) == {0} and len(roots) == 7
    assert sorted(e for ids in roots["entity_ids"] for e in ids) == sorted(tables[ENTITIES]["id"][:39])
    for community, row in communities.iterrows():
        for child in row["children"]:
            assert communities.loc[child, "parent"] == community
            assert communities.loc[child, "level"] == row["level"] + 1
    assert communities.loc[0, "children"] == [7, 8, 9]


def test_unsplit_communities_are_projected_down_so_every_level_covers_every_entity(tables):
    communities = tables[COMMUNITIES].set_index("community")
    clustered = sorted(tables[ENTITIES]["id"][:39])
    for level in (0, 1):
        members = [e for ids in communities[communities["level"] == level]["entity_ids"] for e in ids]
        assert sorted(members) == clustered, level
    for root in range(1, 7):
        (child,) = communities.loc[root, "children"]
        copy = communities.loc[child]
        assert copy["level"] == 1 and copy["parent"] == root and copy["children"] == []
        assert copy["entity_ids"] == communities.loc[root, "entity_ids"]
        assert copy["id"] != communities.loc[root, "id"]
    reports = tables[COMMUNITY_REPORTS].set_index("community")
    assert reports["id"].is_unique and tables[COMMUNITIES]["id"].is_unique
    assert reports.loc[communities.loc[1, "children"][0], "full_content"] == reports.loc[1, "full_content"]


def test_community_members_resolve(tables):
    entity_ids, relationship_ids = set(tables[ENTITIES]["id"]), set(tables[RELATIONSHIPS]["id"])
    for row in tables[COMMUNITIES].itertuples():
        assert set(row.entity_ids) <= entity_ids
        assert set(row.relationship_ids) <= relationship_ids
        assert row.size == len(row.entity_ids)


def test_reports_link_to_their_communities(tables):
    communities = tables[COMMUNITIES].set_index("community")
    reports = tables[COMMUNITY_REPORTS]
    assert set(reports["community"]) == set(communities.index)
    for report in reports.itertuples():
        assert report.level == communities.loc[report.community, "level"]
        assert report.method == "imported"
        assert 0 <= report.rating <= 10
        assert report.findings and set(report.findings[0]) == {"summary", "explanation"}
        assert report.full_content.startswith(f"# {report.title}\n")


def test_report_citations_name_imported_elements(tables):
    """Their reports cite human_readable_ids, which the import keeps."""
    entity_hrids = set(tables[ENTITIES]["human_readable_id"])
    relationship_hrids = set(tables[RELATIONSHIPS]["human_readable_id"])
    report, error = parse_report(
        pd.read_parquet(FIXTURE / "community_reports.parquet")["full_content_json"].iloc[0]
    )
    assert error is None
    assert {4, 26, 29, 33} <= entity_hrids and {6, 65, 79, 83} <= relationship_hrids
    assert "Entities (4); Relationships (6, 79, 65, 83)" in report["findings"][0]["explanation"]


def test_documents_text_units_and_claims(tables):
    document = tables[DOCUMENTS].iloc[0]
    assert document["source"] == "dulce.txt" and document["n_chars"] == len(document["text"])
    assert document["metadata"] == {"creation_date": "2025-03-04 09:39:37 -0800"}
    units = tables[TEXT_UNITS]
    assert set(units["document_id"]) == {document["id"]}
    assert sorted(units["chunk_index"]) == [0, 1, 2, 3, 4]
    claims = tables[CLAIMS]
    assert set(claims["text_unit_id"]) <= set(units["id"])
    assert "NONE" not in set(claims["object"].dropna()) | set(claims["start_date"].dropna())
    assert claims["object"].notna().sum() == 6


def test_imported_graph_gives_report_contexts_within_budget(tables):
    entities, relationships = tables[ENTITIES], tables[RELATIONSHIPS]
    for row in tables[COMMUNITIES].itertuples():
        members = entities[entities["id"].isin(row.entity_ids)]
        edges = relationships[relationships["id"].isin(row.relationship_ids)]
        for budget in (150, 600, 8000):
            context = build_leaf_context(members, edges, None, budget, count_tokens)
            assert context.n_tokens <= budget
            assert set(context.relationship_ids) <= set(row.relationship_ids)


def test_not_an_index_folder_is_one_clear_error(tmp_path):
    pd.DataFrame({"id": ["d"], "title": ["t"], "text": ["x"]}).to_parquet(tmp_path / "documents.parquet")
    pd.DataFrame({"id": ["u"], "human_readable_id": [0], "document_id": ["d"], "text": ["x"], "n_tokens": [1]}).to_parquet(
        tmp_path / "text_units.parquet"
    )
    with pytest.raises(UserError, match="entities.parquet is missing"):
        load_msgraphrag(tmp_path)
    with pytest.raises(UserError, match="is not a folder"):
        load_msgraphrag(tmp_path / "nope")


def copy_fixture(target: Path, skip: str = "") -> None:
    for path in FIXTURE.glob("*.parquet"):
        if path.stem != skip:
            (target / path.name).write_bytes(path.read_bytes())


def test_index_without_claims_imports_an_empty_claims_table(tables, tmp_path):
    copy_fixture(tmp_path, skip="covariates")
    claims = load_msgraphrag(tmp_path)[CLAIMS]
    assert len(claims) == 0 and list(claims.columns) == SCHEMAS[CLAIMS].fieldNames()


def test_other_layout_names_the_missing_column(tables, tmp_path):
    copy_fixture(tmp_path)
    pd.read_parquet(tmp_path / "entities.parquet").drop(columns=["degree"]).to_parquet(tmp_path / "entities.parquet")
    with pytest.raises(UserError, match="lacks column"):
        load_msgraphrag(tmp_path)


@pytest.mark.spark
def test_import_job_writes_delta_tables_that_every_query_method_can_use(spark, make_config):
    """jobs/import_msgraphrag.py's core: their index into our Delta tables, embedded, then asked."""
    shared_path("fixtures/graphrag-operation-dulce")
    from graphrag_spark.interop.msgraphrag import import_msgraphrag
    from graphrag_spark.query.api import GraphRagIndex
    from graphrag_spark.tables import ENTITY_EMBEDDINGS, TEXT_UNIT_EMBEDDINGS, TableStore

    cfg = make_config()
    store = TableStore(spark, cfg.storage)
    counts = import_msgraphrag(spark, store, FIXTURE, cfg)
    assert counts[COMMUNITIES] == 16 and counts[COMMUNITY_REPORTS] == 16 and counts[ENTITIES] == 41
    assert counts[f"{ENTITY_EMBEDDINGS} rows"] == 41 and counts[f"{TEXT_UNIT_EMBEDDINGS} failed"] == 0
    for name in (DOCUMENTS, TEXT_UNITS, ENTITIES, RELATIONSHIPS, CLAIMS, COMMUNITIES, COMMUNITY_REPORTS):
        assert store.read(name).schema == SCHEMAS[name], name

    index = GraphRagIndex.load(spark, cfg)
    answer = index.global_search("What is Operation Dulce about?", level=1)
    assert answer.level == 1 and answer.context_units == 3 + PROJECTED
    assert "[Data: Reports (" in answer.answer
    local = index.local_search("Who is Alex Mercer?")
    assert "ALEX MERCER" in local.context_text and local.context_units > 0
