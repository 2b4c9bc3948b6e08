"""Graph aggregation and clustering at scale: ``python benchmarks/bench_graph.py --relationship-instances 5000000 --entities 500000``.

A seeded synthetic instance set is generated in Spark and written to Delta (the
``entity_instances`` / ``relationship_instances`` tables), then the graph and
communities stages run on it with every stage materialized and timed on its own:
entity aggregation, relationship aggregation, degrees + ids, writing to Delta, edge
collection to the driver, Leiden, hierarchy building, communities table join + write.

The graph has something for Leiden to find: planted communities with Pareto-distributed
sizes, grouped in blocks of ten ("super-communities"), hub-heavy popularity inside each
community, and edges that mostly stay inside their community, sometimes inside their
block, rarely anywhere. Mentions vary in case and spacing (exact matching merges them),
some names are non-ASCII, some types disagree, 0.1% of relationship targets are never
mentioned as entities (dropped edges). Every entity is mentioned at least once.

Driver memory: the Python driver's peak RSS (``ru_maxrss``) and, sampled every 0.2 s per
stage, the Python RSS, the JVM heap in use (totalMemory - freeMemory) and the JVM RSS; the
JVM's VmHWM at the end. ``--leiden-scaling 1000000,5000000`` instead runs only the driver
step (Leiden + hierarchy) on numpy-generated planted graphs of those edge counts, each in
a fresh process, and fits peak memory and time against edges to estimate the largest graph
the driver handles.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
GIB = 2**30
_TYPES = ["PERSON", "ORGANIZATION", "GEO", "EVENT", "CONCEPT"]
_FIRST = ["Ada", "Alan", "Grace", "Edsger", "Barbara", "Donald", "Frances", "Tony", "Radia", "Ken", "Dennis",
          "Margaret", "John", "Hedy", "Claude", "Leslie", "Niklaus", "Bjarne", "Guido", "Linus", "Anita",
          "Shafi", "Silvio", "Whitfield", "Ralph", "Adi", "Ivan", "Douglas", "Vint", "Bob", "Tim", "Sophie",
          "Karen", "Jean", "Kathleen", "Mary", "Evelyn", "Betty", "Ruth", "Marlyn", "Fran", "Carl", "Peter",
          "Robin", "Judea", "Yann", "Geoffrey", "Yoshua", "Fei", "Andrew", "Daphne", "Michael", "Richard",
          "Zoë", "José", "Åsa", "Søren", "Chloé", "Łukasz", "Dvořák", "Müller"]
_LAST = ["Lovelace", "Turing", "Hopper", "Dijkstra", "Liskov", "Knuth", "Allen", "Hoare", "Perlman",
         "Thompson", "Ritchie", "Hamilton", "Backus", "Lamarr", "Shannon", "Lamport", "Wirth", "Stroustrup",
         "Rossum", "Torvalds", "Borg", "Goldwasser", "Micali", "Diffie", "Merkle", "Shamir", "Sutherland",
         "Engelbart", "Cerf", "Kahn", "Berners", "Wilson", "Jones", "Sammet", "Booth", "Keller", "Johnson",
         "Holberton", "Teitelbaum", "Wescoff", "Bilas", "Petri", "Naur", "Milner", "Pearl", "LeCun", "Hinton",
         "Bengio", "Li", "Ng", "Koller", "Stonebraker", "Karp", "Cook"]


# ---------------------------------------------------------------- synthetic instances


def planted_communities(n_entities: int, seed: int, max_size: int = 20_000) -> np.ndarray:
    """Community sizes (Pareto, shape 1.5, at least 8, capped), summing to ``n_entities``."""
    rng = np.random.default_rng(seed)
    sizes: list[int] = []
    total = 0
    while total < n_entities:
        block = np.minimum(np.floor(8 * (1 + rng.pareto(1.5, 4096))).astype(np.int64), max_size)
        sizes.extend(block.tolist())
        total += int(block.sum())
    sizes_arr = np.array(sizes, dtype=np.int64)
    cut = int(np.searchsorted(np.cumsum(sizes_arr), n_entities))
    sizes_arr = sizes_arr[: cut + 1]
    sizes_arr[-1] -= int(sizes_arr.sum()) - n_entities
    return sizes_arr[sizes_arr > 0]


def _community_layout(n_entities: int, n_relationship_instances: int, per_text_unit: int, seed: int):
    """One row per planted community: offset, size, its block's offset and size, text units."""
    sizes = planted_communities(n_entities, seed)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    block = np.arange(len(sizes)) // 10
    block_offset = offsets[np.searchsorted(block, block, side="left")]
    block_size = np.bincount(block, weights=sizes).astype(np.int64)[block]
    sampled = max(0, n_relationship_instances - n_entities)  # the rest are one anchor edge per entity
    text_units = np.maximum(1, np.rint(sizes * sampled / (n_entities * per_text_unit))).astype(np.int64)
    return np.column_stack([np.arange(len(sizes)), offsets, sizes, block_offset, block_size, text_units])


