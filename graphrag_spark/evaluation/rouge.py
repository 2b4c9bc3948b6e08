"""ROUGE-L (Lin 2004) and the paper's claim clustering on distance 1 - ROUGE-L.

ROUGE-L between two texts is the F-measure (beta = 1) of their longest common subsequence of
lower-cased word tokens: P = LCS / len(candidate), R = LCS / len(reference). It is symmetric
with beta = 1, so it serves as a similarity for clustering.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from scipy.cluster.hierarchy import fcluster, linkage

_TOKEN = re.compile(r"[a-z0-9]+")


def rouge_tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Longest common subsequence length, O(len(a) * len(b)) time, O(len(b)) memory."""
    if not a or not b:
        return 0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b, start=1):
            current.append(previous[j - 1] + 1 if x == y else max(previous[j], current[j - 1]))
        previous = current
    return previous[-1]


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 of two texts; 0.0 when either has no word."""
    a, b = rouge_tokens(candidate), rouge_tokens(reference)
    lcs = lcs_length(a, b)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(a), lcs / len(b)
    return 2 * precision * recall / (precision + recall)


def rouge_distances(texts: Sequence[str]) -> np.ndarray:
    """Condensed (scipy ``pdist`` order) matrix of 1 - ROUGE-L between all pairs."""
    tokens = [rouge_tokens(t) for t in texts]
    out = []
    for i in range(len(tokens)):
        for j in range(i + 1, len(tokens)):
            lcs = lcs_length(tokens[i], tokens[j])
            f = 0.0 if lcs == 0 else 2 * lcs / (len(tokens[i]) + len(tokens[j]))
            out.append(1.0 - f)
    return np.asarray(out, dtype=float)


def cluster_counts(claims: Sequence[str], thresholds: Sequence[float]) -> dict[float, int]:
    """Clusters of one answer's claims at each distance threshold: agglomerative, complete linkage
    on 1 - ROUGE-L, cut so that no two claims of a cluster are farther apart than the threshold."""
    if len(claims) < 2:
        return {t: len(claims) for t in thresholds}
    tree = linkage(rouge_distances(claims), method="complete")
    return {t: int(len(set(fcluster(tree, t=t, criterion="distance")))) for t in thresholds}
