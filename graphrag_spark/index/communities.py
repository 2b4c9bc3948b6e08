"""Stage 5, communities: hierarchical Leiden on the driver, membership joined back in Spark.

The driver receives only the edge list as compact integer arrays (node = entity
human_readable_id). graspologic's hierarchical Leiden (seeded) returns a cluster per node
per level; a node whose cluster is not split further is *projected down*: it keeps that
cluster at every finer level, so each level C0..Cn is a partition of all clustered nodes.
Community ids are content hashes of (level, sorted member entity ids): the same members give
the same id, whatever else changed in the graph. The human-readable ``community`` number is
assigned once: a refresh keeps the number of every community it finds again and numbers new
ones after the largest, by level, size (descending) and id. A refresh starts Leiden from the
previous level-0 partition and keeps every previous community whose edges did not change whole,
so regions of the graph that did not change keep their communities (and their reports).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from graphrag_spark.config import CommunitiesConfig
from graphrag_spark.ids import content_id

MEMBERSHIP_COLUMNS = ["node", "level", "community_key"]


@dataclass(frozen=True)
class Hierarchy:
    """``membership``: node, level, community (int); ``communities``: community, id, level, parent, children, size."""

    membership: pd.DataFrame
    communities: pd.DataFrame
    excluded_nodes: int


def largest_component_mask(sources: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Boolean mask over edges: True for edges inside the largest connected component."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    nodes, inverse = np.unique(np.concatenate([sources, targets]), return_inverse=True)
    n = len(nodes)
    matrix = coo_matrix((np.ones(len(sources)), (inverse[: len(sources)], inverse[len(sources):])), shape=(n, n))
    _, labels = connected_components(matrix, directed=False)
    largest = np.bincount(labels).argmax()
    return labels[inverse[: len(sources)]] == largest


def starting_partition(nodes: np.ndarray, previous: dict[int, int]) -> dict[str, int]:
    """Leiden's starting communities: a node's previous level-0 community, a new node alone in a new one
    (graspologic needs every node of the edge list, and only those, in the mapping)."""
    fresh = max(previous.values(), default=-1) + 1
    start = {}
    for node in sorted(int(n) for n in nodes):
        if node in previous:
            start[str(node)] = int(previous[node])
        else:
            start[str(node)], fresh = fresh, fresh + 1
    return start


def run_leiden(sources: np.ndarray, targets: np.ndarray, weights: np.ndarray, cfg: CommunitiesConfig,
               previous: dict[int, int] | None = None) -> pd.DataFrame:
    """Raw hierarchical Leiden: node, cluster, level, parent_cluster, is_final_cluster (one row per node and level).
    ``previous`` (node -> level-0 community of the last run) seeds the first partition."""
    import graspologic_native as gn

    # A sorted edge list makes the result independent of the order Spark returned the edges in.
    order = np.lexsort((targets, sources))
    # graspologic takes (str, str, float) tuples; converting whole arrays first is ~5x faster than per element.
    edges = list(zip(sources[order].astype(str).tolist(), targets[order].astype(str).tolist(),
                     weights[order].astype(float).tolist()))
    start = starting_partition(np.unique(np.concatenate([sources, targets])), previous) if previous else None
    result = gn.hierarchical_leiden(edges, starting_communities=start, resolution=cfg.resolution,
                                    max_cluster_size=cfg.max_cluster_size, seed=cfg.seed)
    return pd.DataFrame([(int(r.node), r.cluster, r.level, r.parent_cluster, r.is_final_cluster) for r in result],
                        columns=["node", "cluster", "level", "parent_cluster", "is_final_cluster"])


def project_levels(raw: pd.DataFrame, max_levels: int) -> pd.DataFrame:
    """Per node and level 0..L, the node's cluster, projecting final clusters down to finer levels."""
    if raw.empty:
        return pd.DataFrame(columns=["node", "level", "cluster"])
    raw = raw[raw["level"] < max_levels]
    deepest = int(raw["level"].max())
    per_node = raw.pivot_table(index="node", columns="level", values="cluster", aggfunc="first")
    per_node = per_node.reindex(columns=range(deepest + 1)).ffill(axis=1)
    long = per_node.stack().reset_index()
    long.columns = ["node", "level", "cluster"]
    return long.astype({"node": "int64", "level": "int32", "cluster": "int64"})