def generate_instances(spark, n_entities: int, n_relationship_instances: int, seed: int, per_text_unit: int = 10):
    """(entity_instances, relationship_instances) DataFrames in the instance table schemas."""
    from pyspark.sql import functions as F

    def uniform(*cols, salt: int):
        bits = F.xxhash64(F.lit(seed), F.lit(salt), *cols).bitwiseAND(F.lit((1 << 53) - 1))
        return bits.cast("double") / float(1 << 53)

    def skewed(size_col, u, power: float):
        return F.floor(size_col * F.pow(u, F.lit(power))).cast("long")

    layout = _community_layout(n_entities, n_relationship_instances, per_text_unit, seed)
    communities = spark.createDataFrame([tuple(int(v) for v in row) for row in layout],
                                        "c long, offset long, size long, block_offset long, block_size long, text_units long")

    slots = (communities.withColumn("t", F.explode(F.sequence(F.lit(0).cast("long"), F.col("text_units") - 1)))
             .withColumn("slot", F.explode(F.sequence(F.lit(0), F.lit(per_text_unit - 1)))))
    u_kind, u_target = uniform("c", "t", "slot", salt=2), uniform("c", "t", "slot", salt=3)
    sampled = slots.select(
        "c", "t", F.col("slot").cast("long").alias("slot"),
        (F.col("offset") + skewed(F.col("size"), uniform("c", "t", "slot", salt=1), 2.5)).alias("s"),
        F.when(u_kind < 0.75, F.col("offset") + skewed(F.col("size"), u_target, 2.5))
         .when(u_kind < 0.92, F.col("block_offset") + skewed(F.col("block_size"), u_target, 1.0))
         .otherwise(skewed(F.lit(n_entities), u_target, 1.5)).alias("o"))
    anchors = (communities.withColumn("p", F.explode(F.sequence(F.lit(0).cast("long"), F.col("size") - 1)))
               .select("c", (F.col("p") % F.col("text_units")).alias("t"), (F.col("p") + per_text_unit).alias("slot"),
                       (F.col("offset") + F.col("p")).alias("s"),
                       (F.col("offset") + skewed(F.col("size"), uniform("c", "p", salt=4), 3.0)).alias("o")))
    pairs = sampled.unionByName(anchors).withColumn("ghost", uniform("c", "t", "slot", salt=5) < 0.001)

    first = F.array(*[F.lit(n) for n in _FIRST])
    last = F.array(*[F.lit(n) for n in _LAST])

    def canonical(e):
        return F.concat(F.element_at(first, (e % len(_FIRST) + 1).cast("int")), F.lit(" "),
                        F.element_at(last, (F.floor(e / len(_FIRST)) % len(_LAST) + 1).cast("int")), F.lit(" "),
                        F.conv(e.cast("string"), 10, 36))

    def mention(e):
        """How one text unit writes the entity's name: mostly canonical, sometimes re-cased or re-spaced."""
        base, u = canonical(e), uniform("c", "t", e, salt=6)
        return (F.when(u < 0.8, base).when(u < 0.9, F.upper(base)).when(u < 0.95, F.lower(base))
                .otherwise(F.regexp_replace(base, " ", "  ")))

    text_unit_id = F.substring(F.sha2(F.concat_ws("-", F.lit("tu"), "c", "t"), 256), 1, 24)
    swap = uniform("c", "t", "slot", salt=7) < 0.5
    relationship_instances = pairs.select(
        F.substring(F.sha2(F.concat_ws("-", F.lit("ri"), "c", "t", "slot"), 256), 1, 24).alias("id"),
        text_unit_id.alias("text_unit_id"),
        F.when(swap, mention(F.col("o"))).otherwise(mention(F.col("s"))).alias("a"),
        F.when(F.col("ghost"), F.concat(F.lit("Ghost "), F.col("o").cast("string")))
         .otherwise(F.when(swap, mention(F.col("s"))).otherwise(mention(F.col("o")))).alias("b"),
        F.concat(canonical(F.col("s")), F.lit(" works with "), canonical(F.col("o")), F.lit(" on topic "),
                 F.floor(uniform("c", "t", "slot", salt=8) * 3).cast("string")).alias("description"),
        (F.floor(uniform("c", "t", "slot", salt=9) * 10) + 1).cast("double").alias("strength"),
        F.lit("synthetic").alias("method"),
    ).withColumnRenamed("a", "source").withColumnRenamed("b", "target")

    mentions = (pairs.select("c", "t", F.col("s").alias("e"))
                .unionByName(pairs.where(~F.col("ghost")).select("c", "t", F.col("o").alias("e"))).distinct())
    main_type = F.element_at(F.array(*[F.lit(t) for t in _TYPES]), (F.col("e") % len(_TYPES) + 1).cast("int"))
    other_type = F.element_at(F.array(*[F.lit(t) for t in _TYPES]), ((F.col("e") + 1) % len(_TYPES) + 1).cast("int"))
    entity_type = F.when(uniform("c", "t", "e", salt=10) < 0.05, other_type).otherwise(main_type)
    entity_instances = mentions.select(
        F.substring(F.sha2(F.concat_ws("-", F.lit("ei"), "c", "t", "e"), 256), 1, 24).alias("id"),
        text_unit_id.alias("text_unit_id"),
        mention(F.col("e")).alias("name"),
        entity_type.alias("type"),
        F.when(uniform("c", "t", "e", salt=11) < 0.1, F.lit(None).cast("string"))
         .otherwise(F.concat(canonical(F.col("e")), F.lit(" is a "), F.lower(main_type), F.lit(" (note "),
                             F.floor(uniform("c", "t", "e", salt=12) * 4).cast("string"), F.lit(")"))).alias("description"),
        F.lit("synthetic").alias("method"),
    )
    return entity_instances, relationship_instances


