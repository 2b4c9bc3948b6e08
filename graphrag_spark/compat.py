"""Classic and Spark Connect sessions behind one set of helpers.

Databricks serverless and Unity Catalog shared clusters run PySpark through Spark Connect:
no ``sparkContext``, no ``_jvm``, no RDDs, no broadcast. Code that needs one of those asks
here first and takes the Connect-safe path when it must.
"""

from __future__ import annotations

from pyspark.sql import SparkSession


def is_connect(spark: SparkSession) -> bool:
    """True for a Spark Connect session; tested on the class so no Connect module is imported."""
    return type(spark).__module__.startswith("pyspark.sql.connect")
