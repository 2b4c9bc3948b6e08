"""The evaluation's pure core against hand-computed answers: Wilcoxon, Holm, ROUGE-L, complete-linkage
clustering, verdict scoring and counterbalancing, question dedup, claim and verdict parsing, report."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from graphrag_spark.evaluation.claims import answer_sentences, dedupe_claims, parse_claims, parse_selection
from graphrag_spark.evaluation.compare import compare_claims, compare_judgements, condition_means, win_rate_matrix
from graphrag_spark.evaluation.judge import condition_pairs, parse_verdict
from graphrag_spark.evaluation.questions import dedupe_questions, parse_personas, parse_strings
from graphrag_spark.evaluation.report import Cost, render_markdown, write_heatmap
from graphrag_spark.evaluation.rouge import cluster_counts, rouge_l
from graphrag_spark.evaluation.stats import holm_bonferroni, signed_rank_test, verdict_score

# |d| ranks 1..8; the negative differences -0.5 and -4.0 have ranks 1 and 6, so W- = 7, W+ = 29.
# Exact two-sided p: subsets of {1..8} with rank sum <= 7 number 1+1+1+2+2+3+4+5 = 19, p = 2 * 19 / 256.
DIFFERENCES = [1.5, -0.5, 3.0, 2.0, -4.0, 6.0, 2.5, 5.0]


def test_wilcoxon_signed_rank_matches_the_hand_computed_exact_test():
    test = signed_rank_test(DIFFERENCES, [0.0] * 8)
    assert test.statistic == 7.0
    assert test.p_value == pytest.approx(38 / 256)
    assert test.n_nonzero == 8


def test_wilcoxon_is_symmetric_in_its_pair_and_drops_zero_differences():
    first = np.array(DIFFERENCES) + 10
    assert signed_rank_test([10.0] * 8, first).statistic == 7.0
    with_zeros = signed_rank_test(DIFFERENCES + [0.0, 0.0], [0.0] * 10)
    assert with_zeros.statistic == 7.0 and with_zeros.n_nonzero == 8


def test_wilcoxon_of_identical_scores_is_not_significant():
    assert signed_rank_test([50.0] * 5, [50.0] * 5).p_value == 1.0


def test_holm_bonferroni_matches_the_hand_computed_step_down():
    # Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> monotone 0.02, 0.03, 0.06, 0.06.
    assert holm_bonferroni([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm_bonferroni([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm_bonferroni([]) == []


def test_rouge_l_matches_lins_examples_and_a_hand_computed_f_measure():
    # Lin (2004), section 3.1: against "police killed the gunman", S2 scores 3/4 and S3 2/4.
    assert rouge_l("police kill the gunman", "police killed the gunman") == pytest.approx(0.75)
    assert rouge_l("the gunman kill police", "police killed the gunman") == pytest.approx(0.5)
    # LCS 6 of 7 and 6 tokens: P = 6/7, R = 1, F = 12/13.
    assert rouge_l("The cat was found under the bed.", "the cat was under the bed") == pytest.approx(12 / 13)
    assert rouge_l("", "anything") == 0.0


def test_claims_cluster_by_complete_linkage_on_one_minus_rouge_l():
    claims = ["The harbour was dredged in 2019.", "The harbour was dredged in 2019 by the council.",
              "Fishermen oppose the dredging plan.", "Fishermen strongly oppose the dredging plan."]
    # Distances: pair 1-2 = 1 - 12/15 = 0.2, pair 3-4 = 1 - 10/11 = 0.09, across the pairs at most 1 - 2/15 = 0.87.
    assert cluster_counts(claims, [0.05, 0.1, 0.5, 0.9]) == {0.05: 4, 0.1: 3, 0.5: 2, 0.9: 1}
    # A chain: A-B and B-C at distance 1/3, A-C at 2/3. Complete linkage keeps C apart at 0.4; single would not.
    assert cluster_counts(["a b c d e f", "a b c d x y", "a b x y z w"], [0.4, 0.7]) == {0.4: 2, 0.7: 1}
    assert cluster_counts(["one claim"], [0.5]) == {0.5: 1}
    assert cluster_counts([], [0.5]) == {0.5: 0}


def test_a_verdict_scores_the_first_condition_in_both_orders():
    assert [verdict_score(w, "ab") for w in (1, 2, 0)] == [100, 0, 50]
    assert [verdict_score(w, "ba") for w in (1, 2, 0)] == [0, 100, 50]


def _judgements(pairs, questions, judge) -> pd.DataFrame:
    rows = []
    for (a, b), q, order, repeat in itertools.product(pairs, questions, ("ab", "ba"), range(2)):
        winner = judge(a, b, order)
        rows.append({"question_id": q, "condition_a": a, "condition_b": b, "criterion": "comprehensiveness",
                     "order": order, "repeat": repeat, "winner": winner, "score_a": verdict_score(winner, order)})
    return pd.DataFrame(rows)


def test_counterbalancing_cancels_a_position_biased_judge_and_keeps_a_real_preference():
    pairs = condition_pairs(["C0", "SS"], self_pairs=["C0"])
    assert pairs == [("C0", "SS"), ("C0", "C0")]
    questions = [f"q{i}" for i in range(8)]
    always_first = compare_judgements(_judgements(pairs, questions, lambda a, b, order: 1), alpha=0.05)
    assert always_first["win_rate"].tolist() == [50.0, 50.0]
    assert not always_first["significant"].any()
    prefers_c0 = _judgements(pairs[:1], questions, lambda a, b, order: 1 if order == "ab" else 2)
    row = compare_judgements(prefers_c0, alpha=0.05).iloc[0]
    assert row.win_rate == 100.0 and row.p_value == pytest.approx(2 / 2**8) and row.significant
    matrix = win_rate_matrix(compare_judgements(prefers_c0, 0.05), "comprehensiveness", ["C0", "SS"])
    assert matrix.loc["SS", "C0"] == 0.0 and matrix.loc["C0", "SS"] == 100.0


def test_claim_comparisons_pair_answers_by_question():
    rows = []
    for i in range(6):
        rows.append({"question_id": f"q{i}", "condition": "C0", "n_claims": 10 + i, "n_clusters": [5, 3], "error": None})
        rows.append({"question_id": f"q{i}", "condition": "SS", "n_claims": 4, "n_clusters": [5, 2], "error": None})
    rows.append({"question_id": "q9", "condition": "C0", "n_claims": None, "n_clusters": None, "error": "failed"})
    claims = pd.DataFrame(rows)
    table = compare_claims(claims, [("C0", "SS")], [0.5, 0.8], alpha=0.05).set_index("metric")
    assert table.loc["claims", "mean_a"] == pytest.approx(12.5) and table.loc["claims", "win_rate"] == 100.0
    assert table.loc["claims", "p_value"] == pytest.approx(2 / 2**6)
    assert table.loc["clusters@0.5", "win_rate"] == 50.0 and table.loc["clusters@0.5", "p_value"] == 1.0
    means = condition_means(claims, ["C0", "SS"], [0.5, 0.8])
    assert means.loc["SS"].tolist() == [4.0, 5.0, 2.0]


def test_exact_and_near_duplicate_questions_are_removed():
    questions = ["What are the main themes of the harbour dispute?",
                 "What are the main themes in the harbour dispute?",
                 "what are the main themes of the harbour dispute",
                 "How do fishermen and the council view the dredging?",
                 "How do the council and fishermen view the dredging?",
                 "How do fishermen and the council view the dredging plans?",
                 "Which groups gain from the new port, and which lose?"]
    kept = dedupe_questions(questions, near_duplicate_rouge=0.9)
    assert [k.duplicate_of for k in kept] == [None, 0, 0, None, 3, 3, None]
    assert [k.duplicate_of for k in dedupe_questions(questions[3:6], 1.0)] == [None, 0, None]


def test_generation_answers_are_read_from_json_or_list_lines():
    text = '```json\n{"personas": [{"name": "Journalist", "description": "Covers the port."}, {"name": "Historian"}]}\n```'
    personas = parse_personas(text, wanted=5)
    assert [p.render() for p in personas] == ["Journalist: Covers the port.", "Historian"]
    assert parse_strings("Here they are:\n1. First task\n2. Second task\n3. Third", "tasks", wanted=2) == ["First task", "Second task"]
    assert parse_strings("no list at all", "questions", wanted=3) == []


def test_verdicts_are_read_from_json_or_a_winner_line():
    assert parse_verdict('{"reasoning": "More detail.", "winner": 2}').winner == 2
    assert parse_verdict('Sure! {"reasoning": "Equal.", "winner": "tie"}').winner == 0
    assert parse_verdict("Reasoning: both fine.\nWinner: Answer 1").winner == 1
    assert parse_verdict('{"winner": 3}') is None and parse_verdict("I cannot decide.") is None


def test_claim_steps_read_sentences_and_claims():
    answer = "## Harbour\n\n- The council dredged the harbour in 2019 [Data: Reports (1, 2)].\n- Fishermen objected. Why?"
    assert answer_sentences(answer) == ["Harbour", "The council dredged the harbour in 2019.", "Fishermen objected.", "Why?"]
    assert parse_selection('{"sentences": [2, "3", 2, 9]}', 4) == [2, 3]
    assert parse_selection("nothing here", 4) is None
    assert parse_claims('{"claims": ["A.", {"claim": "B."}, ""]}') == ["A.", "B."]
    assert dedupe_claims(["The port grew.", "the port grew", "Trade fell."]) == ["The port grew.", "Trade fell."]


def test_report_renders_matrices_aa_claims_and_cost_and_a_heatmap(tmp_path):
    pairs = condition_pairs(["C0", "SS"], self_pairs=["C0"])
    comparisons = compare_judgements(_judgements(pairs, ["q1", "q2"], lambda a, b, order: 1), 0.05)
    costs = [Cost("judge", 16, 16, 8000, 800)]
    text = render_markdown(conditions=["C0", "SS"], criteria=["comprehensiveness"], n_questions=2, n_dropped=1,
                           repeats=2, comparisons=comparisons, means=None, costs=costs, n_pairs=1, alpha=0.05,
                           failed_judgements=0, heatmap="win_rates.png")
    assert "| **C0** | 50 | 50 |" in text and "| **SS** | 50 |  |" in text
    assert "A/A sanity check" in text and "8 judgements per question per condition pair" in text
    png = write_heatmap(comparisons, ["comprehensiveness"], ["C0", "SS"], tmp_path / "heat.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _served(prompt_name: str, **values) -> str:
    from graphrag_spark.llm.server import answer
    from graphrag_spark.prompts import load_prompt

    kind, text = answer([{"role": "user", "content": load_prompt(prompt_name).render(**values)}])
    assert kind == prompt_name
    return text


def test_the_local_server_answers_the_evaluation_prompts_in_their_formats():
    description = _served("eval_corpus_summary", excerpts="The Harbour Board met Fishermen of Eastport. "
                          "The Harbour Board plans dredging near Eastport.", max_words=50)
    assert "Harbour Board" in description
    personas = parse_personas(_served("eval_personas", corpus_description=description, n_personas=3), 3)
    assert len(personas) == 3
    tasks = parse_strings(_served("eval_tasks", corpus_description=description, persona=personas[0].render(), n_tasks=4), "tasks", 4)
    assert len(tasks) == 4
    questions = parse_strings(_served("eval_questions", corpus_description=description, persona=personas[0].render(),
                                      task=tasks[0], n_questions=5), "questions", 5)
    assert len(questions) == 5 and all(q.endswith("?") for q in questions)
    short, long = "The Board plans dredging [Data: Reports (1)].", "The Board plans dredging [Data: Reports (1, 2)]. Fishermen object to it strongly."
    judge = lambda a, b, c: parse_verdict(_served("eval_judge", criterion=c, criterion_description="...", question="Q?",
                                                  answer_1=a, answer_2=b)).winner
    assert judge(short, long, "comprehensiveness") == 2 and judge(long, short, "comprehensiveness") == 1
    assert judge(short, long, "directness") == 1 and judge(long, long, "diversity") == 1
    numbered = "1. The Board plans dredging near Eastport.\n2. Why?\n3. Fishermen object and the Board listens closely."
    assert parse_selection(_served("eval_claim_selection", question="Q?", sentences=numbered), 3) == [1, 3]
    selected = "1. The Board plans dredging near Eastport.\n2. Fishermen of Eastport object and the Board listens closely."
    assert parse_claims(_served("eval_claim_decomposition", question="Q?", sentences=selected)) == [
        "The Board plans dredging near Eastport.", "Fishermen of Eastport object.", "The Board listens closely."]
