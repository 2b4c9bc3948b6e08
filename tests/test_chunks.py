from graphrag_spark.config import ChunkingConfig
from graphrag_spark.index.chunks import chunk_documents, chunk_text, token_windows
from graphrag_spark.tokens import get_encoding

import pandas as pd


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
