"""Stage 3, element instances: entity and relationship instances per text unit, in executors.

Both methods produce the same two tables (``entity_instances``, ``relationship_instances``),
each row keeping its ``text_unit_id`` for provenance; the graph stage does not care which
method ran. ``nlp`` is the offline default; ``llm`` is the paper's prompts (see extract_llm).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import reduce
from typing import Iterator

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.config import ExtractionConfig, LlmConfig, LlmModelConfig
from graphrag_spark.ids import content_id
from graphrag_spark.index import extract_nlp
from graphrag_spark.index.extract_llm import ExtractionPrompts, extract_chunk, extract_claims
from graphrag_spark.llm.stage import LlmWork, StageUsage, run_llm_stage

_INSTANCE_SCHEMA = ("kind string, id string, text_unit_id string, name string, type string, source string, "
                    "target string, description string, strength double, method string")
_INSTANCE_COLUMNS = [f.split()[0] for f in _INSTANCE_SCHEMA.split(", ")]


def _nlp_partition(max_phrases: int):
    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            rows = []
            for unit_id, text in zip(batch["id"], batch["text"]):
                entities, relationships = extract_nlp.extract_unit(unit_id, text, max_phrases)
                rows.extend({"kind": "entity", **e} for e in entities)
                rows.extend({"kind": "relationship", **r} for r in relationships)
            yield pd.DataFrame(rows, columns=_INSTANCE_COLUMNS, dtype=object)
    return run


def nlp_instances(text_units: DataFrame, cfg: ExtractionConfig) -> DataFrame:
    """Offline extraction: entity and relationship instances in one frame (``split_instances`` separates them)."""
    return text_units.select("id", "text").mapInPandas(_nlp_partition(cfg.nlp.max_phrases_per_chunk), _INSTANCE_SCHEMA)


def extract_nlp_instances(text_units: DataFrame, cfg: ExtractionConfig) -> tuple[DataFrame, DataFrame]:
    """Offline extraction; returns (entity_instances, relationship_instances) in the tables' schemas."""
    return split_instances(nlp_instances(text_units, cfg))


def split_instances(instances: DataFrame) -> tuple[DataFrame, DataFrame]:
    entity_cols = [f.name for f in T.SCHEMAS[T.ENTITY_INSTANCES].fields]
    relationship_cols = [f.name for f in T.SCHEMAS[T.RELATIONSHIP_INSTANCES].fields]
    return (instances.where("kind = 'entity'").select(entity_cols),
            instances.where("kind = 'relationship'").select(relationship_cols))


EXTRACTION_STAGE = "extract"
CLAIMS_STAGE = "extract_claims"


def extraction_params(cfg: ExtractionConfig, model: LlmModelConfig) -> dict:
    """Everything besides the chunk and the prompts that changes the extraction answer (part of the cache key)."""
    return {"entity_types": cfg.entity_types, "max_gleanings": cfg.max_gleanings, "gleaning_check": cfg.gleaning_check,
            "temperature": model.temperature, "max_tokens": model.max_tokens}


def claims_params(cfg: ExtractionConfig, model: LlmModelConfig) -> dict:
    """The same for the claims pass (its payload holds the chunk and the entity names it asks about)."""
    return {"claim_description": cfg.claim_description, "entity_types": cfg.entity_types,
            "temperature": model.temperature, "max_tokens": model.max_tokens}


