"""Stage 4, the knowledge graph: element instances merged into weighted nodes and edges (Spark SQL).

- Nodes: instances grouped by normalized name (exact upper-cased matching, the paper's
  choice; ``graph.name_matching: folded`` also folds punctuation and accents). The most
  frequent type wins; the other types are kept in ``type_variants``.
- Edges: undirected (A-B == B-A), self-loops dropped, weight = number of instances (or the
  sum of extracted strengths). Edges whose endpoint is not a node are dropped and counted.
- Degree and combined degree are computed with DataFrame aggregations over the edge list
  (the same definition as GraphFrames' ``degrees``; its JVM package is not used).
Descriptions are the distinct instance descriptions, most frequent first; the LLM method
later replaces multi-description ones with one LLM summary.
"""

from __future__ import annotations

import pandas as pd
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StringType

from graphrag_spark.config import GraphConfig
from graphrag_spark.ids import content_id, normalize_name

_MAX_DESCRIPTIONS = 5


def _name_key(mode: str):
    @F.pandas_udf(StringType())
    def key(names: pd.Series) -> pd.Series:
        return names.map(lambda n: normalize_name(n, mode) if n is not None else None)
    return key


@F.pandas_udf(StringType())
def _pair_id(sources: pd.Series, targets: pd.Series) -> pd.Series:
    return pd.Series([content_id(s, t) for s, t in zip(sources, targets)])


@F.pandas_udf(StringType())
def _entity_id(titles: pd.Series) -> pd.Series:
    return titles.map(content_id)


def _joined_descriptions(df: DataFrame, keys: list[str]) -> DataFrame:
    """Distinct descriptions per key, most frequent first (ties by text), at most 5, newline-joined."""
    counted = df.where(F.col("description").isNotNull() & (F.length("description") > 0)).groupBy(*keys, "description").count()
    ranked = counted.withColumn("rank", F.row_number().over(
        Window.partitionBy(*keys).orderBy(F.desc("count"), F.asc("description"))))
    return (ranked.where(F.col("rank") <= _MAX_DESCRIPTIONS)
            .groupBy(*keys).agg(F.sort_array(F.collect_list(F.struct("rank", "description"))).alias("d"))
            .select(*keys, F.array_join(F.col("d.description"), "\n").alias("description")))


def build_entities(instances: DataFrame, cfg: GraphConfig, min_mentions: int = 1) -> DataFrame:
    """Entity nodes without degree columns (added by ``add_degrees``)."""
    keyed = instances.withColumn("title", _name_key(cfg.name_matching)("name")).where(F.length("title") > 0)
    type_counts = keyed.groupBy("title", "type").count()
    best_type = (type_counts.withColumn("r", F.row_number().over(
        Window.partitionBy("title").orderBy(F.desc("count"), F.asc("type")))).where("r = 1").select("title", "type"))
    stats = keyed.groupBy("title").agg(
        F.sort_array(F.collect_set("type")).alias("type_variants"),
        F.sort_array(F.collect_set("text_unit_id")).alias("text_unit_ids"),
        F.countDistinct("text_unit_id").alias("frequency"))
    return (stats.where(F.col("frequency") >= min_mentions)
            .join(best_type, "title").join(_joined_descriptions(keyed, ["title"]), "title", "left")
            .withColumn("id", _entity_id("title")))


def build_relationships(instances: DataFrame, entities: DataFrame, cfg: GraphConfig) -> DataFrame:
    """Undirected weighted edges between existing entity titles (without degree columns)."""
    key = _name_key(cfg.name_matching)
    keyed = (instances.withColumn("a", key("source")).withColumn("b", key("target"))
             .where(F.col("a") != F.col("b"))
             .withColumn("source", F.least("a", "b")).withColumn("target", F.greatest("a", "b")))
    titles = entities.select("title")
    keyed = (keyed.join(titles.withColumnRenamed("title", "source"), "source", "left_semi")
             .join(titles.withColumnRenamed("title", "target"), "target", "left_semi"))
    weight = F.count(F.lit(1)) if cfg.edge_weight == "count" else F.sum(F.coalesce("strength", F.lit(1.0)))
    edges = keyed.groupBy("source", "target").agg(
        weight.cast("double").alias("weight"),
        F.sort_array(F.collect_set("text_unit_id")).alias("text_unit_ids"))
    return (edges.join(_joined_descriptions(keyed, ["source", "target"]), ["source", "target"], "left")
            .withColumn("id", _pair_id("source", "target")))


def add_degrees(entities: DataFrame, relationships: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Degree per node, combined degree per edge, and deterministic human-readable ids.

    Human-readable ids rank nodes by degree (then title) and edges by combined degree (then
    weight, id), so the same graph always gets the same small integers to cite in reports.
    """
    endpoints = relationships.select(F.col("source").alias("title")).unionAll(relationships.select(F.col("target").alias("title")))
    degrees = endpoints.groupBy("title").agg(F.count(F.lit(1)).alias("degree"))
    entities = (entities.join(degrees, "title", "left").fillna({"degree": 0})
                .withColumn("human_readable_id", F.row_number().over(
                    Window.orderBy(F.desc("degree"), F.asc("title"))) - 1))
    src = degrees.select(F.col("title").alias("source"), F.col("degree").alias("source_degree"))
    tgt = degrees.select(F.col("title").alias("target"), F.col("degree").alias("target_degree"))
    relationships = (relationships.join(src, "source").join(tgt, "target")
                     .withColumn("combined_degree", F.col("source_degree") + F.col("target_degree"))
                     .withColumn("human_readable_id", F.row_number().over(
                         Window.orderBy(F.desc("combined_degree"), F.desc("weight"), F.asc("id"))) - 1))
    return entities, relationships
