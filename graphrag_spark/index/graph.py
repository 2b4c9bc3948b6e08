"""Stage 4, the knowledge graph: element instances merged into weighted nodes and edges (Spark SQL).

- Nodes: instances grouped by normalized name (exact upper-cased matching, the paper's
  choice; ``graph.name_matching: folded`` also folds punctuation and accents). The most
  frequent type wins; the other types are kept in ``type_variants``.
- Edges: undirected (A-B == B-A), self-loops dropped, weight = number of instances (or the
  sum of extracted strengths). Edges whose endpoint is not a node are dropped, and counted
  (``dropped_relationships``) in the run summary.
- Degree and combined degree: GraphFrames' ``degrees`` where it loads, else the same count as a
  DataFrame aggregation over the edge list (``graph_backend``, setting ``graph.backend``).
- Everything runs in Spark SQL except name keys of non-ASCII names (Python
  ``normalize_name``); ids are ``content_id`` computed with ``sha2``; no step moves all rows
  into one task.
Descriptions: ``descriptions`` is the list of an element's distinct instance descriptions, most
frequent first, then in source order (document, chunk), kept while they fit
``graph.max_description_tokens``; every description is kept whole (never split into lines, never
re-sorted). ``description`` is that one description or, for several, their newline-joined text,
which nothing parses back: the LLM method later replaces the elements with two or more
distinct descriptions by one LLM summary, given the list itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import reduce

import pandas as pd
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from graphrag_spark.config import GraphConfig
from graphrag_spark.index import graph_backend
from graphrag_spark.ids import content_id, normalize_name
from graphrag_spark.tokens import count_tokens

_ID_LENGTH = len(content_id())
# The ASCII characters Python's ``str.isspace`` (and so ``re``'s ``\s``) accepts; Java's ``\s`` lacks \x1C-\x1F.
_ASCII_SPACE = "\\t\\n\\x0B\\f\\r\\x1C-\\x1F "
_NON_ASCII = "[^\\x00-\\x7F]"


def _ascii_name_key(name: Column, mode: str) -> Column:
    """``normalize_name`` as Spark SQL, equal to it on ASCII names (there NFC/NFKD and accent
    folding change nothing and upper-casing is a-z to A-Z). One regex per name: regexes
    dominate the cost of the key."""
    key = F.upper(F.btrim(F.trim(F.regexp_replace(name, f"[{_ASCII_SPACE}]+", " ")), F.lit("\"'")))  # btrim: trim(col, chars) is Spark 4 only
    if mode == "folded":  # punctuation to spaces, then runs of spaces to one: one step
        key = F.trim(F.regexp_replace(key, "[^A-Za-z0-9_]+", " "))
    return key


def _with_name_keys(df: DataFrame, keys: dict[str, str], mode: str) -> DataFrame:
    """Adds a name key column per ``{key: name column}``.

    Rows whose names are all ASCII get their keys in Spark SQL; only the others cross into
    Python for ``normalize_name`` (Unicode normalization and case mapping have no exact SQL
    equivalent). A Python worker round trip costs microseconds per row, more than the rest
    of the aggregation, and most names are ASCII.
    """
    ascii_only = reduce(lambda a, b: a & b, [~F.coalesce(F.col(name).rlike(_NON_ASCII), F.lit(False))
                                             for name in keys.values()])
    in_sql = df.where(ascii_only).select("*", *[_ascii_name_key(F.col(n), mode).alias(k) for k, n in keys.items()])

    def add_keys(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            for key, name in keys.items():
                batch[key] = pd.Series([None if n is None else normalize_name(n, mode) for n in batch[name]],
                                       index=batch.index, dtype=object)
            yield batch

    # mapInPandas, not a pandas UDF: the optimizer would copy the UDF into every filter pushed
    # below it (evaluating it twice); mapInPandas is opaque to it.
    schema = StructType(df.schema.fields + [StructField(k, StringType()) for k in keys])
    in_python = df.where(~ascii_only).mapInPandas(add_keys, schema)
    return in_sql.unionByName(in_python)


def _content_id(*parts: str) -> Column:
    """``graphrag_spark.ids.content_id`` of non-null string columns, as Spark SQL."""
    return F.substring(F.sha2(F.concat_ws("\x1f", *parts), 256), 1, _ID_LENGTH)


def _ranks(df: DataFrame, group: str, within: list[Column]) -> DataFrame:
    """``df`` with ``human_readable_id = row_number() over (order by group desc, *within) - 1``,
    without a global window.

    A window without partitioning moves every row into one task. Here rows are numbered
    inside their ``group`` value (a partitioned window) and shifted by the number of rows
    in the groups before theirs, which a global window computes over the per-group counts
    only (one row per distinct value: few). Callers pass only the columns the order needs,
    and join the ranks back.
    """
    earlier = Window.orderBy(F.desc(group)).rowsBetween(Window.unboundedPreceding, -1)
    offsets = df.groupBy(group).count().select(group, F.coalesce(F.sum("count").over(earlier), F.lit(0)).alias("_offset"))
    return (df.join(F.broadcast(offsets), group)
            .withColumn("human_readable_id",
                        F.col("_offset") + F.row_number().over(Window.partitionBy(group).orderBy(*within)) - 1)
            .drop("_offset"))


def _source_positions(instances: DataFrame, text_units: DataFrame | None) -> DataFrame:
    """Adds ``position``: where an instance appears in the corpus (document, then chunk), as a
    sortable string; without the text units, the text unit id (deterministic, not source order)."""
    if text_units is None:
        return instances.withColumn("position", F.col("text_unit_id"))
    units = text_units.select(F.col("id").alias("text_unit_id"),
                              F.concat(F.col("document_id"), F.lit(":"),
                                       F.lpad(F.col("chunk_index").cast("string"), 10, "0")).alias("position"))
    return instances.join(units, "text_unit_id", "left").withColumn("position", F.coalesce("position", "text_unit_id"))


def _ordered_descriptions(count: Column, position: Column) -> Column:
    """Aggregate over rows of distinct descriptions with their ``count`` and first ``position``: every
    non-empty one, most frequent first, then in source order (then by text, for a stable order)."""
    described = F.col("description").isNotNull() & (F.length(F.trim("description")) > 0)
    ranked = F.sort_array(F.collect_set(F.when(described, F.struct((-count).alias("rank"), position.alias("position"),
                                                                   F.col("description")))))
    return ranked.getField("description")


def keep_within_budget(descriptions: list[str], max_tokens: int) -> list[str]:
    """The longest prefix of ``descriptions`` within ``max_tokens`` (cl100k), at least the first one:
    the order is meaningful, so a description that does not fit ends the list."""
    kept, budget = [], max_tokens
    for description in descriptions:
        cost = count_tokens(description)
        if kept and cost > budget:
            break
        kept.append(description)
        budget -= cost
    return kept


def _with_description_budget(frame: DataFrame, max_tokens: int) -> DataFrame:
    """``descriptions`` cut to ``max_tokens`` and ``description`` joined from it.

    A cl100k token is at least one UTF-8 byte, so lists within ``max_tokens`` bytes fit and stay
    in Spark SQL; only the longer ones (hub elements) cross into Python to be counted exactly.
    """
    fits = F.coalesce(F.aggregate("descriptions", F.lit(0), lambda acc, d: acc + F.octet_length(d)), F.lit(0)) <= max_tokens

    def cut(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            batch["descriptions"] = [keep_within_budget(list(d), max_tokens) for d in batch["descriptions"]]
            yield batch

    in_sql = frame.where(fits)
    in_python = frame.where(~fits).mapInPandas(cut, frame.schema)
    joined = F.when(F.size("descriptions") > 0, F.array_join("descriptions", "\n"))
    return in_sql.unionByName(in_python).withColumn("description", joined)


def build_entities(instances: DataFrame, cfg: GraphConfig, min_mentions: int = 1,
                   text_units: DataFrame | None = None) -> DataFrame:
    """Entity nodes without degree columns (added by ``add_degrees``); ``descriptions`` in source
    order needs ``text_units`` (see the module docstring).

    One pass over the instances: counted per (title, type, description), then moved once to
    their title's partition, where type and description totals are windows and the node is one
    aggregation (no further shuffle, no joins besides the text units' positions).
    """
    keyed = (_with_name_keys(instances.select("name", "type", "text_unit_id", "description"), {"title": "name"},
                             cfg.name_matching).where(F.length("title") > 0))
    by_description = Window.partitionBy("title", "description")
    counted = (_source_positions(keyed, text_units).groupBy("title", "type", "description")
               .agg(F.count(F.lit(1)).alias("n"), F.collect_set("text_unit_id").alias("text_unit_ids"),
                    F.min("position").alias("position"))
               .repartition("title")
               .withColumn("type_count", F.sum("n").over(Window.partitionBy("title", "type")))
               .withColumn("description_count", F.sum("n").over(by_description))
               .withColumn("first_position", F.min("position").over(by_description)))
    nodes = counted.groupBy("title").agg(
        # The most frequent type, ties to the first by name (a null type sorts first, as it did).
        F.sort_array(F.collect_set(F.struct((-F.col("type_count")).alias("rank"), F.col("type"))))[0]["type"].alias("type"),
        F.sort_array(F.collect_set("type")).alias("type_variants"),
        F.sort_array(F.array_distinct(F.flatten(F.collect_list("text_unit_ids")))).alias("text_unit_ids"),
        _ordered_descriptions(F.col("description_count"), F.col("first_position")).alias("descriptions"))
    nodes = nodes.withColumn("frequency", F.size("text_unit_ids").cast("long")).where(F.col("frequency") >= min_mentions)
    return _with_description_budget(nodes, cfg.max_description_tokens).withColumn("id", _content_id("title"))


def build_relationships(instances: DataFrame, entities: DataFrame, cfg: GraphConfig,
                        text_units: DataFrame | None = None) -> DataFrame:
    """Undirected weighted edges between existing entity titles (without degree columns);
    ``descriptions`` as for ``build_entities``."""
    return between_entities(candidate_relationships(instances, cfg, text_units), entities)


def candidate_relationships(instances: DataFrame, cfg: GraphConfig, text_units: DataFrame | None = None) -> DataFrame:
    """Every undirected weighted edge the instances name, whether or not its endpoints are entities.
    Fewer rows than these in ``between_entities``: the edges ``dropped_relationships`` counts.

    One pass over the instances: aggregated per (edge, description), then per edge.
    """
    keyed = (_with_name_keys(instances.select("source", "target", "text_unit_id", "description", "strength"),
                             {"a": "source", "b": "target"}, cfg.name_matching)
             .where(F.col("a") != F.col("b"))
             .select(F.least("a", "b").alias("source"), F.greatest("a", "b").alias("target"),
                     "text_unit_id", "description", "strength"))
    weight = F.count(F.lit(1)) if cfg.edge_weight == "count" else F.sum(F.coalesce("strength", F.lit(1.0)))
    counted = _source_positions(keyed, text_units).groupBy("source", "target", "description").agg(
        F.count(F.lit(1)).alias("n"), weight.alias("weight"), F.collect_set("text_unit_id").alias("text_unit_ids"),
        F.min("position").alias("position"))
    edges = counted.groupBy("source", "target").agg(
        F.sum("weight").cast("double").alias("weight"),
        F.sort_array(F.array_distinct(F.flatten(F.collect_list("text_unit_ids")))).alias("text_unit_ids"),
        _ordered_descriptions(F.col("n"), F.col("position")).alias("descriptions"))
    return _with_description_budget(edges, cfg.max_description_tokens)


def between_entities(edges: DataFrame, entities: DataFrame) -> DataFrame:
    """The ``candidate_relationships`` whose endpoints are both entity titles, with their ids."""
    # Unknown endpoints are dropped after the aggregation (the same edges, fewer rows to shuffle);
    # target first, so the edges leave partitioned by source, as ``add_degrees`` joins them.
    titles = entities.select("title")
    return (edges.join(titles.withColumnRenamed("title", "target"), "target", "left_semi")
            .join(titles.withColumnRenamed("title", "source"), "source", "left_semi")
            .withColumn("id", _content_id("source", "target")))


def add_degrees(entities: DataFrame, relationships: DataFrame, backend: str = "sql") -> tuple[DataFrame, DataFrame]:
    """Degree per node (``backend``: ``sql`` or ``graphframes``, see graph_backend), combined degree per
    edge, and deterministic human-readable ids.

    Human-readable ids rank nodes by degree (then title) and edges by combined degree (then
    weight, id), so the same graph always gets the same small integers to cite in reports.
    """
    degrees = graph_backend.degrees(relationships, backend)
    entities = entities.join(degrees, "title", "left").fillna({"degree": 0})
    entities = entities.join(_ranks(entities.select("title", "degree"), "degree", [F.asc("title")]).drop("degree"), "title")
    src = degrees.select(F.col("title").alias("source"), F.col("degree").alias("source_degree"))
    tgt = degrees.select(F.col("title").alias("target"), F.col("degree").alias("target_degree"))
    # Degrees and ranks on the narrow edge list; the wide rows (descriptions, text units) move once, to take them.
    ranked = _ranks(relationships.select("source", "target", "weight", "id").join(src, "source").join(tgt, "target")
                    .withColumn("combined_degree", F.col("source_degree") + F.col("target_degree")),
                    "combined_degree", [F.desc("weight"), F.asc("id")])
    relationships = relationships.join(ranked.drop("weight", "id"), ["source", "target"])
    return entities, relationships


def dropped_relationships(instances: DataFrame, entities: DataFrame, cfg: GraphConfig) -> int:
    """Edges (distinct undirected pairs of name keys) that ``build_relationships`` drops because an
    endpoint is not an entity: the model named it only in a relationship, or (offline method) the
    phrase was pruned as too rare. Counted for the run summary rather than kept as stub entities:
    a stub has no type and no description to summarise, and would bring back the pruned phrases.
    (The pipeline takes the same difference from frames it has at hand.)"""
    candidates = candidate_relationships(instances, cfg)
    return candidates.count() - between_entities(candidates, entities).count()


def key_claims(claims: DataFrame, cfg: GraphConfig) -> DataFrame:
    """Claims with ``subject`` and ``object`` replaced by the entity name key of ``graph.name_matching``,
    so a claim finds its entity (reports, local search) whichever matching mode built the nodes."""
    columns = claims.columns
    keyed = _with_name_keys(claims, {"_subject": "subject", "_object": "object"}, cfg.name_matching)
    return (keyed.drop("subject", "object").withColumnRenamed("_subject", "subject")
            .withColumnRenamed("_object", "object").select(columns))
