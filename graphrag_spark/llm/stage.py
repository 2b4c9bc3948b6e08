"""Running LLM work from Spark: cached in Delta, committed in batches, throttled job-wide, accounted.

Every LLM stage hands this module a DataFrame of items (``item_id``, ``payload``) and an async
function that turns one item into an ``LlmWork``. Each item gets a key: a hash of (stage, model,
prompt version, parameters, payload), i.e. of everything that determines the answer.

- **Nothing paid twice.** Items whose key already has a successful row in ``llm_results`` are
  not called again (an anti-join). Identical items (e.g. a duplicated chunk) share one call.
- **Crash-safe.** Pending items are processed in batches of ``llm.items_per_commit``, each a
  Spark job that appends its results to Delta before the next starts: a crash (driver or
  executor) repeats at most the batch in flight; a retried task repeats only its partition.
- **Job-wide throttling.** Each task gets ``1/concurrent_tasks`` of the requests/min and
  tokens/min budget (a Python worker's limiter sees only its own calls).
- **Nothing lost.** A failed item is a row with its error, stage, item id and attempts; it is
  retried on the next run. The stage fails with a summary only above ``llm.max_failed_share``.
- **Usage.** One ``llm_usage`` row per run and stage: calls, cache hits, retries, failures,
  tokens, latency percentiles and an estimated cost from the configured prices.
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Iterator

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.compat import default_parallelism
from graphrag_spark.config import LlmConfig, LlmModelConfig
from graphrag_spark.errors import StageFailed
from graphrag_spark.llm.client import CallResult, LlmClient, run_items
from graphrag_spark.llm.secrets import ensure_api_key
from graphrag_spark.progress import llm_meter

RESULT_COLUMNS = [f.name for f in T.SCHEMAS[T.LLM_RESULTS].fields]


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

    def render(self) -> str:
        return (f"{self.stage:<24} items {self.items:>6}  cache hits {self.cache_hits:>6}  calls {self.calls:>6}  "
                f"retries {self.retries:>4}  429s {self.n_429:>4}  failures {self.failures:>4}  "
                f"tokens {self.prompt_tokens:>9}+{self.completion_tokens:<8} p50 {self.latency_p50_s:.2f}s "
                f"p95 {self.latency_p95_s:.2f}s  ${self.est_cost_usd:.4f}  {self.wall_s:.1f}s")


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")


def with_item_keys(items: DataFrame, stage: str, model: str, prompt_version: str, params: dict) -> DataFrame:
    """Add ``item_key``: sha256 of everything that determines the answer (computed in Spark SQL)."""
    fixed = "\x1f".join([stage, model, prompt_version, json.dumps(params, sort_keys=True)])
    return items.withColumn("item_key", F.substring(F.sha2(F.concat_ws("\x1f", F.lit(fixed), F.col("payload")), 256), 1, 32))


def _work_rows(run_id: str, stage: str, model: str, keys: list[str], ids: list[str], works: list[LlmWork]) -> pd.DataFrame:
    now = pd.Timestamp.now(tz="UTC").tz_localize(None)
    rows = []
    for key, item_id, work in zip(keys, ids, works):
        calls = work.calls
        rows.append({
            "item_key": key, "stage": stage, "item_id": item_id, "model": model, "run_id": run_id,
            "result": None if work.error else json.dumps(work.result, ensure_ascii=False),
            "error": work.error, "n_calls": len(calls), "attempts": sum(c.attempts for c in calls),
            "n_429": sum(c.n_429 for c in calls), "prompt_tokens": sum(c.prompt_tokens for c in calls),
            "completion_tokens": sum(c.completion_tokens for c in calls),
            "call_latencies": [float(c.latency_s) for c in calls], "created_at": now,
        })
    return pd.DataFrame(rows, columns=RESULT_COLUMNS, dtype=object)


def _safe(work_fn: Callable[[LlmClient, dict], Awaitable[LlmWork]]):
    """A bug in result handling must not kill the task and lose its partition's paid calls."""
    async def run(client: LlmClient, item: dict) -> LlmWork:
        try:
            return await work_fn(client, item)
        except Exception as exc:  # noqa: BLE001 - recorded as the item's error row
            return LlmWork(None, [], f"internal error: {type(exc).__name__}: {exc} | {traceback.format_exc(limit=2)[-300:]}")
    return run


