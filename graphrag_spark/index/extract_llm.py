"""The paper's LLM extraction of one chunk: entities and relationships with gleanings, optional claims.

Pure: no Spark. The Spark layer maps ``extract_chunk`` over a partition with
``graphrag_spark.llm.run_items`` and writes entities, relationships, claims and
failures to Delta.

Gleanings (paper, section 3.1.2): "we first ask the LLM to assess whether all entities
were extracted, using a logit bias of 100 to force a yes/no decision. If the LLM
responds that entities were missed, then a continuation indicating that 'MANY entities
were missed in the last extraction' encourages the LLM to glean these missing
entities." Where that check goes is ``extraction.gleaning_check``:

- ``between`` (the default, microsoft/graphrag's order): glean first, and ask the check only
  before a further gleaning, never after the last one. With ``max_gleanings=1`` a chunk costs
  2 calls: a check before the only gleaning would cost a call to save at most one.
- ``before_each`` (the paper's order): ask before every gleaning and glean only if the model
  says entities were missed (up to ``1 + 2 * max_gleanings`` calls).

The check is phrased "are entities still missing?", so **Y means "missed, glean more"** and N
means "done"; any other answer also stops, because a continuation costs a full call while
stopping costs nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from graphrag_spark.config import ExtractionConfig
from graphrag_spark.ids import normalize_name
from graphrag_spark.llm.client import CallResult, LlmClient
from graphrag_spark.prompts import Prompt, document_text, load_prompt
from graphrag_spark.index.graph import keep_within_budget
from graphrag_spark.tokens import get_encoding

TUPLE_DELIM = "<|>"
RECORD_DELIM = "##"
COMPLETION_DELIM = "<|COMPLETE|>"
DEFAULT_STRENGTH = 1.0

# The record delimiters written inside a document are escaped before it enters a prompt, so text
# the model copies from the document can never open, split or end a record; parsed fields are
# unescaped, so a description quotes the document as written.
_ESCAPES = (
    (re.compile(r"<\|(complete)\|>", re.IGNORECASE), r"<\\|\1\\|>", re.compile(r"<\\\|(complete)\\\|>", re.IGNORECASE), r"<|\1|>"),
    (re.compile(r"<\|>"), r"<\\|>", re.compile(r"<\\\|>"), "<|>"),
    (re.compile(r"#(?=#)"), r"#\\", re.compile(r"#\\(?=#)"), "#"),
)

_FENCE = re.compile(r"```[\w-]*")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_NUMBER_WORDS = {
    word: float(value)
    for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty".split()
    )
}
_CLAIM_STATUS = {
    "TRUE": "TRUE",
    "CONFIRMED": "TRUE",
    "YES": "TRUE",
    "FALSE": "FALSE",
    "NO": "FALSE",
    "REFUTED": "FALSE",
    "SUSPECTED": "SUSPECTED",
    "ALLEGED": "SUSPECTED",
    "UNVERIFIED": "SUSPECTED",
    "UNKNOWN": "SUSPECTED",
}
_NONE_VALUES = {"", "NONE", "NULL", "N/A", "NA", "UNKNOWN"}


@dataclass
class ParsedExtraction:
    entities: list[dict] = field(default_factory=list)
    relationships: list[dict] = field(default_factory=list)
    rejected: int = 0


@dataclass
class ParsedClaims:
    claims: list[dict] = field(default_factory=list)
    rejected: int = 0


@dataclass
class ChunkExtraction:
    """Everything one chunk produced. ``error`` set = the chunk failed: records parsed before the failing
    call are kept for inspection, but the stage must record the chunk as failed, not as extracted."""

    entities: list[dict] = field(default_factory=list)
    relationships: list[dict] = field(default_factory=list)
    claims: list[dict] = field(default_factory=list)
    rejected: int = 0
    calls: list[CallResult] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class ExtractionPrompts:
    extraction: Prompt
    examples: Prompt
    continuation: Prompt
    loop_check: Prompt
    claims: Prompt

    @classmethod
    def load(cls, prompt_dir: str | Path | None = None) -> ExtractionPrompts:
        return cls(
            extraction=load_prompt("entity_extraction", prompt_dir),
            examples=load_prompt("entity_extraction_examples", prompt_dir),
            continuation=load_prompt("gleaning_continue", prompt_dir),
            loop_check=load_prompt("gleaning_loop_check", prompt_dir),
            claims=load_prompt("claims_extraction", prompt_dir),
        )

    @property
    def version(self) -> str:
        """One version for the whole conversation: changing any of its prompts (or the examples) changes it."""
        return "-".join(p.version[:8] for p in (self.extraction, self.examples, self.continuation, self.loop_check))


def escape_delimiters(text: str) -> str:
    """``<|>`` -> ``<\\|>``, ``<|COMPLETE|>`` -> ``<\\|COMPLETE\\|>``, ``##`` -> ``#\\#`` (any run of #)."""
    for pattern, replacement, _, _ in _ESCAPES:
        text = pattern.sub(replacement, text)
    return text


