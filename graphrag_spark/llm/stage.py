"""Running LLM work from Spark: cached in Delta, durable per item, throttled job-wide, accounted.

Every LLM stage hands this module a DataFrame of items (``item_id``, ``payload``) and an async
function that turns one item into an ``LlmWork``. Each item gets a key: a hash of (stage, model,
prompt version, parameters, payload), i.e. of everything that determines the answer.

- **Nothing paid twice.** Items whose key already has a successful row in ``llm_results`` are
  not called again (an anti-join). Identical items (e.g. a duplicated chunk) share one call.
- **One Spark job per stage**, over all pending items: no per-batch re-scan, no pending keys
  collected on the driver, no slowest-item barrier (a task keeps its window of items in flight
  and starts the next item as soon as one returns).
- **Durable per item.** Tasks send each finished item's row to the driver's coordinator
  (``llm.coordinator``), which journals it at once and commits to Delta every
  ``llm.commit_interval_s`` (the calling job leaves one task slot free, so that these commits run while
  it does): a driver crash loses at most the calls in flight, and a task that
  Spark retries pays again for nothing that had returned. ``llm_results`` is compacted once it
  has more than ``llm.max_result_files`` files.
- **Job-wide throttling.** One budget on the driver for all tasks; concurrency is the limit x
  the observed latency (Little's law), up to ``llm.max_in_flight``.
- **Nothing lost.** A failed item is a row with its error, stage, item id and attempts; it is
  retried on the next run. The stage fails with a summary only above ``llm.max_failed_share``.
- **Usage.** One ``llm_usage`` row per run and stage: calls, cache hits, retries, failures,
  tokens, service latency and queue wait percentiles (apart), and an estimated cost. The index job
  appends its stages' rows in one commit at its end (``TableStore.deferred_usage``), not one per stage.

On Spark Connect the executors cannot reach the client, so there is no coordinator: tasks
throttle to ``1/tasks`` of the budget, and the items run in waves, each about ``llm.connect_wave_s`` of
calls and committed when its job returns (a client that goes down loses at most one wave's calls).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import secrets
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

import pandas as pd
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.compat import LLM_ITEMS_PER_TASK, default_parallelism, is_connect, llm_tasks
from graphrag_spark.config import LlmConfig, LlmModelConfig
from graphrag_spark.errors import StageFailed
from graphrag_spark.llm.client import (CallResult, ItemNotStarted, LlmClient, run_items, spark_task_index,
                                       task_concurrency)
from graphrag_spark.llm.coordinator import (Coordinator, RemoteBudget, UsageFigures, journal_dir, read_journal,
                                            rows_frame, shared_budget, usage_of, wait_for)
from graphrag_spark.llm.secrets import ensure_api_key
from graphrag_spark.llm.throttle import JobBudget, ModelRate, RateLimiter, wave_items
from graphrag_spark.progress import llm_meter

log = logging.getLogger(__name__)

RESULT_COLUMNS = [f.name for f in T.SCHEMAS[T.LLM_RESULTS].fields]
_UNBOUNDED = 1_000_000  # the task's window bounds its calls, not the client's semaphore
# Up to this many items a stage's bookkeeping runs on the driver: which items are cached, and the outcome
# (the calls still run in executors). Above it, Spark joins do it: a dozen small jobs saved per stage.
DRIVER_STAGE_ITEMS = 2000


@dataclass
class LlmWork:
    """What one item produced: a JSON-serialisable result (None on failure), its calls, an error."""

    result: Any
    calls: list[CallResult] = field(default_factory=list)
    error: str | None = None


@dataclass
class StageUsage:
    stage: str
    items: int = 0
    cache_hits: int = 0
    calls: int = 0
    retries: int = 0
    failures: int = 0
    n_429: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_p50_s: float = 0.0
    latency_p95_s: float = 0.0
    est_cost_usd: float = 0.0
    wall_s: float = 0.0
    queue_p50_s: float = 0.0
    queue_p95_s: float = 0.0
    cut_at_max_tokens: int = 0  # answers that stopped at their max_tokens (``CallResult.cut``)

    def render(self) -> str:
        return (f"{self.stage:<24} items {self.items:>6}  cache hits {self.cache_hits:>6}  calls {self.calls:>6}  "
                f"retries {self.retries:>4}  429s {self.n_429:>4}  failures {self.failures:>4}  "
                f"cut at max_tokens {self.cut_at_max_tokens:>4}  "
                f"tokens {self.prompt_tokens:>9}+{self.completion_tokens:<8} latency p50 {self.latency_p50_s:.2f}s "
                f"p95 {self.latency_p95_s:.2f}s  queue p50 {self.queue_p50_s:.2f}s p95 {self.queue_p95_s:.2f}s  "
                f"${self.est_cost_usd:.4f}  {self.wall_s:.1f}s")


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")


def _key_prefix(stage: str, model: str, prompt_version: str, params: dict) -> str:
    return "\x1f".join([stage, model, prompt_version, json.dumps(params, sort_keys=True)])


# A keyed item's columns: what the tasks of a stage are given.
_KEYED_COLUMNS = ("item_id", "payload", "item_key")
_KEYED_SCHEMA = "item_id string, payload string, item_key string"


def with_item_keys(items: DataFrame, stage: str, model: str, prompt_version: str, params: dict) -> DataFrame:
    """Add ``item_key``: sha256 of everything that determines the answer (computed in Spark SQL)."""
    fixed = _key_prefix(stage, model, prompt_version, params)
    return items.withColumn("item_key", F.substring(F.sha2(F.concat_ws("\x1f", F.lit(fixed), F.col("payload")), 256), 1, 32))


def item_key(stage: str, model: str, prompt_version: str, params: dict, payload: str) -> str:
    """``with_item_keys``'s key of one payload, in Python (an item made on the driver)."""
    text = _key_prefix(stage, model, prompt_version, params) + "\x1f" + payload
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _work_row(run_id: str, stage: str, model: str, key: str, item_id: str, work: LlmWork) -> dict:
    """One ``llm_results`` row as JSON-ready values (sent to the coordinator, journaled)."""
    calls = work.calls
    return {
        "item_key": key, "stage": stage, "item_id": item_id, "model": model, "run_id": run_id,
        "result": None if work.error else json.dumps(work.result, ensure_ascii=False),
        "error": work.error, "n_calls": len(calls), "attempts": sum(c.attempts for c in calls),
        "n_429": sum(c.n_429 for c in calls), "prompt_tokens": sum(c.prompt_tokens for c in calls),
        "completion_tokens": sum(c.completion_tokens for c in calls), "n_cut": sum(c.cut for c in calls),
        "call_latencies": [float(c.latency_s) for c in calls], "queue_waits": [float(c.queue_s) for c in calls],
        "created_at": datetime.now(timezone.utc).replace(tzinfo=None).isoformat(),
    }