def run_llm_stage(spark: SparkSession, store: T.TableStore, llm: LlmConfig, model: LlmModelConfig, stage: str,
                  items: DataFrame, work_fn: Callable[[LlmClient, dict], Awaitable[LlmWork]], run_id: str,
                  prompt_version: str, params: dict) -> tuple[DataFrame, StageUsage]:
    """Call the LLM for every item not already done; returns (item_id, item_key, result, error) for all items."""
    started = time.perf_counter()
    keyed = with_item_keys(items.select("item_id", "payload"), stage, model.model, prompt_version, params).persist()
    done = store.read_or_empty(T.LLM_RESULTS).where((F.col("stage") == stage) & F.col("error").isNull()).select("item_key")
    unique_items = keyed.dropDuplicates(["item_key"])
    # Batches are fixed on the driver from the pending keys, so a batch never shifts while earlier
    # batches are being committed to the very table the anti-join reads.
    pending_keys = sorted(r.item_key for r in unique_items.join(done, "item_key", "left_anti").select("item_key").collect())
    n_items = unique_items.count()
    n_pending = len(pending_keys)
    if n_pending:
        ensure_api_key(model)  # the closure below carries the key; a bad one fails here, once
    # Task slots of the cluster: every task of a batch runs at once, so each gets 1/n of the budget.
    parallelism = default_parallelism(spark)
    safe_fn = _safe(work_fn)
    model_name = model.model
    meter = llm_meter(spark, stage, n_pending, model.price_per_1k_prompt, model.price_per_1k_completion)
    tally = meter.tally

    for start in range(0, n_pending, llm.items_per_commit):
        batch_keys = pending_keys[start:start + llm.items_per_commit]
        wave = unique_items.join(F.broadcast(spark.createDataFrame([(k,) for k in batch_keys], "item_key string")), "item_key")
        n_tasks = max(1, min(parallelism, len(batch_keys)))
        share = 1.0 / n_tasks

        def call_partition(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            for frame in frames:
                records = frame.to_dict("records")
                works = run_items(records, safe_fn, model, share)
                tally.add(works)
                yield _work_rows(run_id, stage, model_name, frame["item_key"].tolist(), frame["item_id"].tolist(), works)

        results = wave.repartition(n_tasks).mapInPandas(call_partition, T.SCHEMAS[T.LLM_RESULTS])
        store.write(results, T.LLM_RESULTS, mode="append")
        meter.committed(len(batch_keys))

    # Only this call's pending keys: a stage that runs more than once in a run (reports, per level)
    # must not count again the calls an earlier pass made for items that are cache hits now.
    called = spark.createDataFrame([(k,) for k in pending_keys], "item_key string")
    usage = _usage(store, stage, run_id, called, n_items, n_items - n_pending, model, time.perf_counter() - started)
    all_results = store.read(T.LLM_RESULTS).where(F.col("stage") == stage)
    succeeded = (all_results.where(F.col("error").isNull()).groupBy("item_key")
                 .agg(F.first("result").alias("result")).withColumn("error", F.lit(None).cast("string")))
    failed = (all_results.where(F.col("error").isNotNull()).join(succeeded.select("item_key"), "item_key", "left_anti")
              .groupBy("item_key").agg(F.max_by("error", "created_at").alias("error")).withColumn("result", F.lit(None).cast("string")))
    outcome = keyed.select("item_id", "item_key").join(succeeded.unionByName(failed), "item_key", "left")
    keyed.unpersist()
    n_failed = outcome.where(F.col("result").isNull()).count()
    usage.failures = n_failed
    store.write(spark.createDataFrame([{"run_id": run_id, **usage.__dict__}], T.SCHEMAS[T.LLM_USAGE]), T.LLM_USAGE, mode="append")
    if n_items and n_failed / n_items > llm.max_failed_share:
        examples = [r.error for r in outcome.where(F.col("error").isNotNull()).select("error").limit(3).collect()]
        raise StageFailed(f"LLM stage '{stage}': {n_failed} of {n_items} items failed "
                          f"(above llm.max_failed_share={llm.max_failed_share}); their errors are in the "
                          f"'{T.LLM_RESULTS}' table and a rerun retries only them. First errors: {examples}")
    return outcome, usage


def _usage(store: T.TableStore, stage: str, run_id: str, keys: DataFrame, n_items: int, cache_hits: int,
           model: LlmModelConfig, wall_s: float) -> StageUsage:
    usage = StageUsage(stage=stage, items=n_items, cache_hits=cache_hits, wall_s=round(wall_s, 2))
    if not store.exists(T.LLM_RESULTS):
        return usage
    rows = (store.read(T.LLM_RESULTS).where((F.col("stage") == stage) & (F.col("run_id") == run_id))
            .join(keys, "item_key", "left_semi"))
    agg = rows.agg(F.sum("n_calls").alias("calls"), F.sum("attempts").alias("attempts"), F.sum("n_429").alias("n_429"),
                   F.sum("prompt_tokens").alias("pt"), F.sum("completion_tokens").alias("ct")).collect()[0]
    latency = rows.select(F.explode("call_latencies").alias("l")).agg(
        F.percentile_approx("l", [0.5, 0.95]).alias("p")).collect()[0].p or [0.0, 0.0]
    usage.calls = int(agg.calls or 0)
    usage.retries = int((agg.attempts or 0) - usage.calls)
    usage.n_429 = int(agg.n_429 or 0)
    usage.prompt_tokens, usage.completion_tokens = int(agg.pt or 0), int(agg.ct or 0)
    usage.latency_p50_s, usage.latency_p95_s = round(float(latency[0]), 3), round(float(latency[1]), 3)
    usage.est_cost_usd = round(usage.prompt_tokens / 1000 * model.price_per_1k_prompt
                               + usage.completion_tokens / 1000 * model.price_per_1k_completion, 6)
    return usage
