"""The evaluation end to end on the sample index, every LLM call through the local server over HTTP.
The server's answers carry no meaning, so this checks shape, counterbalancing, the A/A check and
that a rerun (from the evaluation notebook) pays for nothing."""

from __future__ import annotations

import itertools

import pytest

from graphrag_spark import tables as T
from graphrag_spark.evaluation.judge import CRITERIA
from graphrag_spark.evaluation.run import Evaluation
from graphrag_spark.llm.server import start_server
from graphrag_spark.config import load_config
from graphrag_spark.query.api import GraphRagIndex

from conftest import REPO
from llm_budget import UNTHROTTLED
from test_notebooks import run_notebook

pytestmark = pytest.mark.spark

CONDITIONS = ["C0", "SS"]
REPEATS = 2


@pytest.fixture(scope="module")
def evaluated(spark, sample_index, tmp_path_factory):
    """One evaluation, then its rerun through the evaluation notebook (same config, so all cache hits)."""
    root = tmp_path_factory.mktemp("evaluation")
    with start_server() as server:
        overrides = [f"spark.ivy_cache={REPO / '.cache' / 'ivy'}", "query.llm=true", f"llm.chat.api_base={server.base_url}",
                     "llm.chat.max_retries=0", "llm.items_per_commit=1000", f"evaluation.root={root}",
                     f"evaluation.conditions=[{', '.join(CONDITIONS)}]", "evaluation.personas=2",
                     "evaluation.tasks_per_persona=2", "evaluation.questions_per_task=2",
                     f"evaluation.repeats={REPEATS}", "evaluation.sample_units=5", *UNTHROTTLED]
        cfg = load_config(REPO / "conf" / "local.yaml", [f"storage.root={sample_index[0].storage.root}", *overrides])
        first = Evaluation(GraphRagIndex(spark, cfg)).run()
        first_stats = server.stats()
        server.reset()
        with pytest.MonkeyPatch.context() as env:
            env.setenv("GRAPHRAG_CONFIG", str(REPO / "conf" / "local.yaml"))
            env.setenv("GRAPHRAG_INDEX_ROOT", str(sample_index[0].storage.root))
            env.setenv("GRAPHRAG_SET", ";".join(overrides))
            again = run_notebook(REPO / "notebooks" / "evaluate.py", spark)["result"]
        yield cfg, first, first_stats, again, server.stats()


def test_questions_come_from_personas_and_tasks_without_duplicates(spark, evaluated):
    cfg, first, stats, _, _ = evaluated
    table = T.TableStore(spark, cfg.storage.model_copy(update={"root": cfg.evaluation.root})).read(T.EVAL_QUESTIONS).toPandas()
    assert 0 < len(first.questions) <= len(table) <= 2 * 2 * 2
    assert set(first.questions["id"]) == set(table.loc[table["duplicate_of"].isna(), "id"])
    assert first.questions["persona"].str.len().gt(0).all() and first.questions["task"].str.len().gt(0).all()
    assert first.questions["question"].str.lower().is_unique
    assert {k: stats["by_kind"][k] for k in ("eval_corpus_summary", "eval_personas", "eval_tasks", "eval_questions")} == \
        {"eval_corpus_summary": 1, "eval_personas": 1, "eval_tasks": 2, "eval_questions": 4}


def test_every_condition_answers_every_question_and_records_its_cost(evaluated):
    _, first, _, _, _ = evaluated
    answers = first.answers
    assert sorted(map(tuple, answers[["question_id", "condition"]].values)) == \
        sorted(itertools.product(first.questions["id"], CONDITIONS))
    assert (answers["llm_calls"] > 0).all() and (answers["context_tokens"] > 0).all()
    assert next(c for c in first.costs if c.step == "answers").calls == answers["llm_calls"].sum()


def test_each_pair_is_judged_in_both_orders_on_every_criterion(evaluated):
    _, first, stats, _, _ = evaluated
    judgements = first.judgements
    n_questions = len(first.questions)
    pairs = {("C0", "SS"), ("C0", "C0")}
    assert set(map(tuple, judgements[["condition_a", "condition_b"]].drop_duplicates().values)) == pairs
    assert len(judgements) == n_questions * len(pairs) * len(CRITERIA) * 2 * REPEATS
    assert judgements["error"].isna().all() and set(judgements["score_a"]) <= {0.0, 50.0, 100.0}
    per_order = judgements.groupby(["question_id", "condition_a", "condition_b", "criterion", "repeat"])["order"].apply(sorted)
    assert per_order.map(lambda orders: orders == ["ab", "ba"]).all()
    # The server judges content, not position, for different answers: a decided comparison must give the same
    # condition the win in both orders, which holds only if the answers really were swapped and scored back.
    real = judgements[(judgements["condition_a"] != judgements["condition_b"]) & (judgements["winner"] != 0)]
    scores = real.pivot_table(index=["question_id", "criterion", "repeat"], columns="order", values="score_a").dropna()
    assert len(scores) > 0 and (scores["ab"] == scores["ba"]).all()
    assert stats["by_kind"]["eval_judge"] == len(judgements)


def test_a_condition_against_itself_scores_fifty_despite_a_position_biased_judge(evaluated):
    _, first, _, _, _ = evaluated
    aa = first.judgements[first.judgements["condition_a"] == first.judgements["condition_b"]]
    assert set(aa["winner"]) == {1}  # the server prefers Answer 1 for identical answers
    rates = first.comparisons[(first.comparisons["condition_a"] == "C0") & (first.comparisons["condition_b"] == "C0")]
    assert sorted(rates["metric"]) == sorted(CRITERIA) and (rates["win_rate"] == 50.0).all()
    assert not rates["significant"].any()


def test_claims_are_counted_and_clustered_per_answer(evaluated):
    cfg, first, stats, _, _ = evaluated
    claims = first.claims
    assert len(claims) == len(first.answers) and claims["error"].isna().all()
    assert (claims["n_claims"] > 0).all()
    for row in claims.itertuples():
        assert list(row.n_clusters) == sorted(row.n_clusters, reverse=True)  # a looser cut never adds clusters
        assert 1 <= row.n_clusters[-1] <= row.n_clusters[0] <= row.n_claims
    metrics = set(first.comparisons["metric"])
    assert {"claims", *(f"clusters@{t:g}" for t in cfg.evaluation.cluster_thresholds)} <= metrics


def test_report_and_heatmap_are_written(evaluated):
    _, first, _, _, _ = evaluated
    text = first.report_path.read_text()
    for heading in ("## Comprehensiveness", "## Directness", "## A/A sanity check", "## Claim-based metrics", "## Cost"):
        assert heading in text
    assert "| **C0** |" in text and "judgements per question per condition pair" in text
    assert first.heatmap_path.read_bytes()[:4] == b"\x89PNG"


def test_a_rerun_from_the_notebook_makes_no_call_and_gives_the_same_results(evaluated):
    _, first, _, again, stats = evaluated
    assert stats["requests"]["chat"] == 0 and stats["requests"]["embeddings"] == 0
    assert again.llm_calls == 0
    key = ["question_id", "condition_a", "condition_b", "criterion", "order", "repeat"]
    assert again.judgements.sort_values(key)["score_a"].tolist() == first.judgements.sort_values(key)["score_a"].tolist()
    assert again.markdown.split("## Cost")[0] == first.markdown.split("## Cost")[0]
