"""Stage 7, embeddings: text units and entity descriptions as vectors in Delta, for basic (SS) and local search.

A stage of at most ``DRIVER_EMBED_ROWS`` input rows runs on the driver: one collect, the model
calls there, one write. A larger one is computed in executors (``mapInPandas``). The offline
MiniLM loads its weights once per Python process; the ``openai`` provider calls the embeddings
endpoint through the project client in batches of ``embeddings.batch_size``, each task throttled
to its share of the job's budget (one over the tasks that run at once, ``task_share``). An item whose
call finally failed is written with a null vector and counted; more failures than
``llm.max_failed_share`` fail the stage after the tables are written.

Endpoint vectors go through the ``embedding_cache`` table (model, dimensions, text hash):
a text already embedded by the same model is never requested again, in this index or a
rerun of it; a failed one is not cached, so the next run asks again. New vectors are appended
to the cache before the stage's table is written: a crash in between does not pay for them twice.
Before that commit, each batch's vectors are journaled on the driver as the batch returns (the
executors post theirs to a ``VectorJournal``), and the stage's next run commits the journal of a
crashed one first: a driver crash loses at most the batches in flight. A task that Spark retries
takes back the vectors its earlier attempt journaled and pays only for the rest. On Spark Connect
the executors cannot reach the client, so the executor path journals nothing there: it embeds in
waves, each appended to the cache as it returns (``_embed_in_waves``).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import math
import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pandas as pd
import pyspark
from pyspark import TaskContext
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType
from threadpoolctl import threadpool_limits

from graphrag_spark import tables as T
from graphrag_spark.compat import default_parallelism, is_connect, llm_tasks
from graphrag_spark.config import Config
from graphrag_spark.embeddings import OfflineMiniLM, OpenAIEmbedder
from graphrag_spark.errors import StageFailed
from graphrag_spark.llm.client import EmbedResult, task_concurrency
from graphrag_spark.llm.coordinator import DriverEndpoint, Journal, post_json, read_journal, usage_of
from graphrag_spark.llm.secrets import ensure_api_key
from graphrag_spark.llm.stage import (StageUsage, connect_waves, driver_host, new_run_id, record_usage, recover_journal,
                                      stage_journal, stage_usage)
from graphrag_spark.llm.throttle import wave_items

log = logging.getLogger(__name__)

# Up to this many input rows a stage embeds on the driver (one collect, one write: ~10 Spark jobs, most of
# them Delta's; the executor path costs ~30, 11-19 s on 2 cores for 40 texts as for 300). At 1,000 texts
# that is about what executors would save: a few endpoint batches, or ~45 core-seconds of MiniLM.
DRIVER_EMBED_ROWS = 1_000


def embedding_model_name(cfg: Config) -> str:
    return OfflineMiniLM.model_name if cfg.embeddings.provider == "offline" else cfg.llm.embedding.model


def _embedder(cfg: Config, share: float) -> OpenAIEmbedder | OfflineMiniLM:
    if cfg.embeddings.provider == "openai":
        # Unless llm.embedding.concurrency says otherwise: up to its share of the job's llm.max_in_flight batches
        # at once, paced by its share of the rate limit (8 per task used 96 of 600 RPM at 10 s on 2 slots).
        return OpenAIEmbedder(cfg.llm.embedding, cfg.embeddings.batch_size, share,
                              task_concurrency(cfg.llm.embedding, cfg.llm.max_in_flight, share))
    return OfflineMiniLM()


def _vectors(embedder: OpenAIEmbedder | OfflineMiniLM, texts: list[str],
             on_batch: Callable[[int, np.ndarray], None] | None = None,
             ) -> tuple[list[list[float] | None], list[EmbedResult]]:
    """One vector per text (a null text is the empty one), as lists, None where an endpoint batch finally
    failed; and the endpoint batches' outcomes (none offline). ``on_batch``: see ``OpenAIEmbedder.embed_batches``."""
    texts = [text if isinstance(text, str) else "" for text in texts]
    outcomes: list[EmbedResult] = []
    if isinstance(embedder, OpenAIEmbedder):
        vectors, outcomes = embedder.embed_batches(texts, on_batch)
    else:
        vectors = list(embedder.embed(texts))  # one call: sorted by length over the whole batch
    return [None if v is None else v.tolist() for v in vectors], outcomes