def _safe(work_fn: Callable[[LlmClient, dict], Awaitable[LlmWork]]):
    """A bug in result handling must not kill the task and lose its partition's paid calls."""
    async def run(client: LlmClient, item: dict) -> LlmWork | None:
        try:
            return await work_fn(client, item)
        except ItemNotStarted:  # nothing was called: None, the item left for a later wave (Connect), not failed
            return None
        except Exception as exc:  # noqa: BLE001 - recorded as the item's error row
            return LlmWork(None, [], f"internal error: {type(exc).__name__}: {exc} | {traceback.format_exc(limit=2)[-300:]}")
    return run


async def _run_task(records: list[dict], url: str, work_fn, model: LlmModelConfig, row_of,
                    partition: int = 0, attempt: int = 0) -> list[LlmWork]:
    """One task: its items not yet returned (asked from the coordinator), each started as soon as
    the window allows, each row sent to the coordinator as soon as the item returns. In a stage with
    follow-ups the task also takes the ones the coordinator hands it (``/more``), ahead of its items
    not yet started, until the stage has nothing left."""
    works: list[LlmWork] = []
    budget = RemoteBudget(url, 1)
    started = await budget.post("start", {"keys": [r["item_key"] for r in records], "partition": partition})
    todo = set(started["todo"])
    budget.take_window(started)
    queue = deque(r for r in records if r["item_key"] in todo)

    def ask_more() -> asyncio.Task:
        return asyncio.create_task(budget.post("more", {"partition": partition, "attempt": attempt}))

    more = ask_more() if started.get("follow_ups") else None
    widened = None
    try:
        async with LlmClient(model, limiter=budget, concurrency=_UNBOUNDED) as client:
            async def one(record: dict) -> None:
                work = await work_fn(client, record)
                await budget.post("result", {"row": row_of(record, work)})
                works.append(work)

            running: set[asyncio.Task] = set()
            # A wider window (the first answers price the calls; the observed latency grows) starts
            # items at once, not when one of the items in flight, perhaps several calls long, ends.
            widened = asyncio.create_task(budget.widened())
            while queue or running or more is not None:
                while queue and len(running) < budget.window:
                    running.add(asyncio.create_task(one(queue.popleft())))
                finished, _ = await asyncio.wait(running | {widened} | ({more} if more is not None else set()),
                                                 return_when=asyncio.FIRST_COMPLETED)
                if widened in finished:
                    widened = asyncio.create_task(budget.widened())
                if more in finished:
                    answer = more.result()
                    queue.extendleft(reversed(answer["records"]))
                    more = ask_more() if answer["open"] else None
                for task in finished & running:
                    running.discard(task)
                    task.result()
    finally:
        for waiting in (more, widened):
            if waiting is not None:
                waiting.cancel()
        await budget.post("finish", {"partition": partition})
    return works