def instances_from_results(results: pd.DataFrame) -> pd.DataFrame:
    """Pure: explode (item_id, result JSON) rows into entity / relationship / claim instance rows."""
    rows = []
    for unit_id, payload in zip(results["item_id"], results["result"]):
        result = json.loads(payload)
        for i, e in enumerate(result.get("entities") or []):
            rows.append({"kind": "entity", "id": content_id(unit_id, "entity", i, e["name"]), "text_unit_id": unit_id,
                         "name": e["name"], "type": e["type"], "description": e["description"], "method": "llm"})
        for i, r in enumerate(result.get("relationships") or []):
            rows.append({"kind": "relationship", "id": content_id(unit_id, "relationship", i, r["source"], r["target"]),
                         "text_unit_id": unit_id, "source": r["source"], "target": r["target"],
                         "description": r["description"], "strength": float(r["strength"]), "method": "llm"})
        for i, c in enumerate(result.get("claims") or []):
            rows.append({"kind": "claim", "id": content_id(unit_id, "claim", i, c.get("subject"), c.get("description")),
                         "text_unit_id": unit_id, "name": c.get("subject"), "target": c.get("object"),
                         "type": c.get("type"), "description": json.dumps(c, ensure_ascii=False)})
    return pd.DataFrame(rows, columns=_INSTANCE_COLUMNS, dtype=object)


# The instance columns the graph stage aggregates, per kind.
ENTITY_GRAPH_COLUMNS = ["name", "type", "text_unit_id", "description"]
RELATIONSHIP_GRAPH_COLUMNS = ["source", "target", "text_unit_id", "description", "strength"]


