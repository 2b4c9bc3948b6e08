"""Retention after a published run: what deleted content leaves behind is removed.

- RAPTOR trees built from a deleted document are dropped (a per-document tree, or the corpus tree,
  whose summaries mix every document): their text would outlive the document. ``jobs/raptor.py``
  rebuilds them.
- Cached LLM results the published index no longer uses (their item is gone, or a newer answer for
  the same item replaced them), and cached embeddings of texts it no longer holds, are deleted once
  older than ``refresh.cache_retention_days``.
- After a run that removed content, VACUUM (``refresh.vacuum_retain_hours``) deletes the files that
  only versions older than the retention use, so a deleted document's text leaves storage too;
  runs older than that can no longer be opened.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from functools import reduce

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from graphrag_spark import tables as T

# Which table's ids an LLM stage's item_ids are (stages not listed are never pruned).
ITEM_TABLES = {"extract": T.TEXT_UNITS, "extract_claims": T.TEXT_UNITS, "summarize_entities": T.ENTITIES,
               "summarize_relationships": T.RELATIONSHIPS, "community_reports": T.COMMUNITIES,
               "raptor_summary": T.RAPTOR_NODES}
VACUUMED = (*T.PUBLISHED, T.LLM_RESULTS, T.EMBEDDING_CACHE, T.RAPTOR_NODES, T.RAPTOR_EDGES)


def drop_raptor_trees(store: T.TableStore, removed_documents: DataFrame) -> list[str]:
    """Delete the RAPTOR trees that hold a leaf of a removed document; returns their tree ids."""
    if not store.exists(T.RAPTOR_NODES):
        return []
    trees = sorted(r.tree_id for r in store.read(T.RAPTOR_NODES)
                   .join(removed_documents.select(F.col("id").alias("document_id")), "document_id", "left_semi")
                   .select("tree_id").distinct().collect())
    if trees:
        listed = ", ".join("'" + t.replace("'", "''") + "'" for t in trees)
        for name in (T.RAPTOR_NODES, T.RAPTOR_EDGES):
            if store.exists(name):
                store.spark.sql(f"DELETE FROM {store.sql_name(name)} WHERE tree_id IN ({listed})")
    return trees


def obsolete_results(store: T.TableStore, cutoff: datetime) -> DataFrame:
    """(item_key, run_id) of ``llm_results`` rows older than ``cutoff`` that the index does not use."""
    results = store.read(T.LLM_RESULTS).where(F.col("stage").isin(list(ITEM_TABLES)))
    used = [store.read(table).select(F.lit(stage).alias("stage"), F.col("id").alias("item_id"))
            for stage, table in ITEM_TABLES.items() if store.exists(table)]
    used_items = reduce(DataFrame.unionByName, used)
    latest = Window.partitionBy("stage", "item_id").orderBy(F.desc("created_at"), F.desc("item_key"))
    # In use: the newest answer to an item the index still has (and failures of such items, retried later).
    answers = (results.join(used_items, ["stage", "item_id"], "left_semi")
               .withColumn("_n", F.when(F.col("error").isNull(), F.row_number().over(latest))))
    in_use = answers.where(F.col("error").isNotNull() | (F.col("_n") == 1)).select("item_key", "run_id")
    return (results.where(F.col("created_at") < F.lit(cutoff)).select("item_key", "run_id")
            .join(in_use, ["item_key", "run_id"], "left_anti").distinct())


def prune_results(store: T.TableStore, retention_days: float) -> int:
    if not store.exists(T.LLM_RESULTS):
        return 0
    cutoff = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(days=retention_days)
    return _delete_matching(store, T.LLM_RESULTS, obsolete_results(store, cutoff), ["item_key", "run_id"])


def prune_embeddings(store: T.TableStore, retention_days: float) -> int:
    """Delete cached vectors of texts the index no longer embeds (older than the retention)."""
    from graphrag_spark.index.embed import EMBEDDED, embedding_input, text_hash

    if not store.exists(T.EMBEDDING_CACHE):
        return 0
    cutoff = datetime.now(timezone.utc).replace(tzinfo=None) - timedelta(days=retention_days)
    inputs = [embedding_input(store, name) for name in EMBEDDED]
    used = inputs[0].unionByName(inputs[1]).select(text_hash(F.col("text")).alias("text_hash"))
    obsolete = (store.read(T.EMBEDDING_CACHE).where(F.col("created_at") < F.lit(cutoff)).select("text_hash")
                .join(used, "text_hash", "left_anti").distinct())
    return _delete_matching(store, T.EMBEDDING_CACHE, obsolete, ["text_hash"])


def _delete_matching(store: T.TableStore, name: str, obsolete: DataFrame, keys: list[str]) -> int:
    """Delete the rows of table ``name`` whose ``keys`` match a row of ``obsolete``; returns how many keys matched."""
    # Checkpointed: the MERGE rewrites the table ``obsolete`` is computed from.
    obsolete = obsolete.localCheckpoint()
    n = obsolete.count()
    if n:
        view = f"obsolete_{name}"
        obsolete.createOrReplaceTempView(view)
        condition = " AND ".join(f"t.{k} = s.{k}" for k in keys)
        store.spark.sql(f"MERGE INTO {store.sql_name(name)} t USING {view} s ON {condition} WHEN MATCHED THEN DELETE")
        store.spark.catalog.dropTempView(view)
    return n


# VACUUM spreads the files it lists over this many tasks, 10,000 by default: tens of seconds of
# empty tasks for each small table. The job's shuffle width is enough, and it is restored after.
_LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


def vacuum(store: T.TableStore, retain_hours: float) -> None:
    spark = store.spark
    if retain_hours < 168:  # Delta refuses a shorter retention while its safety check is on
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    listing, width = spark.conf.get(_LISTING_PARALLELISM), spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set(_LISTING_PARALLELISM, width if width.isdigit() else listing)  # Databricks allows "auto"
    try:
        for name in VACUUMED:
            if store.exists(name):
                spark.sql(f"VACUUM {store.sql_name(name)} RETAIN {retain_hours} HOURS")
    finally:
        spark.conf.set(_LISTING_PARALLELISM, listing)


def apply(run) -> dict:
    """Retention for a run that just published (``run``: pipeline.Run); returns counts for the summary."""
    store, cfg, counts = run.store, run.cfg.refresh, {}
    if run.diff is None or run.diff.empty:
        return counts  # a first build or no change: nothing of the index went away
    if run.diff.n_removed:
        dropped = drop_raptor_trees(store, run.diff.removed)
        if dropped:
            counts["raptor trees dropped"] = f"{dropped} (built from deleted documents; rebuild with jobs/raptor.py)"
    counts["cached llm results pruned"] = prune_results(store, cfg.cache_retention_days)
    counts["cached embeddings pruned"] = prune_embeddings(store, cfg.cache_retention_days)
    # Files of removed content outlive it only in older versions: VACUUM deletes them after the retention.
    if run.diff.n_removed and cfg.vacuum_retain_hours is not None:
        vacuum(store, cfg.vacuum_retain_hours)
    return counts