class Feed:
    """What a stage publishes while it runs (events: the summaries' answers) for a stage running beside it
    that turns them into its items as they come (``run_llm_stage``'s ``feed``). Thread-safe; the publisher
    closes it when done, with its failure where it failed."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._events: list = []
        self._closed = False
        self._failure: BaseException | None = None

    def put(self, events: list) -> None:
        with self._changed:
            self._events.extend(events)
            self._changed.notify_all()

    def close(self, failure: BaseException | None = None) -> None:
        with self._changed:
            self._closed, self._failure = True, failure
            self._changed.notify_all()

    def take(self, wait: bool = True, gather_s: float = 0.0,
             enough: Callable[[list], bool] | None = None) -> tuple[list, bool]:
        """The events not taken yet (where ``wait``, once there are some or it is closed; with ``gather_s``,
        once that long has passed, ``enough(events)`` holds, or it is closed) and whether it is closed;
        raises where the publisher failed."""
        deadline = time.monotonic() + gather_s
        with self._changed:
            while wait and not self._closed and (not self._events or (
                    time.monotonic() < deadline and not (enough is not None and enough(self._events)))):
                self._changed.wait(max(0.0, deadline - time.monotonic()) if self._events else None)
            events, self._events = self._events, []
            if self._closed and self._failure is not None:
                raise RuntimeError(f"the stage feeding this one failed: {self._failure}") from self._failure
            return events, self._closed

    def all(self) -> list:
        """Every event, once it is closed (a reader that cannot take them as they come)."""
        events, closed = self.take()
        while not closed:
            more, closed = self.take()
            events += more
        return events


class FedRecords:
    """The records a stage makes of a feed's events as they come (``FollowUps.fed``, in a thread of its own):
    handed to the stage's job while one runs and takes them (``Coordinator.add``), else kept for its next
    job. A job's tasks end once it has nothing in flight, so a fed stage never holds a task slot while it
    waits for its feed (the stage feeding it may need that slot)."""

    def __init__(self, feed: Feed, feed_items: Callable[[list], list[tuple[str, str]]], follow: FollowUps, meter):
        self._changed = threading.Condition()
        self._kept: list[dict] = []
        self._coordinator: Coordinator | None = None
        self._done = False
        self.failure: BaseException | None = None
        self._feed, self._feed_items, self._follow, self._meter = feed, feed_items, follow, meter
        threading.Thread(target=self._take, name="llm-stage-feed", daemon=True).start()

    def _take(self) -> None:
        try:
            closed = False
            while not closed:
                events, closed = self._feed.take()
                records = self._follow.fed(self._feed_items, events)
                self._meter.total += len(records)
                with self._changed:
                    if records and not (self._coordinator is not None and self._coordinator.add(records)):
                        self._kept += records
                        self._changed.notify_all()
        except BaseException as exc:  # noqa: BLE001 - raised by the stage once its calls have returned
            self.failure = exc
        finally:
            with self._changed:
                self._done = True
                self._changed.notify_all()

    def attach(self, coordinator: Coordinator | None) -> None:
        """The running job's coordinator (None: no job runs); it takes the records kept meanwhile."""
        with self._changed:
            self._coordinator = coordinator
            if coordinator is not None and self._kept and coordinator.add(self._kept):
                self._kept = []

    def next_job(self) -> list[dict] | None:
        """The records for the stage's next job, once there are some; None once the feed is closed and
        every record was handed out."""
        with self._changed:
            while not self._kept and not self._done:
                self._changed.wait()
            records, self._kept = self._kept, []
            return records or None


class FollowUps:
    """A stage's follow-ups (``run_llm_stage``'s ``follow_up``): every answered item is handed to ``follow_up``
    once, under one lock; the items it makes ready are keyed like the stage's, and those whose answer is
    known (cached in ``llm_results``, or already answered in this stage) are answered at once in turn.
    ``after`` returns the records to call; an item whose key is being called waits for that call."""

    def __init__(self, follow_up: Callable[[str, str | None, str | None], list[tuple[str, str]]] | None,
                 key_of: Callable[[str], str], lookup: Callable[[set[str]], dict], ids_of_key: dict[str, list[str]]):
        self._follow_up, self._key_of, self._lookup = follow_up, key_of, lookup
        self._ids = {key: list(ids) for key, ids in ids_of_key.items()}  # every key this stage holds -> its item ids
        self.answered: dict[str, tuple[str | None, str | None]] = {}  # key -> (result, error)
        self._lock = threading.Lock()
        self.items: list[dict] = []  # every follow-up: item_id, payload, item_key
        self.cache_hits: set[str] = set()

    def after(self, answers: list[tuple[str, str | None, str | None]]) -> list[dict]:
        """``answers``: (item_key, result, error) of items just answered; returns the follow-ups to call."""
        with self._lock:
            # (key, the item ids to follow, its answer): an answer is followed for every item of its key.
            return self._made([], [(key, list(self._ids.get(key, ())), result, error) for key, result, error in answers])

    def fed(self, to_items: Callable[[list], list[tuple[str, str]]], events: list) -> list[dict]:
        """The items ``to_items`` makes of a feed's ``events`` (``Feed``), under the same lock as the answers'
        follow-ups (both read and change the caller's state); returns those to call."""
        if not events:
            return []
        with self._lock:
            return self._made(to_items(events), [])

    def _made(self, made: list[tuple[str, str]], todo: list) -> list[dict]:
        """Keys the items ``made`` (item_id, payload) and follows the answers ``todo`` (key, item ids, result,
        error), then what each answer known at once makes in turn; returns the records to call."""
        to_call: list[dict] = []
        while made or todo:
            if not made:
                key, ids, result, error = todo.pop(0)
                self.answered[key] = (result, error)
                made = [pair for item_id in ids for pair in (self._follow_up(item_id, result, error)
                                                             if self._follow_up is not None else ())]
                continue
            records = [{"item_id": item_id, "payload": payload, "item_key": self._key_of(payload)}
                       for item_id, payload in made]
            made = []
            unknown = {r["item_key"] for r in records} - set(self._ids)
            cached = {k: a for k, a in self._lookup(unknown).items() if a[1] is None} if unknown else {}
            for record in records:
                made_key, made_id = record["item_key"], record["item_id"]
                self.items.append(record)
                if made_key in self._ids:  # answered already, or being called: it follows that answer
                    self._ids[made_key].append(made_id)
                    if made_key in self.answered:
                        todo.append((made_key, [made_id], *self.answered[made_key]))
                    continue
                self._ids[made_key] = [made_id]
                if made_key in cached:
                    self.cache_hits.add(made_key)
                    todo.append((made_key, [made_id], *cached[made_key]))
                else:
                    to_call.append(record)
        return to_call


