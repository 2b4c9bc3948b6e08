"""Runs of the index job on one root: the lock, the ``index_runs`` log and publication, retention.

- **Lock.** One job at a time per root. The lock is a one-row Delta table taken and released by
  UPDATE commits: Delta's optimistic concurrency control rejects the second of two commits
  that rewrote the same row, so of two jobs racing for a free (or stale) lock exactly one wins, on
  a local disk, HDFS, object stores, Volumes and Unity Catalog alike (an ``O_EXCL`` lock file is
  atomic only on POSIX disks). The holder renews a heartbeat; a lock whose heartbeat is older than
  ``refresh.lock_stale_after_s``, or whose job on this host is no longer alive, is taken over.
- **Publication.** Stages write their tables as they go; readers never see those writes, because
  they open every table at the Delta versions recorded in the last ``succeeded`` row of
  ``index_runs`` (time travel). A run that fails leaves that row, so the published index, as it
  was; a rerun starts again from the published state and finds its paid calls in the LLM cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.config import Config, RefreshConfig
from graphrag_spark.errors import UserError

LOCK_KEY = "root"
SUCCEEDED, FAILED, RUNNING = "succeeded", "failed", "running"


def _is_conflict(exc: Exception) -> bool:
    """Delta's rejection of a commit that lost a race (classic: ConcurrentXxxException; Connect: DELTA_CONCURRENT_*)."""
    text = str(exc)
    return "Concurrent" in text or "DELTA_CONCURRENT" in text or "already exists" in text.lower()


