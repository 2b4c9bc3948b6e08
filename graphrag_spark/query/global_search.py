"""Global search (paper 3.1.6): map-reduce over the community reports of exactly one level.

Prepare: shuffle the level's reports (seeded) and pack them into token-sized batches, so
relevant reports spread across batches. Map: every batch, in parallel as a Spark job, yields
points with a helpfulness score 0-100; score-0 points are dropped. Reduce: points sorted by
score fill the reduce context up to its token budget and become the final answer, citing
``[Data: Reports (ids)]``. The offline method scores by lexical overlap and answers
extractively; the LLM method plugs other map and reduce functions into the same shape.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from graphrag_spark.errors import UserError
from graphrag_spark.index.extract_nlp import STOP_WORDS, split_sentences
from graphrag_spark.index.report_json import format_data_refs
from graphrag_spark.tokens import count_tokens

NO_ANSWER = "I am sorry, but the index holds no information relevant to this question."
_TERM = re.compile(r"[a-z0-9][a-z0-9'-]*")


@dataclass
class MapPoint:
    description: str
    score: float
    report_ids: list[int]


@dataclass
class SearchResult:
    answer: str
    method: str
    level: int | None
    context: pd.DataFrame = field(repr=False)
    points: pd.DataFrame = field(repr=False)
    context_units: int = 0
    context_tokens: int = 0
    llm_calls: int = 0
    latency_s: float = 0.0


def pack_by_tokens(items: list[dict], max_tokens: int, seed: int | None, text_key: str = "text") -> list[list[dict]]:
    """Shuffle (if seeded) then greedily fill batches up to ``max_tokens``; an oversized item gets a batch alone."""
    items = list(items)
    if seed is not None:
        random.Random(seed).shuffle(items)
    batches, current, used = [], [], 0
    for item in items:
        tokens = item.get("n_tokens") or count_tokens(item[text_key])
        if current and used + tokens > max_tokens:
            batches.append(current)
            current, used = [], 0
        current.append(item)
        used += tokens
    if current:
        batches.append(current)
    return batches


def _terms(text: str) -> list[str]:
    return [t for t in _TERM.findall(text.lower()) if t not in STOP_WORDS and len(t) > 2]


def lexical_map(question: str, batch: list[dict]) -> list[MapPoint]:
    """Offline map: per report, the sentences sharing most question terms; score 0-100 by term coverage."""
    wanted = set(_terms(question))
    points = []
    for report in batch:
        best: list[tuple[int, str]] = []
        for sentence in split_sentences(report["text"]):
            hits = len(wanted & set(_terms(sentence)))
            if hits:
                best.append((hits, sentence.strip()))
        if not best:
            continue
        best.sort(key=lambda pair: -pair[0])
        covered = len(wanted & set(_terms(report["text"])))
        score = round(100 * covered / max(1, len(wanted)), 1)
        text = " ".join(s for _, s in best[:2])
        points.append(MapPoint(f"{text} {format_data_refs({'Reports': [report['community']]})}", score, [report["community"]]))
    return points


def rating_map(batch: list[dict]) -> list[MapPoint]:
    """Offline fallback when no report shares a term with the question: the most significant communities."""
    return [MapPoint(f"{r['title']}: {r['summary']} {format_data_refs({'Reports': [r['community']]})}",
                     max(1.0, 10 * float(r.get("rating") or 0)), [r["community"]]) for r in batch]


def select_points(points: list[MapPoint], max_tokens: int) -> list[MapPoint]:
    """Reduce context: drop score 0, sort by score (desc), add until the token budget."""
    chosen, used = [], 0
    for point in sorted((p for p in points if p.score > 0), key=lambda p: (-p.score, p.report_ids)):
        tokens = count_tokens(point.description)
        if used + tokens > max_tokens:
            continue
        chosen.append(point)
        used += tokens
    return chosen


def extractive_reduce(question: str, points: list[MapPoint], max_points: int, fallback: bool) -> str:
    if not points:
        return NO_ANSWER
    lead = ("No community report shares terms with the question; the most significant communities are summarised instead."
            if fallback else f"The most relevant community reports for \"{question}\" say:")
    return lead + "\n\n" + "\n".join(f"- {p.description}" for p in points[:max_points])


def load_level_reports(spark: SparkSession, reports: DataFrame, level: int) -> list[dict]:
    """Reports of exactly one level; a level finer than the deepest uses the projected communities."""
    levels = sorted(r[0] for r in reports.select("level").distinct().collect())
    if not levels:
        raise UserError("The index has no community reports; run jobs/index.py first.")
    use = min(level, levels[-1])
    rows = reports.where(F.col("level") == use).select("community", "title", "summary", "rating", "full_content").collect()
    return [{"community": r.community, "title": r.title, "summary": r.summary, "rating": r.rating,
             "text": r.full_content, "level": use} for r in rows]


def run_map(spark: SparkSession, batches: list[list[dict]], map_fn: Callable[[list[dict]], list[MapPoint]]) -> list[MapPoint]:
    """The map step as a Spark job: one row per batch, map_fn in executors."""
    if not batches:
        return []
    frame = spark.createDataFrame(pd.DataFrame({"batch": [json.dumps(b) for b in batches]}))
    frame = frame.repartition(min(len(batches), spark.sparkContext.defaultParallelism))

    def run(parts: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for part in parts:
            rows = [(p.description, p.score, p.report_ids) for b in part["batch"] for p in map_fn(json.loads(b))]
            yield pd.DataFrame(rows, columns=["description", "score", "report_ids"], dtype=object)

    out = frame.mapInPandas(run, "description string, score double, report_ids array<int>").collect()
    return [MapPoint(r.description, r.score, list(r.report_ids)) for r in out]


def offline_global_search(spark: SparkSession, reports: DataFrame, question: str, level: int,
                          batch_tokens: int, reduce_tokens: int, seed: int, max_points: int) -> SearchResult:
    started = time.perf_counter()
    level_reports = load_level_reports(spark, reports, level)
    batches = pack_by_tokens(level_reports, batch_tokens, seed)
    points = run_map(spark, batches, lambda batch: lexical_map(question, batch))
    fallback = not points
    if fallback and _terms(question):
        points = run_map(spark, batches, rating_map)
    chosen = select_points(points, reduce_tokens)
    answer = extractive_reduce(question, chosen, max_points, fallback)
    context = pd.DataFrame([{"community": r["community"], "title": r["title"], "level": r["level"],
                             "tokens": count_tokens(r["text"])} for r in level_reports])
    scores = pd.DataFrame([{"description": p.description, "score": p.score, "report_ids": p.report_ids} for p in points])
    return SearchResult(answer=answer, method="global", level=level_reports[0]["level"] if level_reports else level,
                        context=context, points=scores, context_units=len(level_reports),
                        context_tokens=int(context["tokens"].sum()) if len(context) else 0,
                        latency_s=time.perf_counter() - started)
