"""The context a community report is written from (paper section 3.1.5, method doc step 7).

Leaf communities: element summaries in priority order until the token budget. Every edge
of the community is a candidate (the reference implementation lets each entity bring only
one), in decreasing combined degree; each edge brings its source description, its target
description, its own description, then the claims about its endpoints.

Higher communities: if every element summary fits, the same; otherwise sub-communities,
largest element summaries first, have their finished (shorter) report substituted for their
elements until the context fits. The reference builds every context before any report
exists, so there the substitution never happens; here the caller passes the finished
reports of the finer level (reports are generated bottom-up).

Cost is linear in the community size (plus one sort of its edges): every candidate row is
rendered and counted once, and the budget is a running total of those counts (the reference
re-renders and re-counts the whole context per added element). Rows end with a newline and
start with an id, so the tokenizer does not merge tokens across rows and the running total
bounds the tokens of the rendered context.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import pandas as pd

CountTokens = Callable[[str], int]

# Section headers in render order; a section appears only when it has rows.
_HEADERS = {
    "reports": "-----Reports-----\nid,title,content\n",
    "entities": "-----Entities-----\nid,entity,description\n",
    "claims": "-----Claims-----\nid,entity,type,status,description\n",
    "relationships": "-----Relationships-----\nid,source,target,description,combined_degree\n",
}
_SECTION_SEPARATOR = "\n"
_NEEDS_QUOTING = re.compile(r'[,"\n\r]')


@dataclass(frozen=True)
class ReportContext:
    """A rendered context and exactly what went into it (for citations and the run summary)."""

    text: str
    n_tokens: int
    entity_ids: list[str]
    relationship_ids: list[str]
    claim_ids: list[str]
    substituted_communities: list[int]
    truncated: bool


@dataclass(frozen=True)
class CommunityElements:
    """All element summaries of one community (for a higher community: its sub-communities'
    elements plus the edges between them).

    entities: id, human_readable_id, title, description, degree.
    relationships: id, human_readable_id, source, target (entity titles), description, combined_degree.
    claims (optional): id, human_readable_id, subject (an entity title), type, status, description.
    """

    entities: pd.DataFrame
    relationships: pd.DataFrame
    claims: pd.DataFrame | None = None


@dataclass(frozen=True)
class SubCommunity:
    """A finer-level community with its finished report (``report`` is its full_content; None
    if its LLM report failed, in which case its elements are never substituted: the extractive
    stand-in written for it is not a summary to build on; see ``reports.build_context``)."""

    community: int
    title: str
    report: str | None
    entity_ids: Sequence[str]
    relationship_ids: Sequence[str]


class _Row(NamedTuple):
    kind: str
    id: str
    owner: tuple[str, str] | None  # the element it belongs to, for sub-community membership
    text: str


def build_leaf_context(
    entities: pd.DataFrame,
    relationships: pd.DataFrame,
    claims: pd.DataFrame | None,
    max_tokens: int,
    count_tokens: CountTokens,
) -> ReportContext:
    """Element summaries in the paper's priority order until ``max_tokens``."""
    packer = _Packer(max_tokens, count_tokens)
    rows = _prioritized_rows(CommunityElements(entities, relationships, claims))
    complete = packer.fill((row, count_tokens(row.text)) for row in rows)
    return packer.result(truncated=not complete)


def build_higher_context(
    elements: CommunityElements,
    sub_communities: Sequence[SubCommunity],
    max_tokens: int,
    count_tokens: CountTokens,
) -> ReportContext:
    """Leaf procedure if everything fits, else substitute sub-community reports, largest first.

    A sub-community's size is the tokens of its element rows in this context. Only reports
    shorter than the elements they replace are substituted (a longer one cannot help fit).
    If the context still overflows once every such report is in, reports go in first, in rank
    order, each if it fits (a report that does not fit gives its elements back), then element
    rows in priority order with the room left (``truncated``).
    """
    rows = list(_prioritized_rows(elements))
    costs = [count_tokens(row.text) for row in rows]
    headers = _header_costs(count_tokens)
    total = sum(costs) + sum(headers[kind] for kind in {row.kind for row in rows})
    if total <= max_tokens:
        packer = _Packer(max_tokens, count_tokens, headers)
        packer.fill(zip(rows, costs))
        return packer.result(truncated=False)

    community_of: dict[tuple[str, str], int] = {}
    for sub in sub_communities:
        community_of.update((("entity", str(e)), sub.community) for e in sub.entity_ids)
        community_of.update((("relationship", str(r)), sub.community) for r in sub.relationship_ids)
    element_tokens: dict[int, int] = defaultdict(int)
    for row, cost in zip(rows, costs):
        if row.owner in community_of:
            element_tokens[community_of[row.owner]] += cost

    reports: dict[int, tuple[_Row, int]] = {}
    for sub in sub_communities:
        if sub.report is not None:
            row = _Row("reports", str(sub.community), None, _csv_row(sub.community, sub.title, sub.report))
            reports[sub.community] = (row, count_tokens(row.text))
    ranked = sorted(
        (c for c, (_, cost) in reports.items() if cost < element_tokens[c]),
        key=lambda c: (-element_tokens[c], c),
    )
    substituted: list[int] = []
    for community in ranked:
        if total <= max_tokens:
            break
        total += reports[community][1] - element_tokens[community] + (0 if substituted else headers["reports"])
        substituted.append(community)

    packer = _Packer(max_tokens, count_tokens, headers)
    placed = {c for c in substituted if packer.add(*reports[c])}
    remaining = ((row, cost) for row, cost in zip(rows, costs) if community_of.get(row.owner) not in placed)
    complete = packer.fill(remaining)
    return packer.result(truncated=not complete or len(placed) < len(substituted))


