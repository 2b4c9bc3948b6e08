"""Stage 2, text units: token windows over each document, cut in executors with tiktoken.

Paper defaults: 600-token windows with 100 tokens of overlap. Each window is decoded
back to text; a window boundary inside a multi-byte character is repaired by the
decoder rather than producing invalid UTF-8.
"""

from __future__ import annotations

from typing import Iterator

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from graphrag_spark.config import ChunkingConfig
from graphrag_spark.ids import content_id
from graphrag_spark.tokens import get_encoding

TEXT_UNIT_COLUMNS = ["id", "document_id", "chunk_index", "text", "n_tokens"]
TEXT_UNIT_SCHEMA = "id string, document_id string, chunk_index int, text string, n_tokens int"


def token_windows(n_tokens: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """[start, end) windows of ``size`` tokens stepping by ``size - overlap``; the last one ends at n."""
    if n_tokens == 0:
        return []
    step = size - overlap
    windows = []
    start = 0
    while True:
        end = min(start + size, n_tokens)
        windows.append((start, end))
        if end == n_tokens:
            return windows
        start += step


def chunk_text(text: str, size: int, overlap: int, encoding: str = "cl100k_base") -> list[tuple[str, int]]:
    """(chunk text, token count) for each window of ``text``."""
    enc = get_encoding(encoding)
    tokens = enc.encode(text, disallowed_special=())
    return [(enc.decode(tokens[start:end]), end - start) for start, end in token_windows(len(tokens), size, overlap)]


def chunk_documents(documents: pd.DataFrame, cfg: ChunkingConfig) -> pd.DataFrame:
    """Pure: a frame of (id, text) documents -> text unit rows."""
    rows = []
    for document_id, text in zip(documents["id"], documents["text"]):
        for index, (chunk, n_tokens) in enumerate(chunk_text(text, cfg.size, cfg.overlap, cfg.encoding)):
            rows.append((content_id(document_id, index, chunk), document_id, index, chunk, n_tokens))
    return pd.DataFrame(rows, columns=TEXT_UNIT_COLUMNS).astype({"chunk_index": "int32", "n_tokens": "int32"})


# A full build whose documents hold at most this many characters is cut on the driver: one collect of
# their text instead of a Python job in the executors (about 2 s of a small index's critical path on 2
# cores, before its first LLM call), at a driver memory cost of a few times the input's size.
DRIVER_CHUNK_CHARS = 4_000_000


def text_units_on_driver(spark: SparkSession, documents: pd.DataFrame, cfg: ChunkingConfig) -> tuple[DataFrame, pd.DataFrame]:
    """``build_text_units``'s rows of the (id, text) ``documents`` cut on the driver (a small input: see
    ``DRIVER_CHUNK_CHARS``): as a DataFrame, and as the pandas frame it was made of."""
    units = chunk_documents(documents, cfg)
    return spark.createDataFrame(units, TEXT_UNIT_SCHEMA), units


def build_text_units(documents: DataFrame, cfg: ChunkingConfig) -> DataFrame:
    def chunk_partition(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            yield chunk_documents(batch, cfg)

    return documents.select("id", "text").mapInPandas(
        chunk_partition, TEXT_UNIT_SCHEMA)
