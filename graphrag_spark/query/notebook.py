"""What the notebooks share: settings from Databricks widgets (environment variables elsewhere),
the index they name on the notebook's SparkSession, and a text ``display`` outside Databricks."""

from __future__ import annotations

import os

from graphrag_spark.config import load_config
from graphrag_spark.query.api import GraphRagIndex


def setting(name: str, env: str, default: str = "", dbutils=None) -> str:
    """A notebook widget when ``dbutils`` is given (Databricks), else the environment variable ``env``."""
    if dbutils is None:
        return os.environ.get(env, default)
    dbutils.widgets.text(name, os.environ.get(env, default))
    return dbutils.widgets.get(name)


def open_index(notebook_globals: dict) -> GraphRagIndex:
    """The index of the ``index_root`` / ``database`` / ``config`` / ``overrides`` settings, on the
    notebook's ``spark`` (a local SparkSession from the project's factory when there is none)."""
    dbutils = notebook_globals.get("dbutils")
    overrides = [o.strip() for o in setting("overrides", "GRAPHRAG_SET", dbutils=dbutils).split(";") if o.strip()]
    cfg = load_config(setting("config", "GRAPHRAG_CONFIG", dbutils=dbutils) or None, overrides)
    root = setting("index_root", "GRAPHRAG_INDEX_ROOT", dbutils=dbutils)
    database = setting("database", "GRAPHRAG_DATABASE", dbutils=dbutils)
    if root:
        cfg.storage.root = root
    if database:
        cfg.storage.database = database
    spark = notebook_globals.get("spark")
    if spark is None:
        from graphrag_spark.session import build_spark

        spark = build_spark(cfg.spark)
    return GraphRagIndex.load(spark, cfg)


def text_display(frame) -> None:
    """``display`` outside Databricks: the first 50 rows as text."""
    print((frame.limit(50).toPandas() if hasattr(frame, "toPandas") else frame).to_string())
