"""Context windows of the query methods: CSV tables under a token budget, and offline extractive answers.

Every method hands its data to the LLM as ``-----Name-----`` tables of CSV rows (the reference
implementation's format); the table name is the one citations use (``[Data: Sources (3)]``).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence

from graphrag_spark.index.extract_nlp import STOP_WORDS, split_sentences
from graphrag_spark.index.report_json import format_data_refs
from graphrag_spark.tokens import count_tokens

NO_ANSWER = "I am sorry, but the index holds no information relevant to this question."
_TERM = re.compile(r"[a-z0-9][a-z0-9'-]*")


def terms(text: str) -> list[str]:
    """Content words of a question or passage, for offline (lexical) relevance."""
    return [t for t in _TERM.findall(text.lower()) if t not in STOP_WORDS and len(t) > 2]


def csv_line(values: Sequence[object]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(["" if v is None else v for v in values])
    return out.getvalue()


def format_table(name: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    return f"-----{name}-----\n" + csv_line(columns) + "".join(csv_line(row) for row in rows)


def fill_table(name: str, columns: Sequence[str], rows: Sequence[Sequence[object]], max_tokens: int) -> tuple[str, int, int]:
    """The table with its rows, in order, until the next one would pass ``max_tokens``.

    Returns (text, rows kept, tokens used); an empty text when not even the header fits.
    """
    header = f"-----{name}-----\n" + csv_line(columns)
    used = count_tokens(header)
    if used > max_tokens:
        return "", 0, 0
    lines = []
    for row in rows:
        line = csv_line(row)
        tokens = count_tokens(line)
        if used + tokens > max_tokens:
            break
        lines.append(line)
        used += tokens
    return header + "".join(lines), len(lines), used


def extractive_answer(question: str, rows: Sequence[tuple[str, object, str]], max_points: int, lead: str) -> str:
    """Offline answer: the sentences of the context rows ``(table, id, text)`` sharing most question terms, cited."""
    wanted = set(terms(question))
    scored = []
    for order, (table, row_id, text) in enumerate(rows):
        for sentence in split_sentences(text or ""):
            hits = len(wanted & set(terms(sentence)))
            if hits:
                scored.append((-hits, order, sentence.strip(), table, row_id))
    if not scored:
        return NO_ANSWER
    seen, points = set(), []
    for _, _, sentence, table, row_id in sorted(scored, key=lambda s: (s[0], s[1])):
        if sentence in seen:
            continue
        seen.add(sentence)
        points.append(f"- {sentence} {format_data_refs({table: [row_id]})}")
        if len(points) == max_points:
            break
    return lead + "\n\n" + "\n".join(points)
