"""What the notebooks share, on Databricks and off it.

On Databricks the notebook's globals hold ``dbutils``, ``spark``, ``display`` and ``displayHTML``:
settings come from widgets, API keys from a secret scope, tables and answers are rendered by the
platform. Elsewhere the same notebooks read environment variables, start a local SparkSession with
the project's factory, and print.
"""

from __future__ import annotations

import html
import os

from graphrag_spark.config import Config, load_config
from graphrag_spark.query.api import GraphRagIndex


def setting(name: str, env: str, default: str = "", dbutils=None) -> str:
    """A notebook widget when ``dbutils`` is given (Databricks), else the environment variable ``env``."""
    if dbutils is None:
        return os.environ.get(env, default)
    dbutils.widgets.text(name, os.environ.get(env, default))
    return dbutils.widgets.get(name)


def load_secrets(cfg: Config, dbutils=None) -> list[str]:
    """On Databricks with a ``secret_scope`` setting: each model's key from the scope, under the secret
    named like its ``api_key_env``, into that variable of the driver (a variable already set wins).
    Returns the variables filled, never their values. Tasks get the key in their closures
    (``graphrag_spark.llm.secrets``), on serverless and shared clusters too."""
    scope = setting("secret_scope", "GRAPHRAG_SECRET_SCOPE", dbutils=dbutils)
    if dbutils is None or not scope:
        return []
    filled = []
    for env in dict.fromkeys((cfg.llm.chat.api_key_env, cfg.llm.embedding.api_key_env)):
        if not os.environ.get(env):
            os.environ[env] = dbutils.secrets.get(scope=scope, key=env)
            filled.append(env)
    return filled


def open_index(notebook_globals: dict) -> GraphRagIndex:
    """The index of the ``index_root`` / ``database`` / ``catalog`` / ``config`` / ``overrides`` settings,
    on the notebook's ``spark`` (a local SparkSession from the project's factory when there is none)."""
    dbutils = notebook_globals.get("dbutils")
    overrides = [o.strip() for o in setting("overrides", "GRAPHRAG_SET", dbutils=dbutils).split(";") if o.strip()]
    cfg = load_config(setting("config", "GRAPHRAG_CONFIG", dbutils=dbutils) or None, overrides)
    root = setting("index_root", "GRAPHRAG_INDEX_ROOT", dbutils=dbutils)
    database = setting("database", "GRAPHRAG_DATABASE", dbutils=dbutils)
    catalog = setting("catalog", "GRAPHRAG_CATALOG", dbutils=dbutils)
    if root:
        cfg.storage.root = root
    if database:
        cfg.storage.database = database
    if catalog:
        cfg.storage.catalog = catalog
    load_secrets(cfg, dbutils)
    spark = notebook_globals.get("spark")
    if spark is None:
        from graphrag_spark.session import build_spark

        if "driver_jit" not in cfg.spark.model_fields_set:  # a notebook's session lives for hours
            cfg.spark.driver_jit = "full"
        spark = build_spark(cfg.spark)
    return GraphRagIndex.load(spark, cfg)


def text_display(frame) -> None:
    """``display`` outside Databricks: the first 50 rows as text."""
    print((frame.limit(50).toPandas() if hasattr(frame, "toPandas") else frame).to_string())


def show_text(notebook_globals: dict, heading: str, text: str, note: str = "") -> None:
    """A heading and a text: HTML through ``displayHTML`` on Databricks, printed elsewhere."""
    display_html = notebook_globals.get("displayHTML")
    if display_html is None:
        print(f"--- {heading}{f' ({note})' if note else ''} ---\n{text}\n")
        return
    display_html(f"<h3>{html.escape(heading)}</h3>" + (f"<p><small>{html.escape(note)}</small></p>" if note else "")
                 + f"<div style=\"white-space: pre-wrap\">{html.escape(text)}</div>")


def show_answer(notebook_globals: dict, heading: str, result) -> None:
    """An answer with what it cost."""
    show_text(notebook_globals, heading, result.answer,
              f"{result.method}, {result.context_units} context units, {result.context_tokens} tokens, "
              f"{result.llm_calls} LLM calls, {result.latency_s:.2f} s")