# An endpoint batch's outcome rides on one row of the frame that embeds it (a task's k-th row carries its k-th
# batch; a batch holds at least one text), so that the job that writes the vectors also brings back what its
# calls cost (``EmbeddingCalls.observing``): no second pass over a frame whose recomputation would pay again.
_BATCH_FIELDS = [StructField("batch_attempts", IntegerType()), StructField("batch_429s", IntegerType()),
                 StructField("batch_prompt_tokens", LongType()), StructField("batch_latency_s", DoubleType()),
                 StructField("batch_queue_s", DoubleType()), StructField("batch_error", StringType())]
_EMBEDDED_SCHEMA = StructType(T.SCHEMAS[T.TEXT_UNIT_EMBEDDINGS].fields + _BATCH_FIELDS)


def _batch_frame(outcomes: list[EmbedResult], rows: int) -> pd.DataFrame:
    """The batch columns of a task's ``rows`` output rows."""
    values = [(o.attempts, o.n_429, o.prompt_tokens, o.latency_s, o.queue_s, o.error) for o in outcomes]
    values += [(None,) * len(_BATCH_FIELDS)] * (rows - len(outcomes))
    return pd.DataFrame(values, columns=[f.name for f in _BATCH_FIELDS], dtype=object)


def _batch_usage(outcome: EmbedResult) -> dict:
    """One endpoint batch as a row ``usage_of`` sums (an ``llm_results`` row's usage fields)."""
    return {"n_calls": 1, "attempts": outcome.attempts, "n_429": outcome.n_429, "prompt_tokens": outcome.prompt_tokens,
            "completion_tokens": 0, "call_latencies": [outcome.latency_s], "queue_waits": [outcome.queue_s],
            "error": outcome.error}


def task_share(spark: SparkSession, partitions: int) -> float:
    """Each embedding task's share of the endpoint's budget: one over the tasks that run at once. A job of
    more tasks than slots runs them in waves, where one over the tasks would leave most of the budget idle
    (14 tasks of 256 rows on 2 cores used a seventh of it). A Connect client only guesses the slots: there
    every task keeps one over the tasks, which never exceeds the budget."""
    if is_connect(spark):
        return 1.0 / partitions
    return 1.0 / min(partitions, default_parallelism(spark))


def embed_texts(frame: DataFrame, cfg: Config, partitions: int, journal_url: str | None = None) -> DataFrame:
    """``(id, text)`` rows -> ``(id, vector, model_name)`` rows, embedded in executors (``_embedded``)."""
    return _embedded(frame, cfg, partitions, journal_url).select(*T.SCHEMAS[T.TEXT_UNIT_EMBEDDINGS].fieldNames())


