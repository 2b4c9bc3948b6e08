"""Question generation (the paper's Algorithm 1), the pure part: personas, tasks and questions read
from the model's answers, and exact and near-duplicate questions removed.

A near-duplicate has the same content words as an earlier kept question ("What are the main
themes of X?" / "What are the main themes in X?", or the same words reordered), or a ROUGE-L
with one that reaches ``evaluation.near_duplicate_rouge``: it asks for the same understanding
and would count twice.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from graphrag_spark.evaluation.parsing import clean_text, json_list
from graphrag_spark.evaluation.rouge import lcs_length, rouge_tokens

_NON_WORD = re.compile(r"[^\w\s]")
_FUNCTION_WORDS = frozenset("""a an the of in on at to for from by with about and or but is are was were be been do does
did what which who whom how why when where that this these those there their its it as into across over between""".split())


@dataclass(frozen=True)
class Persona:
    name: str
    description: str

    def render(self) -> str:
        return f"{self.name}: {self.description}" if self.description else self.name


def parse_personas(text: str, wanted: int) -> list[Persona]:
    """Up to ``wanted`` personas from ``{"personas": [{"name", "description"}]}`` (or plain list lines)."""
    personas = []
    for item in json_list(text, "personas") or []:
        if isinstance(item, dict):
            name, description = clean_text(item.get("name")), clean_text(item.get("description"))
        else:
            name, _, description = clean_text(item).partition(":")
            name, description = name.strip(), description.strip()
        if name:
            personas.append(Persona(name, description))
    return personas[:wanted]


def parse_strings(text: str, key: str, wanted: int) -> list[str]:
    """Up to ``wanted`` non-empty strings of ``{key: [...]}`` (or of the text's list lines)."""
    values = []
    for item in json_list(text, key) or []:
        if isinstance(item, dict):
            item = item.get("question") or item.get("task") or item.get("text") or ""
        value = clean_text(item)
        if value:
            values.append(value)
    return values[:wanted]


def normalize_question(question: str) -> str:
    return " ".join(_NON_WORD.sub(" ", question.lower()).split())


def content_words(tokens: Sequence[str]) -> frozenset[str]:
    """The words that carry a question's meaning, plurals folded (themes = theme)."""
    return frozenset(t[:-1] if len(t) > 3 and t.endswith("s") else t for t in tokens if t not in _FUNCTION_WORDS)


@dataclass(frozen=True)
class Kept:
    position: int  # index into the input list
    duplicate_of: int | None  # for a dropped question: the position of the kept one it repeats


def dedupe_questions(questions: Sequence[str], near_duplicate_rouge: float) -> list[Kept]:
    """One entry per input question, in order: ``duplicate_of`` is None for a kept question, else the
    kept question it duplicates exactly (after normalisation) or nearly (ROUGE-L >= threshold)."""
    kept: list[tuple[int, list[str]]] = []
    seen: dict[str, int] = {}  # normalised text or content-word key -> kept position
    out = []
    for position, question in enumerate(questions):
        tokens = rouge_tokens(question)
        keys = (normalize_question(question), " ".join(sorted(content_words(tokens))))
        twin = next((seen[k] for k in keys if k in seen), None)
        if twin is None:
            twin = next((p for p, other in kept if tokens and other
                         and 2 * lcs_length(tokens, other) / (len(tokens) + len(other)) >= near_duplicate_rouge), None)
        out.append(Kept(position, twin))
        if twin is None:
            kept.append((position, tokens))
            seen.update({k: position for k in keys if k})
    return out