class FreshResults:
    """Per stage, the item keys of the ``llm_results`` rows an index run committed, where the table did not
    exist as the run began. Only the job holding the index's lock writes the index stages' rows, so such a
    run's stage needs no read of the table to find its cache hits (a snapshot, a file listing and a scan:
    about 2 s on 2 cores) while none of its keys is among them. Settled at the run's first lookup: a
    commit before it, or rows recovered from a crashed run's journal, turn it off for the run."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, set[str]] = {}
        self._fresh: bool | None = None  # None: not settled yet

    def read_needed(self, store: T.TableStore, stage: str, keys: set[str] | None) -> bool:
        """Whether ``stage``'s cache hits among ``keys`` (None: any of its keys) must be read from the table."""
        with self._lock:
            if self._fresh is None:
                self._fresh = not store.exists(T.LLM_RESULTS)
            committed = self._keys.get(stage, set())
            return not self._fresh or bool(committed if keys is None else committed & keys)

    def committed(self, rows: list[dict]) -> None:
        with self._lock:
            if self._fresh is None:
                self._fresh = False
            for row in rows if self._fresh else ():
                self._keys.setdefault(row["stage"], set()).add(row["item_key"])

    @property
    def fresh(self) -> bool:
        """Whether the table did not exist as the run began (and no commit came before its first lookup)."""
        return self._fresh is True

    def turn_off(self) -> None:
        with self._lock:
            self._fresh = False


def _read_needed(store: T.TableStore, stage: str, keys: set[str] | None) -> bool:
    return store.fresh_results is None or store.fresh_results.read_needed(store, stage, keys)


# Per llm_results location: the commits this process made since it last counted the table's files
# (no entry: never counted here). Counting is a Delta job of its own, so it is not repeated per stage.
_commits_since_count: dict[str, int] = {}
_count_lock = threading.Lock()


def _commit(spark: SparkSession, store: T.TableStore, rows: list[dict]) -> None:
    if rows:
        frame = spark.createDataFrame(rows_frame(rows, RESULT_COLUMNS), T.SCHEMAS[T.LLM_RESULTS])
        store.write(frame.coalesce(1), T.LLM_RESULTS, mode="append", counted=False)
        if store.fresh_results is not None:
            store.fresh_results.committed(rows)
        location = store.location(T.LLM_RESULTS)
        with _count_lock:
            if location in _commits_since_count:
                _commits_since_count[location] += 1
            elif store.fresh_results is not None and store.fresh_results.fresh:
                # This run created the table: its files are this run's commits, so none need counting.
                _commits_since_count[location] = 1


def _answers(store: T.TableStore, stage: str, keys: set[str]) -> dict[str, tuple[str | None, str | None]]:
    """Per item key with a row in ``llm_results``: (result, None) where any attempt succeeded, else
    (None, the latest error)."""
    if not keys or not _read_needed(store, stage, keys):
        return {}
    rows = (store.read_or_empty(T.LLM_RESULTS).where((F.col("stage") == stage) & F.col("item_key").isin(list(keys)))
            .select("item_key", "result", "error", "created_at").collect())
    # Errors first, oldest first, then successes: the last row set per key is the answer.
    ordered = sorted(rows, key=lambda row: (row["error"] is None, row["created_at"] or datetime.min))
    return {row["item_key"]: (row["result"], row["error"]) for row in ordered}


def _kept(rows: list[dict], returned: list[dict] | None) -> list[dict]:
    """``rows``, also added to ``returned`` where given (the rows a driver-side outcome is built from)."""
    if returned is not None:
        returned.extend(rows)
    return rows


def stage_journal(store: T.TableStore, name: str) -> Path:
    """The journal file of stage ``name`` of this index (``journal_dir``)."""
    in_catalog = bool(store.storage.database)
    return journal_dir(None if in_catalog else store.storage.root, store.storage.staging,
                       store.namespace() if in_catalog else None) / f"{name}.jsonl"


def recover_journal(spark: SparkSession, store: T.TableStore, journal: Path, table: str,
                    frame_of: Callable[[list[dict]], pd.DataFrame], keys: list[str]) -> int:
    """Append to ``table`` what an earlier, crashed run journaled but did not commit (``frame_of`` turns the
    journal's rows into the table's rows, a pandas frame; a row whose ``keys`` the table holds is not appended again).
    Returns the rows recovered."""
    rows = read_journal(journal)
    if rows:
        frame = spark.createDataFrame(frame_of(rows), T.SCHEMAS[table]).dropDuplicates(keys)
        committed = store.read_or_empty(table).select(*keys)
        store.write(frame.join(committed, keys, "left_anti").coalesce(1), table, mode="append", counted=False)
    journal.unlink(missing_ok=True)
    return len(rows)


def driver_host(spark: SparkSession) -> str:
    """The address executors reach the driver's endpoints at."""
    if spark.sparkContext.master.startswith("local"):
        return "127.0.0.1"
    return spark.conf.get("spark.driver.host")


