"""Building the RAPTOR tree: leaves, then layers of cluster summaries until clustering is infeasible.

Each layer is three steps over plain values: ``cluster_layer`` (clustering module), then
``summarize_clusters`` and ``embed_nodes``; ``next_frontier`` says which nodes the next layer
clusters. The Spark shell runs the same steps, distributing summarizing and embedding;
``build_tree`` runs them in one process.

Failed summaries. A summary that raises or returns no text becomes a node with
``status="failed"``, the error and empty text, with its edges kept, so the failure is visible
and a rerun (same id) can replace it. Its children are not lost: a child with no successful
parent stays in the frontier and is clustered again with the next layer's summaries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from graphrag_spark.ids import content_id
from graphrag_spark.raptor.chunking import CountTokens
from graphrag_spark.raptor.clustering import Cluster, cluster_layer
from graphrag_spark.raptor.nodes import FAILED, OK, Edge, Node, Tree, leaf_id, summary_id
from graphrag_spark.raptor.params import RaptorParams

Embed = Callable[[list[str]], np.ndarray]
Summarize = Callable[[list[str]], str | None]


def make_leaves(
    chunks: Sequence[str], embeddings: np.ndarray, count_tokens: CountTokens, chunk_ids: Sequence[str] | None = None
) -> list[Node]:
    """Layer 0. Without ``chunk_ids``, a chunk is identified by its position and text."""
    if chunk_ids is None:
        chunk_ids = [content_id("raptor-chunk", i, text) for i, text in enumerate(chunks)]
    return [
        Node(leaf_id(chunk_id), 0, text, count_tokens(text), np.asarray(vector), chunk_id=chunk_id)
        for chunk_id, text, vector in zip(chunk_ids, chunks, embeddings, strict=True)
    ]


def summarize_cluster(
    members: Sequence[Node], probabilities: Sequence[float], layer: int, summarize: Summarize, count_tokens: CountTokens
) -> tuple[Node, list[Edge]]:
    """One summary node (not yet embedded) and its edges; a failing summarizer gives a failed node."""
    node_id = summary_id(layer, [m.id for m in members])
    edges = [Edge(node_id, m.id, float(p)) for m, p in zip(members, probabilities, strict=True)]
    try:
        text = (summarize([m.text for m in members]) or "").strip()
        error = None if text else "summarizer returned no text"
    except Exception as exc:  # one failed LLM call must not abort the layer; the failure is recorded
        text, error = "", f"{type(exc).__name__}: {exc}"
    if error:
        return Node(node_id, layer, "", 0, None, status=FAILED, error=error), edges
    return Node(node_id, layer, text, count_tokens(text), None), edges


def summarize_clusters(
    frontier: Sequence[Node], clusters: list[Cluster], layer: int, summarize: Summarize, count_tokens: CountTokens
) -> tuple[list[Node], list[Edge]]:
    """Summaries of a layer's clusters (indices into ``frontier``), children in frontier order."""
    nodes, edges = [], []
    for cluster in clusters:
        node, node_edges = summarize_cluster(
            [frontier[i] for i, _ in cluster], [p for _, p in cluster], layer, summarize, count_tokens
        )
        nodes.append(node)
        edges += node_edges
    return nodes, edges


def embed_nodes(nodes: Sequence[Node], embed: Embed) -> list[Node]:
    """The nodes with embeddings for the successful ones, in one ``embed`` call."""
    ok = [i for i, node in enumerate(nodes) if node.status == OK]
    vectors = embed([nodes[i].text for i in ok]) if ok else []
    embedded = list(nodes)
    for i, vector in zip(ok, vectors, strict=True):
        embedded[i] = replace(nodes[i], embedding=np.asarray(vector))
    return embedded


def next_frontier(frontier: Sequence[Node], summaries: Sequence[Node], edges: Sequence[Edge]) -> list[Node]:
    """What the next layer clusters: the successful summaries, plus nodes no successful summary covers."""
    ok_ids = {s.id for s in summaries if s.status == OK}
    covered = {e.child for e in edges if e.parent in ok_ids}
    return [s for s in summaries if s.status == OK] + [n for n in frontier if n.id not in covered]


def build_tree(
    chunks: Sequence[str],
    embed: Embed,
    summarize: Summarize,
    count_tokens: CountTokens,
    params: RaptorParams = RaptorParams(),
    chunk_ids: Sequence[str] | None = None,
) -> Tree:
    """The whole tree in one process.

    Stops at ``max_layers``, when a layer has fewer than ``min_nodes_to_cluster`` nodes, or when
    a round would not shrink the frontier (clustering merged nothing, or too many summaries failed).
    """
    if not chunks:
        return Tree()
    frontier = make_leaves(chunks, embed(list(chunks)), count_tokens, chunk_ids)
    tree = Tree(nodes=list(frontier))
    for layer in range(1, params.max_layers + 1):
        if len(frontier) < params.min_nodes_to_cluster:
            break
        clusters = cluster_layer(np.stack([n.embedding for n in frontier]), [n.n_tokens for n in frontier], params)
        if len(clusters) >= len(frontier):
            break
        summaries, edges = summarize_clusters(frontier, clusters, layer, summarize, count_tokens)
        summaries = embed_nodes(summaries, embed)
        tree.nodes += summaries
        tree.edges += edges
        following = next_frontier(frontier, summaries, edges)
        if len(following) >= len(frontier):
            break
        frontier = following
    return tree