def _embedded(frame: DataFrame, cfg: Config, partitions: int, journal_url: str | None = None) -> DataFrame:
    """``embed_texts`` with the endpoint batches' outcomes (``_BATCH_FIELDS``). With ``journal_url`` (a
    ``VectorJournal``'s, the ids being text hashes), a task first takes back the vectors of its ids already
    returned (a retried task's) and embeds only the others, posting each endpoint batch's ids and vectors
    there as the batch returns."""
    model_name, share = embedding_model_name(cfg), task_share(frame.sparkSession, partitions)
    if cfg.embeddings.provider == "openai":
        ensure_api_key(cfg.llm.embedding)

    def run(parts: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        embedder = _embedder(cfg, share)
        # The offline model's BLAS threads stay within the task's cores: an executor runs one task per
        # core, and more threads per task only contend (half the speed on 2 cores).
        with threadpool_limits(TaskContext.get().cpus()):
            for part in parts:
                ids, texts = part["id"].tolist(), part["text"].tolist()
                if journal_url is None:
                    vectors, outcomes = _vectors(embedder, texts)
                else:
                    known = post_json(f"{journal_url}/returned", {"ids": ids})
                    todo = [i for i, key in enumerate(ids) if key not in known]
                    todo_ids = [ids[i] for i in todo]

                    def post(start: int, rows: np.ndarray) -> None:
                        post_json(f"{journal_url}/vectors", {"ids": todo_ids[start : start + len(rows)],
                                                             "vectors": [_packed(row) for row in rows]})

                    embedded, outcomes = _vectors(embedder, [texts[i] for i in todo], post)
                    fresh = dict(zip(todo, embedded))
                    vectors = [fresh[i] if i in fresh else _unpacked(known[key]) for i, key in enumerate(ids)]
                yield pd.concat([pd.DataFrame({"id": np.array(ids, dtype=object), "vector": vectors,
                                               "model_name": model_name}, dtype=object),
                                 _batch_frame(outcomes, len(ids))], axis=1)

    return frame.repartition(partitions).mapInPandas(run, _EMBEDDED_SCHEMA)


# threadpool_limits sets the process's BLAS threads: two stages embedding on the driver at once would
# restore each other's setting, and would only contend for the same cores anyway.
_DRIVER_BLAS = threading.Lock()


def _embed_on_driver(texts: list[str], cfg: Config, on_batch: Callable[[int, np.ndarray], None] | None = None,
                     ) -> tuple[list[list[float] | None], list[EmbedResult]]:
    if cfg.embeddings.provider == "openai":
        ensure_api_key(cfg.llm.embedding)
        return _vectors(_embedder(cfg, 1.0), texts, on_batch)  # the driver is the only caller: the whole budget
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    with _DRIVER_BLAS, threadpool_limits(cores):
        return _vectors(_embedder(cfg, 1.0), texts)


# Most texts per executor task whose batches are journaled on the driver: its vectors are held in the task.
JOURNALED_ROWS_PER_TASK = 10_000
# Sizing Connect's embedding waves only: cl100k on English text.
_CHARS_PER_TOKEN = 4.0


def _partitions(spark: SparkSession, rows: int, rows_per_task: int) -> int:
    return max(1, min(rows, max(default_parallelism(spark), math.ceil(rows / rows_per_task))))


def text_hash(text) -> F.Column:
    """The cache key of a text: sha256 of it (a null text as the empty one), as Spark SQL."""
    return F.substring(F.sha2(F.coalesce(text, F.lit("")), 256), 1, 32)


def python_text_hash(text: str | None) -> str:
    """``text_hash`` in Python, for the driver path: the same key for the same text."""
    return hashlib.sha256((text or "").encode("utf-8")).hexdigest()[:32]


def _cache_key(cfg: Config) -> tuple[str, int]:
    return cfg.llm.embedding.model, cfg.llm.embedding.dimensions or 0


# The embedding journal: one line per vector paid for and not yet in the cache (model, dimensions, text
# hash, the float32 vector in base64: exact, and under half the size of its decimal text).
_CACHE_KEYS = ["model", "dimensions", "text_hash"]


def _packed(vector: np.ndarray) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def _unpacked(packed: str) -> list[float]:
    return np.frombuffer(base64.b64decode(packed), dtype="<f4").tolist()


def _journal_rows(cfg: Config, keys, vectors) -> list[dict]:
    model, dimensions = _cache_key(cfg)
    return [{"model": model, "dimensions": dimensions, "text_hash": key, "vector": vector}
            for key, vector in zip(keys, vectors)]


def _cache_rows(rows: list[dict]) -> pd.DataFrame:
    """Journaled vectors as ``embedding_cache`` rows (a pandas frame: Arrow makes it a frame, no Python job)."""
    now = datetime.now(timezone.utc)
    return pd.DataFrame([(row["model"], row["dimensions"], row["text_hash"], _unpacked(row["vector"]), now) for row in rows],
                        columns=T.SCHEMAS[T.EMBEDDING_CACHE].fieldNames())


class VectorJournal:
    """The driver's side of an executor-path embedding stage (a ``DriverEndpoint``): each batch a task posts
    (``/vectors``) is journaled, and a task asks which of its ids already returned (``/returned``) and gets
    their vectors back, so a task that Spark retries pays again only for what was in flight. Only the ids
    are held in memory; the journal file is read when a task finds some of its ids done."""

    def __init__(self, spark: SparkSession, journal: Journal, cfg: Config) -> None:
        self._journal, self._cfg = journal, cfg
        self._done: set[str] = set()
        self._lock = threading.Lock()
        self._endpoint = DriverEndpoint(driver_host(spark), {"vectors": self.add, "returned": self.returned},
                                        "embedding-journal")
        self.url = self._endpoint.url

    def add(self, body: dict) -> dict:
        self._journal.append(_journal_rows(self._cfg, body["ids"], body["vectors"]))
        with self._lock:
            self._done.update(body["ids"])
        return {}

    def returned(self, body: dict) -> dict:
        with self._lock:
            wanted = self._done.intersection(body["ids"])
        if not wanted:
            return {}
        return {row["text_hash"]: row["vector"] for row in read_journal(self._journal.path)
                if row["text_hash"] in wanted}

    def close(self) -> None:
        self._endpoint.close()


def _recovered_journal(spark: SparkSession, store: T.TableStore, name: str) -> Path:
    """The stage's embedding journal file, once what a crashed run left in it is committed to the cache."""
    path = stage_journal(store, f"embeddings-{name}")
    recover_journal(spark, store, path, T.EMBEDDING_CACHE, _cache_rows, _CACHE_KEYS)
    return path


class EmbeddingCalls:
    """What one embedding stage sent to the endpoint, for its ``llm_usage`` row: the texts, and each batch as a
    row ``usage_of`` sums (None once some could not be seen: executors' batches on a Spark Connect client of
    pyspark 3.5, which cannot read the metrics a job observes)."""

    def __init__(self) -> None:
        self.texts = 0
        self.batches: list[dict] | None = []
        self.started = time.perf_counter()

    def add(self, outcomes: list[EmbedResult]) -> None:
        if self.batches is not None:
            self.batches += [_batch_usage(outcome) for outcome in outcomes]

    def observing(self, frame: DataFrame) -> tuple[DataFrame, Callable[[], None]]:
        """``frame`` (``_embedded`` rows) observed, and what to call once an action ran it: adds its batches."""
        if is_connect(frame.sparkSession) and int(pyspark.__version__.split(".")[0]) < 4:
            self.batches = None
            return frame, lambda: None
        observation = Observation()
        batch = F.struct(*(F.col(field.name) for field in _BATCH_FIELDS))
        observed = frame.observe(observation, F.collect_list(F.when(F.col("batch_attempts").isNotNull(), batch))
                                 .alias("batches"))

        def collect() -> None:
            self.add([EmbedResult(attempts=b[0], n_429=b[1], prompt_tokens=b[2], latency_s=b[3], queue_s=b[4],
                                  error=b[5]) for b in observation.get["batches"]])

        return observed, collect

    def usage(self, name: str, items: int, failed: int, cfg: Config) -> StageUsage | None:
        """The stage's usage (``name``: its table; ``items``: its rows, ``failed`` of them without a vector), None
        where its calls could not all be seen."""
        if self.batches is None:
            log.warning("Embedding stage %s: its calls are not in llm_usage (a Spark Connect client of pyspark "
                        "3.5 cannot read what executors observed).", name)
            return None
        usage = stage_usage(name, usage_of(self.batches), items, items - self.texts, cfg.llm.embedding,
                            time.perf_counter() - self.started)
        usage.failures = failed
        return usage


def embed_cached(spark: SparkSession, store: T.TableStore, frame: DataFrame, cfg: Config, rows: int,
                 name: str, calls: EmbeddingCalls | None = None) -> tuple[DataFrame, int]:
    """``(id, text)`` rows -> ``(id, vector, model_name)`` rows and the number of texts sent to the model.

    With the ``openai`` provider, only distinct texts missing from ``embedding_cache`` are
    requested; their vectors are journaled as they return (the journal of the stage ``name``) and
    appended to the cache before the result is read from it (on Spark Connect, appended wave by wave).
    The offline encoder is deterministic and free: it computes every row. ``calls``: where the endpoint
    batches' usage goes.
    """
    if cfg.embeddings.provider != "openai":
        return embed_texts(frame, cfg, _partitions(spark, rows, cfg.llm.items_per_commit)), rows
    model, dimensions = _cache_key(cfg)
    journal_path = _recovered_journal(spark, store, name)

    def cached() -> DataFrame:
        return (store.read_or_empty(T.EMBEDDING_CACHE)
                .where((F.col("model") == model) & (F.col("dimensions") == dimensions)).select("text_hash", "vector"))

    keyed = frame.select("id", "text", text_hash(F.col("text")).alias("text_hash"))
    # Held once counted: the embedding jobs read it from memory rather than deriving it again.
    missing = (keyed.dropDuplicates(["text_hash"]).join(cached().select("text_hash"), "text_hash", "left_anti")
               .select(F.col("text_hash").alias("id"), "text")).persist()
    n_missing, mean_chars = missing.agg(F.count("*"), F.avg(F.length("text"))).first()

    calls = calls or EmbeddingCalls()
    calls.texts += n_missing

    def append_to_cache(fresh: DataFrame) -> None:
        observed, collect = calls.observing(fresh)
        store.write(observed.where(F.col("vector").isNotNull())
                    .select(F.lit(model).alias("model"), F.lit(dimensions).alias("dimensions"),
                            F.col("id").alias("text_hash"), "vector", F.current_timestamp().alias("created_at")),
                    T.EMBEDDING_CACHE, mode="append", counted=False)
        collect()

    try:
        if n_missing and is_connect(spark):
            _embed_in_waves(missing, n_missing, mean_chars or 0.0, cfg, append_to_cache)
        elif n_missing:
            _embed_journaled(missing, n_missing, cfg, Journal(journal_path), append_to_cache)
    finally:
        missing.unpersist()
    vectors = cached().dropDuplicates(["text_hash"])
    return keyed.join(vectors, "text_hash", "left").select("id", "vector", F.lit(model).alias("model_name")), n_missing


def _embed_journaled(missing: DataFrame, n_missing: int, cfg: Config, journal: Journal,
                     append_to_cache: Callable[[DataFrame], None]) -> None:
    """The classic path: one job whose tasks post each batch's vectors to the driver's ``VectorJournal``.
    A journaled task's retry pays again only for its batches in flight, so the task's size need not bound
    what a failure costs: one task per slot (up to ``JOURNALED_ROWS_PER_TASK`` rows), so that each pays the
    endpoint's latency once or twice, not once per ``llm.items_per_commit`` rows in waves of tasks."""
    spark = missing.sparkSession
    endpoint = VectorJournal(spark, journal, cfg)
    rows_per_task = max(cfg.llm.items_per_commit,
                        min(JOURNALED_ROWS_PER_TASK, math.ceil(n_missing / default_parallelism(spark))))
    try:
        append_to_cache(_embedded(missing, cfg, _partitions(spark, n_missing, rows_per_task), endpoint.url))
    finally:
        endpoint.close()
        journal.close()
    journal.discard()


def _embed_in_waves(missing: DataFrame, n_missing: int, mean_chars: float, cfg: Config,
                    append_to_cache: Callable[[DataFrame], None]) -> None:
    """Spark Connect: the executors cannot reach the client, so nothing is journaled. The texts run in waves
    (``connect_waves``) of the endpoint batches the budget sends in ``llm.connect_wave_s`` (at least
    ``llm.items_per_commit``), each one job that appends its vectors to the cache: a client that goes down
    loses at most one wave's. A wave ends with its last batches' latency: sized in time, that tail is the
    same small share of any limit (at 10 s latency, waves of 256 batches held 0.645 of 600 requests/min, one
    wave of 384 sized in time 0.795). A wave runs the fewest tasks its batches allow (``llm_tasks``), each
    with its share of the whole budget: the client cannot see the slots, and one task per
    ``llm.items_per_commit`` rows (200 shuffle partitions at least on a shared cluster) each at one over the
    tasks left most of the budget idle (6 tasks on 2 slots used 0.32 of it)."""
    model, batch_size = cfg.llm.embedding, cfg.embeddings.batch_size
    # Requests/min, or tokens/min at the mean batch (``_CHARS_PER_TOKEN``).
    requests_per_minute = min(model.requests_per_minute,
                              model.tokens_per_minute / max(1.0, batch_size * mean_chars / _CHARS_PER_TOKEN))
    texts = batch_size * wave_items(requests_per_minute, cfg.llm.connect_wave_s, 1.0, cfg.llm.items_per_commit)
    for wave, expected in connect_waves(missing, "id", n_missing, lambda: texts):
        append_to_cache(_embedded(wave, cfg, llm_tasks(missing.sparkSession, math.ceil(expected / batch_size))))


def _cached_vectors(store: T.TableStore, cfg: Config, hashes: set[str]) -> dict[str, list[float]]:
    """The cache's vectors of these text hashes (this model and dimensions): only those rows reach the driver."""
    if not hashes or not store.exists(T.EMBEDDING_CACHE):
        return {}
    model, dimensions = _cache_key(cfg)
    wanted = (F.col("model") == model) & (F.col("dimensions") == dimensions) & F.col("text_hash").isin(sorted(hashes))
    rows = store.read(T.EMBEDDING_CACHE).where(wanted).select("text_hash", "vector").collect()
    return {r.text_hash: r.vector for r in rows}


def _embed_cached_on_driver(store: T.TableStore, texts: list[str | None], cfg: Config, name: str,
                           calls: EmbeddingCalls, known: dict[str, list[float]] | None = None,
                           ) -> tuple[list[list[float] | None], int]:
    """``embed_cached`` for texts held by the driver: one vector per text (None: failed) and the number of
    texts sent to the model. New endpoint vectors are journaled as their batch returns, then appended to
    ``embedding_cache`` in one commit. ``known``: vectors by text hash this process has from the cache
    already (only the other texts are looked up)."""
    if cfg.embeddings.provider != "openai":
        return (_embed_on_driver(texts, cfg)[0] if texts else []), len(texts)
    journal_path = _recovered_journal(store.spark, store, name)
    hashes = [python_text_hash(text) for text in texts]
    known = known or {}
    vectors = {key: known[key] for key in hashes if key in known}
    vectors.update(_cached_vectors(store, cfg, set(hashes) - set(vectors)))
    missing: dict[str, str | None] = {}  # the distinct texts the cache has no vector of, by hash
    for key, text in zip(hashes, texts):
        if key not in vectors:
            missing.setdefault(key, text)
    if missing:
        keys, journal = list(missing), Journal(journal_path)

        def journaled(start: int, rows: np.ndarray) -> None:
            journal.append(_journal_rows(cfg, keys[start : start + len(rows)], [_packed(row) for row in rows]))

        try:
            embedded, outcomes = _embed_on_driver(list(missing.values()), cfg, journaled)
            calls.texts += len(missing)
            calls.add(outcomes)
            fresh = dict(zip(keys, embedded))
            model, dimensions = _cache_key(cfg)
            now = datetime.now(timezone.utc)
            paid = [(model, dimensions, key, vector, now) for key, vector in fresh.items() if vector is not None]
            if paid:  # before the stage's table: a crash after this commit does not pay for them again
                store.write(T.local_frame(store.spark, paid, T.SCHEMAS[T.EMBEDDING_CACHE]), T.EMBEDDING_CACHE,
                            mode="append", counted=False)
        finally:
            journal.close()
        journal.discard()
        vectors = {**vectors, **fresh}
    return [vectors.get(key) for key in hashes], len(missing)


EMBEDDED = (T.TEXT_UNIT_EMBEDDINGS, T.ENTITY_EMBEDDINGS)


def embedding_input(store: T.TableStore, name: str) -> DataFrame:
    """The ``(id, text)`` rows the embeddings table ``name`` holds vectors of."""
    if name == T.TEXT_UNIT_EMBEDDINGS:
        return store.read(T.TEXT_UNITS).select("id", "text")
    # An entity is matched on "TITLE: description" (concat_ws skips a missing description).
    entity_text = F.concat_ws(": ", "title", F.when(F.col("description") != "", F.col("description")))
    return store.read(T.ENTITIES).select("id", entity_text.alias("text"))


def python_entity_text(title: str, description: str | None) -> str:
    """``embedding_input``'s text of an entity, in Python."""
    return f"{title}: {description}" if description else title


# The summaries' answers are embedded in rounds at least this far apart (each round reads and appends to the
# cache): a handful of rounds over a long stage, the last one right after the summaries end.
SUMMARY_ROUND_S = 30.0


def embed_entities_beside_summaries(spark: SparkSession, store: T.TableStore, cfg: Config, entities: list[dict],
                                    awaited: set[str], summaries, run_id: str,
                                    ) -> tuple[dict[str, int], list[StageUsage]]:
    """The entity embeddings stage of a full build beside the summaries: fill ``embedding_cache`` with the
    entity texts while the descriptions are summarized, first every entity not ``awaited`` (its description is
    final), then the summarized ones as their summaries come (``summaries``: the summaries' ``Feed`` of
    (element id, summary; None: it failed and the description stays)), in rounds; the last one as soon as
    the last awaited summary has come. Then the stage's table, from the entities' final texts (those the
    summaries write to ``entities``, so the stage neither waits for that write nor reads it back) and, on
    the driver path, the vectors at hand. ``entities``: rows with ``id``, ``title`` and ``description`` as
    the graph wrote them. Returns ``build_embeddings``' counts with the texts sent beside the summaries, and
    its usage (the calls beside the summaries included)."""
    name, calls = T.ENTITY_EMBEDDINGS, EmbeddingCalls()
    final = {row["id"]: python_entity_text(row["title"], row["description"]) for row in entities}
    waiting = {row["id"]: row for row in entities if row["id"] in awaited}
    # Vectors kept for the driver path only: it is the one that would read them back (and they are small there).
    vectors: dict[str, list[float]] | None = {} if len(entities) <= DRIVER_EMBED_ROWS else None

    def embed(texts: list[str]) -> int:
        embedded, sent = _embed_cached_on_driver(store, texts, cfg, name, calls)
        if vectors is not None:
            vectors.update((python_text_hash(text), vector) for text, vector in zip(texts, embedded) if vector is not None)
        return sent

    sent = embed([text for key, text in final.items() if key not in waiting])
    left = set(waiting)
    while left:
        events, closed = summaries.take(gather_s=SUMMARY_ROUND_S,
                                        enough=lambda events: left <= {key for key, _ in events})
        came = {key: summary for key, summary in events if key in left}
        for key, summary in came.items():
            row = waiting[key]
            final[key] = python_entity_text(row["title"], row["description"] if summary is None else summary)
        left -= set(came)
        if came:
            sent += embed([final[key] for key in came])
        if closed and left:
            raise RuntimeError(f"internal error: {len(left)} summaries awaited by the entity embeddings never came")
    texts = T.local_frame(spark, final.items(), "id string, text string")
    counts, usages = build_embeddings(spark, store, cfg, None, (name,), known=vectors, texts=texts, run_id=run_id,
                                      calls=calls)
    return {**counts, "entity texts embedded beside the summaries": sent}, usages


def _reusable(name: str, current: DataFrame, previous: T.TableStore, model_name: str) -> DataFrame:
    """(id, vector, model_name) rows of the last run whose text is unchanged and whose vector exists."""
    if not previous.exists(name):
        return T.local_frame(current.sparkSession, [], T.SCHEMAS[name])
    unchanged = current.join(embedding_input(previous, name), ["id", "text"], "left_semi").select("id")
    return (previous.read(name).where(F.col("vector").isNotNull() & (F.col("model_name") == model_name))
            .join(unchanged, "id", "left_semi"))


def _build_in_executors(spark: SparkSession, store: T.TableStore, cfg: Config, name: str, frame: DataFrame,
                        previous: T.TableStore | None, calls: EmbeddingCalls) -> tuple[int, int, int]:
    rows = frame.count()
    kept = _reusable(name, frame, previous, embedding_model_name(cfg)) if previous is not None else None
    if kept is not None:  # read as of the last run's version: still readable after the overwrite
        todo = frame.join(kept.select("id"), "id", "left_anti")
        n_todo = todo.count()
        vectors, requested = embed_cached(spark, store, todo, cfg, n_todo, name, calls) if n_todo else (None, 0)
        store.write(kept if vectors is None else kept.unionByName(vectors), name, counted=False)
    else:
        vectors, requested = embed_cached(spark, store, frame, cfg, rows, name, calls)
        store.write(vectors, name, counted=False)
    return rows, requested, store.read(name).where(F.col("vector").isNull()).count()


def _build_on_driver(spark: SparkSession, store: T.TableStore, cfg: Config, name: str, collected: list,
                     previous: T.TableStore | None, known: dict[str, list[float]] | None,
                     calls: EmbeddingCalls) -> tuple[int, int, int]:
    """The executor path's table from the ``(id, text)`` rows in the driver, written once."""
    model_name = embedding_model_name(cfg)
    kept: list = []
    if previous is not None:  # at most one row per current row: small too
        reusable = _reusable(name, T.local_frame(spark, collected, "id string, text string"), previous, model_name)
        kept = [(r.id, r.vector) for r in reusable.select("id", "vector").collect()]
    kept_ids = {key for key, _ in kept}
    todo = [r for r in collected if r.id not in kept_ids]
    vectors, requested = _embed_cached_on_driver(store, [r.text for r in todo], cfg, name, calls, known)
    out = [(key, vector, model_name) for key, vector in kept] + [(r.id, v, model_name) for r, v in zip(todo, vectors)]
    store.write(T.local_frame(spark, out, T.SCHEMAS[name]), name, counted=False)
    return len(collected), requested, sum(v is None for v in vectors)


def build_embeddings(spark: SparkSession, store: T.TableStore, cfg: Config,
                     previous: T.TableStore | None = None, names: tuple[str, ...] = EMBEDDED,
                     known: dict[str, list[float]] | None = None, texts: DataFrame | None = None,
                     run_id: str | None = None, calls: EmbeddingCalls | None = None,
                     ) -> tuple[dict[str, int], list[StageUsage]]:
    """Write the embeddings tables ``names`` (both by default); returns counts for the run summary and, with
    the ``openai`` provider, each table's usage, also recorded in ``llm_usage`` (as run ``run_id``; a new
    run id where None).

    With ``previous`` (the last run's tables) a row whose text did not change keeps its vector:
    only new or changed texts (and earlier failures) are embedded. ``known``: cached vectors by text
    hash the caller holds (a table the driver builds does not read them back). ``texts``: the ``(id,
    text)`` rows of the one table ``names`` names, as the caller made them (not read from its input).
    ``calls``: what that one table's stage sent before (its usage counts them too)."""
    counts: dict[str, int] = {}
    usages: list[StageUsage] = []
    failures = []
    run_id = run_id or new_run_id()
    for name in names:
        stage_calls = calls or EmbeddingCalls()
        frame = embedding_input(store, name) if texts is None else texts
        # One more row than the driver takes: a large table costs a short read, then the executor path.
        collected = frame.limit(DRIVER_EMBED_ROWS + 1).collect()
        if len(collected) <= DRIVER_EMBED_ROWS:
            rows, requested, failed = _build_on_driver(spark, store, cfg, name, collected, previous, known, stage_calls)
        else:
            rows, requested, failed = _build_in_executors(spark, store, cfg, name, frame, previous, stage_calls)
        usage = stage_calls.usage(name, rows, failed, cfg) if cfg.embeddings.provider == "openai" else None
        if usage is not None:
            record_usage(spark, store, run_id, usage)
            usages.append(usage)
        counts[f"{name} rows"] = rows
        counts[f"{name} texts embedded"] = requested
        counts[f"{name} failed"] = failed
        if rows and failed / rows > cfg.llm.max_failed_share:
            failures.append(f"{failed} of {rows} rows of {name}")
    if failures:
        raise StageFailed(f"Embeddings failed for {' and '.join(failures)} (more than llm.max_failed_share = "
                          f"{cfg.llm.max_failed_share}); rows with a null vector in those tables are the failed items.")
    return counts, usages
