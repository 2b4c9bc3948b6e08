"""Throttling to a requests/min and tokens/min budget.

``JobBudget`` is the whole job's budget in one place: the driver's coordinator
(``llm.coordinator``) serves it to every task over localhost/the cluster network, so all
concurrent tasks share one budget and concurrency follows from the limit and the observed
latency (``in_flight_target``, Little's law), not from the number of tasks.

``RateLimiter`` is the same budget kept by a task for itself, for callers without a coordinator
(Spark Connect, query-time calls): every concurrent Spark task is its own Python worker, so it gets
``share`` (1 / concurrent tasks) of the limits, and keeps its share of the rate x the observed latency
in flight (``RateLimiter.calls_in_flight``, which ``CallSlots`` follows). On a burst of 429s both pause
until ``Retry-After``, make the turns still waiting to be sent reserve again, and lower the rate to what the
provider admitted of the last minute's sends (by half at most), then try slowly for more
(``JobBudget.on_rate_limited``). Where the provider states the key's limits on its answers (OpenAI's
``x-ratelimit-limit-*``), limits lower than the configured ones replace them from the first answer
(``JobBudget.limit_to``), before any 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import deque
from collections.abc import Callable


_TOKENS_SMOOTHING = 0.1
_LATENCY_SMOOTHING = 0.2
# Before any call of a model returned: a guessed latency, and the time the first call has been out, which the
# latency is at least. Too large a window only queues calls at the budget (which sets the rate); too small a
# one starves it until the first answer (a window sized at a latency L holds 2L + 2 s of calls:
# ``in_flight_target``). At the request rate the window grows with that time, so it always holds more calls
# than the rate has sent: no latency starves it (a fixed guess of 15 s held 32 s of calls, and a model
# answering in a minute sent half the rate until its first answer). At the token rate it grows the same way
# where a call's charge is the whole of what the provider counts (it counts max_tokens when the call is sent,
# as OpenAI and Azure OpenAI do; embeddings), and else stays at the guess: until the first answers a call is
# charged its prompt alone, so the calls of the first latency go out early by their completions, and the
# answers' debt holds the rest of the minute back; the window stops those sends after about 12 s of calls, so
# that a provider's minute sees no more than the limit even where the answers take longer than a minute.
_INITIAL_LATENCY_S = 5.0
# Before any call of a model: the size of a call that prices the first window at a tokens/min limit.
_TYPICAL_PROMPT_TOKENS = 2000
# The share of the token rate at which refunds of overestimates come back: a window sees at most this much
# of the limit more than it was charged for.
_REFUND_RELEASE = 0.01
# The token headroom (``CallTokens.token_headroom``): the answers it waits for, the standard deviations of a
# minute's summed estimate errors it keeps below the limit, and its bounds (at 0.985, 1M tokens/min at 10 s
# latency saw a minute at 0.995 of the limit).
_HEADROOM_ANSWERS = 20
_HEADROOM_DEVIATIONS = 3.0
_HEADROOM_BOUNDS = (0.80, 0.975)
# A provider's limits are per minute: a 429 tells that what this budget sent in the last minute (less what was
# refused) is about all the provider admits of it. One that enforces them over a shorter interval (Azure OpenAI:
# "typically 1 or 10 seconds", at that part of them) refuses a call that comes early by a fraction of the
# interval, however little was sent in the minute: there the 429 is measured over the time the budget has sent.
_ADMITTED_SPAN_S = 60.0
# Above the rate a burst of 429s measured the provider admitting, the share of the limits a budget tries again
# per second: slowly, since each try past a limit that others share costs a 429 or two, and the limit may
# have risen (the others have stopped).
_PROBE_PER_S = 0.03 / 60.0


class CallTokens:
    """Running means of a model's prompt and completion tokens per call, the completion's also per kind
    of call (a first extraction answers at length, a gleaning check in one token).

    A provider's tokens/min window counts a call's completion when it is sent, but the completion is
    known only once the answer is back. Charging only the prompt would run every call reserved ahead
    of the answers (the whole in-flight window) over the limit by its completion; so a reservation
    also charges the completion expected from the calls of its kind answered so far (at most its
    ``max_tokens``), and the answer settles the difference."""

    def __init__(self) -> None:
        self.prompt: float | None = None
        self.completion: float | None = None
        self._squared_error: float | None = None  # mean squared error of a reservation's charge (a bias counts too)
        self._completion_by_kind: dict[str, float] = {}
        self._seen: dict[str, int] = {}

    def _smoothed(self, name: str, mean: float | None, value: float) -> float:
        """The plain mean of the first calls (a first answer far from the rest is not kept for long), then a
        moving one."""
        self._seen[name] = self._seen.get(name, 0) + 1
        weight = max(_TOKENS_SMOOTHING, 1.0 / self._seen[name])
        return value if mean is None else (1 - weight) * mean + weight * value

    def observe_prompt(self, tokens: int) -> None:
        self.prompt = self._smoothed("prompt", self.prompt, tokens)

    def observe_completion(self, tokens: int, kind: str, error: float) -> None:
        """One answer's completion tokens, and the error of what its reservation charged (used minus charged:
        the completion's, and the prompt's where the provider counts it otherwise)."""
        self.completion = self._smoothed("completion", self.completion, tokens)
        self._squared_error = self._smoothed("error", self._squared_error, error**2)
        self._completion_by_kind[kind] = self._smoothed(f"completion:{kind}", self._completion_by_kind.get(kind),
                                                        tokens)

    def token_headroom(self, tokens_per_minute: float, share: float = 1.0) -> float | None:
        """The share of ``tokens_per_minute`` a budget can aim at (None before ``_HEADROOM_ANSWERS`` answers).

        What a provider's minute sees beyond the budget's rate is one call (the granularity of the sends)
        and the sum of the minute's estimate errors (the answers settle them only after the calls were sent):
        a few standard deviations of that sum, which grows as the square root of the calls a minute holds. A
        budget of few large calls aims lower than one of many small ones (2,350-token calls: 0.957 of 200k
        tokens/min; 1M reaches the upper bound). A budget that is ``share`` of the provider's limit (a task's
        own) keeps its share of the deviations of the whole minute, where the tasks' errors add up as the
        square root of their number: each budgeting for its own errors alone gave away more the more tasks
        there were (four tasks sharing 200k tokens/min, calls of 2,300 tokens charged 100 off: 0.926 each, now
        0.940)."""
        if self._seen.get("completion", 0) < _HEADROOM_ANSWERS or not self.prompt:
            return None
        call = self.prompt + (self.completion or 0.0)
        minute_error = _HEADROOM_DEVIATIONS * math.sqrt(self._squared_error * tokens_per_minute * share / call)
        low, high = _HEADROOM_BOUNDS
        return min(high, max(low, 1.0 - (call + minute_error) / tokens_per_minute))

    def expected_completion(self, kind: str = "", max_tokens: int | None = None) -> int:
        # A kind not answered yet expects nothing: the model's mean (a first extraction's, say) charged to
        # every gleaning in flight before the first one answered was refunded at once, and a refund overruns
        # the windows that start after the call as much as an underestimate does the ones that hold it.
        expected = self._completion_by_kind.get(kind, 0.0)
        return round(min(expected, max_tokens) if max_tokens else expected)

    def calls_per_minute(self, tokens_per_minute: float) -> float:
        """The request rate that ``tokens_per_minute`` allows at the mean call's size (a prompt of
        ``_TYPICAL_PROMPT_TOKENS`` before any call)."""
        return tokens_per_minute / ((self.prompt or _TYPICAL_PROMPT_TOKENS) + (self.completion or 0.0))

    def learned(self) -> dict:
        """The means and counts so far, as JSON (``CallTokens.of``)."""
        return {"prompt": self.prompt, "completion": self.completion, "squared_error": self._squared_error,
                "completion_by_kind": dict(self._completion_by_kind), "seen": dict(self._seen)}

    @classmethod
    def of(cls, learned: dict) -> CallTokens:
        tokens = cls()
        tokens.prompt, tokens.completion = learned["prompt"], learned["completion"]
        tokens._squared_error = learned["squared_error"]
        tokens._completion_by_kind, tokens._seen = dict(learned["completion_by_kind"]), dict(learned["seen"])
        return tokens


class ModelRate:
    """One model's budget as its answers price it: the ``JobBudget``, the calls' token means and charge
    errors (``CallTokens``) and the observed service latency. The coordinator keeps one per model for the
    whole job (``ModelBudget``); a task without a coordinator keeps its own (``RateLimiter``)."""

    def __init__(self, budget: JobBudget, latency_s: float | None = None, learned: dict | None = None,
                 share: float = 1.0) -> None:
        """``learned``: what another ``ModelRate`` of the same model had learned (``learned()``); ``share``: the
        part of the provider's limits ``budget`` is (a task's, without a coordinator)."""
        self.budget = budget
        self.latency_s = latency_s
        self.call_tokens = CallTokens()
        self.share = share
        self.stated_limits: tuple[float | None, float | None] = (None, None)
        self._first_priced_at: float | None = None
        self._completions_unpriced = False  # a call was charged less than the completion it will return
        self._answered = latency_s is not None  # a latency known for this budget (not only ``learned``)
        if learned is not None:
            self.latency_s = learned["latency_s"]
            self.call_tokens = CallTokens.of(learned["call_tokens"])
            self.observe_limits(*learned["stated_limits"])
            self.budget.lowered_to(learned["rate_factor"])
            self._aim_tokens()

    def _aim_tokens(self) -> None:
        """Aim the budget's tokens at the headroom the answers' errors allow (``CallTokens.token_headroom``)."""
        headroom = self.call_tokens.token_headroom(self.budget.tokens_per_minute, self.share)
        if headroom is not None:
            self.budget.aim_tokens(headroom)

    def learned(self) -> dict:
        """The observed latency, the token means, the provider's stated limits and the rate 429s left
        (``JobBudget.factor``), as JSON: a later budget of the same model starts from them."""
        return {"latency_s": self.latency_s, "call_tokens": self.call_tokens.learned(),
                "stated_limits": list(self.stated_limits), "rate_factor": self.budget.factor()}

    def observe_limits(self, requests_per_minute: float | None, tokens_per_minute: float | None) -> None:
        """The limits the provider states for the key (``x-ratelimit-limit-*``): the budget's share of them
        where they are lower than the configured ones (``JobBudget.limit_to``)."""
        if (requests_per_minute, tokens_per_minute) == self.stated_limits:
            return
        self.stated_limits = (requests_per_minute, tokens_per_minute)
        self.budget.limit_to(*(limit * self.share if limit else None for limit in self.stated_limits))
        self._aim_tokens()

    def calls_per_minute(self) -> float:
        """The request rate the binding limit allows: requests/min, or tokens/min at the mean call's size."""
        return min(self.budget.requests_per_minute, self.call_tokens.calls_per_minute(self.budget.tokens_per_minute))

    def in_flight(self, cap: int) -> int:
        """Little's law: the calls in flight that keep the current rate at the observed latency (at most ``cap``).
        Before this budget's first answer, at a guessed latency (``_INITIAL_LATENCY_S``) or the one ``learned``
        from an earlier budget, or the time the first call has been out where that is longer (the latency is at
        least that long); at the calls the token rate allows, at the guess alone where calls were charged less
        than their completions (``_INITIAL_LATENCY_S``)."""
        factor = self.budget.factor()
        if self._answered:
            return in_flight_target(self.calls_per_minute() * factor, self.latency_s, cap)
        guess = _INITIAL_LATENCY_S if self.latency_s is None else self.latency_s
        out_s = 0.0 if self._first_priced_at is None else self.budget.clock() - self._first_priced_at
        at_tokens = self.call_tokens.calls_per_minute(self.budget.tokens_per_minute) * factor
        return min(in_flight_target(self.budget.requests_per_minute * factor, max(guess, out_s), cap),
                   in_flight_target(at_tokens, guess if self._completions_unpriced else max(guess, out_s), cap))

    def observe_latencies(self, latencies: list[float]) -> None:
        self._answered = self._answered or bool(latencies)
        for latency in latencies:
            self.latency_s = latency if self.latency_s is None else (
                (1 - _LATENCY_SMOOTHING) * self.latency_s + _LATENCY_SMOOTHING * latency)

    def price(self, prompt_tokens: int, kind: str, max_tokens: int | None) -> int:
        """The tokens to reserve for a call: its prompt and the completion expected of ``kind`` (none without
        ``max_tokens``: ``prompt_tokens`` are then all the provider counts)."""
        if self._first_priced_at is None:
            self._first_priced_at = self.budget.clock()
        self._completions_unpriced = self._completions_unpriced or max_tokens is not None
        self.call_tokens.observe_prompt(prompt_tokens)
        return prompt_tokens + self.call_tokens.expected_completion(kind, max_tokens)

    def answered(self, completions: list[list]) -> None:
        """Answers ([kind, completion tokens, charge error]): their means, the token headroom their errors
        allow (``CallTokens.token_headroom``), and the budget corrected by their summed errors."""
        if not completions:
            return
        for kind, completion, error in completions:
            self.call_tokens.observe_completion(completion, kind, error)
        self._aim_tokens()
        self.budget.settle(sum(error for _, _, error in completions))


