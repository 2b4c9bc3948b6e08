"""The LLM client through real HTTP and the real openai client: retries, throttling, failures as rows, secrets."""

import asyncio
import json
import logging
import random
import time

import pytest

from graphrag_spark.config import ExtractionConfig, LlmModelConfig
from graphrag_spark.errors import UserError
from graphrag_spark.index.extract_llm import ExtractionPrompts, extract_chunk
from graphrag_spark.llm import ChatRequest, LlmClient, cache_key, run_batch, run_items
from graphrag_spark.llm.client import backoff_seconds, retry_after_seconds
from graphrag_spark.llm.server import start_server
from graphrag_spark.llm.throttle import JobBudget, RateLimiter

SECRET = "sk-test-5f0e1d2c3b4a-do-not-leak"
KEY_ENV = "GRAPHRAG_SPARK_TEST_KEY"


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)


def model_cfg(server, **overrides):
    settings = dict(
        model="local-model",
        api_base=server.base_url,
        api_key_env=KEY_ENV,
        requests_per_minute=100_000,
        tokens_per_minute=100_000_000,
        concurrency=16,
        max_retries=6,
        timeout_s=5.0,
    )
    return LlmModelConfig(**{**settings, **overrides})


def requests(n, stage="test"):
    return [
        ChatRequest(
            messages=[{"role": "user", "content": f"Item number {i}. It has text."}], item_id=str(i), stage=stage
        )
        for i in range(n)
    ]


def test_batch_results_come_back_in_order_with_usage():
    with start_server() as server:
        results = run_batch(
            requests(5) + [{"messages": [{"role": "user", "content": "A dict request."}], "item_id": "d"}],
            model_cfg(server),
        )
    assert [r.item_id for r in results] == ["0", "1", "2", "3", "4", "d"]
    assert results[3].text == "Item number 3. It has text." and results[3].stage == "test"
    assert all(
        r.ok and r.attempts == 1 and r.prompt_tokens > 0 and r.completion_tokens > 0 and r.cache_key for r in results
    )


def test_429_retry_waits_for_retry_after():
    with start_server(requests_per_minute=60, window_s=1.0) as server:  # one request per second
        results = run_batch(requests(2), model_cfg(server))
        stats = server.stats()
    slow = max(results, key=lambda r: r.queue_s)
    assert all(r.ok for r in results) and stats["rate_limited"] == 1
    assert (slow.n_429, slow.attempts) == (1, 2)
    # Retry-After (about 1 s) was honoured, not a quick jittered retry; the wait is queue time, not service time.
    assert slow.queue_s >= 0.9 and slow.latency_s < 0.5


def test_500s_and_dropped_connections_are_retried():
    with start_server(error_rate=0.2, timeout_rate=0.1, seed=3) as server:
        results = run_batch(requests(10), model_cfg(server, max_retries=10))
        stats = server.stats()
    assert all(r.ok for r in results)
    retries = sum(r.attempts - 1 for r in results)
    assert retries == stats["injected"]["500"] + stats["injected"]["timeout"] > 0


def test_a_stalled_call_times_out_and_is_retried():
    with start_server(timeout_rate=0.3, timeout_mode="sleep", timeout_sleep_s=30, seed=1) as server:
        started = time.monotonic()
        results = run_batch(requests(6), model_cfg(server, timeout_s=0.3))
        elapsed = time.monotonic() - started
        stalled = server.stats()["injected"]["timeout"]
    assert all(r.ok for r in results) and stalled > 0
    assert elapsed < 15  # nobody waited for a stalled answer


def test_batch_with_20_percent_faults_extracts_every_chunk_once():
    texts = [
        f"Alice Smith met Bob Jones in Paris on day {i}. Later Alice Smith joined Acme Corp in Berlin."
        for i in range(30)
    ]
    prompts = ExtractionPrompts.load()
    cfg = ExtractionConfig(method="llm", max_gleanings=1)

    async def extract(client, text):
        return await extract_chunk(client, text, cfg, prompts)

    with start_server(error_rate=0.1, timeout_rate=0.05, rate_429=0.05, retry_after_s=0.2, seed=11) as server:
        results = run_items(texts, extract, model_cfg(server, max_retries=8))
        stats = server.stats()
    assert all(r.error is None and r.entities for r in results)
    assert sum(stats["injected"][k] for k in ("500", "timeout", "429")) > 0
    assert set(stats["served_hashes"].values()) == {1}  # no completed call was ever repeated
    assert sum(len(r.calls) for r in results) == stats["served"]["chat"]


def test_client_throttle_keeps_under_the_server_limit():
    n, rpm = 40, 600  # 10 requests/s; the server's 4-s sliding window allows 40
    with start_server(requests_per_minute=rpm, window_s=4.0) as server:
        started = time.monotonic()
        results = run_batch(requests(n), model_cfg(server, requests_per_minute=rpm))
        elapsed = time.monotonic() - started
        stats = server.stats()
    achieved_per_s = (n - 1) / elapsed
    assert all(r.ok for r in results) and stats["rate_limited"] == 0
    assert 0.8 * rpm / 60 <= achieved_per_s <= rpm / 60


def test_share_divides_the_budget():
    n, rpm = 6, 1200  # 20/s for the job, 5/s for this task at share 1/4
    with start_server() as server:
        started = time.monotonic()
        run_batch(requests(n), model_cfg(server, requests_per_minute=rpm), share=0.25)
        elapsed = time.monotonic() - started
    assert elapsed >= (n - 1) / 5


