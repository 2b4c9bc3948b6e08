"""Prompt files in ``prompts/``, versioned by content hash so editing a prompt invalidates its cache entries.

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
        """The prompt with every ``{name}`` replaced; a missing value is a programming error, reported by name."""
        missing = self.variables - values.keys()
        if missing:
            raise KeyError(f"Prompt '{self.name}' needs values for {sorted(missing)}.")
        return _VARIABLE.sub(lambda m: str(values[m.group(1)]), self.text)


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
