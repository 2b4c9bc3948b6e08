"""Largest connected component of a random graph, both graph backends, in one session.

    .venv/bin/python benchmarks/bench_cc.py --edges 3000000 --nodes 1000000

``sql``: the edge list collected to the driver and labelled with scipy (what the index does
without GraphFrames). ``graphframes``: GraphFrames' connectedComponents in the executors, then
the largest component selected in Spark. Prints wall times, their ratio, and checks that both
find the same node set.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
GRAPHFRAMES_JAR = REPO.parent / "shared" / "jars" / "graphframes-spark4_2.13-0.11.0.jar"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--edges", type=int, default=3_000_000)
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--jar", default=str(GRAPHFRAMES_JAR))
    args = parser.parse_args()

    import numpy as np
    from pyspark.sql import functions as F

    from graphrag_spark.config import SparkConfig
    from graphrag_spark.index.communities import largest_component_mask
    from graphrag_spark.index.graph_backend import largest_component_nodes, resolve_backend
    from graphrag_spark.session import build_spark

    spark = build_spark(SparkConfig(shuffle_partitions=8, driver_memory=args.driver_memory, jars=[args.jar],
                                    ivy_cache=str(REPO / ".cache" / "ivy"), conf={"spark.ui.enabled": "false"}),
                        master=args.master)
    assert resolve_backend(spark, "graphframes") == "graphframes"
    with tempfile.TemporaryDirectory() as scratch:
        spark.sparkContext.setCheckpointDir(str(Path(scratch) / "checkpoints"))
        # A sparse random graph: one giant component plus many small ones, like an extracted graph.
        edges = (spark.range(args.edges, numPartitions=8)
                 .select((F.xxhash64("id", F.lit(1)) % args.nodes).cast("long").alias("s"),
                         (F.xxhash64("id", F.lit(2)) % args.nodes).cast("long").alias("t"))
                 .select(F.abs("s").alias("s"), F.abs("t").alias("t")).where("s != t"))
        edges.write.parquet(str(Path(scratch) / "edges"))
        edges = spark.read.parquet(str(Path(scratch) / "edges"))
        n_edges = edges.count()

        started = time.perf_counter()
        frame = edges.toPandas()
        s, t = frame["s"].to_numpy(), frame["t"].to_numpy()
        keep = largest_component_mask(s, t)
        on_driver = np.unique(np.concatenate([s[keep], t[keep]]))
        sql_s = time.perf_counter() - started

        started = time.perf_counter()
        nodes = largest_component_nodes(spark, edges).toPandas()["node"].to_numpy()
        graphframes_s = time.perf_counter() - started

    same = np.array_equal(np.sort(nodes), on_driver)
    print(f"edges                     {n_edges}")
    print(f"largest component nodes   {len(on_driver)}")
    print(f"sql (collect + scipy) s   {sql_s:.1f}")
    print(f"graphframes s             {graphframes_s:.1f}")
    print(f"graphframes / sql         {graphframes_s / sql_s:.2f}")
    print(f"same node set             {same}")
    spark.stop()
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
