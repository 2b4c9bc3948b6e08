"""Scoring and significance of pairwise comparisons, as in the paper (section 4.2).

A judgement scores the first condition of a pair 100 (win), 50 (tie) or 0 (loss). Per question,
its score is the mean over presentation orders and repeats; the win rate of a pair is the mean
over questions. Significance: a Wilcoxon signed-rank test of the per-question paired values
(two-sided), then Holm-Bonferroni across the pairs compared on one criterion or metric.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import wilcoxon

WIN, TIE, LOSS = 100.0, 50.0, 0.0


@dataclass(frozen=True)
class SignedRank:
    statistic: float  # min(W+, W-) over the non-zero differences
    p_value: float  # two-sided; 1.0 when every difference is zero
    n_nonzero: int


def signed_rank_test(first: Sequence[float], second: Sequence[float]) -> SignedRank:
    """Wilcoxon signed-rank test of paired values; zero differences are dropped (Wilcoxon's method)."""
    diffs = np.asarray(first, dtype=float) - np.asarray(second, dtype=float)
    if len(diffs) == 0 or not np.any(diffs):
        return SignedRank(0.0, 1.0, 0)
    result = wilcoxon(diffs, zero_method="wilcox", alternative="two-sided")
    return SignedRank(float(result.statistic), float(result.pvalue), int(np.count_nonzero(diffs)))


def holm_bonferroni(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in input order: the k-th smallest p is multiplied by
    (m - k + 1), made monotone, capped at 1. Reject H_i at level alpha iff adjusted p_i <= alpha."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        value = p_values[i]
        running = max(running, min(1.0, (m - rank) * value) if not math.isnan(value) else 1.0)
        adjusted[i] = running
    return adjusted


def verdict_score(winner: int, order: str) -> float:
    """Score of the pair's first condition for one verdict: ``winner`` is the answer position the
    judge chose (1, 2, or 0 for a tie); ``order`` is ``ab`` (first condition shown as answer 1) or ``ba``."""
    if winner == 0:
        return TIE
    first_won = (winner == 1) == (order == "ab")
    return WIN if first_won else LOSS