def test_exhausted_retries_return_an_error_result():
    with start_server(error_rate=1.0) as server:
        [result] = run_batch(requests(1), model_cfg(server, max_retries=2))
    assert not result.ok and result.text == "" and result.attempts == 3
    assert result.error.startswith("InternalServerError after 3 attempts: ")
    assert (result.item_id, result.stage) == ("0", "test")


def test_api_key_never_appears_in_logs_repr_or_errors(caplog):
    caplog.set_level(logging.DEBUG)
    with start_server(error_rate=1.0) as server:
        cfg = model_cfg(server, max_retries=1)

        async def call(client, request):
            return repr(client), await client.chat(request.messages, item_id=request.item_id)

        [(client_repr, result)] = run_items(requests(1), call, cfg)
    assert result.error and caplog.text
    for text in (caplog.text, client_repr, result.error, repr(result), repr(cfg)):
        assert SECRET not in text


def test_missing_key_names_the_variable_only(monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(UserError, match=KEY_ENV) as raised:
        LlmClient(LlmModelConfig(api_key_env=KEY_ENV))
    assert SECRET not in str(raised.value)
    with start_server() as server:  # a local server needs no key
        [result] = run_batch(requests(1), model_cfg(server))
    assert result.ok


def test_azure_client_reaches_deployment_paths():
    with start_server() as server:
        endpoint = server.base_url.removesuffix("/v1")
        [result] = run_batch(
            requests(1), model_cfg(server, api_type="azure", api_base=endpoint, api_version="2024-06-01")
        )
    assert result.ok and result.text == "Item number 0. It has text."


def test_embeddings_in_input_order():
    with start_server() as server:
        [result] = run_items(
            [["chip maker", "harbour", "chip makers"]], lambda client, texts: client.embed(texts), model_cfg(server)
        )
    assert result.ok and len(result.vectors) == 3 and len(result.vectors[0]) == 384
    similarity = sum(a * b for a, b in zip(result.vectors[0], result.vectors[2]))
    assert similarity > sum(a * b for a, b in zip(result.vectors[0], result.vectors[1]))


def test_an_embedder_without_a_set_concurrency_sends_its_batches_at_once_paced_by_the_rate_limit():
    from graphrag_spark.config import EmbeddingModelConfig
    from graphrag_spark.embeddings import OpenAIEmbedder

    texts = [f"text {i}" for i in range(20)]
    with start_server(latency_s=1.0) as server:
        settings = model_cfg(server).model_dump(exclude={"concurrency"})
        unset = EmbeddingModelConfig(**settings)
        started = time.monotonic()
        vectors, outcomes = OpenAIEmbedder(unset, batch_size=1).embed_batches(texts)
        at_once = time.monotonic() - started
        started = time.monotonic()
        OpenAIEmbedder(EmbeddingModelConfig(**settings, concurrency=5), batch_size=1).embed_batches(texts)
        bounded = time.monotonic() - started
    assert all(outcome.ok for outcome in outcomes) and len(vectors) == 20
    assert at_once < 2.5 and bounded >= 4.0, (at_once, bounded)  # 20 calls of 1 s: one round, or four of five


def test_a_client_keeps_more_calls_in_flight_than_the_openai_clients_own_pool_allows():
    """A high rate limit at a long latency needs more calls in flight than the ``openai`` client's pool (1,000
    connections): the rest waited for a connection (until its pool timeout). The client's bound is the
    caller's (its calls spread over several ``openai`` clients), and the process may open as many sockets as
    its hard limit allows."""
    import resource
    import threading

    calls = 1100
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 3 * calls:
        pytest.skip("the hard limit on open files is too low for a client and a server of 1,100 calls each")
    with start_server() as server:
        results = []
        with server.holding_answers():
            caller = threading.Thread(target=lambda: results.extend(
                run_batch(requests(calls), model_cfg(server, concurrency=calls, timeout_s=120.0))))
            caller.start()
            deadline = time.monotonic() + 60
            while len(server.requests_in_progress()) < calls and time.monotonic() < deadline:
                time.sleep(0.2)
            in_flight = len(server.requests_in_progress())
        caller.join(timeout=120)
    assert in_flight == calls, f"{in_flight} of {calls} calls reached the server before any was answered"
    assert len(results) == calls and all(r.ok for r in results)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == hard, "the soft limit on open files raised to the hard one"


def test_a_client_spreads_its_calls_in_flight_over_openai_clients_of_a_bounded_pool():
    """An ``openai`` client's connection pool scans every connection as each request starts and ends: with
    hundreds of calls in flight on one, that cost milliseconds of CPU a call (2,000 calls with 500 in flight
    against the local server in another process: 10.1 ms a call on one client, 5.3 ms spread). A client puts at
    most ``_CALLS_PER_POOL`` calls in flight on each ``openai`` client, and makes another as it needs one."""
    from graphrag_spark.llm.client import _CALLS_PER_POOL

    calls = 2 * _CALLS_PER_POOL + 20
    with start_server() as server:
        async def scenario():
            async with LlmClient(model_cfg(server, concurrency=calls, timeout_s=60.0)) as client:
                with server.holding_answers():
                    pending = [asyncio.create_task(client.chat([{"role": "user", "content": f"Item {i}."}]))
                               for i in range(calls)]
                    while len(server.requests_in_progress()) < calls:
                        await asyncio.sleep(0.05)
                    loads = list(client._calls_on)
                return loads, await asyncio.gather(*pending), list(client._calls_on)

        loads, results, after = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert sorted(loads) == [20, _CALLS_PER_POOL, _CALLS_PER_POOL]
    assert all(r.ok for r in results) and after == [0, 0, 0]


def test_call_slots_let_waiters_in_in_order_one_a_freed_slot():
    """``CallSlots``: a freed slot lets in the first waiter (not every waiter woken to check), a grown limit as
    many as it allows (``recheck``), and a waiter cancelled, before or after it was let in, holds no slot."""
    from graphrag_spark.llm.throttle import CallSlots

    async def scenario():
        slots, limit, order = CallSlots(), [2], []
        release = {i: asyncio.Event() for i in range(6)}

        async def call(i):
            async with slots.held(lambda: limit[0]):
                order.append(i)
                await release[i].wait()

        tasks = [asyncio.create_task(call(i)) for i in range(6)]
        await asyncio.sleep(0.01)
        assert order == [0, 1]
        tasks[2].cancel()  # cancelled while it waits: skipped
        release[0].set()
        await asyncio.sleep(0.01)
        assert order == [0, 1, 3]
        limit[0] = 4
        slots.recheck()
        await asyncio.sleep(0.01)
        assert order == [0, 1, 3, 4, 5]
        limit[0] = 1
        for i in (1, 3, 4, 5):
            release[i].set()
        await asyncio.gather(*tasks, return_exceptions=True)
        late = [asyncio.create_task(call(6)), asyncio.create_task(call(7))]
        release[6], release[7] = asyncio.Event(), asyncio.Event()
        await asyncio.sleep(0.01)
        release[6].set()  # frees the slot: 7 is let in, and cancelled before it runs: the slot goes on
        await asyncio.sleep(0)
        late[1].cancel()
        await asyncio.gather(*late, return_exceptions=True)
        assert order == [0, 1, 3, 4, 5, 6] and slots._held == 0

    asyncio.run(scenario())


def test_the_open_files_limit_is_raised_as_far_as_the_system_allows(monkeypatch):
    """Linux: the soft limit goes up to the hard one. macOS: the hard limit reads unlimited, which a soft one
    cannot be, and the kernel refuses more than its own bound: the largest of a few finite targets it takes."""
    import types

    from graphrag_spark.llm import client

    def system(soft, hard, most):
        limits = {"now": (soft, hard)}

        def setrlimit(_, wanted):
            if wanted[0] > most:
                raise ValueError("not allowed")
            limits["now"] = wanted

        fake = types.SimpleNamespace(RLIMIT_NOFILE=7, RLIM_INFINITY=-1, getrlimit=lambda _: limits["now"],
                                     setrlimit=setrlimit)
        monkeypatch.setattr(client, "resource", fake)
        client._allow_open_files()
        return limits["now"]

    assert system(1024, 524288, 10**9) == (524288, 524288)
    assert system(256, -1, 24576) == (10240, -1)
    assert system(4096, 4096, 10**9) == (4096, 4096)
    assert system(-1, -1, 10**9) == (-1, -1)


def test_the_default_bound_on_calls_in_flight_fills_a_high_limit_at_a_long_latency():
    """``llm.max_in_flight`` is a bound for safety, not the concurrency: at 10,000 requests/min and 20 s a call
    the budget needs 3,334 calls in flight (Little's law), which the default allows (256 allowed 768 a
    minute: measured at 3,000 requests/min and 10 s, 0.53 of the limit)."""
    from graphrag_spark.config import LlmConfig
    from graphrag_spark.llm.throttle import ModelRate

    rate = ModelRate(JobBudget(10_000, 10**9), latency_s=20.0)
    assert rate.in_flight(LlmConfig().max_in_flight) >= 10_000 / 60 * 20


def test_run_batch_works_inside_a_running_event_loop():
    """Notebooks run a loop already; the façade must not fail there."""
    with start_server() as server:

        async def notebook_cell():
            return run_batch(requests(2), model_cfg(server))

        results = asyncio.run(notebook_cell())
    assert all(r.ok for r in results)


def test_cache_key_is_deterministic_and_sensitive():
    messages = [{"role": "user", "content": "Hi"}]
    key = cache_key("m", messages, {"temperature": 0, "max_tokens": 5}, "v1")
    assert key == cache_key("m", [{"content": "Hi", "role": "user"}], {"max_tokens": 5, "temperature": 0}, "v1")
    assert len(key) == 32 and int(key, 16) >= 0
    assert (
        len(
            {
                key,
                cache_key("m", messages, {"temperature": 0, "max_tokens": 6}, "v1"),
                cache_key("m", messages, {"temperature": 0, "max_tokens": 5}, "v2"),
                cache_key("m2", messages, {"temperature": 0, "max_tokens": 5}, "v1"),
            }
        )
        == 4
    )


def test_retry_after_headers_and_backoff():
    assert retry_after_seconds({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    assert retry_after_seconds({"retry-after": "3"}) == 3.0
    assert (
        55
        < retry_after_seconds(
            {"retry-after": time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 60))}
        )
        <= 60
    )
    assert retry_after_seconds({"retry-after": "soon"}) is None and retry_after_seconds(None) is None
    assert retry_after_seconds({"retry-after": "99999"}) == 120.0
    rng = random.Random(0)
    assert all(0 <= backoff_seconds(3, None, rng) <= 2 for _ in range(100))
    assert all(2.0 <= backoff_seconds(1, 2.0, rng) <= 2.2 for _ in range(100))


def test_a_burst_of_429s_lowers_the_rate_to_what_the_provider_admitted_and_its_pause_spaces_the_calls_after_it():
    """Configured at 900 requests/min against a provider that admits 600 of them (a key others share): the
    burst of 429s after 40 s at 900 lowers the rate to the 600 the last minute got through, not to half of
    900; the calls reserved during its pause go at that rate after it (not all at its end); above it the rate
    comes back slowly. A burst with little sent before it (nothing measured) halves the rate, which comes
    back over ``recovery_s``."""
    now = [0.0]
    budget = JobBudget(900, 10**9, headroom=1.0, recovery_s=10.0, clock=lambda: now[0])
    for i in range(600):
        now[0] = i / 15
        budget.reserve(1000)
    now[0] = 40.0
    assert [budget.reserve(1000) for _ in range(6)][-1] > 0.3, "turns given before the 429s came"
    budget.on_rate_limited(20.0)
    budget.on_rate_limited(20.0)  # the same burst lowers the rate once
    assert budget.refusals == 1 and budget.factor() == pytest.approx(599 / 900, abs=0.003)
    # The turns that waited were given back (their callers reserve again): the first reservation now is first.
    waits = [budget.reserve(1000) for _ in range(10)]
    assert waits[0] == pytest.approx(20.0, abs=0.11) and waits[-1] - waits[0] == pytest.approx(9 / 10, rel=0.01)
    now[0] = 100.0
    assert budget.factor() == pytest.approx(599 / 900 + 0.03, abs=0.002), "3% of the limit a minute above it"

    now[0] = 0.0
    early = JobBudget(900, 10**9, headroom=1.0, recovery_s=10.0, clock=lambda: now[0])
    early.reserve(1000)
    now[0] = 0.5
    early.on_rate_limited(None)
    assert early.factor() == 0.5
    now[0] = 5.5
    assert early.factor() == pytest.approx(0.75 + 5 * 0.0005)
    now[0] = 10.5
    assert early.factor() == 1.0


def test_tasks_that_share_the_limits_send_in_turn_not_together():
    """Tasks that each keep a share of the limits (Spark Connect's waves, a query's map step) start together.
    Each holding one call at its start, they sent a call each at once and again together at every call
    interval of their share: 64 tasks at 600 requests/min sent 640 calls in the first minute, 128 in its
    first 10 s (a provider enforcing over 10 s allows 100) and 64 in its first second. Holding evenly spaced
    parts of a call by their partition, they send in turn at the job's rate."""
    import bisect

    def busiest(tasks: int, **start) -> tuple[int, int, int]:
        """The most calls sent in any 1 s, 10 s and 60 s of the first minute, every task reserving greedily."""
        sent = []
        for index in range(tasks):
            budget = RateLimiter(600, 10**9, 1 / tasks, clock=lambda: 0.0, interval_s=10.0, task_index=index,
                                 **start)._rate.budget
            while (wait := budget.reserve(100)) < 60:
                sent.append(wait)
        sent.sort()
        return tuple(max(bisect.bisect_left(sent, at + span) - i for i, at in enumerate(sent)) for span in (1, 10, 60))

    assert busiest(64, start_requests=1.0) == (64, 128, 640), "the old start: a call per task at once"
    for tasks in (4, 16, 64):
        assert busiest(tasks) == (10, 99, 591), tasks  # 600 x 0.985 a minute, and its parts
    assert RateLimiter(600, 10**9)._rate.budget._requests == 1.0, "a budget of the whole limits starts with a call"
    # Outside a Spark task (no partition), a random place.
    assert {RateLimiter(600, 10**9, 0.25)._rate.budget._requests for _ in range(200)} == {0.125, 0.375, 0.625, 0.875}


def test_where_the_provider_enforces_its_limits_over_10_s_the_burst_is_that_part_and_a_429_is_measured_over_the_sending():
    """Azure OpenAI enforces its requests/min over short intervals ("typically 1 or 10 seconds", at that part of
    them). After idle time a budget enforced over 10 s bursts a sixth of what a minute's allows; a 429 in a
    stage's first seconds, at the budget's own rate, lowers the rate to what was admitted since it began sending,
    here nothing, not to half (over a minute it halves: nothing was measured)."""
    now = [0.0]

    def bursting(interval_s: float) -> int:
        budget = JobBudget(600, 10**9, burst_s=1.0, clock=lambda: now[0], interval_s=interval_s)
        now[0] = 100.0  # idle: the burst is full
        return sum(budget.reserve(1000) == 0 for _ in range(20))

    assert (bursting(60.0), bursting(10.0)) == (9, 1)  # 1 s of 9.85 calls a second; a sixth of it (1.6)

    def after_429s(interval_s: float) -> list[float]:
        now[0] = 0.0
        budget = JobBudget(600, 10**9, headroom=1.0, recovery_s=10.0, clock=lambda: now[0], interval_s=interval_s)
        for i in range(90):  # 9 s at the limit, from 5 s on
            now[0] = 5.0 + i / 10
            budget.reserve(1000)
        budget.on_rate_limited(0.1)
        factors = [budget.factor()]
        now[0] += 2.0  # another 429, nothing sent since: 88 of 109 admitted over the 10.9 s since 5 s
        budget.on_rate_limited(0.1)
        return factors + [budget.factor()]

    assert after_429s(60.0)[0] == 0.5
    assert after_429s(10.0) == [1.0, pytest.approx(88 / 109)]  # 89 of the 89 the limit allowed in 8.9 s
    assert LlmModelConfig().enforced_interval_s == 60.0
    assert LlmModelConfig(api_base="https://my-resource.openai.azure.com/openai/v1").enforced_interval_s == 10.0
    assert LlmModelConfig(api_type="azure", limit_interval_s=1).enforced_interval_s == 1.0


def test_calls_reserved_before_a_429_wait_out_its_pause_then_go_at_the_lowered_rate():
    """Calls whose turn was given before a burst of 429s do not go into the window the provider has just
    refused: each reserves again once it wakes, after the pause and at the lowered rate."""

    async def scenario() -> tuple[list[float], float]:
        limiter = RateLimiter(600, 10**9, headroom=1.0)  # 10 calls a second
        started = time.monotonic()
        sent: list[float] = []

        async def call() -> None:
            await limiter.acquire(10)
            sent.append(time.monotonic() - started)

        calls = [asyncio.create_task(call()) for _ in range(10)]
        await asyncio.sleep(0)  # each has its turn: the first now, the others 0.1 s apart
        limiter.on_rate_limited(0.5)
        refused_at = time.monotonic() - started
        await asyncio.gather(*calls)
        return sorted(sent), refused_at

    sent, refused_at = asyncio.run(scenario())
    assert sent[0] <= refused_at and sent[1] >= refused_at + 0.5, "none of the nine that waited went in the pause"
    # Then at the halved rate (too little was sent to measure what the provider admits): five a second.
    assert sent[-1] - sent[1] >= 0.8 * 8 / 5


def test_limits_the_provider_states_replace_higher_configured_ones_and_carry_to_the_next_wave():
    """OpenAI states the key's limits on its answers (``x-ratelimit-limit-*``): where they are lower than the
    configured ones (a tier below the one configured), the budget takes its share of them; a higher stated
    limit changes nothing (the configured one may be this job's part of a shared key). A Connect stage's next
    wave starts from them, at its own share."""
    from graphrag_spark.config import LlmConfig
    from graphrag_spark.llm.client import stated_limits
    from graphrag_spark.llm.stage import llm_wave_items

    openai_headers = {"x-ratelimit-limit-requests": "5000", "x-ratelimit-limit-tokens": "160000",
                      "x-ratelimit-remaining-requests": "4999", "x-ratelimit-reset-requests": "12ms"}
    assert stated_limits(openai_headers) == (5000.0, 160000.0)
    assert stated_limits({"x-ratelimit-limit-requests": "60", "x-ratelimit-limit-tokens": "n/a"}) == (60.0, None)
    assert stated_limits({"retry-after": "1"}) == stated_limits(None) == (None, None)

    now = [0.0]
    budget = JobBudget(900, 10**9, headroom=1.0, clock=lambda: now[0])
    budget.limit_to(600, None)
    assert budget.requests_per_minute == 600
    assert [budget.reserve(100) for _ in range(11)][-1] == pytest.approx(1.0), "ten calls a second, not fifteen"
    budget.limit_to(1200, 200_000)
    assert (budget.requests_per_minute, budget.tokens_per_minute) == (600, 200_000), "only ever lower"

    limiter = RateLimiter(900, 10**6, share=0.5)
    limiter.observe_limits(600, 200_000)
    assert limiter.requests_per_minute() == 300, "the task's share of the key's limit"
    learned = json.loads(json.dumps(limiter.learned()))
    assert RateLimiter(900, 10**6, share=0.25, learned=learned).requests_per_minute() == 150
    llm = LlmConfig(items_per_commit=16, connect_wave_s=60.0)
    assert llm_wave_items(llm, LlmModelConfig(requests_per_minute=900, tokens_per_minute=10**9), learned, 1.0) == 100, \
        "no call seen yet: 200,000 tokens/min at a typical 2,000-token call"


def test_a_client_takes_the_limits_the_server_states_from_its_first_answer_and_from_a_429(caplog):
    """Over HTTP: configured at ten times what the server admits, the client learns the server's limit from
    the first answer's headers and spaces the calls after it at that rate, with no 429 (before, it sent them
    at the configured rate until the 429s came), and warns once that the configuration is above them. A 429's
    headers state them too."""
    async def scenario(server) -> tuple[list[float], RateLimiter]:
        limiter = RateLimiter(1200, 10**9, headroom=1.0, burst_s=0.0)
        async with LlmClient(model_cfg(server, requests_per_minute=1200), limiter=limiter) as client:
            await client.chat([{"role": "user", "content": "The first."}])
            results = await asyncio.gather(*(client.chat([{"role": "user", "content": f"Call {i}."}])
                                             for i in range(4)))
        assert all(r.ok and r.n_429 == 0 for r in results)
        return sorted(admitted for admitted, _ in server.served_intervals("chat")), limiter

    with start_server(requests_per_minute=120, limit_headers=True) as server, caplog.at_level(logging.WARNING):
        admitted, limiter = asyncio.run(scenario(server))
        assert server.stats()["rate_limited"] == 0
    warned = [r.getMessage() for r in caplog.records if "provider states" in r.getMessage()]
    assert warned == ["The provider states 120 requests/min and no tokens/min for model local-model, below the "
                      "configured 1200 and 100000000: the budget keeps to them (set llm.*.requests_per_minute and "
                      "tokens_per_minute)."]
    assert limiter.requests_per_minute() == 120 and limiter.learned()["stated_limits"] == [120, None]
    # Two calls a second from the first answer on (at the configured 1,200: the four within 0.2 s).
    assert admitted[-1] - admitted[0] >= 0.9 * 3 / 2

    with start_server(requests_per_minute=120, tokens_per_minute=50_000, rate_429=1.0, limit_headers=True) as server:
        refused = RateLimiter(1200, 10**6)
        result = run_items([0], lambda client, _: client.chat([{"role": "user", "content": "x"}]),
                           model_cfg(server, max_retries=0), limiter=refused)[0]
    assert result.n_429 == 1 and refused.learned()["stated_limits"] == [120, 50_000]


def test_a_task_local_limiter_keeps_its_share_of_the_rate_times_the_latency_in_flight():
    """Where tokens/min may bind (here 100 calls of 2,000 tokens a minute, under 600 requests), a task that
    throttles itself keeps its share of the rate x the latency in flight (Little's law), at most its bound:
    before any answer at a guessed latency (5 s) and call size (2,000 tokens), then at the observed ones."""
    from graphrag_spark.llm.client import task_concurrency
    from graphrag_spark.llm.throttle import in_flight_target

    async def scenario():
        limiter = RateLimiter(600, 200_000, share=0.5)
        windows = [limiter.calls_in_flight(64)]
        for _ in range(2):
            charged = await limiter.acquire(1500, "extract")
            limiter.observe_latency(10.0)
            limiter.settle(charged, 1500, 500, "extract")
            windows.append(limiter.calls_in_flight(64))
        return windows + [limiter.calls_in_flight(4)]

    # Half of 200,000 tokens/min at 2,000 a call: 50 calls a minute, 10 s each.
    assert asyncio.run(scenario()) == [in_flight_target(50, 5.0, 64)] + 2 * [in_flight_target(50, 10.0, 64)] + [4]
    assert in_flight_target(50, 10.0, 64) > 8, "more than a fixed eight per task"
    # Where requests/min binds (tokens leave room: no completion is charged short), the window grows with the
    # time the first call has been out (see ``test_before_any_answer_the_window_grows_...``).
    assert RateLimiter(600, 10**9).calls_in_flight(1000) == in_flight_target(600, 5.0, 1000) == 121
    settings = LlmModelConfig().model_dump(exclude={"concurrency"})
    assert task_concurrency(LlmModelConfig(**settings), 256, 0.25) == 64, "unset: the task's share of llm.max_in_flight"
    assert task_concurrency(LlmModelConfig(**settings, concurrency=16), 256, 0.25) == 16


def test_before_any_answer_the_window_grows_with_the_time_the_first_call_is_out():
    """No answer after t seconds means the latency is at least t: at the request rate the window before the first
    answer is sized at that time (past the 5 s guess), so it always holds more calls than the rate has sent and a
    model answering in a minute is not starved until then (a fixed guess of 15 s held 32 s of calls: half the rate
    at 60 s a call). Where the token rate binds it stays at the guess where calls are charged their prompts alone
    until the first answers, and grows the same way where a charge is all the provider counts (a call's prompt and
    max_tokens, as OpenAI and Azure count it); from the first answer on the observed latency sizes it."""
    from graphrag_spark.llm.throttle import ModelRate, in_flight_target

    now = [0.0]
    free_tokens = ModelRate(JobBudget(600, 10**9, clock=lambda: now[0]))
    tight_tokens = ModelRate(JobBudget(600, 1_500_000, clock=lambda: now[0]))  # 750 calls of 2,000 tokens a minute
    counted_tokens = ModelRate(JobBudget(600, 1_500_000, clock=lambda: now[0]))  # 250 of 2,000 + 4,000 max_tokens
    now[0] = 100.0  # made long before their first call: the wait starts with it
    assert free_tokens.in_flight(10_000) == in_flight_target(600, 5.0, 10_000) == 121
    for rate in (free_tokens, tight_tokens):
        rate.price(2000, "extract", 4000)  # the completion unknown until the first answers
    counted_tokens.price(2000 + 4000, "extract", None)
    now[0] += 60.0
    assert free_tokens.in_flight(10_000) == in_flight_target(600, 60.0, 10_000) == 1221, "60 s of calls out: 122 s"
    assert free_tokens.in_flight(10_000) > 600 * 60 / 60, "more than the rate has sent"
    assert tight_tokens.in_flight(10_000) == in_flight_target(750, 5.0, 10_000) == 151, "the token rate's window"
    assert counted_tokens.in_flight(10_000) == in_flight_target(250, 60.0, 10_000) == 510, "a charge all counted"
    free_tokens.observe_latencies([20.0])
    assert free_tokens.in_flight(10_000) == in_flight_target(600, 20.0, 10_000), "the first answer's latency"


def test_a_learned_latency_holds_before_the_first_answer_only_as_far_as_the_first_call_has_been_out():
    """A budget seeded with an earlier one's ``learned()`` (a Connect stage's first wave, from the stage before)
    sizes its window at the learned latency, but until its own first answer no shorter than the time its first
    call has been out at the request rate: a stage slower than the one it learned from is not starved."""
    from graphrag_spark.llm.throttle import in_flight_target

    async def taught() -> RateLimiter:
        limiter = RateLimiter(600, 10**9)
        charged = await limiter.acquire(1500, "summarize")
        limiter.observe_latency(10.0)
        limiter.settle(charged, 1500, 100, "summarize")
        return limiter

    learned = json.loads(json.dumps(asyncio.run(taught()).learned()))
    now = [0.0]
    seeded = RateLimiter(600, 10**9, clock=lambda: now[0], learned=learned)
    assert seeded.calls_in_flight(10_000) == in_flight_target(600, 10.0, 10_000)
    asyncio.run(seeded.acquire(1500, "report"))
    now[0] += 40.0
    assert seeded.calls_in_flight(10_000) == in_flight_target(600, 40.0, 10_000), "40 s without an answer"
    seeded.observe_latency(40.0)
    assert seeded.calls_in_flight(10_000) == in_flight_target(600, 0.8 * 10.0 + 0.2 * 40.0, 10_000), "its answers"


def test_a_window_that_grows_before_any_answer_lets_waiting_calls_in():
    """Before the first answer no slot frees, so the calls waiting for one are let in as the window grows (each
    call's turn at the budget rechecks it): with answers held, more calls reach the server than the window at
    the guessed latency allows (here the guess is cut to 0.25 s: a window of 51 calls at 1,200 a minute; the
    rate sends 70 in about 3.5 s)."""
    import threading

    from graphrag_spark.llm import throttle

    with pytest.MonkeyPatch.context() as patch, start_server() as server:
        patch.setattr(throttle, "_INITIAL_LATENCY_S", 0.25)
        assert RateLimiter(1200, 10**9).calls_in_flight(1000) == 51
        results = []
        cfg = model_cfg(server, requests_per_minute=1200, concurrency=1000, timeout_s=60.0)
        with server.holding_answers():
            caller = threading.Thread(target=lambda: results.extend(run_batch(requests(120), cfg)))
            caller.start()
            deadline = time.monotonic() + 30  # about 4 s on a quiet machine
            while len(server.requests_in_progress()) < 70 and time.monotonic() < deadline:
                time.sleep(0.1)
            in_flight = len(server.requests_in_progress())
        caller.join(timeout=120)
    assert in_flight >= 70, f"{in_flight} calls reached the server before any answer (the first window: 51)"
    assert len(results) == 120 and all(r.ok for r in results)


def test_a_task_local_limiter_starts_from_what_an_earlier_one_learned():
    """A Connect stage's next wave: a limiter given an earlier one's ``learned()`` (through JSON, as it comes
    back from a task) keeps its latency and completion means: its window at the learned latency, and its first
    call priced with the completion its kind of call answers. A new one guesses the latency (5 s) and the
    calls' size (2,000 tokens) and prices the prompt alone."""
    from graphrag_spark.llm.throttle import in_flight_target

    async def taught() -> RateLimiter:
        limiter = RateLimiter(600, 200_000)
        for _ in range(4):
            charged = await limiter.acquire(1500, "extract")
            limiter.observe_latency(10.0)
            limiter.settle(charged, 1500, 500, "extract")
        return limiter

    learned = json.loads(json.dumps(asyncio.run(taught()).learned()))
    seeded, fresh = RateLimiter(600, 200_000, learned=learned), RateLimiter(600, 200_000)
    assert seeded.calls_in_flight(64) == in_flight_target(100, 10.0, 64)
    assert fresh.calls_in_flight(64) == in_flight_target(100, 5.0, 64)
    assert asyncio.run(seeded.acquire(1500, "extract")) == 2000 and asyncio.run(fresh.acquire(1500, "extract")) == 1500
    # And at the rate the earlier one's 429s left it (here halved: it had sent nothing to measure).
    fresh.on_rate_limited(None)
    lowered = RateLimiter(600, 200_000, learned=json.loads(json.dumps(fresh.learned())))
    assert lowered.requests_per_minute() == pytest.approx(300, rel=0.001)


def test_connect_waves_hold_what_the_budget_calls_in_the_wave_time():
    """A Connect stage's waves hold the items the budget calls in ``llm.connect_wave_s``, so that a wave's tail
    is the same share of any limit: the first at the configured limits, a typical call's size and one call an
    item (nothing answered yet), the next at the learned calls' size and the calls per item seen; never fewer
    than ``llm.items_per_commit``."""
    from graphrag_spark.config import LlmConfig
    from graphrag_spark.llm.stage import llm_wave_items
    from graphrag_spark.llm.throttle import wave_items

    limiter = RateLimiter(600, 200_000)
    for _ in range(4):
        charged = asyncio.run(limiter.acquire(1500, "extract"))
        limiter.settle(charged, 1500, 500, "extract")
    learned = json.loads(json.dumps(limiter.learned()))
    llm = LlmConfig(items_per_commit=16, connect_wave_s=300.0)
    tokens_bind = LlmModelConfig(requests_per_minute=600, tokens_per_minute=200_000)
    assert llm_wave_items(llm, tokens_bind, None, 0.0) == 500, "200k tokens/min at a typical 2,000-token call"
    # 200k tokens/min at 2,000 a call: 100 calls a minute, 500 in 300 s, two calls an item.
    assert llm_wave_items(llm, tokens_bind, learned, 2.0) == 250
    requests_bind = LlmModelConfig(requests_per_minute=60, tokens_per_minute=10**9)
    assert llm_wave_items(llm, requests_bind, learned, 1.0) == 300
    assert llm_wave_items(llm, requests_bind, {**learned, "rate_factor": 0.5}, 1.0) == 150, "at the rate 429s left"
    assert llm_wave_items(llm, LlmModelConfig(requests_per_minute=6, tokens_per_minute=10**9), learned, 2.0) == 16
    assert wave_items(600, 300.0, 0.5, 1) == 3000, "fewer than one call an item (failures) counts as one"


def test_a_task_local_client_calls_at_the_rate_before_the_first_answers():
    long = [ChatRequest(messages=[{"role": "user", "content": f"{i} " + "word " * 1000}], item_id=str(i), stage="test")
            for i in range(40)]
    with start_server(latency_s=0.5) as server:
        # Prompts of ~1,000 tokens: 3M tokens/min allows ~2,850 a minute, under the 6,000 requests: it may bind.
        run_batch(long, model_cfg(server, requests_per_minute=6000, tokens_per_minute=3_000_000), concurrency=32)
        served = server.served_intervals("chat")
    first_answer = min(answered for _, answered in served)
    # ~48 calls a second at 0.96 of the limit: no call waits for a first answer to price the completions.
    assert sum(admitted < first_answer for admitted, _ in served) >= 10, "the first latency at the rate"
    peak = max(sum(admitted <= t < answered for admitted, answered in served) for t, _ in served)
    assert 12 <= peak <= 32, "then the rate x the latency, at most the bound"


@pytest.mark.parametrize("client_counts", ["max_tokens", "used"])
def test_where_the_provider_counts_max_tokens_a_client_told_so_reserves_them_and_stays_under_its_token_limit(
        client_counts):
    """OpenAI and Azure OpenAI count a call against tokens/min at its prompt and max_tokens when it arrives, not at
    the completion it returns. A client that reserves the completion it expects sends a call of 10 prompt tokens
    and max_tokens 200 at a fraction of what the provider counts, and runs into 429s; one told how the provider
    counts (``token_limit_counts``, ``auto`` for OpenAI's and Azure's endpoints) reserves the prompt and max_tokens
    and keeps under the limit, near it, while its usage stays what the calls used."""
    n, max_tokens = 120, 200
    tokens_per_minute = 126_000  # ~10 calls of ~210 counted tokens a second; the server's 10 s window holds 100
    with start_server(tokens_per_minute=tokens_per_minute, window_s=10.0, count_max_tokens=True) as server:
        # Configured at 0.9 of the server's limit: a stall of this shared machine sends late calls in a bunch.
        cfg = model_cfg(server, tokens_per_minute=round(0.9 * tokens_per_minute), max_tokens=max_tokens,
                        token_limit_counts=client_counts)
        started = time.monotonic()
        results = run_batch(requests(n), cfg)
        elapsed = time.monotonic() - started
        stats = server.stats()
    if client_counts == "used":
        assert stats["rate_limited"] > 0, "the completion it expected is a fraction of what the provider counts"
        return
    assert all(r.ok for r in results) and stats["rate_limited"] == 0
    counted_per_s = stats["counted_tokens"] / n * (n - 1) / elapsed
    assert 0.8 * cfg.tokens_per_minute / 60 <= counted_per_s <= tokens_per_minute / 60, "near the limit, under it"
    assert sum(r.prompt_tokens + r.completion_tokens for r in results) == stats["prompt_tokens"] + \
        stats["completion_tokens"] < stats["counted_tokens"], "usage is what the calls used, not what was counted"


def test_token_limit_counts_auto_is_max_tokens_on_openai_and_azure_endpoints_only():
    assert LlmModelConfig().limit_counts_max_tokens, "no api_base: OpenAI's own endpoint"
    assert LlmModelConfig(api_base="https://api.openai.com/v1").limit_counts_max_tokens
    assert LlmModelConfig(api_type="azure", api_base="https://gateway.example.com").limit_counts_max_tokens
    assert LlmModelConfig(api_base="https://my-resource.openai.azure.com/openai/v1").limit_counts_max_tokens
    assert not LlmModelConfig(api_base="http://127.0.0.1:8800/v1").limit_counts_max_tokens
    assert LlmModelConfig(api_base="http://127.0.0.1:8800/v1", token_limit_counts="max_tokens").limit_counts_max_tokens
    assert not LlmModelConfig(token_limit_counts="used").limit_counts_max_tokens


def test_rate_limiter_pause_delays_the_next_call():
    async def scenario():
        limiter = RateLimiter(60_000, 1_000_000)
        await limiter.acquire(10)
        limiter.on_rate_limited(0.3)
        started = time.monotonic()
        await limiter.acquire(10)
        return time.monotonic() - started

    assert asyncio.run(scenario()) >= 0.29
