"""The pairwise judge (paper section 4.2): criteria, judgement items, and the verdict read back.

For every pair of conditions (a, b), question, criterion, presentation order and repeat, one
judgement: ``ab`` shows a's answer as Answer 1, ``ba`` shows it as Answer 2, so a judge that
prefers a position scores each condition the same in both orders (counterbalancing).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from graphrag_spark.evaluation.parsing import json_object

# The paper's criteria; directness is the control (it tends to favour the opposite of the others).
CRITERIA: dict[str, str] = {
    "comprehensiveness": "How much detail does the answer provide to cover all aspects and details of the question?",
    "diversity": "How varied and rich is the answer in providing different perspectives and insights on the question?",
    "empowerment": "How well does the answer help the reader understand and make informed judgements about the topic, "
                   "with sources and supporting evidence?",
    "directness": "How specifically and clearly does the answer address the question?",
}
ORDERS = ("ab", "ba")
_WINNER_WORD = re.compile(r"winner\W{0,6}(?:answer\s*)?([012]|tie)\b", re.I)


def condition_pairs(conditions: Sequence[str], self_pairs: Sequence[str] = ()) -> list[tuple[str, str]]:
    """Every unordered pair of distinct conditions, in the given order, then the A/A pairs."""
    return list(itertools.combinations(conditions, 2)) + [(c, c) for c in self_pairs]


@dataclass(frozen=True)
class Verdict:
    winner: int  # 1 or 2 = the answer position chosen, 0 = tie
    reasoning: str


def parse_verdict(text: str) -> Verdict | None:
    """``{"reasoning": ..., "winner": 1|2|0}`` (0 or "tie" = a tie); a ``Winner: 2`` line also counts."""
    obj = json_object(text)
    raw = obj.get("winner") if obj is not None else None
    reasoning = str(obj.get("reasoning", "")) if obj is not None else ""
    if raw is None:
        match = _WINNER_WORD.search(text or "")
        if not match:
            return None
        raw = match.group(1)
    value = str(raw).strip().lower().removeprefix("answer").strip()
    winner = {"1": 1, "2": 2, "0": 0, "tie": 0}.get(value)
    return None if winner is None else Verdict(winner, " ".join(reasoning.split())[:2000])
