"""Stage 7, embeddings: text units and entity descriptions as vectors in Delta, for basic (SS) and local search.

Computed in executors (``mapInPandas``). The offline MiniLM loads its weights once per Python
worker; the ``openai`` provider calls the embeddings endpoint through the project client in
batches of ``embeddings.batch_size``, each task throttled to its share of the job's budget,
and at most ``llm.items_per_commit`` rows per task, so a retried task repeats few calls. An item
whose call finally failed is written with a null vector and counted; more failures than
``llm.max_failed_share`` fail the stage after the tables are written.

Endpoint vectors go through the ``embedding_cache`` table (model, dimensions, text hash):
a text already embedded by the same model is never requested again, in this index or a
rerun of it; a failed one is not cached, so the next run asks again.
"""

from __future__ import annotations

import math
from typing import Iterator

import pandas as pd
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from threadpoolctl import threadpool_limits

from graphrag_spark import tables as T
from graphrag_spark.compat import default_parallelism
from graphrag_spark.config import Config
from graphrag_spark.embeddings import OfflineMiniLM, OpenAIEmbedder
from graphrag_spark.errors import StageFailed
from graphrag_spark.llm.secrets import ensure_api_key


def embedding_model_name(cfg: Config) -> str:
    return OfflineMiniLM.model_name if cfg.embeddings.provider == "offline" else cfg.llm.embedding.model


