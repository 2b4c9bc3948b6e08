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
from dataclasses import dataclass
from functools import reduce

import pandas as pd
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

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
    """``descriptions`` cut to ``max_tokens`` and ``description`` joined from it; ``_cut``: how many
    descriptions the budget dropped.

    A cl100k token is at least one UTF-8 byte, so lists within ``max_tokens`` bytes fit and stay
    in Spark SQL; only the longer ones (hub elements) cross into Python to be counted exactly.
    """
    fits = F.coalesce(F.aggregate("descriptions", F.lit(0), lambda acc, d: acc + F.octet_length(d)), F.lit(0)) <= max_tokens

    def cut(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            before = batch["descriptions"].map(len)
            batch["descriptions"] = [keep_within_budget(list(d), max_tokens) for d in batch["descriptions"]]
            batch["_cut"] = before - batch["descriptions"].map(len)
            yield batch

    in_sql = frame.where(fits).withColumn("_cut", F.lit(0))
    in_python = frame.where(~fits).mapInPandas(cut, StructType(frame.schema.fields + [StructField("_cut", IntegerType())]))
    joined = F.when(F.size("descriptions") > 0, F.array_join("descriptions", "\n"))
    return in_sql.unionByName(in_python).withColumn("description", joined)


def drop_counts(nodes: DataFrame, candidates: DataFrame, edges: DataFrame, min_mentions: int,
                entity_instances: int, relationship_instances: int) -> dict[str, int]:
    """The graph stage's drops, named as ``driver_graph`` names them, in one Spark job: ``nodes`` from
    ``entity_nodes``, ``candidates`` from ``counted_relationships``, ``edges`` the candidates kept."""
    kept = F.col("frequency") >= min_mentions
    total = lambda column: F.coalesce(F.sum(column), F.lit(0))  # noqa: E731 - a sum of no rows is 0 here
    row = (nodes.agg(total("_mentions").alias("mentions"), total((~kept).cast("int")).alias("below"),
                     total(F.when(kept, F.col("_cut"))).alias("entity_cut"))
           .crossJoin(candidates.agg(F.count(F.lit(1)).alias("candidates"), total("_instances").alias("instances")))
           .crossJoin(edges.agg(F.count(F.lit(1)).alias("edges"), total("_cut").alias("edge_cut")))
           .collect()[0])
    return {"entity instances dropped (no name)": entity_instances - row.mentions,
            "entities dropped (below extraction.nlp.min_entity_mentions)": row.below,
            "entity descriptions dropped (over graph.max_description_tokens)": row.entity_cut,
            "relationship instances dropped (self-loop or no name)": relationship_instances - row.instances,
            "relationships dropped (endpoint not an entity)": row.candidates - row.edges,
            "relationship descriptions dropped (over graph.max_description_tokens)": row.edge_cut}


def build_entities(instances: DataFrame, cfg: GraphConfig, min_mentions: int = 1,
                   text_units: DataFrame | None = None) -> DataFrame:
    """Entity nodes without degree columns (added by ``add_degrees``); ``descriptions`` in source
    order needs ``text_units`` (see the module docstring)."""
    return (entity_nodes(instances, cfg, text_units).where(F.col("frequency") >= min_mentions)
            .drop("_cut", "_mentions"))


def entity_nodes(instances: DataFrame, cfg: GraphConfig, text_units: DataFrame | None = None) -> DataFrame:
    """``build_entities`` before the ``min_mentions`` filter, with the columns its drops are counted
    from: ``_mentions`` (instances per node) and ``_cut`` (descriptions over the token budget).

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
        _ordered_descriptions(F.col("description_count"), F.col("first_position")).alias("descriptions"),
        F.sum("n").alias("_mentions"))
    nodes = nodes.withColumn("frequency", F.size("text_unit_ids").cast("long"))
    return _with_description_budget(nodes, cfg.max_description_tokens).withColumn("id", _content_id("title"))


def build_relationships(instances: DataFrame, entities: DataFrame, cfg: GraphConfig,
                        text_units: DataFrame | None = None) -> DataFrame:
    """Undirected weighted edges between existing entity titles (without degree columns);
    ``descriptions`` as for ``build_entities``."""
    return between_entities(candidate_relationships(instances, cfg, text_units), entities)


def candidate_relationships(instances: DataFrame, cfg: GraphConfig, text_units: DataFrame | None = None) -> DataFrame:
    """Every undirected weighted edge the instances name, whether or not its endpoints are entities.
    Fewer rows than these in ``between_entities``: the edges ``dropped_relationships`` counts."""
    return counted_relationships(instances, cfg, text_units).drop("_cut", "_instances")


def counted_relationships(instances: DataFrame, cfg: GraphConfig, text_units: DataFrame | None = None) -> DataFrame:
    """``candidate_relationships`` with the columns its drops are counted from: ``_instances`` (instances
    per edge) and ``_cut`` (descriptions over the token budget).

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
        _ordered_descriptions(F.col("n"), F.col("position")).alias("descriptions"),
        F.sum("n").alias("_instances"))
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


