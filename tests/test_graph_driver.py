"""The graph stage's driver path (small corpora) gives the rows and drop counts of its Spark SQL path."""

from __future__ import annotations

import pandas as pd

from graphrag_spark import tables as T
from graphrag_spark.config import GraphConfig
from graphrag_spark.index import graph

from conftest import table_rows

ENTITY_COLUMNS = ["id", "human_readable_id", "title", "type", "type_variants", "description", "descriptions",
                  "text_unit_ids", "frequency", "degree"]
RELATIONSHIP_COLUMNS = ["id", "human_readable_id", "source", "target", "description", "descriptions", "weight",
                        "text_unit_ids", "combined_degree"]


def _spark_path(entity_instances, relationship_instances, text_units, cfg: GraphConfig, min_mentions: int):
    """The frames ``pipeline._spark_graph`` builds (persisted as there), collected; and its drop counts."""
    all_nodes = graph.entity_nodes(entity_instances, cfg, text_units).persist()
    nodes = all_nodes.where(all_nodes.frequency >= min_mentions).drop("_cut", "_mentions")
    candidates = graph.counted_relationships(relationship_instances, cfg, text_units).persist()
    edges = graph.between_entities(candidates, nodes).persist()
    entities, relationships = graph.add_degrees(nodes, edges.drop("_cut", "_instances"))
    dropped = graph.drop_counts(all_nodes, candidates, edges, min_mentions, entity_instances.count(),
                                relationship_instances.count())
    result = entities.toPandas(), relationships.toPandas(), dropped
    for frame in (all_nodes, candidates, edges):
        frame.unpersist()
    return result


def _driver_path(entity_instances, relationship_instances, text_units, cfg: GraphConfig, min_mentions: int):
    built = graph.driver_graph(entity_instances.toPandas(), relationship_instances.toPandas(), cfg, min_mentions,
                               None if text_units is None else text_units.toPandas())
    return built.entities, built.relationships, built.dropped


def _rows(frame: pd.DataFrame, columns: list[str]) -> list[tuple]:
    def plain(value):
        return tuple(value) if hasattr(value, "__len__") and not isinstance(value, str) else value

    return sorted(tuple(plain(row[c]) for c in columns) for _, row in frame.iterrows())


def assert_same_graph(spark_result, driver_result):
    (spark_entities, spark_relationships, spark_dropped), (entities, relationships, dropped) = spark_result, driver_result
    assert _rows(entities, ENTITY_COLUMNS) == _rows(spark_entities, ENTITY_COLUMNS)
    assert _rows(relationships, RELATIONSHIP_COLUMNS) == _rows(spark_relationships, RELATIONSHIP_COLUMNS)
    assert dropped == spark_dropped