def graph_inputs(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Pure: the entity and relationship instances among ``instances_from_results``' rows, in the graph stage's
    columns and in the dtypes a collect of the instance tables gives (``strength`` a float)."""
    def of(kind: str, columns: list[str]) -> pd.DataFrame:
        return rows.loc[rows["kind"] == kind, columns].reset_index(drop=True)

    return of("entity", ENTITY_GRAPH_COLUMNS), of("relationship", RELATIONSHIP_GRAPH_COLUMNS).astype({"strength": "float64"})


_REJECT_REASONS = ("extraction records rejected (malformed)", "claim records rejected (malformed)")


@dataclass(frozen=True)
class LlmInstances:
    """What LLM extraction found: entity and relationship instances (``T.ENTITY_INSTANCES``' and
    ``T.RELATIONSHIP_INSTANCES``' columns), claims (``T.CLAIMS``'), the stages' usage, and, where the
    answers were parsed on the driver (a small stage), every instance row as ``instances_from_results``
    gave it (so a caller counts and reads them without a Spark job), else None."""
    entities: DataFrame
    relationships: DataFrame
    claims: DataFrame
    usages: list[StageUsage]
    rows: pd.DataFrame | None = None


def extract_llm_instances(spark: SparkSession, store: T.TableStore, text_units: DataFrame, cfg: ExtractionConfig,
                          llm: LlmConfig, run_id: str,
                          dropped: dict | None = None, unit_rows: pd.DataFrame | None = None) -> LlmInstances:
    """The paper's extraction (with gleanings) for every text unit not already extracted, then, if
    enabled, the claims pass as a stage of its own over the extracted chunks: each is cached
    separately, so switching claims on (or changing the claim description) never pays for
    entity extraction again. ``dropped`` (the run summary's counts) gets what was not kept: chunks
    whose extraction failed after retries (retried by the next run) and model records that could
    not be parsed. ``unit_rows``: ``text_units``' rows where the driver holds them already (no Spark job
    keys the items)."""
    prompts = ExtractionPrompts.load()

    async def extract(client, item: dict) -> LlmWork:
        chunk = await extract_chunk(client, item["payload"], cfg, prompts, item_id=item["item_id"])
        return LlmWork({"entities": chunk.entities, "relationships": chunk.relationships, "rejected": chunk.rejected},
                       chunk.calls, chunk.error)

    items = (text_units.select(F.col("id").alias("item_id"), F.col("text").alias("payload")) if unit_rows is None
             else unit_rows[["id", "text"]].set_axis(["item_id", "payload"], axis=1))
    outcome, usage = run_llm_stage(spark, store, llm, llm.chat, EXTRACTION_STAGE, items, extract, run_id,
                                   prompts.version, extraction_params(cfg, llm.chat))
    results, usages = outcome.where(F.col("result").isNotNull()).select("item_id", "result"), [usage]
    labelled = [results.withColumn("reason", F.lit(_REJECT_REASONS[0]))]
    if cfg.claims:
        claim_results, claims_usage = _extract_claims(spark, store, text_units, results, cfg, llm, run_id, prompts)
        labelled.append(claim_results.withColumn("reason", F.lit(_REJECT_REASONS[1])))
        usages.append(claims_usage)
    n_results = sum(u.items for u in usages)
    if dropped is not None:
        dropped["text units failed extraction (retried next run)"] = usage.failures
        if cfg.claims:
            dropped["text units failed claims (retried next run)"] = claims_usage.failures
        dropped.update({reason: 0 for reason in _REJECT_REASONS[:1 + cfg.claims]})
    if n_results <= T.LOCAL_CHECKPOINT_ROWS:
        # A small stage's answers are on the driver already: parsed there, and the instances handed on as
        # local rows (no scratch table, no Python tasks parsing the answers once per table written).
        collected = pd.concat([frame.toPandas() for frame in labelled], ignore_index=True)
        if dropped is not None:
            rejected = collected["result"].map(lambda result: int(json.loads(result).get("rejected") or 0))
            dropped.update({reason: int(n) for reason, n in rejected.groupby(collected["reason"]).sum().items()})
        rows = instances_from_results(collected)
        instances = spark.createDataFrame(rows, _INSTANCE_SCHEMA)
    else:
        rows = None
        # Materialised once: the drop counts and the three instance tables written from it would each
        # derive it again (a scan of llm_results, a join with the items).
        results = store.checkpoint(reduce(DataFrame.unionByName, labelled), "extraction_results")
        if dropped is not None:
            per_reason = results.groupBy("reason").agg(F.sum(F.coalesce(
                F.get_json_object("result", "$.rejected").cast("long"), F.lit(0))).alias("n")).collect()
            dropped.update({row["reason"]: int(row["n"] or 0) for row in per_reason})

        def explode(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
            for batch in batches:
                yield instances_from_results(batch)

        instances = results.mapInPandas(explode, _INSTANCE_SCHEMA)
    entities, relationships = split_instances(instances)
    claims = (instances.where("kind = 'claim'")
              .withColumn("c", F.from_json("description", "map<string,string>"))
              .select("id", F.lit(None).cast("long").alias("human_readable_id"), "text_unit_id",
                      F.upper(F.col("c")["subject"]).alias("subject"), F.upper(F.col("c")["object"]).alias("object"),
                      F.col("c")["type"].alias("type"), F.col("c")["status"].alias("status"),
                      F.col("c")["start_date"].alias("start_date"), F.col("c")["end_date"].alias("end_date"),
                      F.col("c")["description"].alias("description"), F.col("c")["source_text"].alias("source_text")))
    return LlmInstances(entities, relationships, claims, usages, rows)


def _extract_claims(spark: SparkSession, store: T.TableStore, text_units: DataFrame, extracted: DataFrame,
                    cfg: ExtractionConfig, llm: LlmConfig, run_id: str,
                    prompts: ExtractionPrompts) -> tuple[DataFrame, StageUsage]:
    """Claims of every successfully extracted chunk; payload = the chunk and its entity names."""
    names = F.from_json("result", "struct<entities:array<struct<name:string>>>")["entities"]["name"]
    items = (extracted.select("item_id", F.sort_array(F.array_distinct(F.coalesce(names, F.array()))).alias("names"))
             .join(text_units.select(F.col("id").alias("item_id"), "text"), "item_id")
             .select("item_id", F.to_json(F.struct("text", "names")).alias("payload")))

    async def work(client, item: dict) -> LlmWork:
        payload = json.loads(item["payload"])
        chunk = await extract_claims(client, payload["text"], payload["names"], cfg, prompts, item_id=item["item_id"])
        return LlmWork({"claims": chunk.claims, "rejected": chunk.rejected}, chunk.calls, chunk.error)

    outcome, usage = run_llm_stage(spark, store, llm, llm.chat, CLAIMS_STAGE, items, work, run_id,
                                   prompts.claims.version, claims_params(cfg, llm.chat))
    return outcome.where(F.col("result").isNotNull()).select("item_id", "result"), usage