def staggered_start(share: float, task_index: int | None) -> float:
    """The part of a call that a task's budget of ``share`` of the limits holds at its start. Each holding one
    call, the tasks that start together sent a call each at once, and then again together at every call
    interval of their rate (a task's rate is a call every 1.6 s at 16 tasks and 600 requests/min): a provider
    that enforces its limits over 10 s saw 112 calls in the first 10 s, against 100. Holding evenly spaced
    parts of a call, by ``task_index`` (a random place where none is known), the tasks send in turn, at the
    job's rate from the start."""
    if share >= 1:
        return 1.0
    tasks = max(1, round(1 / share))
    place = random.randrange(tasks) if task_index is None else task_index % tasks
    return (place + 0.5) / tasks


class RateLimiter:
    """A task's own budget, for callers without a coordinator (Spark Connect, query-time calls): the job's
    limits times ``share`` (1 / the tasks that run at once, each its own Python worker), a ``ModelRate``
    as the coordinator keeps the job's. ``acquire`` sleeps for exactly the wait its reservation was given
    (reservations are granted in call order: no polling)."""

    def __init__(self, requests_per_minute: float, tokens_per_minute: float, share: float = 1.0, *,
                 clock: Callable[[], float] = time.monotonic, learned: dict | None = None,
                 task_index: int | None = None, **budget) -> None:
        """``learned``: an earlier task's ``learned()`` at the same share (the previous of a stage's waves on
        Spark Connect): its latency and token means, so that this task neither guesses its window nor prices
        its first calls from nothing. ``task_index``: this task's place among those sharing the limits (its
        Spark partition), which sets when its first call goes (``staggered_start``)."""
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        budget.setdefault("start_requests", staggered_start(share, task_index))
        self._rate = ModelRate(JobBudget(requests_per_minute * share, tokens_per_minute * share, clock=clock,
                                         **budget), learned=learned, share=share)

    def learned(self) -> dict:
        """What this task's answers taught its budget (``ModelRate.learned``)."""
        return self._rate.learned()

    def requests_per_minute(self) -> float:
        """Requests/min this task's budget allows now (a 429 halves it, then it recovers)."""
        return self._rate.budget.requests_per_minute * self._rate.budget.factor()

    async def acquire(self, tokens: int, kind: str = "", max_tokens: int | None = None) -> int:
        """Reserve one request of ``tokens`` prompt tokens and the completion expected of ``kind``, and wait
        until it may be sent; returns the tokens charged (what ``settle`` corrects)."""
        charged = self._rate.price(tokens, kind, max_tokens)
        budget = self._rate.budget
        while True:
            refusals = budget.refusals
            wait = budget.reserve(charged)
            if wait > 0:
                await asyncio.sleep(wait)
            if budget.refusals == refusals:  # else a burst of 429s gave its turn back while it waited: again
                break
        return charged

    def settle(self, charged: int, prompt: int, completion: int, kind: str = "") -> None:
        """Charge the difference between what ``acquire`` charged and the tokens the call really used."""
        self._rate.answered([[kind, completion, prompt + completion - charged]])

    def observe_latency(self, latency_s: float) -> None:
        """A call's service time (its running mean sizes ``calls_in_flight``)."""
        self._rate.observe_latencies([latency_s])

    def calls_in_flight(self, cap: int) -> int:
        """The calls this task may have in flight (at most ``cap``): Little's law at its share of the rate
        and the observed latency."""
        return self._rate.in_flight(cap)

    def on_rate_limited(self, retry_after_s: float | None) -> None:
        """A 429: pause this task's calls until ``Retry-After`` and halve its rate (``JobBudget``)."""
        self._rate.budget.on_rate_limited(retry_after_s)

    def observe_limits(self, requests_per_minute: float | None, tokens_per_minute: float | None) -> None:
        """The provider's stated limits for the whole key (``ModelRate.observe_limits``)."""
        self._rate.observe_limits(requests_per_minute, tokens_per_minute)


