"""Claim-based metrics (paper section 4.2, after Claimify): the pure part.

Step 1 (select): the answer's sentences are numbered and the model picks those that state a
verifiable fact. Step 2 (decompose): the selected sentences are rewritten as simple, standalone
factual claims. Claims are then deduplicated per answer; their number measures
comprehensiveness, and the number of clusters of similar claims (complete linkage on
1 - ROUGE-L, at each threshold) measures diversity.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from graphrag_spark.evaluation.parsing import clean_text, json_list
from graphrag_spark.evaluation.questions import normalize_question
from graphrag_spark.index.extract_nlp import split_sentences

_DATA_REFS = re.compile(r"\s*\[Data:[^\[\]]*\]")
_MARKDOWN_LEAD = re.compile(r"^\s*(?:#+|[-*\u2022]|\d+[.)])\s*")


def answer_sentences(answer: str) -> list[str]:
    """The answer's sentences without markdown markers or data references (those are not claims)."""
    sentences = []
    for line in (answer or "").splitlines():
        line = _DATA_REFS.sub("", _MARKDOWN_LEAD.sub("", line)).strip()
        sentences.extend(s for s in split_sentences(line) if any(ch.isalnum() for ch in s))
    return sentences


def number_sentences(sentences: Sequence[str]) -> str:
    return "\n".join(f"{i}. {s}" for i, s in enumerate(sentences, start=1))


def parse_selection(text: str, n_sentences: int) -> list[int] | None:
    """1-based sentence numbers from ``{"sentences": [..]}``, in range and without repeats; None if unreadable."""
    values = json_list(text, "sentences")
    if values is None:
        return None
    picked = []
    for value in values:
        match = re.match(r"\s*(\d+)", str(value))
        if match and 1 <= int(match.group(1)) <= n_sentences and int(match.group(1)) not in picked:
            picked.append(int(match.group(1)))
    return picked


def parse_claims(text: str) -> list[str] | None:
    values = json_list(text, "claims")
    if values is None:
        return None
    return [c for c in (clean_text(v.get("claim") if isinstance(v, dict) else v) for v in values) if c]


def dedupe_claims(claims: Sequence[str]) -> list[str]:
    """First occurrence of each claim, compared case- and punctuation-insensitively."""
    seen, out = set(), []
    for claim in claims:
        key = normalize_question(claim)
        if key and key not in seen:
            seen.add(key)
            out.append(claim)
    return out