def planted_edge_arrays(n_edges: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A planted-community weighted edge list in numpy (the driver step's input), ~n_edges unique edges.

    The same shape as the Spark generator: 10 edges per entity on average (duplicates become weight).
    """
    rng = np.random.default_rng(seed)
    n_nodes = max(100, n_edges // 6)
    sizes = planted_communities(n_nodes, seed)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    draws = int(n_edges * 1.25)
    community = np.repeat(np.arange(len(sizes)), sizes)[rng.integers(0, n_nodes, draws)]
    size, offset = sizes[community], offsets[community]
    source = offset + np.floor(size * rng.random(draws) ** 2.5).astype(np.int64)
    kind = rng.random(draws)
    inside = offset + np.floor(size * rng.random(draws) ** 2.5).astype(np.int64)
    anywhere = np.floor(n_nodes * rng.random(draws) ** 1.5).astype(np.int64)
    target = np.where(kind < 0.85, inside, anywhere)
    keep = source != target
    lo, hi = np.minimum(source, target)[keep], np.maximum(source, target)[keep]
    pairs, weights = np.unique(lo * n_nodes + hi, return_counts=True)
    pairs, weights = pairs[:n_edges], weights[:n_edges]
    return pairs // n_nodes, pairs % n_nodes, weights.astype(np.float64)


# ---------------------------------------------------------------- measurement


def _rss_bytes(pid: int | str = "self", field: str = "VmRSS") -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class MemorySampler:
    """Per-stage peaks of the Python driver RSS, the JVM heap in use and the JVM RSS."""

    def __init__(self, spark=None, interval_s: float = 0.2):
        self.stage = "startup"
        self.peaks: dict[str, dict[str, int]] = {}
        self._runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime() if spark else None
        self.jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()) if spark else None
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        peak = self.peaks.setdefault(self.stage, {"py_rss": 0, "jvm_heap": 0, "jvm_rss": 0})
        peak["py_rss"] = max(peak["py_rss"], _rss_bytes())
        if self._runtime is not None:
            try:
                used = self._runtime.totalMemory() - self._runtime.freeMemory()
            except Exception:  # the gateway is going away at shutdown
                return
            peak["jvm_heap"] = max(peak["jvm_heap"], used)
            peak["jvm_rss"] = max(peak["jvm_rss"], _rss_bytes(self.jvm_pid))

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Stages:
    def __init__(self, sampler: MemorySampler):
        self.sampler = sampler
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        self.sampler.stage = name
        started = time.perf_counter()
        try:
            yield
        finally:
            self.sampler._sample()
            self.seconds[name] = time.perf_counter() - started
            peak = self.sampler.peaks.get(name, {})
            print(f"  {name:<34} {self.seconds[name]:8.1f} s   py rss {peak.get('py_rss', 0) / GIB:5.2f} GiB   "
                  f"jvm heap {peak.get('jvm_heap', 0) / GIB:5.2f} GiB   jvm rss {peak.get('jvm_rss', 0) / GIB:5.2f} GiB",
                  flush=True)


def _driver_step(n_edges: int, max_cluster_size: int) -> None:
    """One --leiden-scaling point, in its own process so ru_maxrss is this graph's peak."""
    from graphrag_spark.config import CommunitiesConfig
    from graphrag_spark.index.communities import build_hierarchy, run_leiden

    sources, targets, weights = planted_edge_arrays(n_edges)
    nodes = len(np.unique(np.concatenate([sources, targets])))
    before = _rss_bytes()
    cfg = CommunitiesConfig(max_cluster_size=max_cluster_size)
    started = time.perf_counter()
    raw = run_leiden(sources, targets, weights, cfg)
    leiden_s = time.perf_counter() - started
    started = time.perf_counter()
    hierarchy = build_hierarchy(raw, cfg.max_levels)
    hierarchy_s = time.perf_counter() - started
    per_level = hierarchy.communities.groupby("level").size().to_dict()
    print(json.dumps({"edges": len(sources), "nodes": nodes, "leiden_s": round(leiden_s, 1),
                      "hierarchy_s": round(hierarchy_s, 1), "rss_before": before,
                      "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "communities_per_level": {int(k): int(v) for k, v in per_level.items()}}))


def leiden_scaling(points: list[int], max_cluster_size: int, budget_gib: float) -> None:
    print(f"Driver step (Leiden + hierarchy) on planted graphs, max_cluster_size={max_cluster_size}")
    results = []
    for n_edges in points:
        out = subprocess.run([sys.executable, __file__, "--driver-step", str(n_edges),
                              "--max-cluster-size", str(max_cluster_size)], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        results.append(r)
        print(f"  {r['edges']:>11,} edges {r['nodes']:>10,} nodes: Leiden {r['leiden_s']:7.1f} s, hierarchy "
              f"{r['hierarchy_s']:6.1f} s, peak RSS {r['peak_rss'] / GIB:5.2f} GiB (input arrays + interpreter "
              f"{r['rss_before'] / GIB:4.2f} GiB), levels {r['communities_per_level']}", flush=True)
    if len(results) >= 2:
        edges = np.array([r["edges"] for r in results], dtype=float)
        peak = np.array([r["peak_rss"] for r in results], dtype=float)
        seconds = np.array([r["leiden_s"] + r["hierarchy_s"] for r in results])
        per_edge, fixed = np.polyfit(edges, peak, 1)
        per_edge_s, _ = np.polyfit(edges, seconds, 1)
        largest = (budget_gib * GIB - fixed) / per_edge
        nodes_per_edge = results[-1]["nodes"] / results[-1]["edges"]
        print(f"  fit: peak RSS ~ {fixed / GIB:.2f} GiB + {per_edge:.0f} B/edge; time ~ {per_edge_s * 1e6:.1f} s per 1M edges")
        print(f"  largest graph in {budget_gib:g} GiB of driver memory: ~{largest / 1e6:.0f}M edges "
              f"(~{largest * nodes_per_edge / 1e6:.0f}M nodes at this edges/node ratio), "
              f"~{per_edge_s * largest / 60:.0f} min of Leiden + hierarchy")


# ---------------------------------------------------------------- the benchmark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--relationship-instances", type=int, default=5_000_000)
    parser.add_argument("--entities", type=int, default=500_000)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--root", help="where the Delta tables go (default: a temp dir, removed afterwards); "
                                       "instances already generated there with the same parameters are reused")
    parser.add_argument("--keep", action="store_true", help="keep the tables under --root")
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--name-matching", choices=["exact", "folded"], default="exact")
    parser.add_argument("--edge-weight", choices=["count", "strength"], default="count")
    parser.add_argument("--max-cluster-size", type=int, default=10)
    parser.add_argument("--leiden-scaling", help="comma-separated edge counts: time only the driver step on those sizes")
    parser.add_argument("--budget-gib", type=float, default=20.0, help="driver memory assumed for the largest-graph estimate")
    parser.add_argument("--driver-step", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.driver_step:
        _driver_step(args.driver_step, args.max_cluster_size)
        return
    if args.leiden_scaling:
        leiden_scaling([int(p) for p in args.leiden_scaling.split(",")], args.max_cluster_size, args.budget_gib)
        return

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import functions as F

    from graphrag_spark import tables as T
    from graphrag_spark.config import CommunitiesConfig, GraphConfig, SparkConfig, StorageConfig
    from graphrag_spark.index import communities, graph
    from graphrag_spark.session import build_spark

    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="bench-graph-"))
    started = time.perf_counter()
    spark = build_spark(SparkConfig(shuffle_partitions=args.shuffle_partitions, driver_memory=args.driver_memory,
                                    ivy_cache=str(REPO / ".cache" / "ivy"),
                                    conf={"spark.local.dir": str(root / "_spark_local")}), master="local[2]")
    print(f"Spark session: {time.perf_counter() - started:.1f} s (local[2], driver memory {args.driver_memory}, "
          f"{args.shuffle_partitions} shuffle partitions); tables under {root}", flush=True)
    sampler = MemorySampler(spark)
    stage = Stages(sampler)
    store = T.TableStore(spark, StorageConfig(root=str(root)))
    graph_cfg = GraphConfig(name_matching=args.name_matching, edge_weight=args.edge_weight)
    communities_cfg = CommunitiesConfig(max_cluster_size=args.max_cluster_size)
    try:
        marker = root / "instances.json"
        wanted = {"relationship_instances": args.relationship_instances, "entities": args.entities, "seed": args.seed}
        if marker.exists() and json.loads(marker.read_text()) == wanted:
            print("Reusing the generated instances")
        else:
            with stage("generate + write instances"):
                ei, ri = generate_instances(spark, args.entities, args.relationship_instances, args.seed)
                store.write(ri, T.RELATIONSHIP_INSTANCES)
                store.write(ei, T.ENTITY_INSTANCES)
            marker.write_text(json.dumps(wanted))
        n_ei, n_ri = store.read(T.ENTITY_INSTANCES).count(), store.read(T.RELATIONSHIP_INSTANCES).count()
        print(f"Instances: {n_ri:,} relationship instances, {n_ei:,} entity instances "
              f"(matching={args.name_matching}, weight={args.edge_weight})", flush=True)

        print("Stages (each materialized before the next; times include the materialization):")
        with stage("entity aggregation"):
            entities = graph.build_entities(store.read(T.ENTITY_INSTANCES), graph_cfg).persist()
            n_entities = entities.count()
        with stage("relationship aggregation"):
            relationships = graph.build_relationships(store.read(T.RELATIONSHIP_INSTANCES), entities, graph_cfg).persist()
            n_relationships = relationships.count()
        with stage("degrees + ids"):
            ranked_entities, ranked_relationships = graph.add_degrees(entities, relationships)
            ranked_entities, ranked_relationships = ranked_entities.persist(), ranked_relationships.persist()
            ranked_entities.count(), ranked_relationships.count()
        with stage("write entities + relationships"):
            store.write(ranked_entities, T.ENTITIES)
            store.write(ranked_relationships, T.RELATIONSHIPS)
        for df in (ranked_entities, ranked_relationships, entities, relationships):
            df.unpersist()

        entities, relationships = store.read(T.ENTITIES), store.read(T.RELATIONSHIPS)
        with stage("edge collection to the driver"):
            sources, targets, weights = communities.collect_edges(entities, relationships)
        n_nodes = len(np.unique(np.concatenate([sources, targets])))
        with stage("Leiden (driver)"):
            raw = communities.run_leiden(sources, targets, weights, communities_cfg)
        with stage("hierarchy building (driver)"):
            hierarchy = communities.build_hierarchy(raw, communities_cfg.max_levels)
        del raw, sources, targets, weights
        with stage("communities join + write"):
            store.write(communities.communities_table(spark, hierarchy, entities, relationships), T.COMMUNITIES)
        sampler.stop()

        total = sum(stage.seconds.get(k, 0) for k in stage.seconds if k != "generate + write instances")
        per_level = hierarchy.communities.groupby("level").size().to_dict()
        written = store.read(T.COMMUNITIES).groupBy("level").agg(F.count("*").alias("n")).orderBy("level").collect()
        degrees = store.read(T.ENTITIES).agg(F.max("degree"), F.avg("degree")).first()
        weights_summary = store.read(T.RELATIONSHIPS).agg(F.max("weight"), F.avg("weight")).first()
        print()
        print(f"Graph: {n_entities:,} entities, {n_relationships:,} relationships (from {n_ri:,} instances), "
              f"{n_nodes:,} nodes with an edge; degree max {degrees[0]:,} avg {degrees[1]:.1f}; "
              f"weight max {weights_summary[0]:.0f} avg {weights_summary[1]:.2f}")
        print(f"Communities per level: {{{', '.join(f'{int(k)}: {int(v):,}' for k, v in sorted(per_level.items()))}}} "
              f"(table: {sum(r['n'] for r in written):,} rows)")
        print(f"Graph + communities stages: {total:.1f} s")
        peaks = {k: max(p[k] for p in sampler.peaks.values()) for k in ("py_rss", "jvm_heap", "jvm_rss")}
        print(f"Driver peak memory: Python ru_maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB; "
              f"JVM heap in use {peaks['jvm_heap'] / GIB:.2f} GiB (of -Xmx {args.driver_memory}); "
              f"JVM VmHWM {_rss_bytes(sampler.jvm_pid, 'VmHWM') / GIB:.2f} GiB")
    finally:
        sampler.stop()
        spark.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