class CallSlots:
    """Calls in flight, each up to a limit read again whenever a slot frees or ``recheck`` is called (it may
    follow a limiter's ``calls_in_flight``, which the answers move, and which grows with time before them).
    Waiters are let in first come, first served, as many as the limit allows: a freed slot lets in the first
    waiter rather than waking all of them to check (a Connect task waits with all its items at once: waking
    2,000 on every answer cost a few milliseconds of CPU a call)."""

    def __init__(self) -> None:
        self._held = 0
        self._waiting: deque[tuple[asyncio.Future, Callable[[], int]]] = deque()

    @contextlib.asynccontextmanager
    async def held(self, limit: Callable[[], int]):
        admitted = asyncio.get_running_loop().create_future()
        self._waiting.append((admitted, limit))
        self.recheck()  # at once where nobody waits ahead and the limit allows
        try:
            await admitted  # ``recheck`` counts the slot as held when it lets this caller in
        except asyncio.CancelledError:
            if admitted.done() and not admitted.cancelled():  # let in, then cancelled: the slot goes on
                self._release()
            raise
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        self._held -= 1
        self.recheck()

    def recheck(self) -> None:
        """Let waiting callers in, in order, while their limit allows more calls than are held (a window that
        grew while no slot freed: before the first answer none frees)."""
        while self._waiting:
            admitted, limit = self._waiting[0]
            if admitted.done():  # cancelled while it waited
                self._waiting.popleft()
                continue
            if self._held >= limit():
                return
            self._waiting.popleft()
            self._held += 1
            admitted.set_result(None)


