"""The RAPTOR tree's data model, shared by building and retrieval (which must not need UMAP)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from graphrag_spark.ids import content_id

OK = "ok"
FAILED = "failed"


@dataclass(frozen=True, eq=False)
class Node:
    """A row of the nodes table. A failed summary has status FAILED, its error, no text and no embedding."""

    id: str
    layer: int
    """0 for leaves; n for the summaries made by the n-th round of clustering."""
    text: str
    n_tokens: int
    embedding: np.ndarray | None
    chunk_id: str | None = None
    """Leaves: the chunk the leaf is; summaries: None (their children are in the edges)."""
    status: str = OK
    error: str | None = None


@dataclass(frozen=True)
class Edge:
    parent: str
    child: str
    probability: float
    """The child's cluster membership probability (product of its posteriors along the clustering passes)."""


@dataclass
class Tree:
    """Nodes of all layers (leaves first) and the parent-child edges; a child may have several parents."""

    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)


def leaf_id(chunk_id: str) -> str:
    return content_id("raptor-leaf", chunk_id)


def summary_id(layer: int, child_ids: Sequence[str]) -> str:
    """From the layer and children alone, so the id is known before the summary is written and a retry reuses it."""
    return content_id("raptor-summary", layer, *sorted(child_ids))
