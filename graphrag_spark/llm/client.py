"""One LLM client for every stage: OpenAI, Azure OpenAI or any OpenAI-compatible endpoint.

Built for calls from Spark executors: bounded concurrency per task, throttling to the
task's share of the job budget, our own retries (the ``openai`` client's are disabled
so that a 429 also slows down the task's other calls), and no exceptions for API
failures: a call that finally fails returns a result with ``error`` set, so the stage
writes a failure row instead of losing the item or killing the job.

The API key is read from the environment variable named in the config when the client
is built. It is handed to the ``openai`` client only; it is not an attribute of this
class, not in its repr, and scrubbed from every error string we produce.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import email.utils
import hashlib
import json
import logging
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlparse

try:
    import resource
except ImportError:  # not on Windows
    resource = None

import openai

from graphrag_spark.config import LlmModelConfig
from graphrag_spark.errors import UserError
from graphrag_spark.llm.throttle import CallSlots, RateLimiter
from graphrag_spark.tokens import count_tokens

log = logging.getLogger(__name__)

LOCAL_PLACEHOLDER_KEY = "no-key-needed-for-local-server"
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}
_BACKOFF_BASE_S = 0.5
_BACKOFF_CAP_S = 30.0
_RETRY_AFTER_CAP_S = 120.0
_ERROR_CHARS = 300
# Calls in flight per client where neither the caller nor the model's config bounds them.
_DEFAULT_CONCURRENCY = 8
# Calls in flight an ``openai`` client holds before the next call goes to another one: its connection pool scans
# every connection as each request starts and ends, so one pool of hundreds cost milliseconds of CPU a call.
_CALLS_PER_POOL = 64
_LIMITS_WARNED: set[tuple] = set()  # (model, stated limits) this process has warned of

T = TypeVar("T")
Item = TypeVar("Item")


class ItemNotStarted(Exception):
    """An item's first call came after its client stopped starting items (``LlmClient``'s ``may_start_item``):
    nothing was sent or reserved for it."""


@dataclass
class CallResult:
    """One chat call after all its attempts; ``error`` is None on success."""

    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    attempts: int = 0
    latency_s: float = 0.0
    error: str | None = None
    n_429: int = 0
    cache_key: str = ""
    queue_s: float = 0.0
    item_id: str | None = None
    stage: str | None = None
    finish_reason: str | None = None
    # The answer stopped at its max_tokens (finish_reason "length"): what it would have said past it is lost. Not
    # a one-token answer (a yes/no check), which stops there by design.
    cut: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class EmbedResult:
    """One embeddings call (a batch of texts) after all its attempts."""

    vectors: list[list[float]] = field(default_factory=list)
    prompt_tokens: int = 0
    attempts: int = 0
    latency_s: float = 0.0
    error: str | None = None
    n_429: int = 0
    cache_key: str = ""
    queue_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class ChatRequest:
    """One independent chat call for ``run_batch``; a dict with the same keys works too."""

    messages: list[dict[str, str]]
    item_id: str | None = None
    stage: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    json_mode: bool = False
    logit_bias: dict[int, int] | None = None
    prompt_version: str = ""


def cache_key(model: str, messages: list[dict[str, str]], params: Mapping[str, Any], prompt_version: str) -> str:
    """Deterministic key of a call: same model, conversation, parameters and prompt version = same answer."""
    canonical = json.dumps(
        {"model": model, "messages": messages, "params": params, "prompt_version": prompt_version},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """Server-requested wait: ``retry-after-ms``, else ``Retry-After`` as seconds or an HTTP date; capped."""
    if not headers:
        return None
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return min(_RETRY_AFTER_CAP_S, max(0.0, float(value) / divisor))
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value:
        try:
            when = email.utils.parsedate_to_datetime(value).timestamp()
        except (TypeError, ValueError):
            return None
        return min(_RETRY_AFTER_CAP_S, max(0.0, when - time.time()))
    return None


def stated_limits(headers: Mapping[str, str] | None) -> tuple[float | None, float | None]:
    """The requests/min and tokens/min a provider states for the key on its answers (OpenAI's
    ``x-ratelimit-limit-requests`` and ``-tokens``); None for one it does not state."""

    def limit(name: str) -> float | None:
        try:
            value = float((headers or {}).get(name) or "nan")
        except ValueError:
            return None
        return value if math.isfinite(value) and value > 0 else None

    return limit("x-ratelimit-limit-requests"), limit("x-ratelimit-limit-tokens")


def backoff_seconds(attempt: int, retry_after: float | None, rng: random.Random) -> float:
    """Full-jitter exponential backoff. A server's Retry-After is a floor, plus up to 10% so that tasks
    told the same instant do not retry in lockstep."""
    if retry_after is not None:
        return retry_after * (1.0 + 0.1 * rng.random())
    return rng.uniform(0.0, min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2 ** (attempt - 1)))


def _is_local(api_base: str | None) -> bool:
    return api_base is not None and (urlparse(api_base).hostname or "") in _LOCAL_HOSTS


def _read_api_key(cfg: LlmModelConfig) -> str:
    # In a task: the key the driver resolved and attached (graphrag_spark.llm.secrets).
    key = cfg.attached_api_key or os.environ.get(cfg.api_key_env)
    if key:
        return key
    if _is_local(cfg.api_base):
        return LOCAL_PLACEHOLDER_KEY
    raise UserError(
        f"Environment variable {cfg.api_key_env} is not set; export it with the API key for model '{cfg.model}' "
        f"(or set llm.*.api_key_env to the variable that holds it)."
    )


def _allow_open_files() -> None:
    """Raise this process's soft limit on open files to its hard one (as Go's runtime does at start): every
    call in flight holds a socket, and a high rate limit at a long latency needs thousands of them, past the
    1,024 many systems give a process by default."""
    if resource is None:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    unlimited = resource.RLIM_INFINITY
    if soft == unlimited:
        return
    # An unlimited hard limit (macOS) cannot be the soft one: the most a process may open there is finite.
    for target in (hard, 65536, 10240):
        if target != unlimited and soft < target and (hard == unlimited or target <= hard):
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                return


def _build_openai_client(cfg: LlmModelConfig, api_key: str) -> openai.AsyncOpenAI:
    if cfg.api_type == "azure" and not (cfg.api_base and cfg.api_version):
        raise UserError(
            "Azure OpenAI needs llm.*.api_base (the resource endpoint) and llm.*.api_version; set both in the config."
        )
    # Its own connection pool (1,000 connections, 100 kept alive) is large enough: an ``LlmClient`` puts at most
    # ``_CALLS_PER_POOL`` calls in flight on one client.
    common = dict(api_key=api_key, max_retries=0, timeout=cfg.timeout_s)
    if cfg.api_type == "azure":
        return openai.AsyncAzureOpenAI(azure_endpoint=cfg.api_base, api_version=cfg.api_version, **common)
    return openai.AsyncOpenAI(base_url=cfg.api_base, **common)


def build_sync_client(cfg: LlmModelConfig, api_key: str, timeout_s: float) -> openai.OpenAI:
    """A blocking client for one-off driver calls (the key preflight)."""
    common = dict(api_key=api_key, max_retries=0, timeout=timeout_s)
    if cfg.api_type == "azure":
        return openai.AzureOpenAI(azure_endpoint=cfg.api_base, api_version=cfg.api_version, **common)
    return openai.OpenAI(base_url=cfg.api_base, **common)


def _is_retryable(exc: Exception) -> bool:
    if isinstance(exc, (openai.APIConnectionError, TimeoutError)):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        if exc.code == "insufficient_quota":  # a 429 that only the billing page can fix
            return False
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return False


def _error_headers(exc: Exception) -> Mapping[str, str] | None:
    response = getattr(exc, "response", None)
    return getattr(response, "headers", None)


class LlmClient:
    """Async chat and embeddings for one configured model; use as ``async with LlmClient(cfg, share) as client``.

    ``limiter`` replaces the task-local ``RateLimiter`` (the coordinator's job-wide budget, or a task's own that
    its caller keeps);
    ``concurrency`` replaces ``cfg.concurrency`` when the caller bounds its calls itself;
    ``may_start_item(items_started)``, where given, is asked as a chat call of an ``item_id`` not called yet
    gets its slot: where it says no, the call raises ``ItemNotStarted`` (a Connect wave's deadline), while the
    items already started go on to their last call.
    """

    def __init__(self, cfg: LlmModelConfig, share: float = 1.0, *, limiter: Any = None,
                 concurrency: int | None = None, may_start_item: Callable[[int], bool] | None = None) -> None:
        self.cfg = cfg
        self._api_key = _read_api_key(cfg)
        _allow_open_files()  # once a client, not once an ``openai`` client it makes
        self._pools = [_build_openai_client(cfg, self._api_key)]  # more are made as the calls in flight grow
        self._calls_on = [0]  # the calls in flight on each
        self._limiter = limiter or RateLimiter(cfg.requests_per_minute, cfg.tokens_per_minute, share,
                                               interval_s=cfg.enforced_interval_s,
                                               task_index=spark_task_index())
        self._most_in_flight = concurrency or cfg.concurrency or _DEFAULT_CONCURRENCY
        self._slots = CallSlots()
        self._rng = random.Random()
        self._may_start_item = may_start_item
        self._items_started: set[str] = set()

    def __repr__(self) -> str:
        return f"LlmClient(model={self.cfg.model!r}, api_type={self.cfg.api_type!r}, api_base={self.cfg.api_base!r})"

    async def __aenter__(self) -> LlmClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        for pool in self._pools:
            await pool.close()

    def _scrub(self, text: str) -> str:
        return text.replace(self._api_key, "***")

    @contextlib.contextmanager
    def _openai_client(self) -> Iterator[openai.AsyncOpenAI]:
        """The ``openai`` client with the fewest calls in flight, or a new one where each holds ``_CALLS_PER_POOL``
        (made once a task's calls in flight need it: about 30 ms, most of it loading the TLS trust store)."""
        least = min(range(len(self._pools)), key=self._calls_on.__getitem__)
        if self._calls_on[least] >= _CALLS_PER_POOL:
            self._pools.append(_build_openai_client(self.cfg, self._api_key))
            self._calls_on.append(0)
            least = len(self._pools) - 1
        self._calls_on[least] += 1
        try:
            yield self._pools[least]
        finally:
            self._calls_on[least] -= 1

    async def chat(
        self,
        messages: list[dict[str, str]],
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        json_mode: bool = False,
        logit_bias: Mapping[int | str, int] | None = None,
        item_id: str | None = None,
        stage: str | None = None,
        prompt_version: str = "",
    ) -> CallResult:
        """One chat completion with throttling and retries; never raises for API errors."""
        params: dict[str, Any] = {
            "temperature": self.cfg.temperature if temperature is None else temperature,
            "max_tokens": max_tokens or self.cfg.max_tokens,
        }
        if json_mode:
            params["response_format"] = {"type": "json_object"}
        if logit_bias:
            params["logit_bias"] = {str(token): bias for token, bias in logit_bias.items()}
        key = cache_key(self.cfg.model, messages, params, prompt_version)
        estimate = sum(count_tokens(m.get("content") or "") for m in messages)

        async def call(client: openai.AsyncOpenAI) -> Any:
            return await client.chat.completions.with_raw_response.create(model=self.cfg.model, messages=messages,
                                                                          **params)

        def used(response: Any) -> tuple[int, int]:
            usage = response.usage
            if usage:
                return usage.prompt_tokens, usage.completion_tokens
            return estimate, count_tokens(response.choices[0].message.content or "")

        kind = stage or "chat"
        # The provider's tokens/min counts the call at its max_tokens when it is sent (OpenAI, Azure), or at the
        # completion it returns, which the reservation expects (``CallTokens``).
        at_max = params["max_tokens"] if self.cfg.limit_counts_max_tokens else 0

        def counted(response: Any) -> tuple[int, int]:
            prompt, completion = used(response)
            return (prompt + at_max, 0) if at_max else (prompt, completion)

        response, outcome = await self._with_retries(call, estimate + at_max, f"{kind}:{item_id}", kind,
                                                     None if at_max else params["max_tokens"], counted, item_id)
        result = CallResult(cache_key=key, item_id=item_id, stage=stage, **outcome)
        if response is not None:
            choice = response.choices[0]
            result.text = choice.message.content or ""
            result.finish_reason = choice.finish_reason
            result.cut = choice.finish_reason == "length" and params["max_tokens"] > 1
            result.prompt_tokens, result.completion_tokens = used(response)
        return result

    async def embed(self, texts: list[str], *, item_id: str | None = None) -> EmbedResult:
        """Embeddings of a batch of texts, in input order; never raises for API errors."""
        dimensions = getattr(self.cfg, "dimensions", None)
        extra = {"dimensions": dimensions} if dimensions else {}
        key = cache_key(self.cfg.model, [{"role": "input", "content": t} for t in texts], extra, "")
        estimate = sum(count_tokens(t) for t in texts)

        async def call(client: openai.AsyncOpenAI) -> Any:
            return await client.embeddings.with_raw_response.create(model=self.cfg.model, input=texts,
                                                                    encoding_format="float", **extra)

        def used(response: Any) -> tuple[int, int]:
            return (response.usage.prompt_tokens if response.usage else estimate), 0

        response, outcome = await self._with_retries(call, estimate, f"embed:{item_id}", "embed", None, used)
        result = EmbedResult(cache_key=key, **outcome)
        if response is not None:
            result.vectors = [list(d.embedding) for d in sorted(response.data, key=lambda d: d.index)]
            result.prompt_tokens = used(response)[0]
        return result

    def _calls_in_flight(self) -> int:
        return self._limiter.calls_in_flight(self._most_in_flight)

    def _observe_limits(self, headers: Mapping[str, str] | None) -> None:
        limits = stated_limits(headers)
        if limits == (None, None):
            return
        self._limiter.observe_limits(*limits)
        configured = (self.cfg.requests_per_minute, self.cfg.tokens_per_minute)
        if any(s and s < c for s, c in zip(limits, configured)) and (self.cfg.model, limits) not in _LIMITS_WARNED:
            _LIMITS_WARNED.add((self.cfg.model, limits))  # once a process (a Python worker runs many tasks)
            log.warning("The provider states %s requests/min and %s tokens/min for model %s, below the configured "
                        "%s and %s: the budget keeps to them (set llm.*.requests_per_minute and tokens_per_minute).",
                        *(f"{s:.0f}" if s else "no" for s in limits), self.cfg.model, *configured)

    def _start_item(self, item_id: str | None) -> None:
        """Where this call may be ``item_id``'s first: ask ``may_start_item`` (see the class)."""
        if self._may_start_item is None or item_id is None or item_id in self._items_started:
            return
        if not self._may_start_item(len(self._items_started)):
            raise ItemNotStarted(item_id)
        self._items_started.add(item_id)

    async def _with_retries(self, call: Callable[[openai.AsyncOpenAI], Awaitable[Any]], estimate: int, label: str,
                            kind: str, max_tokens: int | None, used: Callable[[T], tuple[int, int]],
                            item_id: str | None = None) -> tuple[T | None, dict]:
        """The response (None after the last failure) and the outcome. ``call`` returns the raw response from the
        ``openai`` client it is given (``_openai_client``): its headers (a 429's too) may state the provider's
        limits, for the limiter (``stated_limits``). The reservation of ``estimate`` tokens and the completion
        expected of a call of ``kind`` (none without ``max_tokens``: the estimate is the whole call) is settled
        with what the answer ``used`` (prompt, completion, as the provider's limit counts them) before the call's
        slot frees, so a window the answers widen opens at once.
        ``latency_s`` is the time the endpoint took (every attempt), ``queue_s`` the time spent waiting for a
        slot, the rate budget or a retry's backoff: the two are reported separately. Embedding batches are
        bounded by the client's bound alone (no completion to price)."""
        limit = (lambda: self._most_in_flight) if kind == "embed" else self._calls_in_flight
        started = time.monotonic()
        service = 0.0
        n_429 = 0
        attempt = 0

        def timing() -> dict:
            return dict(latency_s=service, queue_s=max(0.0, time.monotonic() - started - service))

        while True:
            attempt += 1
            sent = None
            try:
                async with self._slots.held(limit):
                    self._start_item(item_id)  # asked once the call has its slot: the items queued meanwhile
                    charged = await self._limiter.acquire(estimate, kind, max_tokens)
                    self._slots.recheck()  # this call's turn came: a window that grew meanwhile opens
                    sent = time.monotonic()
                    with self._openai_client() as client:
                        async with asyncio.timeout(self.cfg.timeout_s):
                            raw = await call(client)
                    response = raw.parse()
                    service += time.monotonic() - sent
                    self._observe_limits(raw.headers)
                    self._limiter.observe_latency(time.monotonic() - sent)
                    self._limiter.settle(charged, *used(response), kind)
                return response, dict(attempts=attempt, n_429=n_429, error=None, **timing())
            except (openai.OpenAIError, TimeoutError) as exc:  # API failures end as an error result, bugs still raise
                if sent is not None:
                    service += time.monotonic() - sent
                retryable = _is_retryable(exc)
                headers = _error_headers(exc)
                retry_after = retry_after_seconds(headers)
                self._observe_limits(headers)
                if isinstance(exc, openai.RateLimitError):
                    n_429 += 1
                    self._limiter.on_rate_limited(retry_after)
                if not retryable or attempt > self.cfg.max_retries:
                    error = self._describe(exc, attempt)
                    log.warning("LLM call %s failed: %s", label, error)
                    return None, dict(attempts=attempt, n_429=n_429, error=error, **timing())
                delay = backoff_seconds(attempt, retry_after, self._rng)
                log.debug("LLM call %s attempt %d: %s; retrying in %.2fs", label, attempt, type(exc).__name__, delay)
            await asyncio.sleep(delay)

    def _describe(self, exc: Exception, attempts: int) -> str:
        name = "Timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
        detail = self._scrub(" ".join(str(exc).split()))[:_ERROR_CHARS]
        return f"{name} after {attempts} attempt{'s' if attempts > 1 else ''}: {detail}".rstrip(": ")


def _run_sync(make_coro: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion from sync code, also when the caller already runs a loop (notebooks)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coro())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make_coro())).result()