def _prioritized_rows(elements: CommunityElements) -> Iterator[_Row]:
    """All element rows in the paper's order: per edge (decreasing combined degree, then id)
    source, target, edge, then the endpoints' claims; each entity and claim once. Entities
    without an edge in the community come last (by degree), so a one-node community still
    gets a context."""
    entities, relationships, claims = elements.entities, elements.relationships, elements.claims
    entity_rows: dict[str, _Row] = {}
    entity_rank: dict[str, tuple[int, str]] = {}
    for eid, hrid, title, description, degree in zip(
        *_columns(entities, "id", "human_readable_id", "title", "description", "degree")
    ):
        entity_rows[title] = _Row("entities", eid, ("entity", eid), _csv_row(hrid, title, description))
        entity_rank[title] = (-_number(degree), eid)

    claim_rows: dict[str, list[_Row]] = defaultdict(list)
    if claims is not None and len(claims):
        ordered = claims.sort_values(["human_readable_id", "id"])
        for cid, hrid, subject, ctype, status, description in zip(
            *_columns(ordered, "id", "human_readable_id", "subject", "type", "status", "description")
        ):
            if subject in entity_rows:
                text = _csv_row(hrid, subject, ctype, status, description)
                claim_rows[subject].append(_Row("claims", cid, entity_rows[subject].owner, text))

    edges = sorted(
        zip(*_columns(relationships, "combined_degree", "id", "human_readable_id", "source", "target", "description")),
        key=lambda edge: (-_number(edge[0]), edge[1]),
    )
    entities_done: set[str] = set()
    claims_done: set[str] = set()
    for combined_degree, rid, hrid, source, target, description in edges:
        for title in (source, target):
            if title in entity_rows and title not in entities_done:
                entities_done.add(title)
                yield entity_rows[title]
        text = _csv_row(hrid, source, target, description, combined_degree)
        yield _Row("relationships", rid, ("relationship", rid), text)
        for title in (source, target):
            if title not in claims_done:
                claims_done.add(title)
                yield from claim_rows.get(title, ())

    for title in sorted(entity_rows.keys() - entities_done, key=entity_rank.__getitem__):
        yield entity_rows[title]
        if title not in claims_done:
            yield from claim_rows.get(title, ())


class _Packer:
    """Adds rows while they fit, keeping the token total as a running sum."""

    def __init__(self, max_tokens: int, count_tokens: CountTokens, header_costs: dict[str, int] | None = None):
        self._room = max_tokens
        self._count_tokens = count_tokens
        self._headers = header_costs or _header_costs(count_tokens)
        self._rows: dict[str, list[_Row]] = {kind: [] for kind in _HEADERS}

    def add(self, row: _Row, cost: int) -> bool:
        if not self._rows[row.kind]:
            cost += self._headers[row.kind]
        if cost > self._room:
            return False
        self._room -= cost
        self._rows[row.kind].append(row)
        return True

    def fill(self, rows: Iterable[tuple[_Row, int]]) -> bool:
        """Add rows in order; stop at the first that does not fit (priority order is kept)."""
        return all(self.add(row, cost) for row, cost in rows)

    def result(self, truncated: bool) -> ReportContext:
        text = _SECTION_SEPARATOR.join(
            _HEADERS[kind] + "".join(row.text for row in rows) for kind, rows in self._rows.items() if rows
        )
        ids = {kind: [row.id for row in rows] for kind, rows in self._rows.items()}
        return ReportContext(
            text=text,
            n_tokens=self._count_tokens(text) if text else 0,
            entity_ids=ids["entities"],
            relationship_ids=ids["relationships"],
            claim_ids=ids["claims"],
            substituted_communities=[int(c) for c in ids["reports"]],
            truncated=truncated,
        )


def _header_costs(count_tokens: CountTokens) -> dict[str, int]:
    separator = count_tokens(_SECTION_SEPARATOR)
    return {kind: count_tokens(header) + separator for kind, header in _HEADERS.items()}


def _csv_row(*fields: object) -> str:
    return ",".join(_csv_field(field) for field in fields) + "\n"


def _csv_field(value: object) -> str:
    """CSV quoting only where needed, so descriptions with commas or newlines stay one field."""
    if isinstance(value, str):
        return '"' + value.replace('"', '""') + '"' if _NEEDS_QUOTING.search(value) else value
    if isinstance(value, int):
        return str(value)
    if _missing(value):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return _csv_field(str(value))


def _columns(df: pd.DataFrame, *names: str) -> list[list]:
    """Columns as Python lists: iterating them is several times faster than iterating Series."""
    return [df[name].tolist() for name in names]


def _number(value: object) -> float:
    return 0.0 if _missing(value) else float(value)


def _missing(value: object) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and value != value)
