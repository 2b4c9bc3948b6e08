"""TS (the paper's text-summarisation condition): global search's map-reduce over the source text units.

Same shuffle, packing, map and reduce prompts and budgets as C0..Cn, but the context units are
the text units themselves, shown as a ``Sources`` table and cited as ``[Data: Sources (ids)]``.
A source id is the unit's position (from 1) in (document, chunk) order, so it is the same for
every question; ``context`` maps it to the text unit id.
"""

from __future__ import annotations

import time

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from graphrag_spark.config import Config
from graphrag_spark.query.global_search import SearchResult, Units, map_reduce, to_results


def load_text_units(text_units: DataFrame) -> list[dict]:
    rows = text_units.select("id", "document_id", "chunk_index", "text", "n_tokens").orderBy("document_id", "chunk_index").collect()
    return [{"short_id": i, "id": r.id, "document_id": r.document_id, "text": r.text, "n_tokens": r.n_tokens}
            for i, r in enumerate(rows, 1)]


def source_units(items: list[dict]) -> Units:
    """TS: text units, shown and cited as ``Sources``."""
    return Units("Sources", "short_id", ("text",), items, described_as="source text passages")


def text_summary_search(spark: SparkSession, text_units: DataFrame, questions: list[str], cfg: Config) -> list[SearchResult]:
    started = time.perf_counter()
    items = load_text_units(text_units)
    units = source_units(items)
    answers = map_reduce(spark, questions, units, cfg)
    context = pd.DataFrame([{"short_id": u["short_id"], "id": u["id"], "document_id": u["document_id"], "tokens": u["n_tokens"]}
                            for u in items], columns=["short_id", "id", "document_id", "tokens"])
    return to_results(answers, units, "ts", None, context, started)