def build_hierarchy(raw: pd.DataFrame, max_levels: int, excluded_nodes: int = 0, node_keys: dict[int, str] | None = None,
                    numbers: dict[str, int] | None = None) -> Hierarchy:
    """Deterministic communities from raw Leiden output (pure).

    ``node_keys`` (node -> entity id) makes ids independent of the node numbering; ``numbers``
    (community id -> number of a previous run) keeps those numbers, new communities are numbered
    after the largest."""
    return hierarchy_from_levels(project_levels(raw, max_levels), excluded_nodes, node_keys, numbers)


def keep_untouched(projected: pd.DataFrame, previous: pd.DataFrame, touched: set[int]) -> pd.DataFrame:
    """Pure: this run's per-level clusters (node, level, cluster), except that every previous community,
    at any level, none of whose members is ``touched`` (an edge of it appeared, went or changed weight)
    and all of whose members are still clustered is kept whole, with its sub-communities, where the
    hierarchy allows it: at level 0 always, below that when its members all lie in one community of the
    level above (so every level still nests in the one above).

    ``previous``: node (None for a member that is gone), level, community of the last run. Leiden
    restarts its local moving and refinement even from a seed, so a seed alone moves untouched
    regions too; this keeps them exactly. A large community that gained one node is reclustered, but
    its untouched sub-communities are carved out of the new clusters as they were, so only the
    communities the change reached get new members (and new ids and reports).
    """
    if projected.empty or previous.empty:
        return projected
    nodes_now = set(projected["node"].tolist())
    deepest = int(max(projected["level"].max(), previous["level"].max()))
    new = _levels_by_node(projected["node"], projected["level"], "n" + projected["cluster"].astype(str), deepest)
    present = previous[previous["node"].notna()]
    old = _levels_by_node(present["node"].astype("int64"), present["level"],
                          "p" + present["community"].astype(str), deepest)
    kept_from = {}  # node -> the level from which it keeps its previous communities
    for (level, _), members in previous.sort_values(["level", "community"]).groupby(["level", "community"], sort=False)["node"]:
        if members.isna().any():
            continue
        nodes = set(members.astype("int64"))
        if nodes & touched or not nodes <= nodes_now or nodes & kept_from.keys():
            continue
        if level > 0 and new.loc[sorted(nodes), level - 1].nunique() != 1:
            continue
        kept_from.update(dict.fromkeys(nodes, int(level)))
    start = pd.Series(kept_from, dtype="float64").reindex(new.index).to_numpy()  # NaN: nothing kept
    keep = pd.DataFrame(new.columns.to_numpy()[None, :] >= start[:, None], index=new.index, columns=new.columns)
    combined = new.mask(keep, old.reindex(index=new.index))
    long = combined.stack().reset_index()
    long.columns = ["node", "level", "cluster"]
    return long.astype({"node": "int64", "level": "int32"})


def _levels_by_node(nodes: pd.Series, levels: pd.Series, clusters: pd.Series, deepest: int) -> pd.DataFrame:
    """node x level 0..deepest cluster labels, a node's deepest cluster projected down to finer levels."""
    frame = pd.DataFrame({"node": nodes.to_numpy(), "level": levels.astype("int64").to_numpy(), "cluster": clusters.to_numpy()})
    per_node = frame.pivot_table(index="node", columns="level", values="cluster", aggfunc="first")
    return per_node.reindex(columns=range(deepest + 1)).ffill(axis=1)


