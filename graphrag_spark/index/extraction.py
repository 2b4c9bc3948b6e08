"""Stage 3, element instances: entity and relationship instances per text unit, in executors.

Both methods produce the same two tables (``entity_instances``, ``relationship_instances``),
each row keeping its ``text_unit_id`` for provenance; the graph stage does not care which
method ran. ``nlp`` is the offline default; ``llm`` is the paper's prompts (see extract_llm).
"""

from __future__ import annotations

from typing import Iterator

import pandas as pd
from pyspark.sql import DataFrame

from graphrag_spark import tables as T
from graphrag_spark.config import ExtractionConfig
from graphrag_spark.index import extract_nlp

_INSTANCE_SCHEMA = ("kind string, id string, text_unit_id string, name string, type string, source string, "
                    "target string, description string, strength double, method string")


def _nlp_partition(max_phrases: int):
    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            rows = []
            for unit_id, text in zip(batch["id"], batch["text"]):
                entities, relationships = extract_nlp.extract_unit(unit_id, text, max_phrases)
                rows.extend({"kind": "entity", **e} for e in entities)
                rows.extend({"kind": "relationship", **r} for r in relationships)
            yield pd.DataFrame(rows, columns=[f.split()[0] for f in _INSTANCE_SCHEMA.split(", ")], dtype=object)
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
