"""Global search (paper 3.1.6): map-reduce over the community reports of exactly one level.

Prepare: shuffle the context units (seeded) and pack them into token-sized batches, so relevant
units spread across batches. Map: every (question, batch) pair, in parallel as one Spark job,
yields points with a helpfulness score 0-100. Reduce: score-0 points are dropped, the rest,
sorted by score, fill the reduce context up to its token budget and become the final answer,
citing ``[Data: Reports (ids)]``; with no point left the answer says the data cannot answer.

The shape is shared: TS (``text_summary``) runs it over shuffled text units, and two pairs of
map and reduce functions plug into it: offline (lexical scores, extractive answer, no LLM) and
LLM (the ``global_map`` / ``global_reduce`` prompts, told which units they read and which table
name to cite: ``Reports`` for C0..Cn, ``Sources`` for TS). A map answer that is not the requested
JSON is counted as malformed (its salvageable points still count), never silently dropped.
Batches and the reduce context are counted as rendered (headers, ids, titles included).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.compat import llm_tasks
from graphrag_spark.config import Config, QueryConfig
from graphrag_spark.errors import UserError
from graphrag_spark.index.extract_nlp import split_sentences
from graphrag_spark.index.report_json import format_data_refs
from graphrag_spark.llm.client import CallResult
from graphrag_spark.prompts import Prompt, load_prompt
from graphrag_spark.query.context import NO_ANSWER, csv_line, format_table, terms
from graphrag_spark.query.executors import chat_calls, chat_in_executors, decode_call
from graphrag_spark.tokens import count_tokens

log = logging.getLogger(__name__)

_DATA_BLOCK = re.compile(r"\[Data:([^\[\]]*)\]")
_POINT = re.compile(r'"description"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"score"\s*:\s*"?(-?\d+(?:\.\d+)?)')
_FENCE = re.compile(r"```[a-zA-Z]*\s*(.*?)(?:```|\Z)", re.S)


@dataclass
class MapPoint:
    description: str
    score: float
    report_ids: list[int]  # the context units the point cites: reports, or text units for TS
    batch: int = -1


@dataclass
class SearchResult:
    """One answered question. ``context``: the units the method looked at (with their scores);
    ``points``: the map points of a map-reduce (``selected`` = went into the reduce context);
    ``context_text``: the single context window of basic and local search, as the LLM sees it."""

    answer: str
    method: str
    level: int | None
    context: pd.DataFrame = field(repr=False)
    points: pd.DataFrame = field(repr=False)
    context_units: int = 0
    context_tokens: int = 0
    llm_calls: int = 0
    latency_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failed_llm_calls: int = 0
    malformed_map_answers: int = 0
    embedding_calls: int = 0
    context_text: str = field(default="", repr=False)

    def as_spark(self, spark: SparkSession, table: str = "context") -> DataFrame:
        """``context`` or ``points`` as a Spark DataFrame (for ``display`` in a notebook)."""
        frame = getattr(self, table)
        if not len(frame):
            return T.local_frame(spark, [], ", ".join(f"`{c}` string" for c in frame.columns))
        return spark.createDataFrame(frame)


@dataclass(frozen=True)
class Units:
    """The context units one map-reduce runs over, and how they are shown and cited."""

    kind: str  # table name in prompts and citations: "Reports" or "Sources"
    id_key: str  # item key holding the cited id
    columns: tuple[str, ...]  # item keys shown in the map context after the id; "text" is the content
    items: list[dict]  # each with id_key, the columns, "text" and "n_tokens"
    rating_fallback: bool = False  # offline: with no lexical match, summarise the highest-rated reports
    described_as: str = "community reports"  # what the map and reduce prompts call the units


def report_units(items: list[dict]) -> Units:
    """C0..Cn: the reports of one level, cited as ``Reports``."""
    return Units("Reports", "community", ("title", "text"), items, rating_fallback=True)


@dataclass
class MapReduceAnswer:
    answer: str
    points: list[MapPoint]
    selected: list[MapPoint]
    calls: list[CallResult] = field(default_factory=list)
    malformed: int = 0


def pack_by_tokens(units: Units, max_tokens: int, seed: int | None) -> list[list[dict]]:
    """Shuffle (if seeded) then greedily fill batches while the rendered map table fits ``max_tokens``.

    A batch's cost is counted on what the map prompt shows: the table header line, the column
    line and every unit's CSV row with its id and title, not just the unit's text. Rows start
    with the id and end with a newline, so the tokenizer never merges across them and the sum
    of the parts is the count of the rendered table. An oversized unit gets a batch alone.
    """
    items = list(units.items)
    if seed is not None:
        random.Random(seed).shuffle(items)
    header = count_tokens(map_context([], units))
    batches, current, used = [], [], header
    for item in items:
        tokens = count_tokens(csv_line(map_row(item, units)))
        if current and used + tokens > max_tokens:
            batches.append(current)
            current, used = [], header
        current.append(item)
        used += tokens
    if current:
        batches.append(current)
    return batches


def lexical_map(question: str, batch: list[dict], kind: str = "Reports", id_key: str = "community") -> list[MapPoint]:
    """Offline map: per unit, the sentences sharing most question terms; score 0-100 by term coverage."""
    wanted = set(terms(question))
    points = []
    for unit in batch:
        best: list[tuple[int, str]] = []
        for sentence in split_sentences(unit["text"]):
            hits = len(wanted & set(terms(sentence)))
            if hits:
                best.append((hits, sentence.strip()))
        if not best:
            continue
        best.sort(key=lambda pair: -pair[0])
        covered = len(wanted & set(terms(unit["text"])))
        score = round(100 * covered / max(1, len(wanted)), 1)
        text = " ".join(s for _, s in best[:2])
        points.append(MapPoint(f"{text} {format_data_refs({kind: [unit[id_key]]})}", score, [unit[id_key]]))
    return points


def rating_map(batch: list[dict]) -> list[MapPoint]:
    """Offline fallback when no report shares a term with the question: the most significant communities."""
    return [MapPoint(f"{r['title']}: {r['summary']} {format_data_refs({'Reports': [r['community']]})}",
                     max(1.0, 10 * float(r.get("rating") or 0)), [r["community"]]) for r in batch]


def select_points(points: list[MapPoint], max_tokens: int) -> list[MapPoint]:
    """Reduce context (paper: "added to a new context window until the token limit is reached"):
    drop score 0, sort by score (desc), add points until the next one's rendered block (analyst
    header, score line, description) does not fit. Blocks are counted as ``reduce_context``
    renders them and the sum of their counts is the count of the whole context."""
    chosen, used = [], 0
    for point in sorted((p for p in points if p.score > 0), key=lambda p: (-p.score, p.report_ids)):
        tokens = count_tokens(_analyst_block(len(chosen) + 1, point))
        if used + tokens > max_tokens:
            break
        chosen.append(point)
        used += tokens
    return chosen


def extractive_reduce(question: str, points: list[MapPoint], max_points: int, fallback: bool,
                      units_name: str = "community reports") -> str:
    if not points:
        return NO_ANSWER
    lead = ("No community report shares terms with the question; the most significant communities are summarised instead."
            if fallback else f"The most relevant {units_name} for \"{question}\" say:")
    return lead + "\n\n" + "\n".join(f"- {p.description}" for p in points[:max_points])


def map_messages(prompt: Prompt, question: str, batch: list[dict], units: Units) -> list[dict[str, str]]:
    """The map call of one batch (instructions as the system message, question and table as the user
    message), naming the units and the table they are cited by (Reports or Sources)."""
    return prompt.messages(question=question, context_data=map_context(batch, units), kind=units.kind,
                           units=units.described_as)


def reduce_messages(prompt: Prompt, question: str, points: list[MapPoint], units: Units,
                    response_type: str) -> list[dict[str, str]]:
    return prompt.messages(question=question, report_data=reduce_context(points), response_type=response_type,
                           kind=units.kind)


def map_row(unit: dict, units: Units) -> list:
    return [unit[units.id_key], *(unit[c] for c in units.columns)]


def map_context(batch: list[dict], units: Units) -> str:
    return format_table(units.kind, ["id", *units.columns], [map_row(unit, units) for unit in batch])


def cited_ids(text: str, kind: str) -> list[int]:
    """Ids of ``kind`` in every ``[Data: ...]`` block of ``text`` ("+more" and non-numbers skipped)."""
    ids = []
    for block in _DATA_BLOCK.findall(text):
        for match in re.finditer(rf"{kind}\s*\(([^()]*)\)", block):
            ids += [int(i) for i in (s.strip() for s in match.group(1).split(",")) if i.isdigit()]
    return list(dict.fromkeys(ids))


def parse_map_answer(text: str, kind: str) -> tuple[list[MapPoint], bool]:
    """Points of a map answer ``{"points": [{"description", "score"}]}`` and whether it was malformed.

    A malformed answer (no such JSON object: prose, cut off at the token limit) still yields the
    complete ``description``/``score`` pairs found in it.
    """
    fenced = _FENCE.search(text)
    body = fenced.group(1) if fenced else text
    for start in [m.start() for m in re.finditer(r"\{", body)][:8]:
        try:
            obj, _ = json.JSONDecoder().raw_decode(body, start)
        except ValueError:
            continue
        if isinstance(obj, dict) and isinstance(obj.get("points"), list):
            points, malformed = [], False
            for item in obj["points"]:
                try:
                    description, score = str(item["description"]), float(item["score"])
                except (KeyError, TypeError, ValueError):
                    malformed = True
                    continue
                points.append(MapPoint(description, min(100.0, max(0.0, score)), cited_ids(description, kind)))
            return points, malformed
    salvaged = [MapPoint(json.loads(f'"{d}"'), min(100.0, max(0.0, float(s))), cited_ids(d, kind))
                for d, s in _POINT.findall(body)]
    return salvaged, True


def _analyst_block(position: int, point: MapPoint) -> str:
    # Ends with a blank line and the next block starts with "-": no token spans two blocks.
    return f"----Analyst {position}----\nImportance Score: {point.score:g}\n{point.description.strip()}\n\n"


def reduce_context(points: list[MapPoint]) -> str:
    return "".join(_analyst_block(i, p) for i, p in enumerate(points, 1))


def map_reduce(spark: SparkSession, questions: list[str], units: Units, cfg: Config) -> list[MapReduceAnswer]:
    """Answer every question over the same packed batches; all map calls of all questions form one Spark job."""
    q = cfg.query
    batches = pack_by_tokens(units, q.batch_tokens, q.seed)
    pairs = [(qi, bi) for qi in range(len(questions)) for bi in range(len(batches))]
    shape = dataclasses.replace(units, items=[])  # what executor closures need; the items travel as batches
    if q.llm:
        return _llm_map_reduce(spark, questions, shape, batches, pairs, cfg)
    return _offline_map_reduce(spark, questions, shape, batches, pairs, q)


MapFn = Callable[[list[tuple[int, list[dict]]]], list[str]]


def _run_map(spark: SparkSession, batches: list[list[dict]], n_questions: int, fn: MapFn) -> list[str]:
    """``fn`` over every (question, batch) pair in executors, as one Spark job; results in (question,
    batch) order. The map runs over a DataFrame of the batches crossed with the question numbers on
    the cluster, so each batch travels once and no broadcast is needed (none exists under Spark Connect)."""
    if not batches or not n_questions:
        return []
    batch_rows = spark.createDataFrame(pd.DataFrame({"batch": range(len(batches)),
                                                     "units": [json.dumps(batch) for batch in batches]}))
    pairs = spark.range(n_questions).withColumnRenamed("id", "question").crossJoin(batch_rows)

    def run(parts: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for part in parts:
            work = [(int(qi), json.loads(units)) for qi, units in zip(part["question"], part["units"])]
            yield pd.DataFrame({"question": part["question"], "batch": part["batch"], "result": fn(work)})

    rows = (pairs.repartition(llm_tasks(spark, n_questions * len(batches)))
            .mapInPandas(run, "question long, batch long, result string").collect())
    return [row.result for row in sorted(rows, key=lambda row: (row.question, row.batch))]


def _points_json(points: list[MapPoint]) -> str:
    return json.dumps([[p.description, p.score, p.report_ids] for p in points])


def _offline_map_reduce(spark: SparkSession, questions: list[str], units: Units, batches: list[list[dict]],
                        pairs: list[tuple[int, int]], q: QueryConfig) -> list[MapReduceAnswer]:
    def lexical(work):
        return [_points_json(lexical_map(questions[qi], batch, units.kind, units.id_key)) for qi, batch in work]

    points: list[list[MapPoint]] = [[] for _ in questions]
    for (qi, bi), found in zip(pairs, _run_map(spark, batches, len(questions), lexical)):
        points[qi] += [MapPoint(d, s, list(ids), bi) for d, s, ids in json.loads(found)]
    fallback = [not found and bool(terms(question)) and units.rating_fallback for found, question in zip(points, questions)]
    if any(fallback):
        rated_pairs = [(0, bi) for bi in range(len(batches))]
        rated = _run_map(spark, batches, 1, lambda work: [_points_json(rating_map(batch)) for _, batch in work])
        rated_points = [MapPoint(d, s, list(ids), bi) for (_, bi), found in zip(rated_pairs, rated) for d, s, ids in json.loads(found)]
        points = [rated_points if use else found for use, found in zip(fallback, points)]
    answers = []
    for question, found, used_fallback in zip(questions, points, fallback):
        selected = select_points(found, q.reduce_tokens)
        answer = extractive_reduce(question, selected, q.max_answer_points, used_fallback,
                                   units.described_as)
        answers.append(MapReduceAnswer(answer, found, selected))
    return answers


def _llm_map_reduce(spark: SparkSession, questions: list[str], units: Units, batches: list[list[dict]],
                    pairs: list[tuple[int, int]], cfg: Config) -> list[MapReduceAnswer]:
    q, chat = cfg.query, cfg.llm.chat
    map_prompt, reduce_prompt = load_prompt("global_map"), load_prompt("global_reduce")
    share = 1.0 / llm_tasks(spark, len(pairs))

    def call_map(work):
        prompts = [map_messages(map_prompt, questions[qi], batch, units) for qi, batch in work]
        return chat_calls(prompts, chat, share, stage="global_map", max_tokens=q.map_max_tokens, json_mode=True,
                          prompt_version=map_prompt.version, max_in_flight=cfg.llm.max_in_flight)

    answers = [MapReduceAnswer("", [], []) for _ in questions]
    for (qi, bi), raw in zip(pairs, _run_map(spark, batches, len(questions), call_map)):
        result = decode_call(raw)
        answer = answers[qi]
        answer.calls.append(result)
        if not result.ok:
            continue
        found, malformed = parse_map_answer(result.text, units.kind)
        if malformed:
            answer.malformed += 1
            log.warning("Malformed map answer (question %d, batch %d): %d points salvaged", qi, bi, len(found))
        answer.points += [MapPoint(p.description, p.score, p.report_ids, bi) for p in found]
    for answer in answers:
        answer.selected = select_points(answer.points, q.reduce_tokens)
    to_reduce = [i for i, answer in enumerate(answers) if answer.selected]
    prompts = [reduce_messages(reduce_prompt, questions[i], answers[i].selected, units, q.response_type)
               for i in to_reduce]
    reduced = chat_in_executors(spark, prompts, chat, stage="global_reduce", max_tokens=q.answer_max_tokens,
                                prompt_version=reduce_prompt.version, max_in_flight=cfg.llm.max_in_flight)
    for i, result in zip(to_reduce, reduced):
        answers[i].calls.append(result)
        answers[i].answer = result.text if result.ok else f"The answer could not be generated: {result.error}"
    for answer in answers:
        failed = [c for c in answer.calls if not c.ok]
        if answer.selected:
            continue
        if failed and len(failed) == len(answer.calls):
            answer.answer = f"The answer could not be generated: all {len(failed)} map calls failed ({failed[0].error})."
        else:
            answer.answer = NO_ANSWER
    return answers


def load_level_reports(spark: SparkSession, reports: DataFrame, level: int) -> list[dict]:
    """Reports of exactly one level; a level finer than the deepest uses the deepest, where the
    communities of coarser levels without sub-communities are projected down."""
    if level < 0:
        raise UserError(f"Level {level} does not exist; community levels start at 0 (C0 = the root communities).")
    levels = sorted(r[0] for r in reports.select("level").distinct().collect())
    if not levels:
        raise UserError("The index has no community reports; run jobs/index.py first.")
    use = min(level, levels[-1])
    rows = reports.where(F.col("level") == use).select("community", "title", "summary", "rating", "full_content").collect()
    return [{"community": r.community, "title": r.title, "summary": r.summary, "rating": r.rating,
             "text": r.full_content, "n_tokens": count_tokens(r.full_content or ""), "level": use} for r in rows]


def to_results(answers: list[MapReduceAnswer], units: Units, method: str, level: int | None,
               context: pd.DataFrame, started: float) -> list[SearchResult]:
    """SearchResults of a map-reduce; ``context`` gains each unit's best map score for that question."""
    latency = (time.perf_counter() - started) / max(1, len(answers))
    results = []
    for answer in answers:
        chosen = {id(p) for p in answer.selected}
        points = pd.DataFrame([{"description": p.description, "score": p.score, "report_ids": p.report_ids,
                                "batch": p.batch, "selected": id(p) in chosen} for p in answer.points],
                              columns=["description", "score", "report_ids", "batch", "selected"])
        best: dict[int, float] = {}
        for p in answer.points:
            for unit in p.report_ids:
                best[unit] = max(best.get(unit, 0.0), p.score)
        scored = context.assign(score=context[units.id_key].map(lambda u: best.get(u, 0.0)))
        calls = answer.calls
        results.append(SearchResult(
            answer=answer.answer, method=method, level=level, context=scored, points=points,
            context_units=len(units.items), context_tokens=sum(u["n_tokens"] for u in units.items),
            llm_calls=len(calls), latency_s=latency,
            prompt_tokens=sum(c.prompt_tokens for c in calls), completion_tokens=sum(c.completion_tokens for c in calls),
            failed_llm_calls=sum(not c.ok for c in calls), malformed_map_answers=answer.malformed))
    return results


