"""Sentence-aware leaf chunks: a chunk never ends inside a sentence, so a leaf reads as whole thoughts.

A sentence that would overflow the chunk moves whole to the next one. Only a sentence longer
than the limit on its own is split: at clause punctuation (; : , and dashes), and where a clause
is still too long, between words. A single word longer than the limit stays whole.
"""

from __future__ import annotations

import re
from collections.abc import Callable

CountTokens = Callable[[str], int]

# A sentence ends at . ! ? (possibly repeated, possibly followed by closing quotes or brackets)
# before whitespace, or at a paragraph break.
_BOUNDARY = re.compile(r"[.!?…]+[\"'’”)\]]*(?=\s)|\n[ \t]*\n")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st jr sr prof rev gen col capt lt sgt mt vs e.g i.e cf fig al".split()
)
_LONGEST_ABBREVIATION = 8
_LAST_WORD = re.compile(r"([\w.]+)\.$")
# Cut points of an over-long sentence, coarsest first: after clause punctuation, then between words.
_CLAUSE_CUT = re.compile(r"[;:,](?=\s)\s*|[—–]\s*")
_WORD_CUT = re.compile(r"\s+")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` with their punctuation, whitespace collapsed.

    A period after a title or an initial ("Mr.", "J.") does not end a sentence, nor does any
    end mark followed by a lower-case word ('"Bah!" said Scrooge').
    """
    sentences, start = [], 0
    for match in _BOUNDARY.finditer(text):
        if match.group().strip() and not _ends_sentence(text, match):
            continue
        sentences.append(text[start : match.end()])
        start = match.end()
    sentences.append(text[start:])
    return [" ".join(s.split()) for s in sentences if s.strip()]


def _ends_sentence(text: str, match: re.Match) -> bool:
    following = text[match.end() :].lstrip()
    if following[:1].islower():
        return False
    if match.group() != ".":
        return True
    last_word = _LAST_WORD.search(text, max(0, match.start() - _LONGEST_ABBREVIATION), match.end())
    if last_word is None:
        return True
    word = last_word.group(1)
    return not (word.lower() in _ABBREVIATIONS or (len(word) == 1 and word.isupper()))


def sentence_chunks(text: str, max_tokens: int = 100, *, count_tokens: CountTokens) -> list[str]:
    """Chunks of at most ``max_tokens`` (by ``count_tokens``) made of whole sentences, in order."""
    pieces = [
        piece
        for sentence in split_sentences(text)
        for piece in _pieces_within(sentence + " ", max_tokens, count_tokens, (_CLAUSE_CUT, _WORD_CUT))
    ]
    return _pack(pieces, max_tokens, count_tokens)


def _pieces_within(text: str, max_tokens: int, count_tokens: CountTokens, cuts: tuple[re.Pattern, ...]) -> list[str]:
    """``text`` cut at the coarsest cut points that bring every piece within the limit.

    Pieces keep their trailing whitespace, so concatenating them gives back ``text`` exactly.
    """
    if not cuts or count_tokens(text.strip()) <= max_tokens:
        return [text]
    ends = [m.end() for m in cuts[0].finditer(text) if m.end() < len(text)]
    bounds = [0, *ends, len(text)]
    return [
        piece
        for start, end in zip(bounds, bounds[1:])
        for piece in _pieces_within(text[start:end], max_tokens, count_tokens, cuts[1:])
    ]


def _pack(pieces: list[str], max_tokens: int, count_tokens: CountTokens) -> list[str]:
    """Greedy: append pieces to the current chunk until the next one would overflow it."""
    chunks, current = [], ""
    for piece in pieces:
        if current and count_tokens((current + piece).strip()) > max_tokens:
            chunks.append(current.strip())
            current = ""
        current += piece
    if current.strip():
        chunks.append(current.strip())
    return chunks
