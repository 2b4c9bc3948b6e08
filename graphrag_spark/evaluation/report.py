"""The evaluation report: Markdown tables (the paper's Figure 2 as win-rate matrices, Tables 3-4 as
claim and cluster means) and a heatmap PNG of the win rates, one panel per criterion."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from graphrag_spark.evaluation.compare import win_rate_matrix


@dataclass(frozen=True)
class Cost:
    """Calls and tokens of one evaluation step (from llm_usage, or the answers' own counts)."""

    step: str
    items: int
    calls: int
    prompt_tokens: int
    completion_tokens: int


def _number(value: float, digits: int = 0) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _matrix_table(comparisons: pd.DataFrame, metric: str, conditions: Sequence[str]) -> str:
    matrix = win_rate_matrix(comparisons, metric, conditions)
    significant = {(r.condition_a, r.condition_b) for r in comparisons[comparisons["metric"] == metric].itertuples()
                   if r.significant}
    rows = []
    for a in conditions:
        cells = []
        for b in conditions:
            mark = "*" if (a, b) in significant or (b, a) in significant else ""
            cells.append(_number(matrix.loc[a, b]) + mark if not math.isnan(matrix.loc[a, b]) else "")
        rows.append([f"**{a}**", *cells])
    return _markdown_table(["row beats column", *conditions], rows)


def render_markdown(*, conditions: Sequence[str], criteria: Sequence[str], n_questions: int, n_dropped: int,
                    repeats: int, comparisons: pd.DataFrame, means: pd.DataFrame | None, costs: Sequence[Cost],
                    n_pairs: int, alpha: float, failed_judgements: int, heatmap: str | None) -> str:
    out = ["# Evaluation report", "",
           f"{n_questions} questions ({n_dropped} duplicates removed), conditions {', '.join(conditions)}; every "
           f"pair judged on {', '.join(criteria)}, in both presentation orders, {repeats} times each "
           f"(win = 100, tie = 50, loss = 0). `*` = significant after Holm-Bonferroni at alpha = {alpha} "
           f"(Wilcoxon signed-rank over questions). Directness is the control criterion.", ""]
    if heatmap:
        out += [f"![win rates]({heatmap})", ""]
    for criterion in criteria:
        out += [f"## {criterion.capitalize()}: win rate (%) of the row over the column", "",
                _matrix_table(comparisons, criterion, conditions), ""]
    aa = comparisons[comparisons["condition_a"] == comparisons["condition_b"]]
    if len(aa):
        out += ["## A/A sanity check (a condition against itself; expected about 50)", "",
                _markdown_table(["criterion", "condition", "win rate", "p"],
                                [[r.metric, r.condition_a, _number(r.win_rate, 1), _number(r.p_value, 3)]
                                 for r in aa.itertuples()]), ""]
    if means is not None and len(means):
        out += ["## Claim-based metrics (mean per answer)", "",
                "Claims: factual claims extracted (selected sentences, decomposed, deduplicated). Clusters@t: "
                "agglomerative clusters of an answer's claims, complete linkage, distance 1 - ROUGE-L, cut at t.", "",
                _markdown_table(["condition", *means.columns],
                                [[c, *(_number(v, 2) for v in means.loc[c])] for c in means.index]), ""]
        claim_rows = comparisons[comparisons["metric"].str.match(r"^(claims|clusters@)")]
        if len(claim_rows):
            out += ["### Pairwise (share of questions where A has more; Wilcoxon, Holm per metric)", "",
                    _markdown_table(["metric", "A", "B", "mean A", "mean B", "A more (%)", "p", "p (Holm)"],
                                    [[r.metric, r.condition_a, r.condition_b, _number(r.mean_a, 2), _number(r.mean_b, 2),
                                      _number(r.win_rate), _number(r.p_value, 4), _number(r.p_holm, 4) + ("*" if r.significant else "")]
                                     for r in claim_rows.itertuples()]), ""]
    judge = next((c for c in costs if c.step == "judge"), None)
    out += ["## Cost", "", _markdown_table(
        ["step", "items", "calls", "prompt tokens", "completion tokens"],
        [[c.step, str(c.items), str(c.calls), f"{c.prompt_tokens:,}", f"{c.completion_tokens:,}"] for c in costs]), ""]
    if judge and n_questions and n_pairs:
        per = n_questions * n_pairs
        out += [f"Judging costs {judge.items / per:.0f} judgements per question per condition pair "
                f"({judge.calls / per:.1f} calls and {(judge.prompt_tokens + judge.completion_tokens) / per:,.0f} tokens "
                f"paid in this run; cached judgements cost nothing).", ""]
    if failed_judgements:
        out += [f"{failed_judgements} judgements failed and are left out; a rerun retries only them.", ""]
    return "\n".join(out)


def write_heatmap(comparisons: pd.DataFrame, criteria: Sequence[str], conditions: Sequence[str], path: Path) -> Path:
    """One panel per criterion, rows beat columns, like the paper's Figure 2; significant cells bold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(criteria)
    size = 0.7 * len(conditions) + 1.5
    fig, axes = plt.subplots(1, n, figsize=(size * n, size + 0.6), squeeze=False)
    for ax, criterion in zip(axes[0], criteria):
        matrix = win_rate_matrix(comparisons, criterion, conditions)
        significant = {(r.condition_a, r.condition_b) for r in comparisons[comparisons["metric"] == criterion].itertuples()
                       if r.significant}
        ax.imshow(matrix.to_numpy(dtype=float), cmap="RdYlGn", vmin=0, vmax=100)
        ax.set_xticks(range(len(conditions)), conditions)
        ax.set_yticks(range(len(conditions)), conditions)
        ax.set_title(criterion.capitalize())
        for i, a in enumerate(conditions):
            for j, b in enumerate(conditions):
                value = matrix.loc[a, b]
                if not math.isnan(value):
                    bold = (a, b) in significant or (b, a) in significant
                    ax.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=9,
                            fontweight="bold" if bold else "normal")
    fig.suptitle("Win rate (%) of the row condition over the column condition", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