def unescape_delimiters(text: str) -> str:
    for _, _, pattern, replacement in reversed(_ESCAPES):
        text = pattern.sub(replacement, text)
    return text


def untrusted(text: str) -> str:
    """Document text (or names taken from it) as it goes into an extraction prompt."""
    return document_text(escape_delimiters(text))


# ---------------------------------------------------------------- parsing


def _clean_field(value: str) -> str:
    value = value.strip()
    while len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'`":
        value = value[1:-1].strip()
    return value


def _parse_strength(value: str | None) -> float:
    if value is None:
        return DEFAULT_STRENGTH
    number = _NUMBER.search(value)
    if number:
        return float(number.group())
    return _NUMBER_WORDS.get(_clean_field(value).lower(), DEFAULT_STRENGTH)


def _looks_like_strength(value: str) -> bool:
    cleaned = _clean_field(value).lower()
    return len(cleaned) <= 20 and (bool(_NUMBER.search(cleaned)) or cleaned in _NUMBER_WORDS)


def _records(text: str, tags: tuple[str, ...], tuple_delim: str, record_delim: str, completion_delim: str):
    """Yield ``(tag, fields)`` per recognised record, ``None`` per record that cannot be trusted.

    A record starts at an (optionally parenthesised, optionally quoted) tag followed by the tuple
    delimiter, so records are found even when the model forgets ``##``, adds prose or fences. A record
    ends at the first ``)`` that closes a line; text with tuple delimiters but no tag is rejected. An
    unclosed last record with no completion delimiter was cut off by the token limit: its last field
    is unreliable, so it is rejected.
    """
    text = _FENCE.sub("\n", text)
    end = text.upper().find(completion_delim.upper())
    completed = end >= 0
    if completed:
        text = text[:end]
    start = re.compile(
        r"\(?\s*[\"'`]?\s*(" + "|".join(tags) + r")\s*[\"'`]?\s*" + re.escape(tuple_delim), re.IGNORECASE
    )
    segments = [s for s in text.split(record_delim) if s.strip()]
    for index, segment in enumerate(segments):
        matches = list(start.finditer(segment))
        if not matches:
            if tuple_delim in segment:  # looks like a record but has no recognisable tag
                yield None
            continue
        for position, match in enumerate(matches):
            stop = matches[position + 1].start() if position + 1 < len(matches) else len(segment)
            body = segment[match.end() : stop]
            closing = re.search(r"\)\s*(?:\n|$)", body)
            is_last = index == len(segments) - 1 and position == len(matches) - 1
            if closing:
                body, rest = body[: closing.start()], body[closing.end() :]
                for line in rest.splitlines():  # untagged records on the following lines
                    if tuple_delim in line:
                        yield None
            elif is_last and not completed:
                yield None
                continue
            yield match.group(1).lower(), [unescape_delimiters(_clean_field(f)) for f in body.strip().split(tuple_delim)]


