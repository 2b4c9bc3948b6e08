"""Local search (the paper's future work; the reference implementation's local search): questions about
specific entities, answered from the graph around the entities most similar to the question.

The question is matched to entity embeddings (``title: description``); the matched entities,
their relationships and claims, the reports of their communities (at one level) and the text
units they were extracted from fill one context with fixed shares of ``query.context_tokens``:
``local_text_unit_prop`` for text units, ``local_community_prop`` for reports, the rest for
entities, then relationships, then claims. Rows are ranked so the best-matched entities' data
comes first; a section stops at the first row that does not fit its share.

Data for all questions of a batch is fetched with one Spark job per table (filtered on the
union of matched entities); building each context is a pure function over pandas frames.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.config import Config, QueryConfig
from graphrag_spark.embeddings import Embedder
from graphrag_spark.errors import UserError
from graphrag_spark.query.answers import answer_all, single_context_results
from graphrag_spark.query.context import fill_table
from graphrag_spark.query.global_search import SearchResult
from graphrag_spark.query.retrieval import nearest
from graphrag_spark.query.vectors import VectorIndex

# Text units fetched per question: far more than a text-unit share of the context can hold.
_MAX_UNIT_CANDIDATES = 50
CONTEXT_COLUMNS = ["table", "id", "name", "score", "text_unit_id"]


@dataclass
class LocalData:
    """What local search may put in a context, for the matched entities of a batch of questions."""

    entities: pd.DataFrame  # id, human_readable_id, title, description, degree, text_unit_ids
    relationships: pd.DataFrame  # human_readable_id, source, target, description, weight
    claims: pd.DataFrame  # human_readable_id, subject, object, type, status, description
    memberships: pd.DataFrame  # community, entity_id (at the chosen level)
    reports: pd.DataFrame  # community, title, rating, summary
    text_units: pd.DataFrame  # id, text


@dataclass
class LocalContext:
    text: str
    frame: pd.DataFrame
    tokens: int
    passages: list[tuple[str, object, str]]  # (table, id, text) of every row, for the offline answer


def _as_list(value) -> list:
    return [] if value is None else list(value)


def unit_candidates(matches: list[tuple[str, float]], entities: pd.DataFrame, limit: int = _MAX_UNIT_CANDIDATES) -> list[str]:
    """Text units of the matched entities, best-matched entity first, at most ``limit``."""
    found: dict[str, None] = {}
    by_id = entities.set_index("id")
    for entity_id, _ in matches:
        if entity_id in by_id.index:
            for unit in _as_list(by_id.at[entity_id, "text_unit_ids"]):
                found.setdefault(unit)
                if len(found) >= limit:
                    return list(found)
    return list(found)


def build_local_context(matches: list[tuple[str, float]], data: LocalData, q: QueryConfig) -> LocalContext:
    """Pure: the budgeted context for one question's matched entities ``(entity id, similarity)``, best first."""
    unit_budget = int(q.context_tokens * q.local_text_unit_prop)
    report_budget = int(q.context_tokens * q.local_community_prop)
    graph_budget = q.context_tokens - unit_budget - report_budget
    known = set(data.entities["id"])
    matched = [(eid, sim) for eid, sim in matches if eid in known]
    sections, rows, passages, used = [], [], [], 0

    def add(table: str, text: str, kept: list[tuple[object, str, float | None, str | None, str]], tokens: int) -> None:
        nonlocal used
        if kept:  # an empty table is left out, so no matched entity means no context at all
            sections.append(text)
            used += tokens
        for row_id, name, score, unit_id, passage in kept:
            rows.append([table, row_id, name, score, unit_id])
            passages.append((table, row_id, passage))

    entities = list(data.entities.set_index("id").loc[[eid for eid, _ in matched]].reset_index().itertuples())
    text, n, tokens = fill_table("Entities", ["id", "entity", "description", "number of relationships"],
                                 [[e.human_readable_id, e.title, e.description, e.degree] for e in entities], graph_budget)
    shown = entities[:n]
    add("Entities", text, [(e.human_readable_id, e.title, sim, None, f"{e.title}: {e.description}")
                           for e, (_, sim) in zip(shown, matched)], tokens)
    rank = {e.title: i for i, e in enumerate(shown)}
    graph_left = graph_budget - tokens

    rels = data.relationships[data.relationships["source"].isin(rank) | data.relationships["target"].isin(rank)]
    rels = sorted(rels.itertuples(), key=lambda r: (not (r.source in rank and r.target in rank),
                                                    min(rank.get(r.source, len(rank)), rank.get(r.target, len(rank))),
                                                    -r.weight, r.human_readable_id))
    text, n, tokens = fill_table("Relationships", ["id", "source", "target", "description", "weight"],
                                 [[r.human_readable_id, r.source, r.target, r.description, r.weight] for r in rels], graph_left)
    add("Relationships", text, [(r.human_readable_id, f"{r.source} -> {r.target}", None, None, r.description) for r in rels[:n]], tokens)
    graph_left -= tokens

    claims = data.claims[data.claims["subject"].isin(rank) | data.claims["object"].isin(rank)]
    claims = sorted(claims.itertuples(), key=lambda c: (rank.get(c.subject, len(rank)), c.human_readable_id))
    text, n, tokens = fill_table("Claims", ["id", "entity", "object", "type", "status", "description"],
                                 [[c.human_readable_id, c.subject, c.object, c.type, c.status, c.description] for c in claims], graph_left)
    add("Claims", text, [(c.human_readable_id, c.subject, None, None, c.description) for c in claims[:n]], tokens)

    counts = data.memberships[data.memberships["entity_id"].isin([e.id for e in shown])].groupby("community").size()
    reports = data.reports[data.reports["community"].isin(counts.index)]
    reports = sorted(reports.itertuples(), key=lambda r: (-counts[r.community], -(r.rating or 0), r.community))
    text, n, tokens = fill_table("Reports", ["id", "title", "content"], [[r.community, r.title, r.summary] for r in reports], report_budget)
    add("Reports", text, [(r.community, r.title, float(counts[r.community]), None, r.summary) for r in reports[:n]], tokens)

    texts = dict(zip(data.text_units["id"], data.text_units["text"]))
    first_seen: dict[str, tuple[int, int]] = {}
    for position, e in enumerate(shown):
        for unit in _as_list(e.text_unit_ids):
            if unit in texts:
                first, mentions = first_seen.get(unit, (position, 0))
                first_seen[unit] = (first, mentions + 1)
    units = sorted(first_seen, key=lambda u: (first_seen[u][0], -first_seen[u][1], u))
    text, n, tokens = fill_table("Sources", ["id", "text"], [[i, texts[u]] for i, u in enumerate(units, 1)], unit_budget)
    add("Sources", text, [(i, u, float(first_seen[u][1]), u, texts[u]) for i, u in enumerate(units[:n], 1)], tokens)

    return LocalContext("".join(sections), pd.DataFrame(rows, columns=CONTEXT_COLUMNS), used, passages)