def spark_task_index() -> int | None:
    """The Spark partition this code runs in (None outside a task): a task's place among the tasks that share
    the limits (``throttle.staggered_start``)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return None if context is None else context.partitionId()


def task_concurrency(cfg: LlmModelConfig, max_in_flight: int, share: float) -> int:
    """A task's bound on its calls in flight: the model's ``concurrency`` where set, else the task's ``share``
    of the job's ``max_in_flight`` (``llm.max_in_flight``)."""
    return cfg.concurrency or max(1, math.ceil(max_in_flight * share))


def run_items(
    items: Iterable[Item],
    fn: Callable[[LlmClient, Item], Awaitable[T]],
    cfg: LlmModelConfig,
    share: float = 1.0,
    concurrency: int | None = None,
    limiter: RateLimiter | None = None,
    may_start_item: Callable[[int], bool] | None = None,
) -> list[T]:
    """Run ``fn(client, item)`` for all items concurrently on one event loop and one client; results in input order.

    The entry point for Spark pandas UDFs: ``share`` is this task's fraction of the job's budget;
    ``concurrency`` replaces ``cfg.concurrency`` as the bound on calls in flight; ``limiter``, the task's
    budget where the caller keeps it (else one at ``share``); ``may_start_item``, see ``LlmClient``.
    """
    items = list(items)

    async def main() -> list[T]:
        async with LlmClient(cfg, share, limiter=limiter, concurrency=concurrency,
                             may_start_item=may_start_item) as client:
            return list(await asyncio.gather(*(fn(client, item) for item in items)))

    return _run_sync(main)


def run_batch(
    requests: Iterable[ChatRequest | Mapping[str, Any]], cfg: LlmModelConfig, share: float = 1.0,
    concurrency: int | None = None,
) -> list[CallResult]:
    """Independent chat calls (one per request), concurrently; results in input order."""

    async def one(client: LlmClient, request: ChatRequest | Mapping[str, Any]) -> CallResult:
        kwargs = dataclasses.asdict(request) if isinstance(request, ChatRequest) else dict(request)
        return await client.chat(kwargs.pop("messages"), **kwargs)

    return run_items(requests, one, cfg, share, concurrency)
