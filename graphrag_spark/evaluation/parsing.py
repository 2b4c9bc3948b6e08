"""Reading the JSON the evaluation prompts ask for, tolerant of the usual model habits (code fences,
prose around the object, a numbered list instead of JSON)."""

from __future__ import annotations

import json
import re
from typing import Any

_FENCE = re.compile(r"```[a-zA-Z]*\s*(.*?)(?:```|\Z)", re.S)
_LIST_ITEM = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+(.+?)\s*$")
_MAX_OBJECT_STARTS = 16


def json_object(text: str) -> dict | None:
    """The first JSON object in ``text`` (inside a code fence if there is one), or None."""
    fenced = _FENCE.search(text or "")
    body = fenced.group(1) if fenced and "{" in fenced.group(1) else (text or "")
    decoder = json.JSONDecoder()
    for match in list(re.finditer(r"\{", body))[:_MAX_OBJECT_STARTS]:
        try:
            obj, _ = decoder.raw_decode(body, match.start())
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def json_list(text: str, key: str) -> list[Any] | None:
    """``obj[key]`` of the first JSON object holding a list there; else the bulleted or numbered
    lines of the text; None when there is neither."""
    obj = json_object(text)
    if obj is not None and isinstance(obj.get(key), list):
        return obj[key]
    lines = [m.group(1) for m in map(_LIST_ITEM.match, (text or "").splitlines()) if m]
    return lines or None


def clean_text(value: Any) -> str:
    return " ".join(str(value).split()) if value is not None else ""
