"""Community report JSON as the LLM returns it: parsed, repaired, normalized, rendered.

The paper's report is ``{title, summary, rating, rating_explanation, findings: [{summary,
explanation}]}``. Models break it in a few recurring ways (code fences, prose around the
object, trailing commas, single quotes, an answer cut off at the token limit, the rating as
a string); those are repaired here so a report is retried or recorded as failed only when
the answer really holds no report.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

MAX_DATA_IDS = 5
_MORE = "+more"
_MAX_TRUNCATION_CUTS = 64
_MAX_OBJECT_STARTS = 16

_FENCE = re.compile(r"```[a-zA-Z]*\s*(.*?)(?:```|\Z)", re.S)
_JSON_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_STRUCTURE_AFTER_STRING = re.compile(r"\s*(?:$|[}\]:]|,\s*(?:$|[\"'{\[\]}]|[A-Za-z_]\w*\s*:))")
_BARE_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_BARE_WORDS = {"true": "true", "false": "false", "null": "null", "True": "true", "False": "false", "None": "null"}
_DATA_BLOCK = re.compile(r"\[Data:\s*([^\[\]]*)\]")
_KIND_IDS = re.compile(r"([A-Za-z][A-Za-z ]*?)\s*\(([^()]*)\)")


def parse_report(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """(report, None) or (None, why it failed). Data references are limited to 5 ids per kind."""
    if not text or not text.strip():
        return None, "empty response"
    obj = _load_object(text)
    if obj is None:
        return None, "no JSON object found in the response"
    title, summary = _text(obj.get("title")), _text(obj.get("summary"))
    if not title:
        return None, "report JSON has no title"
    if not summary:
        return None, "report JSON has no summary"
    findings = obj.get("findings")
    if findings is not None and not isinstance(findings, list):
        return None, "report JSON findings is not a list"
    findings = [_finding(item) for item in findings or ()]
    return {
        "title": title,
        "summary": limit_data_refs(summary),
        "rating": _rating(obj.get("rating")),
        "rating_explanation": limit_data_refs(_text(obj.get("rating_explanation"))),
        "findings": [f for f in findings if f["summary"] or f["explanation"]],
    }, None


def render_full_content(report: Mapping[str, Any]) -> str:
    """The markdown a reader skims: title, summary, one section per finding."""
    parts = [f"# {report['title']}", report["summary"]]
    parts += [f"## {f['summary']}\n\n{f['explanation']}" for f in report.get("findings") or ()]
    return "\n\n".join(part for part in parts if part)


def format_data_refs(kind_to_ids: Mapping[str, Sequence[object]], max_ids: int = MAX_DATA_IDS) -> str:
    """``[Data: Entities (1, 2, 3, 4, 5, +more); Relationships (7)]``; empty kinds are left out."""
    return _format_refs([(kind, [str(i) for i in ids], False) for kind, ids in kind_to_ids.items()], max_ids)


def limit_data_refs(text: str, max_ids: int = MAX_DATA_IDS) -> str:
    """Rewrite every ``[Data: ...]`` block so each kind keeps at most ``max_ids`` ids, then ``+more``."""

    def rewrite(block: re.Match[str]) -> str:
        refs = []
        for kind, ids in _KIND_IDS.findall(block.group(1)):
            items = [item.strip() for item in ids.split(",")]
            refs.append((kind.strip(), [i for i in items if i and i.lower() != _MORE], _MORE in map(str.lower, items)))
        return _format_refs(refs, max_ids) if refs else block.group(0)

    return _DATA_BLOCK.sub(rewrite, text)


def _format_refs(refs: Sequence[tuple[str, list[str], bool]], max_ids: int) -> str:
    merged: dict[str, tuple[list[str], bool]] = {}
    for kind, ids, more in refs:
        known, had_more = merged.get(kind, ([], False))
        merged[kind] = (list(dict.fromkeys(known + ids)), had_more or more)
    parts = []
    for kind, (ids, more) in merged.items():
        if ids:
            shown = ids[:max_ids] + ([_MORE] if more or len(ids) > max_ids else [])
            parts.append(f"{kind} ({', '.join(shown)})")
    return f"[Data: {'; '.join(parts)}]" if parts else ""


def _load_object(text: str) -> dict | None:
    """The first object with a title (else the first object), trying each ``{`` so braces in
    leading prose do not hide the report."""
    fenced = _FENCE.search(text)
    body = fenced.group(1) if fenced and "{" in fenced.group(1) else text
    first = None
    for start in [match.start() for match in re.finditer(r"\{", body)][:_MAX_OBJECT_STARTS]:
        try:
            obj, _ = json.JSONDecoder().raw_decode(body, start)
        except ValueError:
            obj = _repair(body[start:])
        if isinstance(obj, dict):
            if "title" in obj:
                return obj
            first = first or obj
    return first


def _repair(text: str) -> Any:
    """Re-emit ``text`` as JSON in one pass: strings in either quote re-quoted (a quote only
    closes a string if JSON structure follows it, so apostrophes and inner quotes survive),
    Python literals and bare keys fixed, trailing commas dropped, prose after the root object
    ignored. A truncated answer is closed, or cut back to its last complete member."""
    out: list[str] = []
    closers: list[str] = []
    cuts: list[tuple[int, tuple[str, ...]]] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch in "\"'":
            value, i, closed = _read_string(text, i)
            out.append(json.dumps(value))
            if not closed:
                break
            continue
        if ch in "{[":
            closers.append("}" if ch == "{" else "]")
            out.append(ch)
        elif ch in "}]":
            _drop_trailing_comma(out)
            out.append(closers.pop())
            if not closers:
                return _loads("".join(out))
        elif ch == ",":
            cuts.append((len(out), tuple(closers)))
            out.append(ch)
        elif number := _JSON_NUMBER.match(text, i):
            out.append(number.group())
            i = number.end()
            continue
        elif word := _BARE_WORD.match(text, i):
            out.append(_BARE_WORDS.get(word.group(), json.dumps(word.group())))
            i = word.end()
            continue
        else:
            out.append(ch)
        i += 1
    attempts = [(len(out), tuple(closers))] + cuts[::-1][:_MAX_TRUNCATION_CUTS]
    for end, open_closers in attempts:
        head = out[:end]
        _drop_trailing_comma(head)
        obj = _loads("".join(head) + "".join(reversed(open_closers)))
        if obj is not None:
            return obj
    return None


def _read_string(text: str, start: int) -> tuple[str, int, bool]:
    """(value, index after the string, whether it was closed) for a string opened at ``start``."""
    quote, chars, i = text[start], [], start + 1
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            escaped = text[i + 1]
            if escaped == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[i + 2 : i + 6]):
                chars.append(chr(int(text[i + 2 : i + 6], 16)))
                i += 6
                continue
            chars.append({"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}.get(escaped, escaped))
            i += 2
            continue
        if ch == quote and _ends_string(text, i + 1):
            return "".join(chars), i + 1, True
        chars.append(ch)
        i += 1
    return "".join(chars), len(text), False


def _ends_string(text: str, i: int) -> bool:
    """A quote closes a string if JSON structure follows it, not more prose."""
    return _STRUCTURE_AFTER_STRING.match(text, i) is not None


def _drop_trailing_comma(out: list[str]) -> None:
    while out and (out[-1].isspace() or out[-1] == ","):
        out.pop()


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _finding(item: Any) -> dict[str, str]:
    if isinstance(item, Mapping):
        return {"summary": _text(item.get("summary")), "explanation": limit_data_refs(_text(item.get("explanation")))}
    return {"summary": _text(item), "explanation": ""}


def _rating(value: Any) -> float | None:
    """Impact severity clamped to 0-10; a string such as "8.5" or "7/10" gives its first number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        number = _JSON_NUMBER.search(value)
        value = float(number.group()) if number else None
    if not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return min(10.0, max(0.0, float(value)))


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()