def parse_extraction(
    text: str,
    tuple_delim: str = TUPLE_DELIM,
    record_delim: str = RECORD_DELIM,
    completion_delim: str = COMPLETION_DELIM,
) -> ParsedExtraction:
    """Entities and relationships from one model answer; keeps every usable record, counts the rest."""
    parsed = ParsedExtraction()
    for record in _records(text, ("entity", "relationship"), tuple_delim, record_delim, completion_delim):
        if record is None:
            parsed.rejected += 1
            continue
        tag, fields = record
        if tag == "entity" and len(fields) >= 2 and normalize_name(fields[0]) and fields[1]:
            parsed.entities.append(
                {
                    "name": normalize_name(fields[0]),
                    "type": normalize_name(fields[1]),
                    "description": " ".join(fields[2:]).strip(),
                }
            )
        elif tag == "relationship" and len(fields) >= 3:
            source, target = normalize_name(fields[0]), normalize_name(fields[1])
            # The 4th field is the strength slot; with more fields, the description held a delimiter.
            has_strength = len(fields) == 4 or (len(fields) > 4 and _looks_like_strength(fields[-1]))
            description = " ".join(fields[2:-1] if has_strength else fields[2:]).strip()
            if not source or not target or source == target:
                parsed.rejected += 1
                continue
            parsed.relationships.append(
                {
                    "source": source,
                    "target": target,
                    "description": description,
                    "strength": _parse_strength(fields[-1] if has_strength else None),
                }
            )
        else:
            parsed.rejected += 1
    return parsed


def _iso_date(value: str) -> str | None:
    value = _clean_field(value)
    try:
        return date.fromisoformat(value[:10]).isoformat()
    except ValueError:
        return None


def parse_claims(
    text: str,
    tuple_delim: str = TUPLE_DELIM,
    record_delim: str = RECORD_DELIM,
    completion_delim: str = COMPLETION_DELIM,
) -> ParsedClaims:
    """Claims (subject, object, type, status, dates, description, source text) from one model answer.

    Unknown status words become SUSPECTED (unverified); dates that are not ISO become None.
    """
    parsed = ParsedClaims()
    for record in _records(text, ("claim",), tuple_delim, record_delim, completion_delim):
        if record is None or len(record[1]) < 7 or not normalize_name(record[1][0]):
            parsed.rejected += 1
            continue
        subject, obj, claim_type, status, start, end, description, *source = record[1]
        obj_name = normalize_name(obj)
        parsed.claims.append(
            {
                "subject": normalize_name(subject),
                "object": None if obj_name in _NONE_VALUES else obj_name,
                "type": normalize_name(claim_type),
                "status": _CLAIM_STATUS.get(normalize_name(status), "SUSPECTED"),
                "start_date": _iso_date(start),
                "end_date": _iso_date(end),
                "description": description,
                "source_text": " ".join(source).strip(),
            }
        )
    return parsed


# ---------------------------------------------------------------- LLM calls


def yes_no_logit_bias() -> dict[int, int]:
    """Logit bias 100 on the single tokens "Y" and "N" (cl100k), forcing a one-letter yes/no answer."""
    encoding = get_encoding("cl100k_base")
    return {token: 100 for letter in ("Y", "N") for token in encoding.encode(letter)}


def extraction_calls_at_most(cfg: ExtractionConfig) -> int:
    """Calls one chunk's extraction can pay: the first pass, the gleanings and their checks."""
    checks = cfg.max_gleanings if cfg.gleaning_check == "before_each" else max(0, cfg.max_gleanings - 1)
    return 1 + cfg.max_gleanings + checks


def _merge(target: ChunkExtraction, parsed: ParsedExtraction) -> None:
    """Add a round's records, minus exact repeats of earlier rounds: a gleaning that re-lists a record
    must not count as a second instance (relationship instances become edge weights)."""
    target.entities.extend(e for e in parsed.entities if e not in target.entities)
    target.relationships.extend(r for r in parsed.relationships if r not in target.relationships)
    target.rejected += parsed.rejected