def gather_local_data(spark: SparkSession, store: T.TableStore, matches: list[list[tuple[str, float]]], level: int) -> tuple[LocalData, int]:
    """Everything the questions' contexts may use (one filtered read per table) and the level used."""
    entity_ids = sorted({eid for row in matches for eid, _ in row})
    entities = (store.read(T.ENTITIES).where(F.col("id").isin(entity_ids))
                .select("id", "human_readable_id", "title", "description", "degree", "text_unit_ids").toPandas())
    titles = entities["title"].tolist()
    relationships = (store.read(T.RELATIONSHIPS).where(F.col("source").isin(titles) | F.col("target").isin(titles))
                     .select("human_readable_id", "source", "target", "description", "weight").toPandas())
    claims = (store.read_or_empty(T.CLAIMS).where(F.col("subject").isin(titles) | F.col("object").isin(titles))
              .select("human_readable_id", "subject", "object", "type", "status", "description").toPandas())
    communities = store.read(T.COMMUNITIES)
    levels = sorted(r[0] for r in communities.select("level").distinct().collect())
    use = min(level, levels[-1]) if levels else level
    memberships = (communities.where(F.col("level") == use).select("community", F.explode("entity_ids").alias("entity_id"))
                   .where(F.col("entity_id").isin(entity_ids)).toPandas())
    reports = (store.read(T.COMMUNITY_REPORTS).where((F.col("level") == use) & F.col("community").isin(sorted(set(memberships["community"].tolist()))))
               .select("community", "title", "rating", "summary").toPandas())
    unit_ids = sorted({u for row in matches for u in unit_candidates(row, entities)})
    text_units = store.read(T.TEXT_UNITS).where(F.col("id").isin(unit_ids)).select("id", "text").toPandas()
    return LocalData(entities, relationships, claims, memberships, reports, text_units), use


def local_search(spark: SparkSession, store: T.TableStore, entity_vectors: VectorIndex, embedder: Embedder,
                 questions: list[str], cfg: Config, level: int | None = None) -> list[SearchResult]:
    started = time.perf_counter()
    q = cfg.query
    level = q.level if level is None else level
    if level < 0:
        raise UserError(f"Level {level} does not exist; community levels start at 0 (C0 = the root communities).")
    matches = nearest(entity_vectors, embedder, questions, q.local_top_k_entities)
    data, used_level = gather_local_data(spark, store, matches, level)
    contexts = [build_local_context(row, data, q) for row in matches]
    answers = answer_all(spark, "local_search", questions, [c.text for c in contexts], [c.passages for c in contexts], cfg,
                         lead="What the index records about the entities closest to the question:")
    return single_context_results("local", used_level, answers, [(c.text, c.frame, c.tokens) for c in contexts],
                                  embedder, started)
