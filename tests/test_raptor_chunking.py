"""RAPTOR leaves: ~100-token chunks that never cut a sentence."""

from pathlib import Path

import pytest
from conftest import shared_path

from graphrag_spark.raptor.chunking import sentence_chunks, split_sentences



@pytest.fixture
def carol() -> Path:
    return shared_path("corpora/a_christmas_carol.txt")


def words(text: str) -> int:
    return len(text.split())


def test_sentences_keep_their_punctuation_and_survive_titles_initials_and_dialogue():
    text = 'Mr. Scrooge met J. Marley. "Bah!" said Scrooge. "Humbug!"\nIt was cold; very cold...\n\nSTAVE II\n\nThe end?'
    assert split_sentences(text) == [
        "Mr. Scrooge met J. Marley.",
        '"Bah!" said Scrooge.',
        '"Humbug!"',
        "It was cold; very cold...",
        "STAVE II",
        "The end?",
    ]


def test_a_sentence_that_would_overflow_moves_whole_to_the_next_chunk():
    text = "One two three four. Five six seven eight nine ten. Eleven twelve."
    assert sentence_chunks(text, 8, count_tokens=words) == [
        "One two three four.",
        "Five six seven eight nine ten. Eleven twelve.",
    ]


def test_chunks_are_whole_sentences_in_order_and_within_the_limit():
    sentences = [" ".join(f"W{i}x{j}" for j in range(1 + (i * 7) % 13)) + "." for i in range(60)]
    chunks = sentence_chunks(" ".join(sentences), 20, count_tokens=words)
    assert all(words(chunk) <= 20 for chunk in chunks)
    assert [s for chunk in chunks for s in split_sentences(chunk)] == sentences
    assert len(chunks) < len(sentences)  # sentences are packed, not one per chunk


def test_an_over_long_sentence_is_split_at_clause_punctuation():
    sentence = (
        "The fog came pouring in at every chink and keyhole, and was so dense without that "
        "the houses opposite were mere phantoms; the clerk, who had a very small fire, "
        "could not replenish it: the master kept the coal-box in his own room."
    )
    chunks = sentence_chunks(sentence, 15, count_tokens=words)
    assert len(chunks) > 1
    assert all(words(chunk) <= 15 for chunk in chunks)
    assert all(chunk[-1] in ",;:." for chunk in chunks)
    assert " ".join(chunks) == sentence


def test_a_clause_without_punctuation_is_split_between_words_as_a_last_resort():
    sentence = " ".join(f"word{i}" for i in range(25)) + "."
    chunks = sentence_chunks(f"Short one. {sentence} Next one.", 10, count_tokens=words)
    assert all(words(chunk) <= 10 for chunk in chunks)
    assert " ".join(chunks) == f"Short one. {sentence} Next one."


def test_empty_text_gives_no_chunks():
    assert sentence_chunks("  \n\n ", count_tokens=words) == []


def test_christmas_carol_chunks_with_the_project_tokenizer(carol):
    from graphrag_spark.tokens import count_tokens

    text = carol.read_text()[20_000:40_000]
    chunks = sentence_chunks(text, 100, count_tokens=count_tokens)
    sizes = [count_tokens(chunk) for chunk in chunks]
    assert max(sizes) <= 100
    assert sum(sizes) / len(sizes) > 60  # packed close to the limit, not sentence by sentence
    # A chunk ends where a sentence does (closing quotes and brackets allowed after the mark).
    ends = [chunk.rstrip("'\"’”)]_") for chunk in chunks[:-1]]
    assert sum(end[-1] in ".!?" for end in ends) / len(ends) > 0.95
    assert " ".join(chunks) == " ".join(text.split())


@pytest.mark.parametrize("limit", [1, 3])
def test_tiny_limits_still_terminate_and_keep_every_word(limit):
    text = "Marley was dead: to begin with. There is no doubt whatever about that."
    chunks = sentence_chunks(text, limit, count_tokens=words)
    assert " ".join(chunks) == text
    assert all(words(chunk) <= limit for chunk in chunks)
