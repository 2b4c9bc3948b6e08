"""Prompt files in ``prompts/``, versioned by content hash so editing a prompt invalidates its cache entries.

A prompt's instructions go in a system message and the data (document text, tables) in the user
message: the file holds both, split by the line ``===== user message =====``. Document text sits
between ``<document>`` and ``</document>`` lines, passed through ``document_text``.

Templates hold ``{name}`` tokens. They are filled in one pass with a regex rather than
``str.format``: JSON examples in a prompt keep their braces, and a value that itself
contains ``{name}`` (a document quoting a template) is never substituted again.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from graphrag_spark.errors import UserError
from graphrag_spark.resources import PROMPTS_DIR

DEFAULT_PROMPT_DIR = PROMPTS_DIR

_configured_dir: Path | None = None

_VARIABLE = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_USER_MESSAGE = re.compile(r"^===== user message =====[ \t]*\n", re.MULTILINE)
_FENCE_TAG = re.compile(r"<(\s*/?\s*document\b)", re.IGNORECASE)


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str

    @property
    def version(self) -> str:
        """Content hash: part of every LLM cache key, so a changed prompt is never answered from the cache."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()[:16]

    @property
    def variables(self) -> frozenset[str]:
        return frozenset(_VARIABLE.findall(self.text))

    def render(self, **values: object) -> str:
        """The prompt with every ``{name}`` replaced, as one text (instructions, then data); a missing
        value is a programming error, reported by name."""
        return "\n".join(self._render_parts(values))

    def messages(self, **values: object) -> list[dict[str, str]]:
        """The prompt as chat messages: the instructions above the line ``===== user message =====`` as the
        system message, the data below it as the user message; without that line, one user message."""
        parts = self._render_parts(values)
        if len(parts) == 1:
            return [{"role": "user", "content": parts[0]}]
        return [{"role": "system", "content": parts[0]}, {"role": "user", "content": parts[1]}]

    def _render_parts(self, values: dict[str, object]) -> list[str]:
        missing = self.variables - values.keys()
        if missing:
            raise KeyError(f"Prompt '{self.name}' needs values for {sorted(missing)}.")
        # Split before substituting: a value holding the separator line never splits the prompt.
        return [_VARIABLE.sub(lambda m: str(values[m.group(1)]), part) for part in _USER_MESSAGE.split(self.text, maxsplit=1)]


def document_text(text: str) -> str:
    """Untrusted text for a ``<document>`` ... ``</document>`` fence of a prompt: a fence tag inside the
    text is defused, so the text cannot close its fence and pose as instructions after it."""
    return _FENCE_TAG.sub(lambda m: "&lt;" + m.group(1), text)


def use_prompt_dir(prompt_dir: str | Path | None) -> None:
    """Make ``prompts.dir`` of the config the folder every ``load_prompt`` reads first (None = the project's)."""
    global _configured_dir
    _configured_dir = Path(prompt_dir).expanduser() if prompt_dir else None


def prompt_path(name: str, prompt_dir: str | Path | None = None) -> Path:
    """Where ``load_prompt`` reads ``name``: an explicit folder; else the configured folder when it
    holds the file (a prompt added to the project after ``init`` still loads); else ``prompts/``."""
    file_name = name if name.endswith(".txt") else f"{name}.txt"
    if prompt_dir is not None:
        return Path(prompt_dir) / file_name
    if _configured_dir is not None and (_configured_dir / file_name).is_file():
        return _configured_dir / file_name
    return DEFAULT_PROMPT_DIR / file_name


def load_prompt(name: str, prompt_dir: str | Path | None = None) -> Prompt:
    """Read ``<name>.txt`` from ``prompt_dir``, else the configured folder, else the repository's ``prompts/``."""
    path = prompt_path(name, prompt_dir)
    directory = path.parent
    if not path.is_file():
        raise UserError(
            f"Prompt file '{path}' does not exist; copy it from the project's prompts/ folder into '{directory}'."
        )
    return Prompt(name=path.stem, text=path.read_text(encoding="utf-8"))
