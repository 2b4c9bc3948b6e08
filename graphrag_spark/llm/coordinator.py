"""The driver's side of an LLM stage: one job-wide rate budget and per-item durability for every task.

Each Spark task is its own Python worker; none of them can see the whole job. The coordinator
is a small HTTP server in the driver process (bound to the driver's address, port chosen by
the OS, a random token in every request) that the stage's tasks talk to:

- ``/start`` (a task's item keys): the keys not already returned in this stage. A retried
  task (its Python worker killed mid-task) therefore pays again for nothing that had returned.
- ``/acquire`` (prompt tokens, 429s seen, service latencies, the completion tokens and charge
  errors of the task's last calls, and the limits the provider states where they changed): the
  seconds to wait before the call, from the job's ``JobBudget``, the tokens charged (the prompt and
  the completion expected, ``CallTokens``), and the task's window of items in flight: the job's
  Little's-law target (the binding limit, requests/min or tokens/min at the mean call's size, x
  observed latency) divided by the tasks running. The budget and the
  observed latency belong to the model (``shared_budget``), not to the stage: stages that overlap
  share one budget, and a stage that starts after another starts at the latency already observed,
  not at a guess. A fed stage
  (the reports, fed by the summaries) takes only the part of that target the model's other open
  stages leave: what feeds it ends first, so its own items are ready sooner, and the work that
  waits on the feeding stage alone (the entity embeddings wait on the summaries) leaves the run's tail.
- ``/result`` (one item's ``llm_results`` row): appended to a journal file and buffered. The
  stage commits the buffer to Delta every ``llm.commit_interval_s``; a stage that starts finds
  an earlier crash's journal and commits what it holds first. A driver crash therefore loses at
  most the calls in flight.
- ``/more`` (a stage with follow-ups only): the items that answers of this stage made ready on
  the driver (a parent community's report context once its sub-reports are written), handed to
  the first task that asks, ahead of its items not yet started; long-polled until every item,
  follow-ups included, has returned. A retried task attempt is handed its partition's follow-ups
  that had not returned again.

Usage is computed here from the rows received (no scan of ``llm_results``): calls, retries,
429s, tokens, and service latency and queue wait as separate percentiles.

The HTTP server (``DriverEndpoint``) and the journal (``Journal``) are also what the embedding
stages use to keep each returned batch of vectors (``index.embed``).
"""

from __future__ import annotations

import asyncio
import json
import hashlib
import math
import secrets
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from graphrag_spark.llm.throttle import JobBudget, ModelRate

_REQUEST_TIMEOUT_S = 60.0
_SHUTDOWN_POLL_S = 0.02


class ModelBudget(ModelRate):
    """One model's budget and observed latency in this driver, shared by every stage that calls it."""

    def __init__(self, budget: JobBudget, lock: threading.Lock, latency_s: float | None = None) -> None:
        super().__init__(budget, latency_s)
        self.lock = lock
        self.open_stages: list = []  # the open ``Coordinator``s calling this model

    def unfed_outstanding(self) -> int:
        """Items not yet returned of the open stages that are not fed: the calls a fed stage yields to."""
        return sum(stage.outstanding() for stage in list(self.open_stages) if not stage.fed)


_BUDGETS: dict[tuple, ModelBudget] = {}
_BUDGETS_LOCK = threading.Lock()


def shared_budget(key: tuple, requests_per_minute: float, tokens_per_minute: float,
                  interval_s: float = 60.0) -> ModelBudget:
    """The driver's budget for ``key`` (endpoint, model) at these limits, enforced over ``interval_s``, created
    on first use."""
    with _BUDGETS_LOCK:
        full_key = (*key, requests_per_minute, tokens_per_minute, interval_s)
        if full_key not in _BUDGETS:
            _BUDGETS[full_key] = ModelBudget(JobBudget(requests_per_minute, tokens_per_minute, interval_s=interval_s),
                                             threading.Lock())
        return _BUDGETS[full_key]