def _sql_string(value: str) -> str:
    """A Spark SQL string literal (the job name holds argv[0] and the host name, which may hold quotes)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe_job() -> str:
    return f"{os.path.basename(sys.argv[0]) or 'python'} (pid {os.getpid()} on {socket.gethostname()})"


class RootLocked(UserError):
    """Another job holds the root."""


class IndexLock:
    """``with IndexLock(store, run_id, cfg.refresh):`` holds the root for one run."""

    def __init__(self, store: T.TableStore, run_id: str, cfg: RefreshConfig, job: str | None = None):
        self.store, self.run_id, self.cfg = store, run_id, cfg
        self.job = job or describe_job()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    # -------------------------------------------------------------- taking
    def _create_taken(self) -> bool:
        """On a root without a lock table: create it already held by this run (one commit, no read).
        Creating a Delta table is itself a compare-and-swap: of two jobs creating it, one commit wins,
        and the other finds the table and takes the lock as usual. True if this run created it."""
        if self.store.exists(T.INDEX_LOCK):
            return False
        taken = T.local_frame(self.store.spark, [
            (LOCK_KEY, self.run_id, self.job, socket.gethostname(), os.getpid(), None, None)], T.SCHEMAS[T.INDEX_LOCK]
        ).withColumn("acquired_at", F.current_timestamp()).withColumn("heartbeat_at", F.current_timestamp())
        writer = taken.write.format("delta").mode("error").options(**T.TABLE_PROPERTIES)  # Connect knows only "error"
        try:
            if self.store.storage.database:
                writer.saveAsTable(self.store.location(T.INDEX_LOCK))
            else:
                writer.save(self.store.location(T.INDEX_LOCK))
        except Exception as exc:  # noqa: BLE001 - another job created it first: its version 0 won
            if not (_is_conflict(exc) or self.store.exists(T.INDEX_LOCK)):
                raise
            return False
        return True

    def holder(self) -> Row | None:
        """The current holder with ``age_s`` (seconds since its heartbeat), or None if the lock is free."""
        row = (self.store.read(T.INDEX_LOCK).where(F.col("lock") == LOCK_KEY)
               .withColumn("age_s", F.unix_timestamp(F.current_timestamp()) - F.unix_timestamp("heartbeat_at"))
               .collect())
        return row[0] if row and row[0]["run_id"] is not None else None

    def _stale(self, holder: Row) -> bool:
        if holder["age_s"] is not None and holder["age_s"] > self.cfg.lock_stale_after_s:
            return True
        return holder["host"] == socket.gethostname() and not _pid_alive(int(holder["pid"]))

    def _swap(self, expected: str) -> bool:
        """Compare-and-swap: the row becomes this run's only if its ``run_id`` is still ``expected`` (a SQL
        predicate); Delta rejects the second of two concurrent rewrites of the row. An UPDATE, not a MERGE:
        Delta logs every failed MERGE at ERROR with a stack trace, which the losing job would print before
        its one sentence. True if the row is this run's now."""
        try:
            updated = self.store.spark.sql(
                f"UPDATE {self.store.sql_name(T.INDEX_LOCK)} SET run_id = {_sql_string(self.run_id)}, "
                f"job = {_sql_string(self.job)}, host = {_sql_string(socket.gethostname())}, pid = {os.getpid()}, "
                "acquired_at = current_timestamp(), heartbeat_at = current_timestamp() "
                f"WHERE lock = '{LOCK_KEY}' AND run_id {expected}").collect()
        except Exception as exc:  # noqa: BLE001
            if not _is_conflict(exc):
                raise
            return False
        return bool(updated) and updated[0][0] == 1  # num_affected_rows

    def _try_take(self) -> tuple[bool, Row | None]:
        """(whether this run now holds the lock, the holder otherwise: None if it was just released)."""
        holder = self.holder()
        if holder is not None and holder["run_id"] == self.run_id:  # a swap that reported failure had committed
            return True, None
        if holder is not None and not self._stale(holder):
            return False, holder
        if self._swap("IS NULL" if holder is None else f"= {_sql_string(holder['run_id'])}"):
            return True, None
        holder = self.holder()
        taken = holder is not None and holder["run_id"] == self.run_id
        return taken, None if taken else holder

    def acquire(self) -> None:
        deadline = time.monotonic() + self.cfg.lock_wait_s
        # A free lock (the usual case) is taken with one commit and no read of its holder first.
        taken = self._create_taken() or self._swap("IS NULL")
        while not taken:
            taken, holder = self._try_take()
            if taken:
                break
            if holder is None:  # released while we tried: try again
                continue
            if time.monotonic() >= deadline:
                raise RootLocked(
                    f"Another index job is running on '{self.store.location('')}': run {holder['run_id']}, "
                    f"{holder['job']}, started {holder['acquired_at']:%Y-%m-%d %H:%M:%S}, last heartbeat "
                    f"{holder['age_s']} s ago; wait for it to finish (or set refresh.lock_wait_s to wait).")
            time.sleep(min(5.0, max(0.5, deadline - time.monotonic())))
        self._heartbeat = threading.Thread(target=self._beat, name="index-lock-heartbeat", daemon=True)
        self._heartbeat.start()

    # -------------------------------------------------------------- holding
    def _update(self, assignments: str) -> None:
        for _ in range(5):
            try:
                self.store.spark.sql(f"UPDATE {self.store.sql_name(T.INDEX_LOCK)} SET {assignments} "
                                     f"WHERE lock = '{LOCK_KEY}' AND run_id = {_sql_string(self.run_id)}")
                return
            except Exception as exc:  # noqa: BLE001
                if not _is_conflict(exc):
                    raise
                time.sleep(0.2)

    def _beat(self) -> None:
        while not self._stop.wait(self.cfg.lock_heartbeat_s):
            try:
                self._update("heartbeat_at = current_timestamp()")
            except Exception:  # noqa: BLE001 - a missed beat only ages the lock; the next one renews it
                pass

    def release(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
        self._update("run_id = NULL, job = NULL, host = NULL, pid = NULL, acquired_at = NULL, heartbeat_at = NULL")

    def __enter__(self) -> IndexLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


# ------------------------------------------------------------------ the run log


def config_fingerprint(cfg: Config) -> str:
    """Hash of every setting that shapes the index: a refresh is only incremental under the same ones."""
    shaping = {"input": cfg.input.model_dump(include={"format", "text_column", "title_column", "id_column",
                                                      "max_document_bytes"}),
               "chunking": cfg.chunking.model_dump(), "extraction": cfg.extraction.model_dump(),
               "graph": cfg.graph.model_dump(), "communities": cfg.communities.model_dump(),
               "reports": cfg.reports.model_dump(), "embeddings": cfg.embeddings.model_dump(),
               "models": [cfg.llm.chat.model, cfg.llm.embedding.model]}
    return hashlib.sha256(json.dumps(shaping, sort_keys=True, default=str).encode()).hexdigest()[:16]


def published_run(store: T.TableStore, run_id: str | None = None) -> Row | None:
    """The last succeeded run (or the named one); None if the root has no recorded run."""
    if not store.exists(T.INDEX_RUNS):
        if run_id is not None:
            raise UserError(f"The index at '{store.location('')}' has no '{T.INDEX_RUNS}' table, so no run '{run_id}'.")
        return None
    runs = store.read(T.INDEX_RUNS).where(F.col("status") == SUCCEEDED)
    if run_id is not None:
        rows = runs.where(F.col("run_id") == run_id).collect()
        if not rows:
            known = [r.run_id for r in runs.orderBy(F.desc("ended_at")).limit(5).collect()]
            raise UserError(f"No succeeded run '{run_id}' in '{store.location(T.INDEX_RUNS)}'; recent ones: {known}.")
        return rows[0]
    rows = runs.orderBy(F.desc("ended_at"), F.desc("run_id")).limit(1).collect()
    return rows[0] if rows else None


def published_store(spark: SparkSession, storage, run_id: str | None = None) -> T.TableStore:
    """A store reading the index as of its last succeeded run (or ``run_id``)."""
    live = T.TableStore(spark, storage)
    run = published_run(live, run_id)
    if run is None:
        # No recorded run: an index from before index_runs (or imported) is read as it is; a root whose
        # runs all failed has published nothing.
        return T.TableStore(spark, storage, {}) if live.exists(T.INDEX_RUNS) else live
    return T.TableStore(spark, storage, dict(run["table_versions"]))


def current_versions(store: T.TableStore, known: dict[str, int | None] | None = None) -> dict[str, int]:
    """The latest version of every published table the root holds, ``known`` ones (None: no table) as
    given, the others read: one history read each, no existence check first; four at once: each is
    mostly a round trip, a quarter second on a small table."""
    known = dict(known or {})
    unknown = [name for name in T.PUBLISHED if name not in known]
    with ThreadPoolExecutor(max_workers=4, thread_name_prefix="table-version") as pool:
        known.update(zip(unknown, pool.map(store.version_or_none, unknown)))
    return {name: known[name] for name in T.PUBLISHED if known[name] is not None}


def record_run(store: T.TableStore, **row) -> None:
    schema = T.SCHEMAS[T.INDEX_RUNS]
    store.write(T.local_frame(store.spark, [row], schema), T.INDEX_RUNS, mode="append", counted=False)

