"""Degrees and the largest connected component through GraphFrames or through Spark SQL and the
driver (``graph.backend``: ``auto`` / ``graphframes`` / ``sql``; see :func:`resolve_backend` for ``auto``).

Both backends compute the same thing: a node's degree is the number of relationships it ends;
the largest component is the one with most nodes, ties going to the component holding the
smallest node id (``human_readable_id``), which is also what scipy's labelling gives the driver
path. GraphFrames runs connected components in the executors, so the edge list never has to fit
on the driver for that step; it ships with the Databricks ML runtime, or as
``io.graphframes:graphframes-spark4_2.13`` in ``spark.packages`` / a JAR in ``spark.jars``.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from graphrag_spark.compat import is_connect
from graphrag_spark.errors import UserError

GRAPHFRAMES_CLASS = "org.graphframes.GraphFrame"


def graphframes_available(spark: SparkSession) -> bool:
    """The Python package imports and its JVM classes load (through Spark's class loader, where
    ``spark.jars`` land; py4j's own ``Class.forName`` does not see them)."""
    if is_connect(spark):
        return False  # the 0.11 JAR has no Spark Connect plugin
    try:
        import graphframes  # noqa: F401
    except ImportError:
        return False
    from graphrag_spark.session import _class_loadable

    return _class_loadable(spark, GRAPHFRAMES_CLASS)


def resolve_backend(spark: SparkSession, setting: str, edges: int | None = None,
                    driver_max_edges: int = 20_000_000) -> str:
    """``graphframes`` or ``sql`` for this session; an explicit ``graphframes`` that cannot load is a user error.

    ``auto`` takes the driver path while the graph has at most ``driver_max_edges`` relationships
    (``edges``; unknown = small): Leiden needs the edge list on the driver anyway, and there the
    driver path was 18x faster (3M edges: 34 s against 608 s for GraphFrames, 2 cores). Beyond it,
    GraphFrames finds the largest component in the executors, so only that component's edges reach
    the driver. Degrees are one aggregation either way. GraphFrames is looked for only where the answer
    depends on it: its Python package imports pyspark.ml, half a second of CPU as the communities start."""
    if setting == "sql":
        return "sql"
    if setting == "auto":
        large = edges is not None and edges > driver_max_edges
        return "graphframes" if large and graphframes_available(spark) else "sql"
    if not graphframes_available(spark):
        raise UserError("graph.backend is 'graphframes' but GraphFrames does not load here; install graphframes-py and "
                        "add its JAR (spark.jars, or io.graphframes:graphframes-spark4_2.13 in spark.packages), "
                        "or set graph.backend=auto.")
    return "graphframes"


def _graph(relationships: DataFrame, vertices: DataFrame | None = None):
    from graphframes import GraphFrame

    edges = relationships.select(F.col("source").alias("src"), F.col("target").alias("dst"))
    if vertices is None:
        vertices = edges.select(F.col("src").alias("id")).union(edges.select(F.col("dst").alias("id"))).distinct()
    return GraphFrame(vertices, edges)


def degrees(relationships: DataFrame, backend: str) -> DataFrame:
    """``(title, degree)`` for every node that ends at least one relationship."""
    if backend == "graphframes":
        return _graph(relationships).degrees.select(F.col("id").alias("title"), F.col("degree").cast("long"))
    endpoints = relationships.select(F.col("source").alias("title")).unionAll(relationships.select(F.col("target").alias("title")))
    return endpoints.groupBy("title").agg(F.count(F.lit(1)).alias("degree"))


def largest_component_nodes(spark: SparkSession, node_edges: DataFrame) -> DataFrame:
    """GraphFrames: ``(node)`` ids of the largest connected component of ``(s, t)`` edges over integer node ids."""
    edges = node_edges.select(F.col("s").alias("source"), F.col("t").alias("target"))
    # A reliable checkpoint directory (spark.checkpoint.dir) survives a lost executor; without one,
    # local checkpoints (fine on a single machine).
    local = spark.sparkContext.getCheckpointDir() is None
    components = _graph(edges).connectedComponents(use_local_checkpoints=local)
    sizes = components.groupBy("component").agg(F.count(F.lit(1)).alias("size"), F.min("id").alias("smallest"))
    best = sizes.orderBy(F.desc("size"), F.asc("smallest")).limit(1)
    return components.join(best.select("component"), "component").select(F.col("id").alias("node"))