@dataclass
class UsageFigures:
    calls: int = 0
    attempts: int = 0
    n_429: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cut: int = 0
    latency_p50_s: float = 0.0
    latency_p95_s: float = 0.0
    queue_p50_s: float = 0.0
    queue_p95_s: float = 0.0
    failed_items: int = 0
    first_errors: list[str] = field(default_factory=list)


def _percentiles(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    p50, p95 = np.percentile(np.asarray(values, dtype=float), [50, 95])
    return round(float(p50), 3), round(float(p95), 3)


def usage_of(rows: list[dict]) -> UsageFigures:
    """Usage figures of ``llm_results`` rows (as dicts)."""
    figures = UsageFigures()
    latencies, waits = [], []
    for row in rows:
        figures.calls += row["n_calls"]
        figures.attempts += row["attempts"]
        figures.n_429 += row["n_429"]
        figures.prompt_tokens += row["prompt_tokens"]
        figures.completion_tokens += row["completion_tokens"]
        figures.cut += row.get("n_cut") or 0  # a journal row of an older version has none
        if row["error"] is not None:
            figures.failed_items += 1
            if len(figures.first_errors) < 3:
                figures.first_errors.append(row["error"])
        latencies += row["call_latencies"] or []
        waits += row["queue_waits"] or []
    figures.latency_p50_s, figures.latency_p95_s = _percentiles(latencies)
    figures.queue_p50_s, figures.queue_p95_s = _percentiles(waits)
    return figures


def read_journal(path: Path) -> list[dict]:
    """The rows of a journal file; a line cut short by a crash is ignored (its call was in flight)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class Journal:
    """Rows obtained and not yet committed to Delta, one JSON line each, flushed as written: what the
    rerun of a crashed driver commits before it pays for anything again (``read_journal``)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def append(self, rows: list[dict]) -> None:
        text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        with self._lock:
            self._file.write(text)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def discard(self) -> None:
        """Close and delete: everything journaled is committed."""
        self.close()
        self.path.unlink(missing_ok=True)


class DriverEndpoint:
    """A small HTTP server in the driver process that a stage's tasks post JSON to: bound to the driver's
    address, port chosen by the OS, a random token in every path (requests are never logged)."""

    def __init__(self, host: str, routes: dict[str, Any], name: str) -> None:
        token = secrets.token_hex(16)
        self._server = ThreadingHTTPServer((host, 0), _handler(token, routes))
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}/{token}"
        # A short poll: ``close`` waits for the loop to see it, and a stage's end waits for ``close``
        # (at the default half second, a quarter second on average at every stage's end).
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": _SHUTDOWN_POLL_S}, name=name,
                         daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(token: str, routes: dict[str, Any]):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            _, given, route = (self.path.split("/") + ["", ""])[:3]
            if given != token or route not in routes:
                self.send_error(404)
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            payload = json.dumps(routes[route](body)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:  # requests carry the token: never logged
            pass

    return Handler


# How long a task's ``/more`` waits for follow-ups before it asks again.
_MORE_POLL_S = 5.0


class Coordinator:
    def __init__(self, host: str, model: ModelBudget, max_in_flight: int, journal: Path, tasks: int = 1,
                 follow: Callable[[dict], list[dict]] | None = None, expected: int = 0, fed: bool = False) -> None:
        self._model = model
        self._max_in_flight = max_in_flight
        self._tasks = tasks  # the tasks expected to run at once: a task that starts first must not take every slot
        self._lock = threading.Lock()
        self._done: set[str] = set()
        self._buffer: list[dict] = []
        self._rows: list[dict] = []
        # Partitions, not attempts: an attempt lost with its executor never says it finished, and its retry
        # must not count as one more task sharing the window.
        self._running: set[int] = set()
        self._finished: set[int] = set()
        # Numbers each window a task is told: a task's concurrent ``/acquire``s may answer out of order, and
        # an older, narrower window must not replace a wider one that already started items.
        self._windows_told = 0
        self.on_result = None  # a callable(row) the stage may set (progress)
        self._journal = Journal(journal)
        # Follow-ups: ``follow(row)`` gives the records a returned row made ready. The stage stays open
        # while fewer than ``expected`` distinct items returned, or a row's follow-ups are being made. ``fed``:
        # items may also be ``add``ed while it is open (a stage fed by another one); once it is not, it is sealed.
        self._follow = follow
        self._expected = expected
        self.fed = fed
        self._sealed = False
        self._following = 0
        self._late: list[dict] = []  # follow-ups no task has taken yet
        self._handed: dict[int, list[dict]] = {}  # per partition, the follow-ups its attempts took
        self._attempts: dict[int, int] = {}
        self._changed = threading.Condition(self._lock)
        self.follow_error: BaseException | None = None
        routes = {"start": lambda b: self.start(b["keys"], b["partition"]),
                  "finish": lambda b: self.finish(b["partition"]),
                  "acquire": lambda b: self.acquire(b["tokens"], b.get("rate_limited", []),
                                                    b.get("latencies", []), b.get("completions", []),
                                                    b.get("kind", ""), b.get("max_tokens"), b.get("waited_since"),
                                                    b.get("stated_limits")),
                  "result": lambda b: self.result(b["row"]),
                  "more": lambda b: self.more(b["partition"], b["attempt"])}
        self._endpoint = DriverEndpoint(host, routes, "llm-coordinator")
        self.url = self._endpoint.url
        with model.lock:
            model.open_stages.append(self)

    def close(self) -> None:
        with self._model.lock:
            self._model.open_stages.remove(self)
        self._endpoint.close()
        self._journal.close()

    def outstanding(self) -> int:
        """Items expected and not returned yet (read without the lock: a scheduling hint)."""
        return max(0, self._expected - len(self._rows))

    # -- what tasks call -------------------------------------------------------------------
    def window(self) -> int:
        """Items a task may have in flight: the job's Little's-law target shared by the running tasks."""
        model = self._model
        sharing = max(1, len(self._running), self._tasks - len(self._finished))
        total = model.in_flight(self._max_in_flight)
        if self.fed:  # what the stages feeding it leave (see the module's docstring), at least one item
            total = max(1, total - model.unfed_outstanding())
        return max(1, math.ceil(total / sharing))

    def _told_window(self) -> dict:
        """The window, numbered in the order it was computed (called under ``self._lock``)."""
        self._windows_told += 1
        return {"window": self.window(), "window_number": self._windows_told}

    def start(self, keys: list[str], partition: int) -> dict:
        with self._lock:
            self._running.add(partition)
            return {"todo": [k for k in keys if k not in self._done], **self._told_window(),
                    "follow_ups": self._follow is not None or self.fed}

    def finish(self, partition: int) -> dict:
        with self._lock:
            self._running.discard(partition)
            self._finished.add(partition)
        return {}

    def acquire(self, tokens: int, rate_limited: list[float | None], latencies: list[float],
                completions: list[list], kind: str = "", max_tokens: int | None = None,
                waited_since: int | None = None, stated_limits: list | None = None) -> dict:
        """A reservation, with the bursts of 429s so far (``refusals``). ``waited_since``: the ``refusals`` of a
        reservation of ``tokens`` (charged already) that has waited its time: it is sent now, unless a burst
        since gave it back (``JobBudget``): then it is made again. ``stated_limits``: the provider's, where an
        answer told them (``ModelRate.observe_limits``)."""
        model = self._model
        with model.lock:
            if stated_limits:
                model.observe_limits(*stated_limits)
            model.observe_latencies(latencies)
            model.answered(completions)
            for retry_after in rate_limited:
                model.budget.on_rate_limited(retry_after)
            refusals = model.budget.refusals
            if waited_since == refusals:
                charged, wait = tokens, 0.0
            else:
                charged = tokens if waited_since is not None else model.price(tokens, kind, max_tokens)
                wait = model.budget.reserve(charged)
        with self._lock:
            return {"wait": wait, "charged": charged, "refusals": refusals, **self._told_window()}

    def result(self, row: dict) -> dict:
        with self._lock:
            if row["item_key"] in self._done:  # a speculative or retried copy: keep the first
                return {}
            self._journal.append([row])
            self._done.add(row["item_key"])
            self._buffer.append(row)
            self._rows.append(row)
            self._following += self._follow is not None
        if self.on_result is not None:
            self.on_result(row)
        if self._follow is not None:
            records: list[dict] = []
            try:
                if self.follow_error is None:
                    records = self._follow(row)
            except BaseException as exc:  # noqa: BLE001 - no more follow-ups; the stage raises it once its calls end
                self.follow_error = exc
            with self._changed:
                self._late.extend(records)
                self._expected += len(records)
                self._following -= 1
                self._changed.notify_all()
        return {}

    def _open(self) -> bool:
        """Whether the stage is open; once a task is told it is not, it stays sealed (``add`` takes nothing)."""
        self._sealed = self._sealed or not (self._following > 0 or len(self._rows) < self._expected)
        return not self._sealed

    def more(self, partition: int, attempt: int) -> dict:
        """Follow-ups for a task of ``partition``: a new attempt first gets again what its partition took and
        did not return; then the ones no task took. Waits up to ``_MORE_POLL_S`` for some while the stage is open.
        ``attempt`` is the task attempt's id (``TaskContext.taskAttemptId``): unique in the application and
        larger for a later attempt, in a resubmitted stage too."""
        deadline = time.monotonic() + _MORE_POLL_S
        with self._changed:
            handed = self._handed.setdefault(partition, [])
            given = []
            if self._attempts.get(partition, -1) < attempt:
                self._attempts[partition] = attempt
                given = [record for record in handed if record["item_key"] not in self._done]

            def current() -> bool:  # an earlier attempt's poll (its worker may be dead) takes nothing
                return self._attempts[partition] == attempt

            while current() and not given and not self._late and self._open() and time.monotonic() < deadline:
                self._changed.wait(max(0.0, deadline - time.monotonic()))
            if not current():
                return {"records": [], "open": self._open()}
            given += self._late
            handed += self._late
            self._late = []
            return {"records": given, "open": self._open()}

    # -- what the stage calls --------------------------------------------------------------
    def add(self, records: list[dict]) -> bool:
        """Items made ready outside the calls (a feed's), handed to the tasks as follow-ups are; False (not
        taken) once the job has nothing left in flight: its tasks end, a later job calls them."""
        with self._changed:
            if self._sealed:
                return False
            self._late.extend(records)
            self._expected += len(records)
            self._changed.notify_all()
            return True

    def take_buffer(self) -> list[dict]:
        with self._lock:
            rows, self._buffer = self._buffer, []
        return rows

    def returned(self) -> int:
        with self._lock:
            return len(self._rows)

    def usage(self) -> UsageFigures:
        with self._lock:
            rows = list(self._rows)
        return usage_of(rows)


def rows_frame(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    """Journal/buffer rows as a pandas frame in ``llm_results`` column order (timestamps parsed)."""
    # A key a row lacks (a journal of an older version) is null, not NaN.
    frame = pd.DataFrame([[row.get(c) for c in columns] for row in rows], columns=columns, dtype=object)
    frame["created_at"] = pd.to_datetime(frame["created_at"])
    return frame


def post_json(url: str, body: dict) -> dict:
    """One request to the coordinator (stdlib only: the executors need nothing more)."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=_REQUEST_TIMEOUT_S) as response:
        return json.loads(response.read())


class RemoteBudget:
    """The task's side of ``/acquire``: the ``RateLimiter`` interface that ``LlmClient`` uses, backed by
    the coordinator. Answers' charge errors, 429s and the limits the provider states ride along with the next
    reservation. Made in the task's event loop (``widened``)."""

    def __init__(self, url: str, window: int) -> None:
        self._url = url
        self.window = window
        self._window_number = 0
        self._wider = asyncio.Event()
        self._rate_limited: list[float | None] = []
        self._latencies: list[float] = []
        self._completions: list[list] = []  # [kind, completion, error] of the calls answered since the last acquire
        self._stated_limits: list | None = None  # the provider's, when they changed since the last acquire
        self._told_limits: list | None = None

    async def post(self, route: str, body: dict) -> dict:
        return await asyncio.to_thread(post_json, f"{self._url}/{route}", body)

    async def acquire(self, tokens: int, kind: str = "", max_tokens: int | None = None) -> int:
        """Reserve at the coordinator and wait the time it gives, then ask whether the reservation still holds: a
        burst of 429s meanwhile gave it back, and the coordinator makes it again (``Coordinator.acquire``)."""
        answer = await self._post_acquire({"tokens": tokens, "kind": kind, "max_tokens": max_tokens})
        while answer["wait"] > 0:
            await asyncio.sleep(answer["wait"])
            answer = await self._post_acquire({"tokens": answer["charged"], "waited_since": answer["refusals"]})
        return answer["charged"]

    async def _post_acquire(self, body: dict) -> dict:
        """``/acquire``, with what the task's answers and 429s told since the last one."""
        rate_limited, self._rate_limited = self._rate_limited, []
        latencies, self._latencies = self._latencies, []
        completions, self._completions = self._completions, []
        stated_limits, self._stated_limits = self._stated_limits, None
        answer = await self.post("acquire", {**body, "rate_limited": rate_limited, "latencies": latencies,
                                             "completions": completions, "stated_limits": stated_limits})
        self.take_window(answer)
        return answer

    def take_window(self, answer: dict) -> None:
        """The window of a coordinator's answer, unless a later one was already taken."""
        if answer["window_number"] < self._window_number:
            return
        if answer["window"] > self.window:
            self._wider.set()
        self.window, self._window_number = answer["window"], answer["window_number"]

    async def widened(self) -> None:
        """Returns once an answer to ``/acquire`` gave a wider window than the one before."""
        await self._wider.wait()
        self._wider.clear()

    def settle(self, charged: int, prompt: int, completion: int, kind: str = "") -> None:
        self._completions.append([kind, completion, prompt + completion - charged])

    def on_rate_limited(self, retry_after_s: float | None) -> None:
        self._rate_limited.append(retry_after_s)

    def observe_latency(self, latency_s: float) -> None:
        self._latencies.append(latency_s)

    def observe_limits(self, requests_per_minute: float | None, tokens_per_minute: float | None) -> None:
        limits = [requests_per_minute, tokens_per_minute]
        if limits != self._told_limits:
            self._stated_limits = self._told_limits = limits

    def calls_in_flight(self, cap: int) -> int:
        """The coordinator's window bounds the task's items, not its calls."""
        return cap


def _driver_path(location: str) -> str | None:
    """``location`` as a path the driver can open (a ``/Volumes/...`` path is one on Databricks, kept as
    written); None for a URI such as ``s3://`` or ``abfss://``."""
    if location.startswith("file:"):
        return "/" + location.removeprefix("file:").lstrip("/")
    return None if ":" in location.split("/")[0] else location


def journal_dir(root: str | None, staging: str | None = None, index: str | None = None) -> Path:
    """Where stages journal their results: a folder per index under ``staging`` (``storage.staging``) when
    set, else next to the tables for a local root, else a temp folder of the driver. ``index`` names the
    index where ``root`` does not (tables in a catalog), so two indexes never share a journal."""
    digest = hashlib.sha256((index or root or "").encode()).hexdigest()[:16]
    if staging:
        return Path(_driver_path(staging)) / digest
    local = _driver_path(root) if root else None
    if local is not None:
        return Path(local) / "_llm_journal"
    return Path(tempfile.gettempdir()) / "graphrag-spark-journal" / digest


def wait_for(thread: threading.Thread, interval_s: float, on_tick) -> None:
    """Join ``thread``, calling ``on_tick`` every ``interval_s`` while it runs."""
    deadline = time.monotonic() + interval_s
    while thread.is_alive():
        thread.join(timeout=max(0.05, deadline - time.monotonic()))
        if time.monotonic() >= deadline:
            on_tick()
            deadline = time.monotonic() + interval_s