def embed_texts(frame: DataFrame, cfg: Config, partitions: int) -> DataFrame:
    """``(id, text)`` rows -> ``(id, vector, model_name)`` rows, embedded in executors."""
    provider, batch_size = cfg.embeddings.provider, cfg.embeddings.batch_size
    llm_embedding, model_name = cfg.llm.embedding, embedding_model_name(cfg)
    share = 1.0 / partitions
    if provider == "openai":
        ensure_api_key(llm_embedding)

    def run(parts: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        embedder = OpenAIEmbedder(llm_embedding, batch_size, share) if provider == "openai" else OfflineMiniLM()
        # The offline model's BLAS threads stay within the task's cores: an executor runs one task per
        # core, and more threads per task only contend (half the speed on 2 cores).
        with threadpool_limits(TaskContext.get().cpus()):
            for part in parts:
                texts = part["text"].fillna("").tolist()
                if isinstance(embedder, OpenAIEmbedder):
                    vectors = embedder.embed_batches(texts)[0]  # a failed batch gives None rows
                else:
                    vectors = list(embedder.embed(texts))  # one call: sorted by length over the whole batch
                yield pd.DataFrame({"id": part["id"].to_numpy(dtype=object),
                                    "vector": [None if v is None else v.tolist() for v in vectors],
                                    "model_name": model_name}, dtype=object)

    return frame.repartition(partitions).mapInPandas(run, T.SCHEMAS[T.TEXT_UNIT_EMBEDDINGS])


def _partitions(spark: SparkSession, rows: int, rows_per_task: int) -> int:
    return max(1, min(rows, max(default_parallelism(spark), math.ceil(rows / rows_per_task))))


def text_hash(text) -> F.Column:
    """The cache key of a text: sha256 of it (a null text as the empty one), as Spark SQL."""
    return F.substring(F.sha2(F.coalesce(text, F.lit("")), 256), 1, 32)


def embed_cached(spark: SparkSession, store: T.TableStore, frame: DataFrame, cfg: Config, rows: int) -> tuple[DataFrame, int]:
    """``(id, text)`` rows -> ``(id, vector, model_name)`` rows and the number of texts sent to the model.

    With the ``openai`` provider, only distinct texts missing from ``embedding_cache`` are
    requested; their vectors are appended to it before the result is read from it. The offline
    encoder is deterministic and free: it computes every row.
    """
    if cfg.embeddings.provider != "openai":
        return embed_texts(frame, cfg, _partitions(spark, rows, cfg.llm.items_per_commit)), rows
    model, dimensions = cfg.llm.embedding.model, cfg.llm.embedding.dimensions or 0

    def cached() -> DataFrame:
        return (store.read_or_empty(T.EMBEDDING_CACHE)
                .where((F.col("model") == model) & (F.col("dimensions") == dimensions)).select("text_hash", "vector"))

    keyed = frame.select("id", "text", text_hash(F.col("text")).alias("text_hash"))
    missing = (keyed.dropDuplicates(["text_hash"]).join(cached().select("text_hash"), "text_hash", "left_anti")
               .select(F.col("text_hash").alias("id"), "text"))
    n_missing = missing.count()
    if n_missing:
        fresh = embed_texts(missing, cfg, _partitions(spark, n_missing, cfg.llm.items_per_commit))
        store.write(fresh.where(F.col("vector").isNotNull())
                    .select(F.lit(model).alias("model"), F.lit(dimensions).alias("dimensions"),
                            F.col("id").alias("text_hash"), "vector", F.current_timestamp().alias("created_at")),
                    T.EMBEDDING_CACHE, mode="append", counted=False)
    vectors = cached().dropDuplicates(["text_hash"])
    return keyed.join(vectors, "text_hash", "left").select("id", "vector", F.lit(model).alias("model_name")), n_missing


EMBEDDED = (T.TEXT_UNIT_EMBEDDINGS, T.ENTITY_EMBEDDINGS)


def embedding_input(store: T.TableStore, name: str) -> DataFrame:
    """The ``(id, text)`` rows the embeddings table ``name`` holds vectors of."""
    if name == T.TEXT_UNIT_EMBEDDINGS:
        return store.read(T.TEXT_UNITS).select("id", "text")
    # An entity is matched on "TITLE: description" (concat_ws skips a missing description).
    entity_text = F.concat_ws(": ", "title", F.when(F.col("description") != "", F.col("description")))
    return store.read(T.ENTITIES).select("id", entity_text.alias("text"))


def _reusable(name: str, current: DataFrame, previous: T.TableStore, model_name: str) -> DataFrame:
    """(id, vector, model_name) rows of the last run whose text is unchanged and whose vector exists."""
    if not previous.exists(name):
        return current.sparkSession.createDataFrame([], T.SCHEMAS[name])
    unchanged = current.join(embedding_input(previous, name), ["id", "text"], "left_semi").select("id")
    return (previous.read(name).where(F.col("vector").isNotNull() & (F.col("model_name") == model_name))
            .join(unchanged, "id", "left_semi"))


def build_embeddings(spark: SparkSession, store: T.TableStore, cfg: Config,
                     previous: T.TableStore | None = None, names: tuple[str, ...] = EMBEDDED) -> dict[str, int]:
    """Write the embeddings tables ``names`` (both by default); returns counts for the run summary.

    With ``previous`` (the last run's tables) a row whose text did not change keeps its vector:
    only new or changed texts (and earlier failures) are embedded."""
    counts: dict[str, int] = {}
    failures = []
    for name in names:
        frame = embedding_input(store, name)
        rows = frame.count()
        kept = _reusable(name, frame, previous, embedding_model_name(cfg)) if previous is not None else None
        if kept is not None:  # read as of the last run's version: still readable after the overwrite
            todo = frame.join(kept.select("id"), "id", "left_anti")
            n_todo = todo.count()
            vectors, requested = embed_cached(spark, store, todo, cfg, n_todo) if n_todo else (None, 0)
            store.write(kept if vectors is None else kept.unionByName(vectors), name, counted=False)
        else:
            vectors, requested = embed_cached(spark, store, frame, cfg, rows)
            store.write(vectors, name, counted=False)
        failed = store.read(name).where(F.col("vector").isNull()).count()
        counts[f"{name} rows"] = rows
        counts[f"{name} texts embedded"] = requested
        counts[f"{name} failed"] = failed
        if rows and failed / rows > cfg.llm.max_failed_share:
            failures.append(f"{failed} of {rows} rows of {name}")
    if failures:
        raise StageFailed(f"Embeddings failed for {' and '.join(failures)} (more than llm.max_failed_share = "
                          f"{cfg.llm.max_failed_share}); rows with a null vector in those tables are the failed items.")
    return counts