def hierarchy_from_levels(projected: pd.DataFrame, excluded_nodes: int = 0, node_keys: dict[int, str] | None = None,
                          numbers: dict[str, int] | None = None) -> Hierarchy:
    """``build_hierarchy`` from per-level clusters (node, level, cluster) that partition the nodes at every level."""
    if projected.empty:
        empty = pd.DataFrame(columns=["community", "id", "level", "parent", "children", "size"])
        return Hierarchy(pd.DataFrame(columns=["node", "level", "community"]), empty, excluded_nodes)
    groups = projected.groupby(["level", "cluster"])["node"].apply(lambda s: sorted(s.tolist())).reset_index()
    key = (lambda n: node_keys[n]) if node_keys is not None else str
    groups["id"] = [content_id("community", level, ",".join(sorted(key(n) for n in members)))
                    for level, members in zip(groups["level"], groups["node"])]
    groups["size"] = groups["node"].map(len)
    groups = groups.sort_values(["level", "size", "id"], ascending=[True, False, True]).reset_index(drop=True)
    numbers = numbers or {}
    kept = groups["id"].map(numbers)
    first_new = max(numbers.values(), default=-1) + 1
    fresh = iter(range(first_new, first_new + int(kept.isna().sum())))
    groups["community"] = [int(n) if not pd.isna(n) else next(fresh) for n in kept]
    membership = projected.merge(groups[["level", "cluster", "community"]], on=["level", "cluster"])
    # Parent of a level-l community: the level l-1 community of any of its members.
    probe = pd.DataFrame({"community": groups["community"], "node": groups["node"].map(lambda m: m[0]),
                          "level": groups["level"] - 1})
    parents = probe.merge(membership[["node", "level", "community"]].rename(columns={"community": "parent"}),
                          on=["node", "level"], how="left")
    groups["parent"] = groups["community"].map(parents.set_index("community")["parent"]).fillna(-1).astype("int64")
    children = groups[groups["parent"] >= 0].groupby("parent")["community"].apply(lambda s: sorted(s.tolist()))
    groups["children"] = groups["community"].map(children).map(lambda c: c if isinstance(c, list) else [])
    communities = groups[["community", "id", "level", "parent", "children", "size"]]
    return Hierarchy(membership[["node", "level", "community"]].reset_index(drop=True), communities, excluded_nodes)


def node_edges(entities: DataFrame, relationships: DataFrame) -> DataFrame:
    """``(s, t, weight)``: the edges between entity human_readable_ids."""
    node_ids = entities.select(F.col("title"), F.col("human_readable_id").alias("node"))
    return (relationships.select("source", "target", "weight")
            .join(node_ids.withColumnRenamed("title", "source").withColumnRenamed("node", "s"), "source")
            .join(node_ids.withColumnRenamed("title", "target").withColumnRenamed("node", "t"), "target")
            .select("s", "t", "weight"))


