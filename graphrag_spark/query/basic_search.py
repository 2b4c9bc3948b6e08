"""SS (the paper's vector-RAG condition): the text units most similar to the question fill the context
up to ``query.context_tokens``, then one answer (the ``basic_search`` prompt, or offline extractive).

Sources are numbered 1..n in similarity order within each answer's context; ``context`` maps
those ids to text unit ids, with their similarity.
"""

from __future__ import annotations

import time

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from graphrag_spark.config import Config
from graphrag_spark.embeddings import Embedder
from graphrag_spark.query.answers import answer_all, single_context_results
from graphrag_spark.query.context import fill_table
from graphrag_spark.query.global_search import SearchResult
from graphrag_spark.query.retrieval import nearest
from graphrag_spark.query.vectors import VectorIndex

CONTEXT_COLUMNS = ["short_id", "id", "similarity"]


def basic_context(ranked: list[tuple[str, float]], texts: dict[str, str], max_tokens: int) -> tuple[str, pd.DataFrame, int]:
    """Pure: the ``Sources`` table of the ranked units that fit; returns (text, context rows, tokens)."""
    present = [(uid, score) for uid, score in ranked if uid in texts]
    text, kept, tokens = fill_table("Sources", ["id", "text"], [[i, texts[uid]] for i, (uid, _) in enumerate(present, 1)], max_tokens)
    frame = pd.DataFrame([[i, uid, score] for i, (uid, score) in enumerate(present[:kept], 1)], columns=CONTEXT_COLUMNS)
    return (text, frame, tokens) if kept else ("", frame, 0)


def basic_search(spark: SparkSession, text_units: DataFrame, vectors: VectorIndex, embedder: Embedder,
                 questions: list[str], cfg: Config) -> list[SearchResult]:
    started = time.perf_counter()
    q = cfg.query
    ranked = nearest(vectors, embedder, questions, q.basic_top_k)
    wanted = sorted({uid for row in ranked for uid, _ in row})
    texts = {r.id: r.text for r in text_units.where(F.col("id").isin(wanted)).select("id", "text").collect()} if wanted else {}
    contexts = [basic_context(row, texts, q.context_tokens) for row in ranked]
    passages = [[("Sources", sid, texts[uid]) for sid, uid in zip(frame["short_id"], frame["id"])] for _, frame, _ in contexts]
    answers = answer_all(spark, "basic_search", questions, [text for text, _, _ in contexts], passages, cfg,
                         lead="The passages most similar to the question say:")
    return single_context_results("basic", None, answers, contexts, embedder, started)
