"""The evaluation as Spark jobs over Delta: questions, answers, judgements, claims, comparisons, report.

Every step is resumable without paying twice. LLM work (corpus description, personas, tasks,
questions, judgements, claims) runs through ``llm.stage.run_llm_stage``: executors, cached in the
evaluation's ``llm_results``, throttled job-wide. Answers come from the batch query path and are
stored per (question, condition); a rerun answers only the missing ones (and those whose LLM calls
failed). A rerun of a finished evaluation therefore makes no LLM call at all.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.config import Config, StorageConfig
from graphrag_spark.errors import StageFailed, UserError
from graphrag_spark.evaluation import claims as C
from graphrag_spark.evaluation.compare import compare_claims, compare_judgements, condition_means
from graphrag_spark.evaluation.judge import CRITERIA, ORDERS, condition_pairs, parse_verdict
from graphrag_spark.evaluation.questions import dedupe_questions, parse_personas, parse_strings
from graphrag_spark.evaluation.report import Cost, render_markdown, write_heatmap
from graphrag_spark.evaluation.rouge import cluster_counts
from graphrag_spark.evaluation.stats import verdict_score
from graphrag_spark.ids import content_id
from graphrag_spark.llm.client import LlmClient
from graphrag_spark.llm.stage import LlmWork, StageUsage, new_run_id, run_llm_stage
from graphrag_spark.prompts import Prompt, load_prompt
from graphrag_spark.query.api import GraphRagIndex
from graphrag_spark.query.batch import answers_frame, read_questions


class _GenerationFailed(Exception):
    """A question-generation call failed or was unreadable: the whole generation item is retried next run."""


_METHODS = {"TS": ("ts", None), "SS": ("basic", None), "ts": ("ts", None), "basic": ("basic", None),
            "raptor": ("raptor", None), "local": ("local", None)}


def parse_condition(name: str, levels: list[int]) -> tuple[str, int | None]:
    """``C<n>`` / ``global:<n>`` -> global search at level n; ``TS``, ``SS`` (= basic), ``local[:<n>]``, ``raptor``."""
    head, _, level = name.partition(":")
    if name[:1] == "C" and name[1:].isdigit():
        head, level = "global", name[1:]
    if head == "global" or (head == "local" and level):
        if not level.isdigit() or (head == "global" and int(level) not in levels):
            raise UserError(f"Condition '{name}' needs a community level of the index ({', '.join(f'C{n}' for n in levels)}).")
        return head, int(level)
    if name not in _METHODS:
        raise UserError(f"Unknown condition '{name}'; use C<level>, TS, SS, local, local:<level> or raptor.")
    return _METHODS[name]


def _chat_work(prompt: Prompt, parse: Callable[[str, dict], Any], max_tokens: int, stage: str,
               temperature: float | None = None):
    """Work function of one-call items: render the payload, call, parse (None = unreadable, retried next run)."""
    async def work(client: LlmClient, item: dict) -> LlmWork:
        values = json.loads(item["payload"])
        call = await client.chat(prompt.messages(**values), max_tokens=max_tokens, temperature=temperature,
                                 item_id=item["item_id"], stage=stage, prompt_version=prompt.version)
        if call.error:
            return LlmWork(None, [call], call.error)
        parsed = parse(call.text, values)
        if parsed is None:
            return LlmWork(None, [call], f"unreadable {stage} answer: {call.text[:200]!r}")
        return LlmWork(parsed, [call])
    return work


@dataclass
class EvaluationResult:
    """What one evaluation run produced; every frame is also a Delta table under ``evaluation.root``."""

    questions: pd.DataFrame
    answers: pd.DataFrame
    judgements: pd.DataFrame
    claims: pd.DataFrame
    comparisons: pd.DataFrame
    costs: list[Cost]
    usage: list[StageUsage] = field(default_factory=list)
    report_path: Path | None = None
    heatmap_path: Path | None = None
    markdown: str = ""
    wall_s: float = 0.0

    @property
    def llm_calls(self) -> int:
        """Calls paid in this run (answers + every LLM stage); 0 on a rerun of a finished evaluation."""
        return sum(c.calls for c in self.costs)


class Evaluation:
    """The steps of one evaluation of an index; ``run()`` does them all, each step can be run alone."""

    def __init__(self, index: GraphRagIndex, cfg: Config | None = None) -> None:
        self.index = index
        self.spark = index.spark
        self.cfg = cfg or index.cfg
        self.ev = self.cfg.evaluation
        self.store = T.TableStore(self.spark, StorageConfig(root=self.ev.root, database=self.cfg.storage.database))
        self.run_id = new_run_id()
        levels = index.levels() if any(c[:1] == "C" or c.startswith("global") for c in self.ev.conditions) else []
        self.methods = {c: parse_condition(c, levels) for c in self.ev.conditions}
        if len(set(self.ev.conditions)) != len(self.ev.conditions):
            raise UserError(f"evaluation.conditions names a condition twice: {self.ev.conditions}.")
        self.pairs = condition_pairs(self.ev.conditions, self.ev.conditions[:1] if self.ev.aa_check else ())
        self.usage: list[StageUsage] = []
        self.answer_cost = Cost("answers", 0, 0, 0, 0)

    def _stage(self, stage: str, items: DataFrame, work, prompt_version: str, params: dict) -> dict[str, tuple[Any, str | None]]:
        outcome, usage = run_llm_stage(self.spark, self.store, self.cfg.llm, self.cfg.llm.chat, stage, items, work,
                                       self.run_id, prompt_version, params)
        self.usage.append(usage)
        return {r.item_id: (json.loads(r.result) if r.result is not None else None, r.error)
                for r in outcome.select("item_id", "result", "error").collect()}

    # ------------------------------------------------------------------ 1. questions

    def _excerpts(self) -> str:
        """A seeded sample of text units, for the model to describe the corpus from."""
        units = (self.index.table(T.TEXT_UNITS).orderBy(F.sha2(F.concat(F.lit(str(self.ev.seed)), F.col("id")), 256))
                 .limit(self.ev.sample_units).select("text").collect())
        return "\n\n".join(f"Excerpt {i}:\n{r.text}" for i, r in enumerate(units, start=1))

    def _generate(self) -> dict:
        """Algorithm 1 as one cached LLM item: description, personas, tasks per persona (concurrently), then
        questions per persona-task (concurrently). A failed or unreadable call fails the item, so the next run
        retries it; a finished generation is never paid again."""
        ev = self.ev
        prompts = {name: load_prompt(f"eval_{name}") for name in ("corpus_summary", "personas", "tasks", "questions")}
        payload = {"corpus_description": ev.corpus_description or "", "excerpts": "" if ev.corpus_description else self._excerpts(),
                   "max_words": ev.description_max_words, "n_personas": ev.personas, "n_tasks": ev.tasks_per_persona,
                   "n_questions": ev.questions_per_task}
        max_tokens = ev.generation_max_tokens

        async def work(client: LlmClient, item: dict) -> LlmWork:
            values = json.loads(item["payload"])
            calls = []

            async def ask(name: str, parse: Callable[[str], Any], **extra: Any) -> Any:
                prompt = prompts[name]
                call = await client.chat(prompt.messages(**values, **extra), max_tokens=max_tokens,
                                         item_id=item["item_id"], stage="eval_generation", prompt_version=prompt.version)
                calls.append(call)
                parsed = None if call.error else parse(call.text)
                if parsed is None:
                    raise _GenerationFailed(call.error or f"unreadable eval_{name} answer: {call.text[:200]!r}")
                return parsed

            try:
                description = values["corpus_description"] or await ask("corpus_summary", lambda t: " ".join(t.split()) or None)
                values["corpus_description"] = description
                personas = await ask("personas", lambda t: [p.render() for p in parse_personas(t, values["n_personas"])] or None)
                tasks = await asyncio.gather(*(ask("tasks", lambda t: parse_strings(t, "tasks", values["n_tasks"]) or None,
                                                   persona=p) for p in personas))
                persona_tasks = [(p, t) for p, ts in zip(personas, tasks) for t in ts]
                questions = await asyncio.gather(*(
                    ask("questions", lambda t: parse_strings(t, "questions", values["n_questions"]) or None, persona=p, task=t)
                    for p, t in persona_tasks))
            except _GenerationFailed as exc:
                return LlmWork(None, calls, str(exc))
            return LlmWork({"description": description,
                            "rows": [[p, t, q] for (p, t), qs in zip(persona_tasks, questions) for q in qs]}, calls)

        items = T.local_frame(self.spark, [("generation", json.dumps(payload, sort_keys=True))], "item_id string, payload string")
        version = "+".join(p.version for p in prompts.values())
        done = self._stage("eval_generation", items, work, version, {"max_tokens": max_tokens})
        result, error = done["generation"]
        if result is None:
            raise StageFailed(f"Question generation failed ({error}); rerun to retry it, or give evaluation.questions.")
        return result

    def generate_questions(self) -> pd.DataFrame:
        """Personas -> tasks -> questions (Algorithm 1), deduplicated, written to eval_questions."""
        ev = self.ev
        if ev.questions:
            rows = [("", "", q) for q in read_questions(self.spark, ev.questions)]
        else:
            rows = [tuple(row) for row in self._generate()["rows"]]
        if not rows:
            raise UserError("No questions to evaluate: the generation returned none (see the eval_* rows of "
                            f"'{self.store.location(T.LLM_RESULTS)}'), or evaluation.questions holds none.")
        kept = dedupe_questions([q for _, _, q in rows], ev.near_duplicate_rouge)
        ids = [content_id("eval_question", q) for _, _, q in rows]
        frame = pd.DataFrame({
            "id": ids, "position": range(len(rows)), "persona": [p for p, _, _ in rows], "task": [t for _, t, _ in rows],
            "question": [q for _, _, q in rows],
            "duplicate_of": [None if k.duplicate_of is None else ids[k.duplicate_of] for k in kept]})
        self.store.write(self.spark.createDataFrame(frame, T.SCHEMAS[T.EVAL_QUESTIONS]), T.EVAL_QUESTIONS)
        return frame[frame["duplicate_of"].isna()].reset_index(drop=True)

    # ------------------------------------------------------------------ 2. answers

    def answer(self, questions: pd.DataFrame) -> pd.DataFrame:
        """Each condition answers the questions it has no good answer to yet, through the batch query path."""
        columns = [f.name for f in T.SCHEMAS[T.EVAL_ANSWERS].fields]
        stored = self.store.read_or_empty(T.EVAL_ANSWERS).toPandas()
        stored = stored[stored["failed_llm_calls"].fillna(0) == 0] if len(stored) else pd.DataFrame(columns=columns)
        for condition, (method, level) in self.methods.items():
            have = set(stored.loc[stored["condition"] == condition, "question_id"])
            pending = questions[~questions["id"].isin(have)]
            if pending.empty:
                continue
            results = self.index.search(method, pending["question"].tolist(), level)
            frame = answers_frame(self.spark, pending["question"].tolist(), results).toPandas()
            frame.insert(0, "condition", condition)
            frame.insert(0, "question_id", pending["id"].tolist())
            kept = stored[~((stored["condition"] == condition) & stored["question_id"].isin(pending["id"]))]
            stored = pd.concat([kept, frame[columns]], ignore_index=True) if len(kept) else frame[columns]
            self.store.write(self.spark.createDataFrame(stored[columns], T.SCHEMAS[T.EVAL_ANSWERS]), T.EVAL_ANSWERS)
            self.answer_cost = Cost("answers", self.answer_cost.items + len(frame),
                                    self.answer_cost.calls + int(frame["llm_calls"].sum()),
                                    self.answer_cost.prompt_tokens + int(frame["prompt_tokens"].sum()),
                                    self.answer_cost.completion_tokens + int(frame["completion_tokens"].sum()))
        wanted = set(questions["id"])
        return stored[stored["question_id"].isin(wanted) & stored["condition"].isin(self.methods)].reset_index(drop=True)

    # ------------------------------------------------------------------ 3. judging

    def judge(self, questions: pd.DataFrame) -> pd.DataFrame:
        """Every pair x question x criterion x order x repeat, as one cached LLM stage on executors."""
        ev = self.ev
        skeleton = T.local_frame(
            self.spark, [(q, a, b, c, o, r) for (a, b) in self.pairs for q in questions["id"] for c in ev.criteria
             for o in ORDERS for r in range(ev.repeats)],
            "question_id string, condition_a string, condition_b string, criterion string, order string, repeat int")
        answers = self.store.read(T.EVAL_ANSWERS).select("question_id", "condition", "question", "answer")
        a = answers.select("question_id", F.col("condition").alias("condition_a"), "question", F.col("answer").alias("answer_a"))
        b = answers.select("question_id", F.col("condition").alias("condition_b"), F.col("answer").alias("answer_b"))
        measures = T.local_frame(self.spark, CRITERIA.items(), "criterion string, criterion_description string")
        first = F.col("order") == "ab"
        items = (skeleton.join(a, ["question_id", "condition_a"]).join(b, ["question_id", "condition_b"])
                 .join(F.broadcast(measures), "criterion")
                 .select(F.concat_ws("|", "question_id", "condition_a", "condition_b", "criterion", "order",
                                     F.col("repeat").cast("string")).alias("item_id"),
                         F.to_json(F.struct("question", F.when(first, F.col("answer_a")).otherwise(F.col("answer_b")).alias("answer_1"),
                                            F.when(first, F.col("answer_b")).otherwise(F.col("answer_a")).alias("answer_2"),
                                            "criterion", "criterion_description", "order", "repeat")).alias("payload")))
        prompt = load_prompt("eval_judge")

        def parse(text: str, _values: dict):
            verdict = parse_verdict(text)
            return None if verdict is None else {"winner": verdict.winner, "reasoning": verdict.reasoning}

        work = _chat_work(prompt, parse, ev.judge_max_tokens, "eval_judge", ev.judge_temperature)
        done = self._stage("eval_judge", items, work, prompt.version,
                           {"max_tokens": ev.judge_max_tokens, "temperature": ev.judge_temperature})
        rows = []
        for item_id, (result, error) in done.items():
            question_id, cond_a, cond_b, criterion, order, repeat = item_id.split("|")
            winner = result["winner"] if result else None
            rows.append({"question_id": question_id, "condition_a": cond_a, "condition_b": cond_b, "criterion": criterion,
                         "order": order, "repeat": int(repeat), "winner": winner,
                         "score_a": None if winner is None else verdict_score(winner, order),
                         "reasoning": result["reasoning"] if result else None, "error": error})
        frame = pd.DataFrame(rows, columns=[f.name for f in T.SCHEMAS[T.EVAL_JUDGEMENTS].fields])
        self.store.write(self.spark.createDataFrame(frame.astype(object).where(frame.notna(), None),
                                                    T.SCHEMAS[T.EVAL_JUDGEMENTS]), T.EVAL_JUDGEMENTS)
        return frame

    # ------------------------------------------------------------------ 4. claims

    def extract_claims(self, questions: pd.DataFrame) -> pd.DataFrame:
        """Select, then decompose, per answer (two calls, one cached item); dedupe; cluster at each threshold."""
        ev = self.ev
        wanted = T.local_frame(self.spark, [(q,) for q in questions["id"]], "question_id string")
        items = (self.store.read(T.EVAL_ANSWERS).join(wanted, "question_id")
                 .where(F.col("condition").isin(list(self.methods)))
                 .select(F.concat_ws("|", "question_id", "condition").alias("item_id"),
                         F.to_json(F.struct("question", "answer")).alias("payload")))
        select_prompt, split_prompt = load_prompt("eval_claim_selection"), load_prompt("eval_claim_decomposition")
        max_tokens = ev.claims_max_tokens

        async def work(client: LlmClient, item: dict) -> LlmWork:
            values = json.loads(item["payload"])
            sentences = C.answer_sentences(values["answer"] or "")
            if not sentences:
                return LlmWork({"n_sentences": 0, "selected": [], "claims": []})
            calls = [await client.chat(select_prompt.messages(question=values["question"],
                                                                sentences=C.number_sentences(sentences)),
                                       max_tokens=max_tokens, item_id=item["item_id"], stage="eval_claims",
                                       prompt_version=select_prompt.version)]
            selected = None if calls[0].error else C.parse_selection(calls[0].text, len(sentences))
            if selected is None:
                return LlmWork(None, calls, calls[0].error or f"unreadable sentence selection: {calls[0].text[:200]!r}")
            claims: list[str] = []
            if selected:
                chosen = [sentences[i - 1] for i in selected]
                calls.append(await client.chat(split_prompt.messages(question=values["question"],
                                                                       sentences=C.number_sentences(chosen)),
                                               max_tokens=max_tokens, item_id=item["item_id"], stage="eval_claims",
                                               prompt_version=split_prompt.version))
                parsed = None if calls[1].error else C.parse_claims(calls[1].text)
                if parsed is None:
                    return LlmWork(None, calls, calls[1].error or f"unreadable claims: {calls[1].text[:200]!r}")
                claims = C.dedupe_claims(parsed)
            return LlmWork({"n_sentences": len(sentences), "selected": selected, "claims": claims}, calls)

        done = self._stage("eval_claims", items, work, f"{select_prompt.version}+{split_prompt.version}",
                           {"max_tokens": max_tokens})
        rows = []
        for item_id, (result, error) in done.items():
            question_id, condition = item_id.split("|")
            claims = result["claims"] if result else None
            counts = cluster_counts(claims, ev.cluster_thresholds) if claims is not None else None
            rows.append({"question_id": question_id, "condition": condition,
                         "n_sentences": result["n_sentences"] if result else None,
                         "n_selected": len(result["selected"]) if result else None, "claims": claims,
                         "n_claims": len(claims) if claims is not None else None,
                         "cluster_thresholds": list(ev.cluster_thresholds),
                         "n_clusters": [counts[t] for t in ev.cluster_thresholds] if counts else None, "error": error})
        frame = pd.DataFrame(rows, columns=[f.name for f in T.SCHEMAS[T.EVAL_CLAIMS].fields])
        self.store.write(self.spark.createDataFrame(frame.astype(object).where(frame.notna(), None),
                                                    T.SCHEMAS[T.EVAL_CLAIMS]), T.EVAL_CLAIMS)
        return frame

    # ------------------------------------------------------------------ 5. comparisons and report

    def costs(self) -> list[Cost]:
        steps = {"eval_generation": "questions", "eval_judge": "judge", "eval_claims": "claims"}
        return [Cost(steps.get(u.stage, u.stage), u.items, u.calls, u.prompt_tokens, u.completion_tokens)
                for u in self.usage] + [self.answer_cost]

    def run(self) -> EvaluationResult:
        started = time.perf_counter()
        ev = self.ev
        questions = self.generate_questions()
        answers = self.answer(questions)
        judgements = self.judge(questions)
        claims = self.extract_claims(questions) if ev.claims else pd.DataFrame(columns=[f.name for f in T.SCHEMAS[T.EVAL_CLAIMS].fields])
        comparisons = compare_judgements(judgements, ev.alpha)
        means = None
        if ev.claims and claims["error"].isna().any():
            comparisons = pd.concat([comparisons, compare_claims(claims, self.pairs, ev.cluster_thresholds, ev.alpha)],
                                    ignore_index=True)
            means = condition_means(claims, ev.conditions, ev.cluster_thresholds)
        self.store.write(self.spark.createDataFrame(comparisons.astype(object).where(comparisons.notna(), None),
                                                    T.SCHEMAS[T.EVAL_COMPARISONS]), T.EVAL_COMPARISONS)
        report_dir = Path(ev.report_dir or f"{ev.root}/report")
        heatmap = write_heatmap(comparisons, ev.criteria, ev.conditions, report_dir / "win_rates.png")
        costs = self.costs()
        n_dropped = int(self.store.read(T.EVAL_QUESTIONS).where(F.col("duplicate_of").isNotNull()).count())
        markdown = render_markdown(
            conditions=ev.conditions, criteria=ev.criteria, n_questions=len(questions), n_dropped=n_dropped,
            repeats=ev.repeats, comparisons=comparisons, means=means, costs=costs,
            n_pairs=len(self.pairs), alpha=ev.alpha,
            failed_judgements=int(judgements["score_a"].isna().sum()), heatmap=heatmap.name)
        report = report_dir / "report.md"
        report.write_text(markdown, encoding="utf-8")
        return EvaluationResult(questions, answers, judgements, claims, comparisons, costs, self.usage, report, heatmap,
                                markdown, time.perf_counter() - started)


def run_evaluation(index: GraphRagIndex, cfg: Config | None = None) -> EvaluationResult:
    """The whole evaluation of ``index`` with ``cfg.evaluation`` (default: the index's config)."""
    return Evaluation(index, cfg).run()
