"""RAPTOR parameters with the paper's defaults; the project config mirrors these fields."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RaptorParams:
    chunk_tokens: int = 100
    """Leaf chunk size (paper: ~100 tokens, never cutting a sentence)."""
    threshold: float = 0.1
    """A node joins every cluster whose posterior exceeds this (paper: 0.1); it always joins its best one."""
    max_layers: int = 5
    """Most summary layers above the leaves."""
    reduction_dim: int = 10
    """UMAP components (paper: 10). A set of at most reduction_dim + 1 nodes is one cluster: UMAP needs more points than that."""
    max_cluster_tokens: int = 3500
    """Summarizer input budget: a cluster with more tokens is clustered again, so the prompt fits the model."""
    summary_tokens: int = 150
    """Length of one summary (paper: LLM summaries average ~131 tokens)."""
    seed: int = 224
    """Seed of UMAP and the Gaussian mixtures: the same layer gives the same clusters."""
    min_nodes_to_cluster: int = 3
    """A layer with fewer nodes is the top of the tree (1 node is a root; 2 are short enough to read whole)."""
    reg_covar: float = 1e-3
    """Added to the mixtures' (diagonal) variances. Smaller values let a component shrink onto one or two
    nodes (A Christmas Carol, MiniLM leaves: 1e-4 gave 11 single-node clusters of 79, 1e-3 one of 58,
    1e-2 none of 46, mean sizes 7.0 / 9.7 / 13.2; the paper's full covariance: 85 of ~6 nodes, 6-20x slower)."""
    max_clusters: int = 50
    """Largest number of mixture components tried when choosing k by BIC (paper: 50)."""
    global_neighbors_cap: int = 50
    """Cap on the global pass's n_neighbors (~sqrt(n)): bounds the kNN graph to n x 50 entries on large layers."""
    local_neighbors: int = 10
    """n_neighbors of the local pass inside one global cluster (paper: 10)."""

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1:
            raise ValueError(f"raptor threshold must be between 0 and 1, got {self.threshold}")
        if self.reg_covar <= 0:
            raise ValueError(f"raptor reg_covar must be positive, got {self.reg_covar}")
        for name in ("chunk_tokens", "max_layers", "reduction_dim", "max_cluster_tokens", "summary_tokens", "max_clusters"):
            if getattr(self, name) < 1:
                raise ValueError(f"raptor {name} must be at least 1, got {getattr(self, name)}")
        for name in ("min_nodes_to_cluster", "global_neighbors_cap", "local_neighbors"):
            if getattr(self, name) < 2:
                raise ValueError(f"raptor {name} must be at least 2, got {getattr(self, name)}")
