"""GraphFrames and Spark SQL give the same degrees, components and tables on the same input."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import GRAPHFRAMES_JAR, shared_path

pytestmark = pytest.mark.spark


@pytest.fixture
def graphframes_session(spark):
    shared_path(str(GRAPHFRAMES_JAR.relative_to(GRAPHFRAMES_JAR.parents[1])))
    from graphrag_spark.index.graph_backend import resolve_backend

    assert resolve_backend(spark, "graphframes") == "graphframes", "the JAR is on the test session's classpath"
    return spark


def test_auto_takes_the_driver_path_until_the_edge_budget_then_graphframes(graphframes_session):
    from graphrag_spark.index.graph_backend import resolve_backend

    assert resolve_backend(graphframes_session, "auto") == "sql", "degrees (edge count unknown): one aggregation"
    assert resolve_backend(graphframes_session, "auto", 3_000_000) == "sql", "the default budget holds 3M edges"
    assert resolve_backend(graphframes_session, "auto", 11, driver_max_edges=10) == "graphframes"
    assert resolve_backend(graphframes_session, "auto", 10, driver_max_edges=10) == "sql"
    assert resolve_backend(graphframes_session, "sql", 10**9) == "sql"


def _edges(spark):
    # Two components of 4 nodes (a tie: the one holding node 0 wins), one of 2, and node 9 only in entities.
    pairs = [(0, 1), (1, 2), (2, 3), (4, 5), (5, 6), (6, 7), (4, 7), (10, 11)]
    return spark.createDataFrame([(f"N{s}", f"N{t}", 1.0) for s, t in pairs], "source string, target string, weight double")


def test_both_backends_give_the_same_degrees(graphframes_session):
    from graphrag_spark.index.graph_backend import degrees

    relationships = _edges(graphframes_session)
    by_sql = {r.title: r.degree for r in degrees(relationships, "sql").collect()}
    by_graphframes = {r.title: r.degree for r in degrees(relationships, "graphframes").collect()}
    assert by_sql == by_graphframes and by_sql["N4"] == 2 and by_sql["N10"] == 1


def test_largest_component_matches_the_driver_path(graphframes_session):
    from graphrag_spark.index.communities import largest_component_mask
    from graphrag_spark.index.graph_backend import largest_component_nodes

    pairs = [(0, 1), (1, 2), (2, 3), (4, 5), (5, 6), (6, 7), (4, 7), (10, 11)]
    s, t = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    on_driver = set(s[largest_component_mask(s, t)]) | set(t[largest_component_mask(s, t)])
    edges = graphframes_session.createDataFrame(pairs, "s long, t long")
    in_executors = {r.node for r in largest_component_nodes(graphframes_session, edges).collect()}
    assert in_executors == on_driver == {0, 1, 2, 3}


def test_graph_and_community_tables_identical_with_either_backend(graphframes_session, sample_index):
    """On the sample index: degrees from either backend equal the stored ones, and clustering only the
    largest component gives the same communities table and counts."""
    from graphrag_spark import tables as T
    from graphrag_spark.index.communities import cluster_graph
    from graphrag_spark.index.graph_backend import degrees

    cfg, _ = sample_index
    store = T.TableStore(graphframes_session, cfg.storage)
    entities, relationships = store.read(T.ENTITIES), store.read(T.RELATIONSHIPS)
    stored = {r.title: r.degree for r in entities.where("degree > 0").select("title", "degree").collect()}
    for backend in ("sql", "graphframes"):
        assert {r.title: r.degree for r in degrees(relationships, backend).collect()} == stored, backend
    results = {}
    for backend in ("sql", "graphframes"):
        table, counts = cluster_graph(graphframes_session, entities, relationships, cfg.communities, True, backend)
        results[backend] = (sorted((r.id, r.level, tuple(r.entity_ids), tuple(r.relationship_ids))
                                   for r in table.select("id", "level", "entity_ids", "relationship_ids").collect()), counts)
    # The sample graph is one component; test_largest_component_matches_the_driver_path covers several.
    assert results["sql"] == results["graphframes"] and results["sql"][0]