async def extract_chunk(
    client: LlmClient,
    text: str,
    cfg: ExtractionConfig,
    prompts: ExtractionPrompts,
    *,
    item_id: str | None = None,
) -> ChunkExtraction:
    """Extract one chunk: first pass, then up to ``cfg.max_gleanings`` gleanings, each after a check
    where ``cfg.gleaning_check`` puts one."""
    result = ChunkExtraction()

    async def ask(messages: list[dict], stage: str, version: str = prompts.version, **params) -> CallResult | None:
        call = await client.chat(messages, item_id=item_id, stage=stage, prompt_version=version, **params)
        result.calls.append(call)
        if call.error:
            result.error = f"{stage}: {call.error}"
            return None
        return call

    messages = prompts.extraction.messages(
        entity_types=", ".join(cfg.entity_types), examples=prompts.examples.text.strip(), input_text=untrusted(text)
    )
    first = await ask(messages, "extract")
    if first is None:
        return result
    _merge(result, parse_extraction(first.text))
    messages.append({"role": "assistant", "content": first.text})

    for round_number in range(cfg.max_gleanings):
        if cfg.gleaning_check == "before_each" or round_number > 0:
            check_messages = messages + [{"role": "user", "content": prompts.loop_check.text.strip()}]
            check = await ask(check_messages, "gleaning_check", max_tokens=1, logit_bias=yes_no_logit_bias())
            if check is None:
                return result
            if check.text.strip().upper()[:1] != "Y":
                break
            messages = check_messages + [{"role": "assistant", "content": check.text}]
        messages = messages + [{"role": "user", "content": prompts.continuation.text.strip()}]
        more = await ask(messages, "gleaning")
        if more is None:
            return result
        _merge(result, parse_extraction(more.text))
        messages.append({"role": "assistant", "content": more.text})
    return result


async def extract_claims(
    client: LlmClient,
    text: str,
    entity_names: list[str],
    cfg: ExtractionConfig,
    prompts: ExtractionPrompts,
    *,
    item_id: str | None = None,
) -> ChunkExtraction:
    """The claims pass of one chunk, about the entities its extraction found (or, if it found
    none, about the configured entity types). Its own work item, so switching claims on later
    does not pay for entity extraction again."""
    result = ChunkExtraction()
    messages = prompts.claims.messages(
        claim_description=cfg.claim_description,
        entity_specs=untrusted(", ".join(sorted(set(entity_names))) if entity_names else ", ".join(cfg.entity_types)),
        input_text=untrusted(text),
    )
    call = await client.chat(messages, item_id=item_id, stage="claims", prompt_version=prompts.claims.version)
    result.calls.append(call)
    if call.error:
        result.error = f"claims: {call.error}"
        return result
    parsed = parse_claims(call.text)
    result.claims, result.rejected = parsed.claims, parsed.rejected
    return result


async def summarize_descriptions(
    client: LlmClient,
    name: str,
    descriptions: list[str],
    max_tokens: int,
    *,
    prompt: Prompt | None = None,
    max_input_tokens: int = 4000,
    item_id: str | None = None,
) -> tuple[str, CallResult]:
    """One description merged from an entity's (or relationship's) instance descriptions.

    The descriptions are taken in the caller's order (most frequent first, then source order),
    exact repeats dropped, and kept whole while they fit ``max_input_tokens``: hub entities seen
    in thousands of chunks would otherwise overflow the context. If the call fails, the kept
    descriptions joined are returned as the text, so the graph keeps every fact; the
    CallResult's error marks the failure.
    """
    prompt = prompt or load_prompt("summarize_descriptions")
    distinct = list(dict.fromkeys(d.strip() for d in descriptions if d and d.strip()))
    kept = keep_within_budget(distinct, max_input_tokens)
    messages = prompt.messages(
        entity_name=name, description_list="\n".join(f"- {d}" for d in kept), max_words=max(1, int(max_tokens * 0.75))
    )
    call = await client.chat(
        messages,
        max_tokens=max_tokens,
        item_id=item_id,
        stage="summarize_descriptions",
        prompt_version=prompt.version,
    )
    text = call.text.strip() if call.ok and call.text.strip() else "\n".join(kept)
    return text, call