def in_flight_target(requests_per_minute: float, latency_s: float, cap: int, margin: float = 2.0,
                     slack_s: float = 2.0) -> int:
    """Little's law: calls that must be in flight for ``requests_per_minute`` at ``latency_s`` each,
    at least 1 and at most ``cap``. The margin is wide because a window counts the items waiting for
    their reserved slot at the budget too (about one service time each when the budget is the
    bottleneck: measured queue p50 ~ latency); ``slack_s`` of calls more cover an item's own work
    between its calls (parsing, the coordinator's round trips), which at a short latency would
    otherwise leave the budget without a caller waiting. A window too large only queues calls at the
    budget, which still sets the rate, while one too small leaves the limit unused."""
    rate = requests_per_minute / 60.0
    return max(1, min(cap, math.ceil(rate * (latency_s * margin + slack_s)) + 1))


def wave_items(calls_per_minute: float, wave_s: float, calls_per_item: float, least: int) -> int:
    """The items of a wave that keeps a budget of ``calls_per_minute`` sending for ``wave_s`` seconds, at
    ``calls_per_item`` calls each (at least ``least``). A wave ends with its last items' calls, while no new
    ones start: sized in time rather than items, that tail is the same small share of any limit."""
    return max(least, math.floor(calls_per_minute / 60.0 * wave_s / max(calls_per_item, 1.0)))


