"""Stage 3, element instances: entity and relationship instances per text unit, in executors.

Both methods produce the same two tables (``entity_instances``, ``relationship_instances``),
each row keeping its ``text_unit_id`` for provenance; the graph stage does not care which
method ran. ``nlp`` is the offline default; ``llm`` is the paper's prompts (see extract_llm).
"""

from __future__ import annotations

import json
from typing import Iterator

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.config import ExtractionConfig, LlmConfig, LlmModelConfig
from graphrag_spark.ids import content_id
from graphrag_spark.index import extract_nlp
from graphrag_spark.index.extract_llm import ExtractionPrompts, extract_chunk
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


def extract_nlp_instances(text_units: DataFrame, cfg: ExtractionConfig) -> tuple[DataFrame, DataFrame]:
    """Offline extraction; returns (entity_instances, relationship_instances) in the tables' schemas."""
    instances = text_units.select("id", "text").mapInPandas(_nlp_partition(cfg.nlp.max_phrases_per_chunk), _INSTANCE_SCHEMA)
    return _split(instances)


def _split(instances: DataFrame) -> tuple[DataFrame, DataFrame]:
    entity_cols = [f.name for f in T.SCHEMAS[T.ENTITY_INSTANCES].fields]
    relationship_cols = [f.name for f in T.SCHEMAS[T.RELATIONSHIP_INSTANCES].fields]
    return (instances.where("kind = 'entity'").select(entity_cols),
            instances.where("kind = 'relationship'").select(relationship_cols))


EXTRACTION_STAGE = "extract"


def extraction_params(cfg: ExtractionConfig, model: LlmModelConfig) -> dict:
    """Everything besides the chunk and the prompts that changes the extraction answer (part of the cache key)."""
    return {"entity_types": cfg.entity_types, "max_gleanings": cfg.max_gleanings, "claims": cfg.claims,
            "claim_description": cfg.claim_description if cfg.claims else None,
            "temperature": model.temperature, "max_tokens": model.max_tokens}


def instances_from_results(results: pd.DataFrame) -> pd.DataFrame:
    """Pure: explode (item_id, result JSON) rows into entity / relationship / claim instance rows."""
    rows = []
    for unit_id, payload in zip(results["item_id"], results["result"]):
        result = json.loads(payload)
        for i, e in enumerate(result["entities"]):
            rows.append({"kind": "entity", "id": content_id(unit_id, "entity", i, e["name"]), "text_unit_id": unit_id,
                         "name": e["name"], "type": e["type"], "description": e["description"], "method": "llm"})
        for i, r in enumerate(result["relationships"]):
            rows.append({"kind": "relationship", "id": content_id(unit_id, "relationship", i, r["source"], r["target"]),
                         "text_unit_id": unit_id, "source": r["source"], "target": r["target"],
                         "description": r["description"], "strength": float(r["strength"]), "method": "llm"})
        for i, c in enumerate(result.get("claims") or []):
            rows.append({"kind": "claim", "id": content_id(unit_id, "claim", i, c.get("subject"), c.get("description")),
                         "text_unit_id": unit_id, "name": c.get("subject"), "target": c.get("object"),
                         "type": c.get("type"), "description": json.dumps(c, ensure_ascii=False)})
    return pd.DataFrame(rows, columns=_INSTANCE_COLUMNS, dtype=object)


def extract_llm_instances(spark: SparkSession, store: T.TableStore, text_units: DataFrame, cfg: ExtractionConfig,
                          llm: LlmConfig, run_id: str) -> tuple[DataFrame, DataFrame, DataFrame, StageUsage]:
    """The paper's extraction (with gleanings, optional claims) for every text unit not already extracted."""
    prompts = ExtractionPrompts.load()
    version = prompts.version + (f"+{prompts.claims.version[:8]}" if cfg.claims else "")

    async def work(client, item: dict) -> LlmWork:
        chunk = await extract_chunk(client, item["payload"], cfg, prompts, item_id=item["item_id"])
        return LlmWork({"entities": chunk.entities, "relationships": chunk.relationships, "claims": chunk.claims,
                        "rejected": chunk.rejected}, chunk.calls, chunk.error)

    items = text_units.select(F.col("id").alias("item_id"), F.col("text").alias("payload"))
    outcome, usage = run_llm_stage(spark, store, llm, llm.chat, EXTRACTION_STAGE, items, work, run_id, version,
                                   extraction_params(cfg, llm.chat))

    def explode(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            yield instances_from_results(batch)

    instances = outcome.where(F.col("result").isNotNull()).select("item_id", "result").mapInPandas(explode, _INSTANCE_SCHEMA)
    entities, relationships = _split(instances)
    claims = (instances.where("kind = 'claim'")
              .withColumn("c", F.from_json("description", "map<string,string>"))
              .select("id", F.lit(None).cast("long").alias("human_readable_id"), "text_unit_id",
                      F.upper(F.col("c")["subject"]).alias("subject"), F.upper(F.col("c")["object"]).alias("object"),
                      F.col("c")["type"].alias("type"), F.col("c")["status"].alias("status"),
                      F.col("c")["start_date"].alias("start_date"), F.col("c")["end_date"].alias("end_date"),
                      F.col("c")["description"].alias("description"), F.col("c")["source_text"].alias("source_text")))
    return entities, relationships, claims, usage
