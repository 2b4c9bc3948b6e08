"""From judgements and claim counts to the comparison table: win rates, Wilcoxon, Holm (pure pandas).

Holm-Bonferroni runs over the pairs of distinct conditions compared on one metric (the family
of tests a reader scans in one table or heatmap panel); the A/A check is not part of that family
and keeps its raw p-value.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from graphrag_spark.evaluation.stats import LOSS, TIE, WIN, holm_bonferroni, signed_rank_test

COLUMNS = ["metric", "condition_a", "condition_b", "n_questions", "win_rate", "mean_a", "mean_b", "statistic",
           "p_value", "p_holm", "significant"]


def _with_holm(rows: list[dict], alpha: float) -> list[dict]:
    for metric in dict.fromkeys(r["metric"] for r in rows):
        family = [r for r in rows if r["metric"] == metric and r["condition_a"] != r["condition_b"]]
        for row, adjusted in zip(family, holm_bonferroni([r["p_value"] for r in family])):
            row["p_holm"] = adjusted
    for row in rows:
        row.setdefault("p_holm", row["p_value"])
        row["significant"] = bool(row["p_holm"] <= alpha)
    return rows


def question_scores(judgements: pd.DataFrame) -> pd.DataFrame:
    """Per (pair, criterion, question): the first condition's mean score over orders and repeats."""
    scored = judgements[judgements["score_a"].notna()]
    return (scored.groupby(["condition_a", "condition_b", "criterion", "question_id"], sort=False)["score_a"]
            .mean().reset_index())


def compare_judgements(judgements: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """One row per (criterion, pair): win rate of a = mean over questions; Wilcoxon of a's per-question
    score against b's (100 - a's)."""
    rows = []
    for (a, b, criterion), group in question_scores(judgements).groupby(["condition_a", "condition_b", "criterion"], sort=False):
        scores = group["score_a"].to_numpy()
        test = signed_rank_test(scores, 100.0 - scores)
        rows.append({"metric": criterion, "condition_a": a, "condition_b": b, "n_questions": len(scores),
                     "win_rate": float(scores.mean()), "mean_a": float(scores.mean()), "mean_b": float(100 - scores.mean()),
                     "statistic": test.statistic, "p_value": test.p_value})
    return pd.DataFrame(_with_holm(rows, alpha), columns=COLUMNS)


def claim_metrics(claims: pd.DataFrame, thresholds: Sequence[float]) -> pd.DataFrame:
    """Long form (question_id, condition, metric, value): ``claims`` and ``clusters@<t>`` per answer."""
    ok = claims[claims["error"].isna()]
    frames = [ok.assign(metric="claims", value=ok["n_claims"].astype(float))[["question_id", "condition", "metric", "value"]]]
    for i, t in enumerate(thresholds):
        values = ok["n_clusters"].map(lambda counts, i=i: float(counts[i]))
        frames.append(ok.assign(metric=f"clusters@{t:g}", value=values)[["question_id", "condition", "metric", "value"]])
    return pd.concat(frames, ignore_index=True)


def compare_claims(claims: pd.DataFrame, pairs: Sequence[tuple[str, str]], thresholds: Sequence[float],
                   alpha: float) -> pd.DataFrame:
    """Per metric and pair of distinct conditions, over the questions both answered: means, the share
    of questions where a has more (ties half), and the Wilcoxon test of the paired counts."""
    values = claim_metrics(claims, thresholds)
    wide = values.pivot_table(index=["metric", "question_id"], columns="condition", values="value")
    rows = []
    for metric in dict.fromkeys(values["metric"]):
        table = wide.loc[metric]
        for a, b in pairs:
            if a == b or a not in table or b not in table:
                continue
            both = table[[a, b]].dropna()
            va, vb = both[a].to_numpy(), both[b].to_numpy()
            outcome = np.where(va > vb, WIN, np.where(va == vb, TIE, LOSS))
            test = signed_rank_test(va, vb)
            rows.append({"metric": metric, "condition_a": a, "condition_b": b, "n_questions": len(va),
                         "win_rate": float(outcome.mean()) if len(va) else float("nan"),
                         "mean_a": float(va.mean()) if len(va) else float("nan"),
                         "mean_b": float(vb.mean()) if len(vb) else float("nan"),
                         "statistic": test.statistic, "p_value": test.p_value})
    return pd.DataFrame(_with_holm(rows, alpha), columns=COLUMNS)


def condition_means(claims: pd.DataFrame, conditions: Sequence[str], thresholds: Sequence[float]) -> pd.DataFrame:
    """The paper's Tables 3-4 shape: per condition, mean claims and mean clusters at each threshold."""
    values = claim_metrics(claims, thresholds)
    table = values.pivot_table(index="condition", columns="metric", values="value", aggfunc="mean")
    metrics = ["claims"] + [f"clusters@{t:g}" for t in thresholds]
    return table.reindex(index=[c for c in conditions if c in table.index], columns=metrics)


def win_rate_matrix(comparisons: pd.DataFrame, metric: str, conditions: Sequence[str]) -> pd.DataFrame:
    """Rows beat columns: cell (r, c) = win rate of r over c (100 - the stored rate when stored as (c, r))."""
    matrix = pd.DataFrame(np.nan, index=list(conditions), columns=list(conditions))
    for row in comparisons[comparisons["metric"] == metric].itertuples():
        matrix.loc[row.condition_a, row.condition_b] = row.win_rate
        if row.condition_a != row.condition_b:
            matrix.loc[row.condition_b, row.condition_a] = 100.0 - row.win_rate
    return matrix