class JobBudget:
    """The whole job's requests/min and tokens/min budget, in one place (the driver's coordinator).

    Every call of every task reserves its request and estimated tokens here and is told how long
    to wait before sending: reservations are granted in arrival order and may run the buckets
    into debt, so the wait of a caller is exactly the time its reservation needs to refill (no
    polling, no per-task shares). Bursts are capped at ``burst_s`` of budget, the rate aims at
    ``headroom`` of the limit, and 429s slow everyone down (``on_rate_limited``: once per burst of 429s,
    down to what the provider admitted of the last minute's sends, by half at most, and pause until
    ``Retry-After``; a halving comes back over ``recovery_s``, and above what got through the rate tries
    ``_PROBE_PER_S`` for more). A reservation waiting to be sent when a burst of 429s comes is given back,
    and its caller reserves again (``refusals`` tells it), at the lower rate and after the pause, rather
    than sending into the window the provider has just refused.

    A provider's one-minute window sees at most one burst plus a minute at the budget's rate: 0.25 s
    and 0.985 of the limit make that 0.989 of it, and leave about half a second of send jitter before
    a 429 (a second's burst at 0.97 left 0.8 s, and gave away 3% of every limit). A burst only follows
    idle budget, so its size never sets the sustained rate. Where the provider enforces its limits over a
    shorter ``interval_s`` (at that part of them), the burst is that part of ``burst_s``, and a burst of 429s
    lowers the rate to what was admitted since the last interval without a send (over a minute, a 429 in a
    stage's first seconds halved the rate: Carol at 600 requests/min enforced over 10 s ran at 0.76 of the limit
    while calling, over 1 s at 0.58; now 0.98 and 0.95).

    Tokens aim lower (``token_headroom``, then ``aim_tokens``): a call's tokens are an estimate until its
    answer settles them a latency later, so a window's edges hold the errors of the calls just sent, one
    way, and the refunds of calls sent just before it, the other; at 0.985 those made a few 429s a stage
    at a tokens/min limit of 200k (measured with ``bench_llm.py --tpm``: 0.96 and slow refunds made none at
    1 s or 10 s latency), while at 1M a minute's errors average out and 0.96 left 4% of it unused.
    """

    def __init__(self, requests_per_minute: float, tokens_per_minute: float, *, headroom: float = 0.985,
                 token_headroom: float = 0.96, burst_s: float = 0.25, min_factor: float = 0.05,
                 recovery_s: float = 30.0, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 start_requests: float = 1.0) -> None:
        """``start_requests``: the requests the budget holds at its start (one: a call at once)."""
        self.requests_per_minute = requests_per_minute
        self.tokens_per_minute = tokens_per_minute
        self._refunds = 0.0  # overestimates not yet given back (``settle``)
        self._request_rate = requests_per_minute * headroom / 60.0
        self._token_rate = tokens_per_minute * token_headroom / 60.0
        self._burst_s = burst_s * min(1.0, interval_s / 60.0)
        self._interval_s = min(interval_s, _ADMITTED_SPAN_S)
        self._min_factor = min_factor
        self._recovery_s = recovery_s
        self.clock = clock
        now = clock()
        self._updated = now
        self._requests = start_requests
        self._tokens = max(1.0, self._token_rate * burst_s)
        self._paused_until = now
        self._factor_base = 1.0  # the factor the last burst of 429s set ...
        self._regain = 0.0  # ... and what of the rate before it comes back over ``recovery_s`` (after a halving)
        self._decreased_at = now - recovery_s
        self._sends: deque[tuple[float, int]] = deque()  # (sent at, tokens) of the reservations
        self._sending_since = now  # the first reservation after an interval with none
        self._refused: deque[float] = deque()  # when the 429s came
        self.refusals = 0  # bursts of 429s so far: a reservation granted before the latest one is stale

    def factor(self) -> float:
        since = self.clock() - self._decreased_at
        return min(1.0, self._factor_base + self._regain * min(1.0, since / self._recovery_s) + since * _PROBE_PER_S)

    def limit_to(self, requests_per_minute: float | None, tokens_per_minute: float | None) -> None:
        """Limits the provider states (``x-ratelimit-limit-*`` of its answers) replace the configured ones where
        they are lower: a key's tier below the one configured is then known from the first answer, before any
        429 (learning it from bursts of 429s costs a few of them and a pause each). A higher stated limit
        changes nothing: the configured one may be this job's part of a key that others share. They come with
        the first answers, before a 429 lowered the rate, so the rate's factor is kept."""
        self._refill(self.clock())
        if requests_per_minute and requests_per_minute < self.requests_per_minute:
            self._request_rate *= requests_per_minute / self.requests_per_minute
            self.requests_per_minute = requests_per_minute
        if tokens_per_minute and tokens_per_minute < self.tokens_per_minute:
            self._token_rate *= tokens_per_minute / self.tokens_per_minute
            self.tokens_per_minute = tokens_per_minute
        self._refill(self.clock())  # the bursts the lower rates allow

    def lowered_to(self, factor: float) -> None:
        """Start at ``factor`` of the rate, where an earlier budget of the same limits was left by 429s (it comes
        back slowly, as after a burst of them)."""
        self._factor_base, self._regain, self._decreased_at = factor, 0.0, self.clock()

    def _refill(self, now: float) -> float:
        factor = self.factor()
        # A pause (a 429's Retry-After) adds nothing: the calls that waited it out are then spaced at the rate
        # (they were sent all at once at its end, and most were refused again).
        elapsed, self._updated = max(0.0, now - max(self._updated, self._paused_until)), now
        self._requests = min(max(1.0, self._request_rate * factor * self._burst_s),
                             self._requests + elapsed * self._request_rate * factor)
        released = min(self._refunds, elapsed * self._token_rate * _REFUND_RELEASE)
        self._refunds -= released
        self._tokens = min(max(1.0, self._token_rate * factor * self._burst_s),
                           self._tokens + elapsed * self._token_rate * factor + released)
        return factor

    def aim_tokens(self, headroom: float) -> None:
        """Aim at ``headroom`` of tokens/min from now on (``CallTokens.token_headroom``)."""
        self._refill(self.clock())
        self._token_rate = self.tokens_per_minute * headroom / 60.0

    def reserve(self, tokens: int) -> float:
        """Charge one request of about ``tokens`` tokens; returns the seconds to wait before sending it."""
        now = self.clock()
        factor = self._refill(now)
        if not self._sends or now - self._sends[-1][0] > self._interval_s:  # the provider's interval saw none
            self._sending_since = now
        self._requests -= 1.0
        self._tokens -= tokens
        wait = max(0.0, self._paused_until - now) + max(0.0, -self._requests / (self._request_rate * factor),
                                                        -self._tokens / (self._token_rate * factor))
        self._sends.append((now + wait, tokens))
        while self._sends[0][0] < now - _ADMITTED_SPAN_S:
            self._sends.popleft()
        return wait

    def settle(self, tokens: int) -> None:
        """Charge the difference between estimated and used tokens. A refund (negative) comes back slowly
        (``_REFUND_RELEASE`` of the rate): tokens refunded at once are sent again in the windows that no
        longer hold the call they were charged to (at 10 s latency the first answers' overestimates,
        refunded at once, made five 429s)."""
        if tokens < 0:
            self._refunds -= tokens
        else:
            self._tokens -= tokens

    def _admitted_share(self, now: float) -> float:
        """What the provider admitted of the last minute's sends (those sent less the 429s), as a share of
        the limits: the larger of the requests' and the tokens'. Where it enforces them over a shorter interval,
        of the sends since the last interval without any (at most a minute's)."""
        span = _ADMITTED_SPAN_S
        if self._interval_s < _ADMITTED_SPAN_S:
            span = min(span, max(1e-3, now - self._sending_since))
        since = now - span
        sent = [tokens for at, tokens in self._sends if since <= at <= now]
        admitted = max(0, len(sent) - sum(1 for at in self._refused if at >= since))
        tokens = sum(sent) * admitted / len(sent) if sent else 0.0
        per_minute = span / 60.0
        return max(admitted / (self.requests_per_minute * per_minute), tokens / (self.tokens_per_minute * per_minute))

    def _give_back_waiting(self, now: float) -> None:
        """Give back the reservations that wait to be sent: a burst of 429s made them stale, and their callers
        reserve again once they wake (``refusals``), after the pause and at the lowered rate, in the order they
        were given. Kept, they would have been sent into the window the provider has just refused (and the
        calls reserved again would have queued behind them)."""
        waiting = [tokens for at, tokens in self._sends if at > now]
        self._requests += len(waiting)
        self._tokens += sum(waiting)
        self._sends = deque((at, tokens) for at, tokens in self._sends if at <= now)

    def on_rate_limited(self, retry_after_s: float | None) -> None:
        """A 429: pause until ``Retry-After``, and once per burst of them lower the rate to what the provider
        admitted of the last minute's sends, by half at most. A limit lower than the one configured (a key
        other callers share) is learnt in a burst or two; halving each time gave a quarter of it away
        (configured at 900 requests/min against 600: 0.81 of them, 11% of calls refused)."""
        now = self.clock()
        factor = self._refill(now)
        self._refused.append(now)
        while self._refused[0] <= now - _ADMITTED_SPAN_S:
            self._refused.popleft()
        if retry_after_s:
            self._paused_until = max(self._paused_until, now + retry_after_s)
        if now - self._decreased_at >= max(1.0, retry_after_s or 0.0):
            admitted = min(factor, self._admitted_share(now))
            self._factor_base = max(self._min_factor, factor / 2.0, admitted)
            self._regain = factor - self._factor_base if admitted < factor / 2.0 else 0.0
            self._decreased_at = now
            self._give_back_waiting(now)
            self.refusals += 1
