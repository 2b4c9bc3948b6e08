"""Deterministic content-hash ids: reruns and refreshes give the same ids, so upserts work."""

from __future__ import annotations

import hashlib
import re
import unicodedata

_ID_HEX_CHARS = 24  # 96 bits: collision-free far beyond any corpus this runs on


def content_id(*parts: object) -> str:
    """Stable id of the given parts (joined with an unambiguous separator)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8")).hexdigest()
    return digest[:_ID_HEX_CHARS]


def normalize_text(text: str) -> str:
    """Document identity: NFC, unified newlines, trailing whitespace stripped per line and at the ends."""
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n")
    return "\n".join(line.rstrip() for line in text.split("\n")).strip()


_WS = re.compile(r"\s+")
_PUNCT = re.compile(r"[^\w\s]")


def normalize_name(name: str, mode: str = "exact") -> str:
    """Entity key. ``exact``: upper-cased, trimmed, whitespace collapsed (the paper's exact matching).
    ``folded``: additionally drops punctuation and accents, so "Dr. Jekyll" == "DR JEKYLL"."""
    key = _WS.sub(" ", unicodedata.normalize("NFC", name)).strip().strip('"\'').upper()
    if mode == "folded":
        key = unicodedata.normalize("NFKD", key)
        key = "".join(ch for ch in key if not unicodedata.combining(ch))
        key = _WS.sub(" ", _PUNCT.sub(" ", key)).strip()
    return key