def test_driver_path_equals_spark_path_on_edge_cases(spark):
    """Names that key alike (spaces, quotes, case, accents), unnamed and blank instances, null types and
    descriptions, ties, self-loops, unknown endpoints, a description list over the token budget."""
    entity_rows = [
        ("Alice", "PERSON", "t1", "a friend"), (" alice  ", "PERSON", "t2", "a friend"), ("ALICE", "ORG", "t3", "a firm"),
        ("Alice", None, "t3", "a friend"), ('"Alice Smith"', "PERSON", "t1", None), ("alice\tsmith", "GEO", "t2", "  "),
        ("Café Royal", "GEO", "t2", "a café"), ("CAFÉ  ROYAL", "GEO", "t1", "zinc bar"), ("   ", "PERSON", "t1", "blank"),
        (None, "PERSON", "t1", "no name"), ("Bob", "PERSON", "t9", "b"), ("Bob", "ORG", "t1", "a"),
        ("Rare", "THING", "t1", "seen once"), ("Hub", "PERSON", "t1", "x " * 30), ("Hub", "PERSON", "t2", "y " * 30),
        ("Hub", "PERSON", "t3", "short"),
    ]
    relationship_rows = [
        ("Alice", "Bob", "t1", 2.0, "knows"), ("bob", "alice", "t2", None, "knows"), ("Alice", "ALICE", "t1", 1.0, "self"),
        ("Alice", "Nobody", "t1", 1.0, "unknown endpoint"), (None, "Bob", "t1", 1.0, "no name"),
        ("Hub", "Alice", "t1", 1.0, "x " * 30), ("Hub", "Alice", "t2", 1.0, "y " * 30), ("Café Royal", "Hub", "t3", 0.5, ""),
        ("Rare", "Bob", "t1", 1.0, "rare"),
    ]
    entities = spark.createDataFrame([(f"ei{i}", r[2], r[0], r[1], r[3], "test") for i, r in enumerate(entity_rows)],
                                     T.SCHEMAS[T.ENTITY_INSTANCES])
    relationships = spark.createDataFrame([(f"ri{i}", r[2], r[0], r[1], r[4], r[3], "test")
                                           for i, r in enumerate(relationship_rows)], T.SCHEMAS[T.RELATIONSHIP_INSTANCES])
    units = spark.createDataFrame([("t1", "d1", 0), ("t2", "d1", 1), ("t3", "d0", 7)], "id string, document_id string, chunk_index int")
    cfg = GraphConfig(max_description_tokens=25, edge_weight="strength")
    driver_result = _driver_path(entities, relationships, units, cfg, 2)
    assert_same_graph(_spark_path(entities, relationships, units, cfg, 2), driver_result)
    assert driver_result[2] == {
        "entity instances dropped (no name)": 2, "entities dropped (below extraction.nlp.min_entity_mentions)": 1,  # Rare
        "entity descriptions dropped (over graph.max_description_tokens)": 2,  # Hub keeps "short" (document d0 comes first)
        "relationship instances dropped (self-loop or no name)": 2,
        "relationships dropped (endpoint not an entity)": 2,  # Alice-NOBODY, BOB-RARE
        "relationship descriptions dropped (over graph.max_description_tokens)": 1}
    folded = _driver_path(entities, relationships, units, GraphConfig(name_matching="folded"), 1)[0]
    assert "CAFE ROYAL" in set(folded["title"])


def test_driver_path_equals_spark_path_on_the_sample_index(spark, sample_index):
    cfg, summary = sample_index
    store = T.TableStore(spark, cfg.storage)
    inputs = (store.read(T.ENTITY_INSTANCES), store.read(T.RELATIONSHIP_INSTANCES), store.read(T.TEXT_UNITS))
    min_mentions = cfg.extraction.nlp.min_entity_mentions
    driver_result = _driver_path(*inputs, cfg.graph, min_mentions)
    assert_same_graph(_spark_path(*inputs, cfg.graph, min_mentions), driver_result)
    # The index itself was built on the driver, with every drop in its summary.
    assert summary.counts["graph aggregated"] == "on the driver"
    assert _rows(store.read(T.ENTITIES).toPandas(), [c for c in ENTITY_COLUMNS if c != "descriptions"]) == \
        _rows(driver_result[0], [c for c in ENTITY_COLUMNS if c != "descriptions"])
    assert {key: summary.counts[key] for key in driver_result[2]} == driver_result[2]
    assert summary.counts["entities dropped (below extraction.nlp.min_entity_mentions)"] > 0


def test_community_rows_equal_the_spark_communities_table_on_the_sample_index(spark, sample_index):
    from graphrag_spark.index import communities

    cfg, _ = sample_index
    store = T.TableStore(spark, cfg.storage)
    entities, relationships = store.read(T.ENTITIES), store.read(T.RELATIONSHIPS)
    collected = (entities.select("human_readable_id", "id", "title", "degree").toPandas(),
                 relationships.select("id", "source", "target", "weight", "text_unit_ids").toPandas())
    sources, targets, weights = communities.driver_edges(*collected)
    assert sorted(zip(sources, targets, weights)) == sorted(zip(*communities.collect_edges(entities, relationships)))
    node_keys = dict(zip(collected[0]["human_readable_id"].tolist(), collected[0]["id"]))
    hierarchy = communities.build_hierarchy(communities.run_leiden(sources, targets, weights, cfg.communities),
                                            cfg.communities.max_levels, 0, node_keys)
    columns = ["community", "id", "level", "parent", "children", "size", "entity_ids", "relationship_ids",
               "text_unit_ids", "title"]
    in_spark = communities.communities_table(spark, hierarchy, entities, relationships).toPandas()
    assert len(in_spark) > 5
    assert _rows(communities.community_rows(hierarchy, *collected), columns) == _rows(in_spark, columns)
    # The published table (built on the driver) is these rows.
    assert _rows(store.read(T.COMMUNITIES).toPandas(), ["id", "entity_ids", "relationship_ids", "title"]) == \
        _rows(in_spark, ["id", "entity_ids", "relationship_ids", "title"])


