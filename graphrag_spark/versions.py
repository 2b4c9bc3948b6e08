"""The numpy, pandas and pyarrow a cluster brings, checked at import.

A Databricks runtime ships its own copies, and a cluster library installed with ``--no-deps`` (or a
runtime library loaded ahead of pip's) can leave one that graphrag-spark does not support. That is
one sentence naming the conflict here, not an ImportError from deep inside scipy or pandas.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import metadata

# name -> (lowest supported, first unsupported or None): pyproject.toml's bounds (tests/test_versions.py holds them equal).
SUPPORTED = {
    "numpy": ("1.23.5", "3"),
    "pandas": ("1.5.3", "3"),
    "pyarrow": ("14.0.1", None),
}
# pandas wheels before 2.2.2 are built against numpy 1.x and fail to import under numpy 2.
PANDAS_FOR_NUMPY_2 = "2.2.2"


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: "1.26.4" -> (1, 26, 4), "2.0.0rc1" -> (2, 0, 0)."""
    parts = []
    for piece in version.split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        parts.append(int(digits.group()))
        if digits.group() != piece:
            break
    return tuple(parts)


def installed_versions() -> dict[str, str | None]:
    """The installed version of each checked library (None where absent), read from package metadata without importing it."""
    versions: dict[str, str | None] = {}
    for name in SUPPORTED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def conflict(installed: Mapping[str, str | None]) -> str | None:
    """One sentence naming the first unsupported library version in ``installed`` (name -> version), or None."""
    for name, (lowest, first_unsupported) in SUPPORTED.items():
        have = installed.get(name)
        if have is None:  # a dependency pip installs; its absence raises its own ModuleNotFoundError
            continue
        if release(have) < release(lowest):
            return (f"graphrag-spark needs {name}>={lowest} and this environment has {name} {have}: use Databricks "
                    f"Runtime 15.4 LTS or later (their {name} is supported), or let pip install graphrag-spark's "
                    f"dependencies (no --no-deps).")
        if first_unsupported and release(have) >= release(first_unsupported):
            return (f"graphrag-spark supports {name}<{first_unsupported} and this environment has {name} {have}: "
                    f"install {name}<{first_unsupported} next to it.")
    numpy, pandas = installed.get("numpy"), installed.get("pandas")
    if numpy and pandas and release(numpy) >= (2,) and release(pandas) < release(PANDAS_FOR_NUMPY_2):
        return (f"pandas {pandas} is built for numpy 1.x and this environment has numpy {numpy}: keep numpy<2 (on "
                f"Databricks Runtime 15.4 or 16.4 LTS, `pip install graphrag-spark -c constraints-dbr-<runtime>.txt` "
                f"keeps the runtime's numpy) or use pandas>={PANDAS_FOR_NUMPY_2}.")
    return None