def collect_edges(entities: DataFrame, relationships: DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The edge list on the driver as arrays: source node, target node (entity human_readable_id), weight."""
    return _arrays(node_edges(entities, relationships))


def _arrays(edges: DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    frame = edges.toPandas()
    return tuple(frame[c].to_numpy() for c in ("s", "t", "weight"))


def previous_membership(entities: DataFrame, previous: DataFrame) -> pd.DataFrame:
    """The last run's communities as (node, level, community); node is None for an entity that is gone."""
    return (previous.select("community", "level", F.explode("entity_ids").alias("id"))
            .join(entities.select("id", F.col("human_readable_id").alias("node")), "id", "left")
            .select("node", "level", "community").toPandas())


def touched_nodes(entities: DataFrame, relationships: DataFrame, previous_relationships: DataFrame) -> set[int]:
    """Nodes at an end of an edge that appeared, disappeared or changed weight since the last run."""
    now = relationships.select("source", "target", F.col("weight").alias("now"))
    before = previous_relationships.select("source", "target", F.col("weight").alias("before"))
    changed = now.join(before, ["source", "target"], "full_outer").where(~F.col("now").eqNullSafe(F.col("before")))
    titles = changed.select(F.explode(F.array("source", "target")).alias("title")).distinct()
    return {int(r.node) for r in titles.join(entities.select("title", F.col("human_readable_id").alias("node")), "title")
            .select("node").collect()}


def cluster_graph(spark: SparkSession, entities: DataFrame, relationships: DataFrame,
                  cfg: CommunitiesConfig, largest_component_only: bool, graph_backend: str = "sql",
                  previous: DataFrame | None = None, previous_relationships: DataFrame | None = None,
                  on_driver: bool = False, collected: tuple[pd.DataFrame, pd.DataFrame] | None = None
                  ) -> tuple[DataFrame, dict]:
    """The communities table (Spark) and counts for the run summary. ``graph_backend`` ``graphframes``
    finds the largest component in the executors (GraphFrames) before the edges reach the driver.
    A refresh passes the last run's communities and relationships: Leiden is seeded with its level-0
    partition, untouched communities are kept whole (``keep_untouched``) and community numbers are kept.
    ``on_driver`` (a small graph): both tables are collected once and the communities table is built in
    pandas (``community_rows``), not in a Spark job per join; ``collected`` (the rows of both tables, as
    the graph stage wrote them) saves reading them back."""
    if on_driver and not (largest_component_only and graph_backend == "graphframes"):
        if collected is None:
            collected = (entities.select("human_readable_id", "id", "title", "degree").toPandas(),
                         relationships.select("id", "source", "target", "weight", "text_unit_ids").toPandas())
        sources, targets, weights = driver_edges(*collected)
        n_nodes = len(np.unique(np.concatenate([sources, targets]))) if len(sources) else 0
        if largest_component_only and len(sources):
            keep = largest_component_mask(sources, targets)
            sources, targets, weights = sources[keep], targets[keep], weights[keep]
    elif largest_component_only and graph_backend == "graphframes":
        collected = None
        from graphrag_spark.index.graph_backend import largest_component_nodes

        edges = node_edges(entities, relationships).persist()
        n_nodes = edges.select(F.col("s").alias("n")).union(edges.select(F.col("t").alias("n"))).distinct().count()
        # Both ends of an edge lie in the same component.
        sources, targets, weights = _arrays(edges.join(largest_component_nodes(spark, edges).withColumnRenamed("node", "s"),
                                                       "s", "left_semi"))
        edges.unpersist()
    else:
        collected = None
        sources, targets, weights = collect_edges(entities, relationships)
        n_nodes = len(np.unique(np.concatenate([sources, targets]))) if len(sources) else 0
        if largest_component_only and len(sources):
            keep = largest_component_mask(sources, targets)
            sources, targets, weights = sources[keep], targets[keep], weights[keep]
    before = previous_membership(entities, previous) if previous is not None else pd.DataFrame(
        columns=["node", "level", "community"])
    level0 = before[(before["level"] == 0) & before["node"].notna()]
    seed = {int(n): int(c) for n, c in zip(level0["node"], level0["community"])}
    raw = run_leiden(sources, targets, weights, cfg, seed) if len(sources) else pd.DataFrame(
        columns=["node", "cluster", "level", "parent_cluster", "is_final_cluster"])
    kept_nodes = len(np.unique(np.concatenate([sources, targets]))) if len(sources) else 0
    projected = project_levels(raw, cfg.max_levels)
    numbers = {}
    if previous is not None and previous_relationships is not None:
        projected = keep_untouched(projected, before, touched_nodes(entities, relationships, previous_relationships))
        numbers = {r.id: int(r.community) for r in previous.select("id", "community").collect()}
    if collected is not None:
        node_keys = dict(zip(collected[0]["human_readable_id"].astype("int64").tolist(), collected[0]["id"]))
    else:
        node_keys = {int(r.node): r.id for r in entities.select(F.col("human_readable_id").alias("node"), "id").collect()}
    hierarchy = hierarchy_from_levels(projected, n_nodes - kept_nodes, node_keys, numbers)
    if collected is not None:
        table = spark.createDataFrame(community_rows(hierarchy, *collected), COMMUNITY_ROWS_SCHEMA)
    else:
        table = communities_table(spark, hierarchy, entities, relationships)
    per_level = hierarchy.communities.groupby("level").size().to_dict()
    counts = {"communities": len(hierarchy.communities), "communities_per_level": {int(k): int(v) for k, v in per_level.items()},
              "clustered_entities": kept_nodes, "excluded_from_clustering": hierarchy.excluded_nodes}
    return table, counts


def communities_table(spark: SparkSession, hierarchy: Hierarchy, entities: DataFrame, relationships: DataFrame) -> DataFrame:
    """Join membership back to entity ids, internal relationships and their text units, in Spark."""
    membership = spark.createDataFrame(hierarchy.membership.astype({"node": "int64", "level": "int32", "community": "int64"}),
                                       "node long, level int, community long")
    meta = spark.createDataFrame(
        hierarchy.communities.astype({"community": "int64", "level": "int32", "parent": "int64", "size": "int32"}),
        "community long, id string, level int, parent long, children array<long>, size int")
    members = membership.join(entities.select(F.col("human_readable_id").alias("node"), F.col("id").alias("entity_id"),
                                              "title", "degree"), "node")
    entity_lists = members.groupBy("community").agg(
        F.sort_array(F.collect_list("entity_id")).alias("entity_ids"),
        F.slice(F.sort_array(F.collect_list(F.struct(-F.col("degree"), F.col("title"))), asc=True), 1, 3).alias("top"))
    # An edge is internal to the communities its endpoints share. With each node's (level,
    # community) pairs in one array, that is an array intersection per edge: the edge list is
    # joined twice, not expanded to one row per endpoint and level before the filter.
    paths = members.groupBy("title").agg(F.collect_list(F.struct("level", "community")).alias("path"))
    internal = (relationships.select("source", "target", F.col("id").alias("relationship_id"), "text_unit_ids")
                .join(paths.withColumnRenamed("title", "source").withColumnRenamed("path", "source_path"), "source")
                .join(paths.withColumnRenamed("title", "target").withColumnRenamed("path", "target_path"), "target")
                .select("relationship_id", "text_unit_ids",
                        F.explode(F.array_intersect("source_path", "target_path")).alias("shared"))
                .select("relationship_id", "text_unit_ids", F.col("shared.community").alias("community")))
    relationship_lists = internal.groupBy("community").agg(
        F.sort_array(F.collect_list("relationship_id")).alias("relationship_ids"),
        F.sort_array(F.array_distinct(F.flatten(F.collect_list("text_unit_ids")))).alias("text_unit_ids"))
    return (meta.join(entity_lists, "community").join(relationship_lists, "community", "left")
            .withColumn("title", F.concat(F.lit("Community "), F.col("community").cast("string"), F.lit(": "),
                                          F.array_join(F.col("top.title"), ", ")))
            .withColumn("relationship_ids", F.coalesce("relationship_ids", F.array().cast("array<string>")))
            .withColumn("text_unit_ids", F.coalesce("text_unit_ids", F.array().cast("array<string>")))
            .drop("top"))


COMMUNITY_ROWS_SCHEMA = ("community long, id string, level int, parent long, children array<long>, size int, "
                         "entity_ids array<string>, relationship_ids array<string>, text_unit_ids array<string>, "
                         "title string")


def driver_edges(entities: pd.DataFrame, relationships: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``collect_edges`` from collected tables (pure): source node, target node, weight."""
    node = dict(zip(entities["title"], entities["human_readable_id"].astype("int64")))
    known = [s in node and t in node for s, t in zip(relationships["source"], relationships["target"])]
    kept = relationships[known] if len(relationships) else relationships
    return (np.array([node[s] for s in kept["source"]], dtype="int64"),
            np.array([node[t] for t in kept["target"]], dtype="int64"), kept["weight"].to_numpy(dtype="float64"))


def community_rows(hierarchy: Hierarchy, entities: pd.DataFrame, relationships: pd.DataFrame) -> pd.DataFrame:
    """``communities_table`` from collected tables (pure, the same rows): entities (human_readable_id, id,
    title, degree), relationships (id, source, target, text_unit_ids)."""
    by_node = {int(n): (i, t, int(d)) for n, i, t, d in zip(entities["human_readable_id"], entities["id"],
                                                              entities["title"], entities["degree"])}
    members: dict[int, list] = {}
    paths: dict[str, set] = {}
    for node, level, community in zip(hierarchy.membership["node"], hierarchy.membership["level"],
                                      hierarchy.membership["community"]):
        if int(node) not in by_node:
            continue
        entity_id, title, degree = by_node[int(node)]
        members.setdefault(int(community), []).append((entity_id, title, degree))
        paths.setdefault(title, set()).add((int(level), int(community)))
    internal: dict[int, tuple[list, set]] = {}
    for relationship_id, source, target, units in zip(relationships["id"], relationships["source"],
                                                      relationships["target"], relationships["text_unit_ids"]):
        for _, community in paths.get(source, set()) & paths.get(target, set()):
            ids, unit_set = internal.setdefault(community, ([], set()))
            ids.append(relationship_id)
            unit_set.update(units)
    rows = []
    for meta in hierarchy.communities.itertuples(index=False):
        community = int(meta.community)
        if community not in members:
            continue
        top = [title for _, title in sorted((-degree, title) for _, title, degree in members[community])[:3]]
        ids, units = internal.get(community, ([], set()))
        rows.append({"community": community, "id": meta.id, "level": int(meta.level), "parent": int(meta.parent),
                     "children": [int(c) for c in meta.children], "size": int(meta.size),
                     "entity_ids": sorted(e for e, _, _ in members[community]), "relationship_ids": sorted(ids),
                     "text_unit_ids": sorted(units), "title": f"Community {community}: " + ", ".join(top)})
    columns = ["community", "id", "level", "parent", "children", "size", "entity_ids", "relationship_ids",
               "text_unit_ids", "title"]
    return pd.DataFrame(rows, columns=columns)
