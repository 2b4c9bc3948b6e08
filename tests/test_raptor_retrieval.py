"""RAPTOR retrieval: collapsed tree under a token budget, and top-k tree traversal."""

import numpy as np
import pandas as pd

from graphrag_spark.raptor.nodes import FAILED, OK
from graphrag_spark.raptor.retrieval import RESULT_COLUMNS, collapsed_tree, tree_traversal
from graphrag_spark.raptor.tree import build_tree

QUERY = np.array([1.0, 0.0])


def at(score: float) -> np.ndarray:
    """A 2-d embedding whose cosine similarity to QUERY is ``score``."""
    return np.array([score, np.sqrt(1 - score**2)])


def frame(rows: list[tuple]) -> pd.DataFrame:
    """Nodes from (id, layer, score, n_tokens[, status])."""
    return pd.DataFrame(
        [
            {"id": r[0], "layer": r[1], "text": f"text of {r[0]}", "n_tokens": r[3],
             "embedding": None if r[4:] == (FAILED,) else at(r[2]), "status": r[4] if r[4:] else OK}
            for r in rows
        ]
    )


def edges(pairs: list[tuple[str, str]]) -> pd.DataFrame:
    return pd.DataFrame([{"parent": p, "child": c, "probability": 1.0} for p, c in pairs])


def test_collapsed_tree_ranks_all_layers_and_skips_a_node_that_would_overflow():
    nodes = frame([("root", 2, 0.5, 150), ("big", 1, 0.9, 1500), ("long", 1, 0.8, 800), ("leaf", 0, 0.7, 400), ("far", 0, 0.1, 100)])
    hits = collapsed_tree(nodes, QUERY, max_tokens=2000)
    assert list(hits.columns) == RESULT_COLUMNS
    assert list(hits["id"]) == ["big", "leaf", "far"]  # "long" would overflow; "root" too, after "leaf"
    assert hits["n_tokens"].sum() <= 2000
    np.testing.assert_allclose(hits["score"], [0.9, 0.7, 0.1])
    assert list(hits["layer"]) == [1, 0, 0]


def test_collapsed_tree_never_returns_failed_summaries():
    nodes = frame([("failed", 1, 0.0, 0, FAILED), ("leaf", 0, 0.3, 50)])
    assert list(collapsed_tree(nodes, QUERY)["id"]) == ["leaf"]


def test_traversal_descends_from_the_roots_through_children_of_the_selected_nodes():
    nodes = frame([
        ("root-a", 2, 0.9, 100), ("root-b", 2, 0.8, 100),
        ("a1", 1, 0.2, 100), ("a2", 1, 0.6, 100), ("b1", 1, 0.99, 100),
        ("a1-leaf", 0, 0.95, 100), ("a2-leaf-x", 0, 0.3, 100), ("a2-leaf-y", 0, 0.4, 100), ("b1-leaf", 0, 0.99, 100),
    ])
    tree_edges = edges([("root-a", "a1"), ("root-a", "a2"), ("root-b", "b1"),
                        ("a1", "a1-leaf"), ("a2", "a2-leaf-x"), ("a2", "a2-leaf-y"), ("b1", "b1-leaf")])
    hits = tree_traversal(nodes, tree_edges, QUERY, top_k=1)
    assert list(hits["id"]) == ["root-a", "a2", "a2-leaf-y"]  # never b1, however similar: root-b lost
    assert list(hits["layer"]) == [2, 1, 0]
    assert list(tree_traversal(nodes, tree_edges, QUERY, top_k=2)["id"]) == [
        "root-a", "root-b", "b1", "a2", "b1-leaf", "a2-leaf-y"
    ]


def test_traversal_starts_also_at_nodes_whose_only_parent_failed():
    nodes = frame([("root", 2, 0.5, 100), ("failed", 1, 0.0, 0, FAILED), ("kept", 1, 0.4, 100), ("orphan", 0, 0.9, 100), ("leaf", 0, 0.2, 100)])
    tree_edges = edges([("root", "kept"), ("failed", "orphan"), ("kept", "leaf")])
    assert list(tree_traversal(nodes, tree_edges, QUERY, top_k=1)["id"]) == ["orphan"]
    assert list(tree_traversal(nodes, tree_edges, QUERY, top_k=2)["id"]) == ["orphan", "root", "kept", "leaf"]


def test_retrieval_over_a_built_tree():
    chunks = ["Scrooge counted coins.", "Marley was dead.", "Tiny Tim sang a song."]

    def embed(texts):
        return np.array([[t.count("Scrooge") + 0.1, t.count("Tim") + 0.1] for t in texts])

    tree = build_tree(chunks, embed, " ".join, lambda t: len(t.split()))
    nodes, tree_edges = pd.DataFrame(tree.nodes), pd.DataFrame(tree.edges)
    query = np.array([0.0, 1.0])
    assert collapsed_tree(nodes, query, max_tokens=5)["text"].tolist() == ["Tiny Tim sang a song."]
    assert collapsed_tree(nodes, query, max_tokens=4)["text"].tolist() == ["Marley was dead."]
    traversed = tree_traversal(nodes, tree_edges, query, top_k=1)
    assert traversed["layer"].tolist() == [1, 0]
    assert traversed["text"].iloc[1] == "Tiny Tim sang a song."
    assert tree_traversal(nodes.iloc[:0], tree_edges.iloc[:0], query).empty
