"""RAPTOR retrieval over a built tree: collapsed tree (the paper's default) and tree traversal.

Both take the tree as pandas frames, as read from the nodes and edges tables (columns ``id,
layer, text, n_tokens, embedding, status`` and ``parent, child``), and return the selected nodes
as a frame with columns ``id, layer, score, n_tokens, text`` (score = cosine similarity to the
query). Failed summaries have no text or embedding and are never selected.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from graphrag_spark.raptor.nodes import OK

RESULT_COLUMNS = ["id", "layer", "score", "n_tokens", "text"]


def collapsed_tree(nodes: pd.DataFrame, query_embedding: np.ndarray, max_tokens: int = 2000) -> pd.DataFrame:
    """Nodes of every layer by similarity, added until ``max_tokens``.

    A node that would overflow the budget is skipped and the next, shorter one still gets its
    chance, so the budget is filled instead of ending at the first long summary.
    """
    ranked = _by_score(_scored(nodes, query_embedding))
    keep, used = [], 0
    for position, n_tokens in enumerate(ranked["n_tokens"].to_numpy()):
        if used + n_tokens <= max_tokens:
            keep.append(position)
            used += n_tokens
    return ranked.iloc[keep].reset_index(drop=True)


def tree_traversal(
    nodes: pd.DataFrame, edges: pd.DataFrame, query_embedding: np.ndarray, top_k: int = 5
) -> pd.DataFrame:
    """The ``top_k`` roots by similarity, then the ``top_k`` among their children, down to the leaves.

    Roots are the nodes without a successful parent: the top layer, plus any node whose only
    parents failed to summarize.
    """
    scored = _scored(nodes, query_embedding)
    ok_edges = edges[edges["parent"].isin(scored["id"]) & edges["child"].isin(scored["id"])]
    children = ok_edges.groupby("parent")["child"].agg(list).to_dict()
    frontier = scored[~scored["id"].isin(ok_edges["child"])]
    selected = []
    while len(frontier):
        top = _by_score(frontier).head(top_k)
        selected.append(top)
        below = {child for parent in top["id"] for child in children.get(parent, ())}
        frontier = scored[scored["id"].isin(below)]
    return pd.concat(selected, ignore_index=True) if selected else scored.iloc[:0]


def _scored(nodes: pd.DataFrame, query_embedding: np.ndarray) -> pd.DataFrame:
    usable = nodes[nodes["status"] == OK]
    query = np.asarray(query_embedding, dtype=np.float64)
    matrix = np.stack(usable["embedding"].to_numpy()).astype(np.float64) if len(usable) else np.empty((0, len(query)))
    scores = _unit_rows(matrix) @ _unit_rows(query[None, :])[0]
    return pd.DataFrame(
        {
            "id": usable["id"].to_numpy(),
            "layer": usable["layer"].to_numpy(),
            "score": scores,
            "n_tokens": usable["n_tokens"].to_numpy(),
            "text": usable["text"].to_numpy(),
        },
        columns=RESULT_COLUMNS,
    )


def _by_score(frame: pd.DataFrame) -> pd.DataFrame:
    """Best first; ties broken by id so the selection is deterministic."""
    return frame.sort_values(["score", "id"], ascending=[False, True], kind="stable").reset_index(drop=True)


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1, norms)