def test_graph_inputs_from_the_parsed_rows_equal_a_collect_of_the_instance_tables(spark):
    """A full build's graph stage aggregates extraction's parsed rows as they are (``extraction.graph_inputs``):
    the same frames as a collect of the instance tables written from them, claims and odd values included."""
    import json

    from graphrag_spark.index import extraction

    results = pd.DataFrame({"item_id": ["u1", "u2"], "result": [
        json.dumps({"entities": [{"name": "SCROOGE", "type": "PERSON", "description": "A miser.\nCold."},
                                 {"name": "MARLEY", "type": "PERSON", "description": ""}],
                    "relationships": [{"source": "SCROOGE", "target": "MARLEY", "description": "Partners.",
                                       "strength": 9}]}),
        json.dumps({"entities": [{"name": "SCROOGE", "type": "PERSON", "description": "Reformed, émigré-free."}],
                    "relationships": [{"source": "MARLEY", "target": "SCROOGE", "description": "Haunts him.",
                                       "strength": 7.5}],
                    "claims": [{"subject": "SCROOGE", "object": "MARLEY", "description": "owes"}]})]})
    rows = extraction.instances_from_results(results)
    entity_rows, relationship_rows = extraction.graph_inputs(rows)
    entities, relationships = extraction.split_instances(spark.createDataFrame(rows, extraction._INSTANCE_SCHEMA))
    collected = (T.conform(entities, T.ENTITY_INSTANCES).select(extraction.ENTITY_GRAPH_COLUMNS).toPandas(),
                 T.conform(relationships, T.RELATIONSHIP_INSTANCES).select(extraction.RELATIONSHIP_GRAPH_COLUMNS).toPandas())
    pd.testing.assert_frame_equal(entity_rows, collected[0])
    pd.testing.assert_frame_equal(relationship_rows, collected[1])
    assert len(entity_rows) == 3 and len(relationship_rows) == 2


def test_an_index_whose_graph_is_built_in_spark_sql_publishes_the_driver_built_tables(spark, sample_index, make_config):
    """The pipeline's Spark SQL path (a corpus over ``graph.driver_max_instances``, forced here with 0): its
    graph and communities stages publish the tables the sample index got on the driver, row for row, with
    the same drop counts, and the reports built from them are the same."""
    from graphrag_spark.index.pipeline import run_index

    driver_cfg, driver_summary = sample_index
    cfg = make_config("graph.driver_max_instances=0")
    summary = run_index(spark, cfg)
    assert (summary.counts["graph aggregated"], driver_summary.counts["graph aggregated"]) == ("in Spark SQL",
                                                                                              "on the driver")
    counted = [key for key in driver_summary.counts if "dropped" in key or key in (
        "entities", "relationships", "communities per level", "entities not clustered",
        "isolated entities (no relationship)")]
    assert len(counted) >= 10
    assert {key: summary.counts[key] for key in counted} == {key: driver_summary.counts[key] for key in counted}
    in_sql, on_driver = T.TableStore(spark, cfg.storage), T.TableStore(spark, driver_cfg.storage)
    for name in (T.ENTITIES, T.RELATIONSHIPS, T.COMMUNITIES, T.COMMUNITY_REPORTS):
        published = table_rows(in_sql, name)
        assert len(published) > 5, name
        assert published == table_rows(on_driver, name), name