def _run_coordinated(spark: SparkSession, store: T.TableStore, llm: LlmConfig, model: LlmModelConfig,
                     pending: DataFrame, n_tasks: int, safe_fn, row_of, meter, journal: Path,
                     returned: list[dict] | None, follow: FollowUps | None = None, n_pending: int = 0,
                     fed: FedRecords | None = None) -> UsageFigures:
    """The calls of ``pending`` (``n_pending`` items split into ``n_tasks`` partitions) in one Spark job, each
    task talking to the driver's coordinator; with ``follow``, the follow-ups too, and with ``fed``, the
    records made of a feed while the job runs."""
    budget = shared_budget((model.api_base, model.model), model.requests_per_minute, model.tokens_per_minute,
                           model.enforced_interval_s)

    def follow_row(row: dict) -> list[dict]:
        records = follow.after([(row["item_key"], row["result"], row["error"])])
        meter.total += len(records)
        return records

    coordinator = Coordinator(driver_host(spark), budget, llm.max_in_flight, journal,
                              tasks=min(n_tasks, default_parallelism(spark)),
                              follow=None if follow is None else follow_row, expected=n_pending,
                              fed=fed is not None)
    coordinator.on_result = meter.result
    if fed is not None:
        fed.attach(coordinator)
    url = coordinator.url

    def call_partition(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from pyspark import TaskContext

        records = [record for frame in frames for record in frame.to_dict("records")]
        context = TaskContext.get()
        # The attempt's id, not its number: a stage resubmitted after an executor's loss took its shuffle
        # input numbers its attempts from 0 again, and would be taken for the lost attempt.
        works = asyncio.run(_run_task(records, url, safe_fn, model, row_of, context.partitionId(),
                                      context.taskAttemptId()))
        yield pd.DataFrame({"n": [len(works)]})

    group = f"llm-stage-{secrets.token_hex(4)}"
    failure: list[BaseException] = []

    def run_job() -> None:
        spark.sparkContext.setJobGroup(group, "LLM stage", interruptOnCancel=True)
        try:
            pending.mapInPandas(call_partition, "n long").collect()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the driver's main thread
            failure.append(exc)

    job = threading.Thread(target=run_job, name=group, daemon=True)
    job.start()
    try:
        wait_for(job, llm.commit_interval_s, lambda: _commit(spark, store, _kept(coordinator.take_buffer(), returned)))
        _commit(spark, store, _kept(coordinator.take_buffer(), returned))
    finally:
        if fed is not None:
            fed.attach(None)
        if job.is_alive():  # the driver is going down: stop the calls (the journal keeps what returned)
            spark.sparkContext.cancelJobGroup(group)
        coordinator.close()
    journal.unlink(missing_ok=True)
    if failure:
        raise failure[0]
    if coordinator.follow_error is not None:
        raise coordinator.follow_error
    return coordinator.usage()


# Connect's waves take ranges of a hash of their items' keys in [0, _WAVE_HASHES).
_WAVE_HASHES = 1 << 40


def connect_waves(frame: DataFrame, key: str, n_items: int, next_size: Callable[[], int],
                  carried: Callable[[], list[str]] = list) -> Iterator[tuple[DataFrame, int]]:
    """Spark Connect's waves over ``frame``'s ``n_items`` rows, split by a hash of ``key``: each about
    ``next_size()`` rows (asked as the wave starts, so that it can follow what the earlier waves measured),
    the last the rest (up to half a wave more). ``carried()``, asked as a wave starts, names the rows (by
    ``key``) an earlier wave left unstarted: they lead it, in place of as many new rows, until none is left.
    Yields each wave's rows and the rows expected in it; no job runs to split them."""
    position = F.pmod(F.xxhash64(key), F.lit(_WAVE_HASHES))
    low, left = 0, n_items
    while (carry := carried()) or left > 0:
        size = max(1, next_size())
        new = min(left, max(0, size - len(carry)))
        new = left if left - new < max(new, 1) / 2 else new  # no last wave of a few rows: its own tail and job
        in_wave = F.col(key).isin(carry) if carry else F.lit(False)
        if new:
            high = _WAVE_HASHES if new == left else low + round(_WAVE_HASHES * new / n_items)
            in_wave = in_wave | ((position >= low) & (position < high))
            low, left = high, left - new
        yield frame if new == n_items and not carry else frame.where(in_wave), new + len(carry)


# What a model's Connect waves learned (``RateLimiter.learned``: its latency, token means and the rate its 429s
# left), by endpoint, model and limits, as the classic path's coordinator keeps one budget per model
# (``shared_budget``): a stage's first wave starts from the waves of the stages before it, not from guesses.
_CONNECT_LEARNED: dict[tuple, dict] = {}


def llm_wave_items(llm: LlmConfig, model: LlmModelConfig, learned: dict | None, calls_per_item: float) -> int:
    """The items of an LLM stage's next wave on Spark Connect: those the budget calls in ``llm.connect_wave_s``
    at the rate that ``learned`` (the previous wave's ``RateLimiter.learned``; before any, the configured
    limits at a typical call's size) prices its calls and the ``calls_per_item`` seen (one before any), at
    least ``llm.items_per_commit``. A first wave so guessed may hold more than its time: its deadline ends it
    (``_run_in_waves``)."""
    rate = ModelRate(JobBudget(model.requests_per_minute, model.tokens_per_minute), learned=learned)
    return wave_items(rate.calls_per_minute() * rate.budget.factor(), llm.connect_wave_s, calls_per_item,
                      llm.items_per_commit)


def _run_in_waves(spark: SparkSession, store: T.TableStore, llm: LlmConfig, model: LlmModelConfig, pending: DataFrame,
                  n_pending: int, safe_fn, row_of, meter, returned: list[dict] | None) -> UsageFigures:
    """Spark Connect: the executors cannot reach the client, so there is no coordinator. Each task
    throttles to its share of the budget (and keeps its share of the rate x the latency in flight,
    ``RateLimiter.calls_in_flight``), and the items run in waves (``connect_waves``): a wave's rows come
    back to the client and are committed before the next wave starts, so a client that goes down loses
    at most one wave's calls. A wave's tasks start from what the previous wave's budget had learned
    (``RateLimiter.learned``: the latency and the token means), the first wave from the last one of the
    model's stage before (``_CONNECT_LEARNED``), so that only a job's first wave guesses them. A wave
    ends with its slowest items' chains, so each holds the items the budget calls in ``llm.connect_wave_s``
    (``llm_wave_items``), and its tasks start no item after that time from their start (unless what a task
    has left would be done within half of it more, or it has started fewer than its share of
    ``llm.items_per_commit``): the items left lead the next wave. So the first wave, sized at a typical
    call, is bounded by its time, not by the guess. Carol at 200k tokens/min and 10 s latency in 6 waves of
    16 items held 0.642 of the limit while calling (0.513 learning afresh each wave), in a first wave of 16
    and one sized in time 0.834 (0.853 in one wave); War and Peace's first 1,000 chunks at 1M tokens/min in
    a first wave of 256 items and one sized in time 0.929 (1.136x the floor), in one wave 0.956 (1.110x)."""
    budget_key = (model.api_base, model.model, model.requests_per_minute, model.tokens_per_minute)
    learned = _CONNECT_LEARNED.get(budget_key)
    usage_rows: list[dict] = []
    calls = 0
    left: list[str] = []  # the keys of the items the last wave's deadline left unstarted

    def next_size() -> int:
        return llm_wave_items(llm, model, learned, calls / max(1, len(usage_rows)))

    def call_partition(share: float, concurrency: int, start_from: dict | None, fewest: int,
                       ) -> Callable[[Iterator[pd.DataFrame]], Iterator[pd.DataFrame]]:
        wave_s = llm.connect_wave_s

        def call(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            records = [record for frame in frames for record in frame.to_dict("records")]
            if not records:  # a wave's hash split can leave a task empty; an empty frame fails Arrow's conversion
                return
            began = time.monotonic()  # the task's own clock: no skew against the client's, no wait for a slot

            def may_start(started: int) -> bool:  # what is left done within half a wave more, at the pace so far
                elapsed = time.monotonic() - began
                return started < fewest or elapsed < wave_s or (len(records) - started) * elapsed <= started * wave_s / 2

            limiter = RateLimiter(model.requests_per_minute, model.tokens_per_minute, share, learned=start_from,
                                  interval_s=model.enforced_interval_s, task_index=spark_task_index())
            works = run_items(records, safe_fn, model, share, concurrency, limiter, may_start)
            rows = [json.dumps(row_of(r, w), ensure_ascii=False) if w is not None else None
                    for r, w in zip(records, works)]
            yield pd.DataFrame({"row": rows, "left": [r["item_key"] if w is None else None
                                                      for r, w in zip(records, works)],
                                "learned": [None] * (len(rows) - 1) + [json.dumps(limiter.learned())]})

        return call

    for items, expected in connect_waves(pending, "item_key", n_pending, next_size, lambda: left):
        tasks = llm_tasks(spark, expected)
        share = 1.0 / tasks
        call = call_partition(share, task_concurrency(model, llm.max_in_flight, share), learned,
                              math.ceil(llm.items_per_commit / tasks))
        out = items.repartition(tasks).mapInPandas(call, "row string, left string, learned string").toPandas()
        rows = [json.loads(r) for r in out["row"].dropna()]
        left = out["left"].dropna().tolist()
        # The task that saw the most answers knows the model best (one task per wave but on big waves).
        learned = max((json.loads(state) for state in out["learned"].dropna()),
                      key=lambda state: state["call_tokens"]["seen"].get("completion", 0), default=learned)
        if learned is not None:
            _CONNECT_LEARNED[budget_key] = learned
        _commit(spark, store, _kept(rows, returned))
        wave_usage = [{**row, "result": None} for row in rows]
        wave_figures = usage_of(wave_usage)
        meter.returned(wave_figures, len(rows))
        calls += wave_figures.calls
        usage_rows += wave_usage
    return usage_of(usage_rows)


def _compact(spark: SparkSession, store: T.TableStore, max_files: int) -> None:
    """OPTIMIZE ``llm_results`` once it has more than ``max_files`` data files. The files are counted at
    the first stage of a process, then again only after ``max_files // 4`` more commits of its own: each
    commit adds at most one file, so the table stays within ``max_files`` plus a quarter (plus what other
    jobs append meanwhile)."""
    location = store.location(T.LLM_RESULTS)
    with _count_lock:
        if _commits_since_count.get(location, max_files) < max(1, max_files // 4):
            return
        _commits_since_count[location] = 0
    if spark.sql(f"DESCRIBE DETAIL {store.sql_name(T.LLM_RESULTS)}").collect()[0]["numFiles"] > max_files:
        spark.sql(f"OPTIMIZE {store.sql_name(T.LLM_RESULTS)}")


def run_llm_stage(spark: SparkSession, store: T.TableStore, llm: LlmConfig, model: LlmModelConfig, stage: str,
                  items: DataFrame | pd.DataFrame, work_fn: Callable[[LlmClient, dict], Awaitable[LlmWork]], run_id: str,
                  prompt_version: str, params: dict,
                  follow_up: Callable[[str, str | None, str | None], list[tuple[str, str]]] | None = None,
                  feed: Feed | None = None, feed_items: Callable[[list], list[tuple[str, str]]] | None = None,
                  ) -> tuple[DataFrame, StageUsage]:
    """Call the LLM for every item not already done; returns (item_id, item_key, result, error) for all items.
    ``items`` (item_id, payload): a DataFrame, or a pandas frame the driver holds already (keyed there, no job).

    ``follow_up(item_id, result, error)``, called on the driver with each item's answer (cache hits first,
    then each as it returns), gives the items of this stage (item_id, payload) that this answer makes
    ready: they are called in the same Spark job, ahead of the items not yet started, so work that waits
    for other answers does not wait for the whole stage. Only a driver-side stage with a coordinator (up
    to ``DRIVER_STAGE_ITEMS`` items, not Spark Connect) takes follow-ups; elsewhere ``follow_up`` is not
    called, and the caller runs what is left once the stage returns.

    ``feed`` (a driver-side stage only; not on Spark Connect): the stage also calls the items ``feed_items``
    makes of the feed's events (under the follow-ups' lock, keyed and cached like them), as they come, and
    ends once the feed is closed and every item has returned."""
    started = time.perf_counter()
    if isinstance(items, pd.DataFrame) and len(items) <= DRIVER_STAGE_ITEMS:
        few = [Row(item_id=item_id, payload=payload,
                   item_key=item_key(stage, model.model, prompt_version, params, payload))
               for item_id, payload in zip(items["item_id"], items["payload"])]
        keyed = None
    else:
        if isinstance(items, pd.DataFrame):  # more than the driver keeps: keyed and counted in Spark
            items = spark.createDataFrame(items[["item_id", "payload"]], "item_id string, payload string")
        keyed = with_item_keys(items.select("item_id", "payload"), stage, model.model, prompt_version, params).persist()
    journal = stage_journal(store, stage)
    if recover_journal(spark, store, journal, T.LLM_RESULTS, lambda rows: rows_frame(rows, RESULT_COLUMNS),
                       ["item_key", "run_id"]) and store.fresh_results is not None:
        store.fresh_results.turn_off()
    if keyed is not None:  # one task reads until it has one item more than the bound: one job, however many partitions
        few = keyed.coalesce(1).limit(DRIVER_STAGE_ITEMS + 1).collect()
    on_driver = len(few) <= DRIVER_STAGE_ITEMS
    if feed is not None and (not on_driver or is_connect(spark)):
        raise ValueError(f"LLM stage '{stage}': a fed stage runs on the driver with a coordinator "
                         f"(up to {DRIVER_STAGE_ITEMS} items, not on Spark Connect)")
    follow: FollowUps | None = None
    if on_driver:
        # The cache lookup and the outcome in Python: one read of the stage's rows of these keys, no
        # shuffles, and this run's rows kept as they are committed rather than read back.
        if keyed is not None:
            keyed.unpersist()
        answers = _answers(store, stage, {row["item_key"] for row in few})
        unique = {row["item_key"]: row for row in few}
        cached = {key for key, (_, error) in answers.items() if error is None}
        pending_rows = [row for key, row in unique.items() if key not in cached]
        if (follow_up is not None or feed is not None) and not is_connect(spark):
            ids_of_key: dict[str, list[str]] = {}
            for row in few:
                ids_of_key.setdefault(row["item_key"], []).append(row["item_id"])
            follow = FollowUps(follow_up, lambda payload: item_key(stage, model.model, prompt_version, params, payload),
                               lambda keys: _answers(store, stage, keys), ids_of_key)
            # The cache hits' follow-ups first: ready now, they may be what the rest of the stage waits for.
            ready = follow.after([(key, *answers[key]) for key in unique if key in cached])
            if feed is not None:  # what the feed holds already; a closed feed leaves a stage like any other
                events, closed = feed.take(wait=False)
                ready += follow.fed(feed_items, events)
                feed = None if closed else feed
            pending_rows = [tuple(record[name] for name in _KEYED_COLUMNS) for record in ready] + pending_rows
        n_items, n_pending = len(unique), len(pending_rows)
        pending = None
        returned: list[dict] | None = []
    else:
        done = (store.read_or_empty(T.LLM_RESULTS) if _read_needed(store, stage, None) else
                T.local_frame(spark, [], T.SCHEMAS[T.LLM_RESULTS])).where(
            (F.col("stage") == stage) & F.col("error").isNull()).select("item_key")
        # One job counts the stage's items and its cache hits; the pending items are then read from
        # memory by the stage's job instead of being derived again (items, llm_results scan, anti-join).
        status = (keyed.dropDuplicates(["item_key"])
                  .join(done.dropDuplicates(["item_key"]).withColumn("_cached", F.lit(True)), "item_key", "left")
                  .persist())
        counts = status.agg(F.count("*").alias("items"), F.count("_cached").alias("cached")).collect()[0]
        n_items, n_pending = counts["items"], counts["items"] - counts["cached"]
        pending, pending_rows = status.where(F.col("_cached").isNull()).drop("_cached"), None
        returned = None
    if n_pending or feed is not None:
        ensure_api_key(model)  # the task closures carry the key; a bad one fails here, once
    safe_fn = _safe(work_fn)
    model_name = model.model

    def row_of(record: dict, work: LlmWork) -> dict:
        return _work_row(run_id, stage, model_name, record["item_key"], record["item_id"], work)

    meter = llm_meter(stage, n_pending, model.price_per_1k_prompt, model.price_per_1k_completion)
    figures = UsageFigures()
    if n_pending or feed is not None:
        if is_connect(spark):
            if pending_rows is not None:  # the waves split the items themselves
                pending = T.local_frame(spark, pending_rows, _KEYED_SCHEMA)
            figures = _run_in_waves(spark, store, llm, model, pending, n_pending, safe_fn, row_of, meter, returned)
        else:
            def call(rows: list | None, n_items: int, fed: FedRecords | None = None) -> UsageFigures:
                # One slot stays free: the periodic commit is a Spark job, and it could not start before the
                # calling tasks end if they held every slot. A task's calls are async, so it loses no rate.
                n_tasks = max(1, min(n_items, max(default_parallelism(spark) - 1,
                                                  math.ceil(n_items / LLM_ITEMS_PER_TASK))))
                # The driver's rows: a local relation, dealt round-robin to the tasks (no Python job).
                frame = (pending if rows is None else T.local_frame(spark, rows, _KEYED_SCHEMA)).repartition(n_tasks)
                return _run_coordinated(spark, store, llm, model, frame, n_tasks, safe_fn, row_of, meter, journal,
                                        returned, follow, n_items, fed)

            if feed is None:
                figures = call(pending_rows, n_pending)
            else:  # a job for what is ready, then one for what the feed made meanwhile, until it is closed
                fed = FedRecords(feed, feed_items, follow, meter)
                rows = pending_rows
                while rows is not None:
                    if rows:
                        call(rows, len(rows), fed)
                    records = fed.next_job()
                    rows = None if records is None else [tuple(r[name] for name in _KEYED_COLUMNS) for r in records]
                if fed.failure is not None:
                    raise fed.failure
                figures = usage_of(returned)
        _compact(spark, store, llm.max_result_files)

    cache_hits = n_items - n_pending
    listed = few
    if follow is not None:
        followed = {record["item_key"]: record for record in follow.items if record["item_key"] not in unique}
        n_items, cache_hits = n_items + len(followed), len(cached) + len(follow.cache_hits)
        answers.update(follow.answered)
        listed = few + follow.items
    usage = stage_usage(stage, figures, n_items, cache_hits, model, time.perf_counter() - started)
    if on_driver:
        answers.update({row["item_key"]: (row["result"], row["error"]) for row in returned})
        # From pandas: a local relation, which the caller's reads (and checkpoints) take from the plan, no job.
        outcome = spark.createDataFrame(
            pd.DataFrame([(row["item_id"], row["item_key"], *answers.get(row["item_key"], (None, None))) for row in listed],
                         columns=["item_id", "item_key", "result", "error"], dtype=object),
            "item_id string, item_key string, result string, error string")
    else:
        all_results = store.read_or_empty(T.LLM_RESULTS).where(F.col("stage") == stage)
        succeeded = (all_results.where(F.col("error").isNull()).groupBy("item_key")
                     .agg(F.first("result").alias("result")).withColumn("error", F.lit(None).cast("string")))
        failed = (all_results.where(F.col("error").isNotNull()).join(succeeded.select("item_key"), "item_key", "left_anti")
                  .groupBy("item_key").agg(F.max_by("error", "created_at").alias("error")).withColumn("result", F.lit(None).cast("string")))
        outcome = keyed.select("item_id", "item_key").join(succeeded.unionByName(failed), "item_key", "left")
        keyed.unpersist()
        status.unpersist()
    # Every cache hit succeeded before and every pending item returned a row in this run, so the
    # failed items are this run's error rows (no scan of llm_results).
    n_failed = figures.failed_items
    usage.failures = n_failed
    record_usage(spark, store, run_id, usage)
    if usage.cut_at_max_tokens:
        log.warning("LLM stage '%s': %d answers stopped at their max_tokens, and what they would have said past it "
                    "is lost (each was parsed up to the cut). Raise the stage's max_tokens to keep it.",
                    stage, usage.cut_at_max_tokens)
    if n_items and n_failed / n_items > llm.max_failed_share:
        examples = figures.first_errors
        raise StageFailed(f"LLM stage '{stage}': {n_failed} of {n_items} items failed "
                          f"(above llm.max_failed_share={llm.max_failed_share}); their errors are in the "
                          f"'{T.LLM_RESULTS}' table and a rerun retries only them. First errors: {examples}")
    return outcome, usage


def record_usage(spark: SparkSession, store: T.TableStore, run_id: str, usage: StageUsage) -> None:
    """A stage's ``llm_usage`` row: kept for the job's one commit at its end where it defers them, else appended."""
    row = {"run_id": run_id, **usage.__dict__}
    if store.deferred_usage is not None:
        store.deferred_usage.append(row)
    else:
        append_usage(spark, store, [row])


def append_usage(spark: SparkSession, store: T.TableStore, rows: list[dict]) -> None:
    """``llm_usage`` rows in one commit."""
    if rows:
        store.write(T.local_frame(spark, rows, T.SCHEMAS[T.LLM_USAGE]), T.LLM_USAGE, mode="append", counted=False)


def stage_usage(stage: str, figures: UsageFigures, n_items: int, cache_hits: int, model: LlmModelConfig,
                wall_s: float) -> StageUsage:
    usage = StageUsage(stage=stage, items=n_items, cache_hits=cache_hits, wall_s=round(wall_s, 2),
                       calls=figures.calls, retries=figures.attempts - figures.calls, n_429=figures.n_429,
                       prompt_tokens=figures.prompt_tokens, completion_tokens=figures.completion_tokens,
                       latency_p50_s=figures.latency_p50_s, latency_p95_s=figures.latency_p95_s,
                       queue_p50_s=figures.queue_p50_s, queue_p95_s=figures.queue_p95_s,
                       cut_at_max_tokens=figures.cut)
    usage.est_cost_usd = round(usage.prompt_tokens / 1000 * model.price_per_1k_prompt
                               + usage.completion_tokens / 1000 * model.price_per_1k_completion, 6)
    return usage
