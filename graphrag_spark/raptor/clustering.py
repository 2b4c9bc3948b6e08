"""Soft clustering of one tree layer, as in the paper: UMAP, then Gaussian mixtures sized by BIC.

Two passes: a global UMAP (n_neighbors ~ sqrt(n)) finds broad themes, then a local UMAP
(small neighbourhood) inside each global cluster finds the fine ones. A node joins every
cluster whose posterior exceeds the threshold, so it can have several parents. A cluster whose
text exceeds the summarizer's budget is clustered again.

A cluster is a list of ``(node_index, probability)``; a final cluster's probability is the
product of the node's posteriors along the passes that put it there (global x local x ...).
The global pass runs on the Spark driver and each local pass in an executor, so the passes are
separate functions; ``cluster_layer`` composes them in one process.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
import umap
from sklearn.mixture import GaussianMixture

from graphrag_spark.raptor.params import RaptorParams

Cluster = list[tuple[int, float]]

# Full covariance fails as "ill-defined" on large layers, and is slow: 259 s against 14-40 s for
# diagonal on one 522-node layer (A Christmas Carol).
_COVARIANCE_TYPE = "diag"


def global_clusters(embeddings: np.ndarray, params: RaptorParams) -> list[Cluster]:
    """Broad clusters of a whole layer (neighbourhood ~ sqrt(n), capped for large layers)."""
    neighbors = min(params.global_neighbors_cap, math.isqrt(max(len(embeddings) - 1, 0)))
    return _soft_clusters(embeddings, neighbors, params)


def local_clusters(embeddings: np.ndarray, params: RaptorParams) -> list[Cluster]:
    """Fine clusters inside one global cluster; indices refer to the rows of ``embeddings``."""
    return _soft_clusters(embeddings, params.local_neighbors, params)


def lift_clusters(outer: Cluster, inner: list[Cluster]) -> list[Cluster]:
    """Express clusters found inside ``outer`` (indices into it) in ``outer``'s node indices."""
    return [[(outer[pos][0], outer[pos][1] * prob) for pos, prob in cluster] for cluster in inner]


def cluster_layer(embeddings: np.ndarray, n_tokens: Sequence[int], params: RaptorParams) -> list[Cluster]:
    """Final clusters of a layer: global pass, local pass per global cluster, token budget enforced."""
    embeddings = np.asarray(embeddings, dtype=np.float64)
    clusters = [
        cluster
        for outer in global_clusters(embeddings, params)
        for cluster in lift_clusters(outer, local_clusters(embeddings[[i for i, _ in outer]], params))
    ]
    return enforce_token_budget(clusters, embeddings, n_tokens, params)


def enforce_token_budget(
    clusters: list[Cluster], embeddings: np.ndarray, n_tokens: Sequence[int], params: RaptorParams
) -> list[Cluster]:
    """Re-cluster every cluster whose texts exceed ``max_cluster_tokens``, recursively.

    When clustering cannot split a cluster (it comes back whole), its members are cut in index
    order into runs that fit, so every summarizer input stays within budget unless a single node
    is larger than the budget on its own.
    """
    tokens = np.asarray(n_tokens)
    result: list[Cluster] = []
    for cluster in clusters:
        members = [i for i, _ in cluster]
        if len(cluster) == 1 or tokens[members].sum() <= params.max_cluster_tokens:
            result.append(cluster)
        elif len(cluster) < len(embeddings):
            result += lift_clusters(cluster, cluster_layer(embeddings[members], tokens[members], params))
        else:
            result += _runs_within_budget(cluster, tokens, params.max_cluster_tokens)
    return _distinct(result)


def soft_assign(posteriors: np.ndarray, threshold: float) -> list[Cluster]:
    """Clusters from an (n_nodes x n_components) posterior matrix; every node joins at least its best."""
    members = posteriors > threshold
    members[np.arange(len(posteriors)), posteriors.argmax(axis=1)] = True
    clusters = [
        [(int(i), float(posteriors[i, k])) for i in np.flatnonzero(members[:, k])] for k in range(posteriors.shape[1])
    ]
    return [cluster for cluster in clusters if cluster]


def _soft_clusters(embeddings: np.ndarray, neighbors: int, params: RaptorParams) -> list[Cluster]:
    n = len(embeddings)
    if n <= params.reduction_dim + 1:
        # UMAP cannot embed this few points in reduction_dim dimensions; the set is small enough
        # to summarize whole (the token budget is enforced afterwards).
        return [[(i, 1.0) for i in range(n)]] if n else []
    points = _reduce(embeddings, max(2, min(neighbors, n - 1)), params)
    return soft_assign(_best_mixture(points, params).predict_proba(points), params.threshold)


def _reduce(embeddings: np.ndarray, neighbors: int, params: RaptorParams) -> np.ndarray:
    reducer = umap.UMAP(
        n_neighbors=neighbors,
        n_components=params.reduction_dim,
        metric="cosine",
        random_state=params.seed,  # makes UMAP single-threaded, which determinism requires
        n_jobs=1,
    )
    with warnings.catch_warnings():
        # Small or well-separated layers give disconnected kNN graphs; UMAP warns and copes.
        warnings.filterwarnings("ignore", category=UserWarning, module="umap")
        return reducer.fit_transform(embeddings)


def _best_mixture(points: np.ndarray, params: RaptorParams) -> GaussianMixture:
    """The mixture with the lowest BIC over k = 1..min(max_clusters, n/2) (at least 2 nodes per cluster on average)."""
    best, best_bic = None, math.inf
    for k in range(1, max(1, min(params.max_clusters, len(points) // 2)) + 1):
        model = GaussianMixture(k, covariance_type=_COVARIANCE_TYPE, reg_covar=params.reg_covar, random_state=params.seed)
        bic = model.fit(points).bic(points)
        if bic < best_bic:
            best, best_bic = model, bic
    return best


def _runs_within_budget(cluster: Cluster, tokens: np.ndarray, budget: int) -> list[Cluster]:
    runs: list[Cluster] = [[]]
    used = 0
    for index, prob in sorted(cluster):
        if runs[-1] and used + tokens[index] > budget:
            runs.append([])
            used = 0
        runs[-1].append((index, prob))
        used += tokens[index]
    return runs


def _distinct(clusters: list[Cluster]) -> list[Cluster]:
    """One cluster per distinct member set (keeping each member's highest probability), in a stable order."""
    by_members: dict[tuple[int, ...], dict[int, float]] = {}
    for cluster in clusters:
        probs = by_members.setdefault(tuple(sorted(i for i, _ in cluster)), {})
        for index, prob in cluster:
            probs[index] = max(prob, probs.get(index, 0.0))
    return [sorted(by_members[members].items()) for members in sorted(by_members)]
