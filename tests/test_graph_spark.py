"""The graph stage in Spark: how instances merge into nodes and edges, degrees, and ids."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from graphrag_spark import tables as T
from graphrag_spark.config import GraphConfig
from graphrag_spark.ids import content_id, normalize_name
from graphrag_spark.index.graph import add_degrees, build_entities, build_relationships, dropped_relationships, key_claims


def entity_instances(spark, rows):
    """rows: (name, type, text_unit_id[, description])."""
    full = [(f"ei{i}", row[2], row[0], row[1], row[3] if len(row) > 3 else None, "test") for i, row in enumerate(rows)]
    return spark.createDataFrame(full, T.SCHEMAS[T.ENTITY_INSTANCES])


def relationship_instances(spark, rows):
    """rows: (source, target, text_unit_id[, strength[, description]])."""
    full = [(f"ri{i}", row[2], row[0], row[1], row[4] if len(row) > 4 else None, row[3] if len(row) > 3 else None, "test")
            for i, row in enumerate(rows)]
    return spark.createDataFrame(full, T.SCHEMAS[T.RELATIONSHIP_INSTANCES])


def build_nodes(spark, entity_rows, **cfg):
    entities = build_entities(entity_instances(spark, entity_rows), GraphConfig(**cfg))
    return entities.toPandas().set_index("title").sort_index()


def build_edges(spark, entity_rows, relationship_rows, **cfg):
    cfg = GraphConfig(**cfg)
    entities = build_entities(entity_instances(spark, entity_rows), cfg)
    relationships = build_relationships(relationship_instances(spark, relationship_rows), entities, cfg)
    return relationships.toPandas().set_index(["source", "target"]).sort_index()


def build_graph(spark, entity_rows, relationship_rows):
    """Entities and relationships with degrees and ids, the intermediates cached as the index job does."""
    cfg = GraphConfig()
    entities = build_entities(entity_instances(spark, entity_rows), cfg).persist()
    relationships = build_relationships(relationship_instances(spark, relationship_rows), entities, cfg).persist()
    ranked_entities, ranked_relationships = add_degrees(entities, relationships)
    result = (ranked_entities.toPandas().set_index("title").sort_index(),
              ranked_relationships.toPandas().set_index(["source", "target"]).sort_index())
    entities.unpersist()
    relationships.unpersist()
    return result


def test_nodes_merge_by_exact_name_and_keep_type_variants(spark):
    entities = build_nodes(spark, [
        ("Alice", "PERSON", "t1", "a friend"), (" alice  ", "PERSON", "t2", "a friend"), ("ALICE", "ORGANIZATION", "t3", "a firm"),
        ("Alice", "PERSON", "t3", "a friend"), ('"Alice Smith"', "PERSON", "t1"), ("alice\tsmith", "GEO", "t2"),
        ("Dr. Jekyll", "PERSON", "t1"), ("DR JEKYLL", "PERSON", "t2"),
    ])
    assert list(entities.index) == ["ALICE", "ALICE SMITH", "DR JEKYLL", "DR. JEKYLL"]
    alice = entities.loc["ALICE"]
    assert alice["type"] == "PERSON" and list(alice["type_variants"]) == ["ORGANIZATION", "PERSON"]
    assert alice["frequency"] == 3 and list(alice["text_unit_ids"]) == ["t1", "t2", "t3"]
    assert alice["description"] == "a friend\na firm"  # most frequent first
    smith = entities.loc["ALICE SMITH"]  # a tie between types: the first by name wins, the other is kept
    assert smith["type"] == "GEO" and list(smith["type_variants"]) == ["GEO", "PERSON"]


def test_folded_matching_merges_punctuation_case_and_accent_variants(spark):
    entities = build_nodes(spark, [("Dr. Jekyll", "PERSON", "t1"), ("DR JEKYLL", "PERSON", "t2"),
                                   ("dr jekyll!", "PERSON", "t3"), ("Zoë", "PERSON", "t1"), ("ZOE", "PERSON", "t2")],
                           name_matching="folded")
    assert entities["frequency"].to_dict() == {"DR JEKYLL": 3, "ZOE": 2}


@pytest.mark.parametrize("mode", ["exact", "folded"])
def test_node_titles_are_normalize_name_for_any_name(spark, mode):
    """The titles computed in Spark SQL (ASCII names) or Python (the rest) equal ``normalize_name``."""
    rng = random.Random(5)
    alphabet = [chr(c) for c in range(1, 128)] + list(" \t\"'.-aA\x1c\x0b") * 6
    names = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 7))) for _ in range(1500)]
    names += ["Zoë", "ZOË", "Zoe\u0308", "straße", "STRASSE", "ﬁle", "Ångström", "a\xa0b", "x\u2028y", '"Łódź"',
              "  café  ", "\u3000東京\u3000", "İstanbul", "ǅemal", "Ⅻ", "Dr.\u00a0No"]
    rows = [(name, "T", f"t{i}") for i, name in enumerate(names)]
    entities = build_nodes(spark, rows, name_matching=mode)
    expected = pd.Series([normalize_name(n, mode) for n in names]).loc[lambda s: s.str.len() > 0].value_counts()
    assert entities["frequency"].to_dict() == expected.to_dict()
    assert list(entities["id"]) == [content_id(title) for title in entities.index]


def test_edges_are_undirected_weighted_and_only_between_known_nodes(spark):
    nodes = [(n, "PERSON", "t1") for n in ("A", "B", "C", "Zoë")]
    edges = [("A", "B", "t1", 2.0, "a helps b"), ("b", "A ", "t2", 3.0, "b helps a"), ("B", "a", "t3", None, "a helps b"),
             ("A", "a", "t1", 5.0), ("A", "Nobody", "t1", 1.0), ("Nobody", "Else", "t1"), ("ZOË", "C", "t2", 0.5)]
    by_count = build_edges(spark, nodes, edges)
    assert list(by_count.index) == [("A", "B"), ("C", "ZOË")]
    ab = by_count.loc[("A", "B")]
    assert ab["weight"] == 3 and list(ab["text_unit_ids"]) == ["t1", "t2", "t3"]
    assert ab["description"] == "a helps b\nb helps a"
    assert list(by_count["id"]) == [content_id("A", "B"), content_id("C", "ZOË")]
    by_strength = build_edges(spark, nodes, edges, edge_weight="strength")
    assert by_strength["weight"].to_dict() == {("A", "B"): 6.0, ("C", "ZOË"): 0.5}  # a missing strength counts 1


def test_degrees_and_human_readable_ids(spark):
    nodes = [(n, "PERSON", "t1") for n in "ABCDE"]
    edges = [("A", "B", "t1"), ("B", "A", "t2"), ("B", "C", "t1"), ("C", "A", "t1"), ("C", "D", "t1")]
    entities, relationships = build_graph(spark, nodes, edges)
    assert entities["degree"].to_dict() == {"A": 2, "B": 2, "C": 3, "D": 1, "E": 0}
    # Degree descending, then title.
    assert entities["human_readable_id"].to_dict() == {"C": 0, "A": 1, "B": 2, "D": 3, "E": 4}
    assert relationships["combined_degree"].to_dict() == {("A", "B"): 4, ("A", "C"): 5, ("B", "C"): 5, ("C", "D"): 4}
    # Combined degree descending, then weight descending, then id.
    tied = sorted([("A", "C"), ("B", "C")], key=lambda edge: content_id(*edge))
    assert relationships["human_readable_id"].to_dict() == {tied[0]: 0, tied[1]: 1, ("A", "B"): 2, ("C", "D"): 3}


def test_human_readable_ids_follow_the_global_order_whatever_the_input_order(spark):
    rng = random.Random(3)
    titles = [f"N{i:03d}" for i in range(120)]
    edges = [(rng.choice(titles[:20]), rng.choice(titles), f"t{rng.randint(0, 9)}") for _ in range(400)]
    nodes = [(t, "X", "t0") for t in titles]
    entities, relationships = build_graph(spark, nodes, edges)

    expected = entities.reset_index().sort_values(["degree", "title"], ascending=[False, True])
    assert list(expected["human_readable_id"]) == list(range(len(titles)))
    ranked = relationships.sort_values(["combined_degree", "weight", "id"], ascending=[False, False, True])
    assert list(ranked["human_readable_id"]) == list(range(len(relationships)))

    rng.shuffle(nodes)
    rng.shuffle(edges)
    shuffled_entities, shuffled_relationships = build_graph(spark, nodes, edges)
    pd.testing.assert_series_equal(shuffled_entities["human_readable_id"], entities["human_readable_id"])
    pd.testing.assert_series_equal(shuffled_relationships["human_readable_id"], relationships["human_readable_id"])


def test_relationships_to_unextracted_entities_are_counted(spark):
    cfg = GraphConfig()
    entities = build_entities(entity_instances(spark, [("A", "PERSON", "t1"), ("B", "PERSON", "t1")]), cfg)
    edges = [("A", "B", "t1"), ("A", "Nobody", "t1"), ("nobody", "a", "t2"), ("Nobody", "Else", "t1"), ("B", "b", "t1")]
    # A-NOBODY (two instances, one edge) and ELSE-NOBODY; A-B is kept, B-B is a self-loop.
    assert dropped_relationships(relationship_instances(spark, edges), entities, cfg) == 2


def test_claims_take_the_entities_name_key_under_folded_matching(spark):
    folded = GraphConfig(name_matching="folded")
    entities = build_entities(entity_instances(spark, [("Dr. Jekyll", "PERSON", "t1"), ("Café Royal", "GEO", "t1")]),
                              folded)
    claims = spark.createDataFrame([("c1", None, "t1", "DR. JEKYLL", "CAFÉ ROYAL", "VISIT", "TRUE", None, None, "d", "s"),
                                    ("c2", None, "t1", "DR. JEKYLL", None, "HABIT", "TRUE", None, None, "d", "s")],
                                   T.SCHEMAS[T.CLAIMS])
    titles = {row.title for row in entities.collect()}
    keyed = {row.id: row for row in key_claims(claims, folded).collect()}
    assert keyed["c1"].subject in titles and keyed["c1"].object in titles
    assert keyed["c2"].subject in titles and keyed["c2"].object is None
    assert key_claims(claims, GraphConfig()).where("id = 'c1'").first().subject == "DR. JEKYLL"
    assert key_claims(claims, folded).columns == claims.columns