# ------------------------------------------------------------------ the driver path (small graphs)
#
# The same tables as the Spark SQL path above, computed in plain Python from the instances
# collected to the driver. On a small corpus the SQL path's cost is its Spark jobs (one per
# shuffle, most of a minute on a loaded machine for a few thousand rows); this path is one
# collect per input table. The rules are those of the SQL path, rule for rule (``tests``
# compare both on the sample corpus).


@dataclass
class DriverGraph:
    """Entity and relationship rows (``tables.SCHEMAS`` columns plus ``descriptions``) and the drop counts."""

    entities: pd.DataFrame
    relationships: pd.DataFrame
    dropped: dict[str, int]


def _first(values: list, key) -> object:
    return min(values, key=key) if values else None


def _null_first(value: str | None) -> tuple[bool, str]:
    """A sort key that orders None before every string, as Spark orders nulls in ascending sorts."""
    return (value is not None, value or "")


def _described(description: str | None) -> bool:
    """Spark's ``length(trim(description)) > 0``: ``trim`` strips only spaces."""
    return description is not None and len(description.strip(" ")) > 0


def _budgeted(descriptions: list[str], max_tokens: int) -> list[str]:
    """``_with_description_budget`` for one list: within ``max_tokens`` bytes it fits as is."""
    if sum(len(d.encode("utf-8")) for d in descriptions) <= max_tokens:
        return descriptions
    return keep_within_budget(descriptions, max_tokens)


def instance_positions(text_units: pd.DataFrame | None) -> dict[str, str | None]:
    """``_source_positions``' position per text unit id: ``document_id:chunk_index`` (padded to 10 digits)."""
    if text_units is None:
        return {}
    return {unit: None if document is None or pd.isna(index) else f"{document}:{str(int(index)).rjust(10, '0')[:10]}"
            for unit, document, index in zip(text_units["id"], text_units["document_id"], text_units["chunk_index"])}


def _position(unit: str | None, positions: dict[str, str | None]) -> str | None:
    position = positions.get(unit) if unit is not None else None
    return position if position is not None else unit


def _key(name: str | None, mode: str) -> str | None:
    return None if name is None else normalize_name(name, mode)


def driver_entities(instances: pd.DataFrame, cfg: GraphConfig, min_mentions: int,
                    positions: dict[str, str | None]) -> tuple[pd.DataFrame, dict[str, int]]:
    """``build_entities`` over collected instances (name, type, text_unit_id, description), and the
    counts of what it drops: instances without a name, names below ``min_mentions``, descriptions over
    the token budget."""
    groups: dict[tuple, list] = {}  # (title, type, description) -> [instances, text units, first position]
    unnamed = 0
    for name, kind, unit, description in zip(instances["name"], instances["type"], instances["text_unit_id"],
                                             instances["description"]):
        title = _key(name, cfg.name_matching)
        if not title:
            unnamed += 1
            continue
        group = groups.setdefault((title, kind, description), [0, set(), None])
        group[0] += 1
        if unit is not None:
            group[1].add(unit)
        position = _position(unit, positions)
        if position is not None and (group[2] is None or position < group[2]):
            group[2] = position
    by_title: dict[str, dict] = {}
    for (title, kind, description), (n, units, position) in groups.items():
        node = by_title.setdefault(title, {"types": {}, "descriptions": {}, "units": set()})
        node["types"][kind] = node["types"].get(kind, 0) + n
        count, first = node["descriptions"].get(description, (0, None))
        if position is not None and (first is None or position < first):
            first = position
        node["descriptions"][description] = (count + n, first)
        node["units"] |= units
    rows, below, cut = [], 0, 0
    for title, node in by_title.items():
        if len(node["units"]) < min_mentions:
            below += 1
            continue
        types = node["types"]
        ordered = sorted(((-count, _null_first(first), d) for d, (count, first) in node["descriptions"].items()
                          if _described(d)))
        descriptions = [d for _, _, d in ordered]
        kept = _budgeted(descriptions, cfg.max_description_tokens)
        cut += len(descriptions) - len(kept)
        rows.append({"id": content_id(title), "title": title,
                     "type": _first(list(types), key=lambda t: (-types[t], _null_first(t))),
                     "type_variants": sorted(t for t in types if t is not None),
                     "description": "\n".join(kept) if kept else None, "descriptions": kept,
                     "text_unit_ids": sorted(node["units"]), "frequency": len(node["units"])})
    dropped = {"entity instances dropped (no name)": unnamed,
               "entities dropped (below extraction.nlp.min_entity_mentions)": below,
               "entity descriptions dropped (over graph.max_description_tokens)": cut}
    columns = ["id", "title", "type", "type_variants", "description", "descriptions", "text_unit_ids", "frequency"]
    return pd.DataFrame(rows, columns=columns), dropped