def global_search(spark: SparkSession, reports: DataFrame, questions: list[str], cfg: Config,
                  level: int | None = None) -> list[SearchResult]:
    """Conditions C0..Cn: map-reduce over the reports of one level (default ``query.level``)."""
    started = time.perf_counter()
    items = load_level_reports(spark, reports, cfg.query.level if level is None else level)
    used_level = items[0]["level"] if items else level
    units = report_units(items)
    answers = map_reduce(spark, questions, units, cfg)
    context = pd.DataFrame([{"community": r["community"], "title": r["title"], "level": r["level"], "rating": r["rating"],
                             "tokens": r["n_tokens"]} for r in items],
                           columns=["community", "title", "level", "rating", "tokens"])
    return to_results(answers, units, "global", used_level, context, started)


def offline_global_search(spark: SparkSession, reports: DataFrame, question: str, level: int,
                          batch_tokens: int, reduce_tokens: int, seed: int, max_points: int) -> SearchResult:
    """One question, offline (no LLM), with the map-reduce settings given explicitly."""
    cfg = Config(query=QueryConfig(level=level, batch_tokens=batch_tokens, reduce_tokens=reduce_tokens, seed=seed,
                                   max_answer_points=max_points))
    return global_search(spark, reports, [question], cfg)[0]
