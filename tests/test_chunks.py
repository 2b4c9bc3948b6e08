from graphrag_spark.config import ChunkingConfig
from graphrag_spark.index.chunks import build_text_units, chunk_documents, chunk_text, text_units_on_driver, token_windows
from graphrag_spark.tokens import get_encoding

import pandas as pd
import pytest


def test_windows_step_by_size_minus_overlap_and_end_at_n():
    assert token_windows(1300, 600, 100) == [(0, 600), (500, 1100), (1000, 1300)]
    assert token_windows(600, 600, 100) == [(0, 600)]
    assert token_windows(0, 600, 100) == []
    assert token_windows(5, 600, 100) == [(0, 5)]


def test_consecutive_chunks_share_exactly_the_overlap_tokens():
    enc = get_encoding()
    text = " ".join(f"word{i}" for i in range(3000))
    chunks = chunk_text(text, size=200, overlap=50)
    tokens = [enc.encode(c) for c, _ in chunks]
    assert all(n == 200 for _, n in chunks[:-1])
    for previous, current in zip(tokens, tokens[1:]):
        assert previous[-50:] == current[:50]
    assert enc.decode(tokens[0] + [t for tok in tokens[1:] for t in tok[50:]]) == text


def test_chunk_ids_are_deterministic_and_distinct():
    docs = pd.DataFrame({"id": ["d1", "d2"], "text": ["alpha beta gamma " * 400, "alpha beta gamma " * 400]})
    cfg = ChunkingConfig(size=100, overlap=10)
    first, second = chunk_documents(docs, cfg), chunk_documents(docs, cfg)
    assert first["id"].tolist() == second["id"].tolist()
    assert first["id"].is_unique
    assert set(first["document_id"]) == {"d1", "d2"}


def test_special_token_text_in_documents_is_plain_text():
    assert chunk_text("see <|endoftext|> here", 600, 100)[0][0] == "see <|endoftext|> here"


@pytest.mark.spark
def test_text_units_cut_on_the_driver_equal_the_executors(spark):
    """A small full build cuts its text units on the driver (``DRIVER_CHUNK_CHARS``): the same rows as
    the executors' cut, multi-byte characters at window edges, an empty text and many documents included."""
    texts = ["Scrooge's nephew. " * 300, "日本語のテキスト、" * 400 + "émigré " * 50, "", "One short line.",
             *(f"Document {i}: the Lumen Cells factory, shift {i}. " * (i + 1) for i in range(20))]
    documents = spark.createDataFrame([(f"doc-{i}", text) for i, text in enumerate(texts)], "id string, text string")
    cfg = ChunkingConfig(size=60, overlap=10)
    on_driver, rows = text_units_on_driver(spark, documents.toPandas(), cfg)
    in_executors = sorted(map(tuple, build_text_units(documents, cfg).collect()))
    assert sorted(map(tuple, on_driver.collect())) == in_executors == sorted(rows.itertuples(index=False, name=None))
    assert len(in_executors) > 100