def driver_relationships(instances: pd.DataFrame, titles: set[str], cfg: GraphConfig,
                         positions: dict[str, str | None]) -> tuple[pd.DataFrame, dict[str, int]]:
    """``build_relationships`` over collected instances (source, target, text_unit_id, description,
    strength) between ``titles``, and the counts of what it drops."""
    groups: dict[tuple, list] = {}  # (source, target, description) -> [instances, weight, text units, first position]
    foreign: set[tuple[str, str]] = set()  # edges with an endpoint that is not an entity: only counted
    loops = 0
    for source, target, unit, description, strength in zip(instances["source"], instances["target"],
                                                           instances["text_unit_id"], instances["description"],
                                                           instances["strength"]):
        a, b = _key(source, cfg.name_matching), _key(target, cfg.name_matching)
        if a is None or b is None or a == b:
            loops += 1
            continue
        pair = (a, b) if a < b else (b, a)
        if a not in titles or b not in titles:
            foreign.add(pair)
            continue
        group = groups.setdefault((*pair, description), [0, 0.0, set(), None])
        group[0] += 1
        group[1] += 1.0 if cfg.edge_weight == "count" or strength is None or pd.isna(strength) else float(strength)
        if unit is not None:
            group[2].add(unit)
        position = _position(unit, positions)
        if position is not None and (group[3] is None or position < group[3]):
            group[3] = position
    edges: dict[tuple[str, str], dict] = {}
    for (source, target, description), (n, weight, units, position) in groups.items():
        edge = edges.setdefault((source, target), {"weight": 0.0, "units": set(), "descriptions": []})
        edge["weight"] += weight
        edge["units"] |= units
        if _described(description):
            edge["descriptions"].append((-n, _null_first(position), description))
    rows, cut = [], 0
    for (source, target), edge in edges.items():
        descriptions = [d for _, _, d in sorted(edge["descriptions"])]
        kept = _budgeted(descriptions, cfg.max_description_tokens)
        cut += len(descriptions) - len(kept)
        rows.append({"id": content_id(source, target), "source": source, "target": target,
                     "description": "\n".join(kept) if kept else None, "descriptions": kept,
                     "weight": float(edge["weight"]), "text_unit_ids": sorted(edge["units"])})
    dropped = {"relationship instances dropped (self-loop or no name)": loops,
               "relationships dropped (endpoint not an entity)": len(foreign),
               "relationship descriptions dropped (over graph.max_description_tokens)": cut}
    columns = ["id", "source", "target", "description", "descriptions", "weight", "text_unit_ids"]
    return pd.DataFrame(rows, columns=columns), dropped


def driver_degrees(entities: pd.DataFrame, relationships: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``add_degrees``: degree per node, combined degree per edge, and the same rank-ordered human-readable ids."""
    sources, targets = relationships["source"].tolist(), relationships["target"].tolist()
    degree: dict[str, int] = {}
    for title in sources + targets:
        degree[title] = degree.get(title, 0) + 1
    titles = entities["title"].tolist()
    degrees = [degree.get(t, 0) for t in titles]
    order = sorted(range(len(titles)), key=lambda i: (-degrees[i], titles[i]))
    entities = entities.assign(degree=degrees).iloc[order].reset_index(drop=True)
    entities["human_readable_id"] = range(len(entities))
    combined = [degree[s] + degree[t] for s, t in zip(sources, targets)]
    weights, ids = relationships["weight"].tolist(), relationships["id"].tolist()
    order = sorted(range(len(ids)), key=lambda i: (-combined[i], -weights[i], ids[i]))
    relationships = relationships.assign(combined_degree=combined).iloc[order].reset_index(drop=True)
    relationships["human_readable_id"] = range(len(relationships))
    return (entities.astype({"degree": "int64", "frequency": "int64", "human_readable_id": "int64"}),
            relationships.astype({"combined_degree": "int64", "human_readable_id": "int64", "weight": "float64"}))


def driver_graph(entity_instances: pd.DataFrame, relationship_instances: pd.DataFrame, cfg: GraphConfig,
                 min_mentions: int = 1, text_units: pd.DataFrame | None = None) -> DriverGraph:
    """The graph stage's entities and relationships (with degrees and ids) from collected instances (pure)."""
    positions = instance_positions(text_units)
    entities, entity_drops = driver_entities(entity_instances, cfg, min_mentions, positions)
    relationships, relationship_drops = driver_relationships(relationship_instances, set(entities["title"]), cfg,
                                                             positions)
    entities, relationships = driver_degrees(entities, relationships)
    return DriverGraph(entities, relationships, {**entity_drops, **relationship_drops})
