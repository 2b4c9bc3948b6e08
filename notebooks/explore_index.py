# Databricks notebook source
# MAGIC %md
# MAGIC # Explore a GraphRAG index
# MAGIC
# MAGIC Community reports per level, the most connected entities, and a drill-down from a root community's report
# MAGIC to its sub-communities and to the source text its entities were extracted from.
# MAGIC
# MAGIC **Where the index is.** On Databricks: the `index_root` widget (a Delta root), or `database` (metastore
# MAGIC tables `<database>.<name>`), and optionally `config` (a YAML file of the project). Elsewhere the same
# MAGIC settings come from the environment: `GRAPHRAG_INDEX_ROOT`, `GRAPHRAG_DATABASE`, `GRAPHRAG_CONFIG`, and
# MAGIC `GRAPHRAG_SET` (`;`-separated `section.key=value` overrides). Outside Databricks a local SparkSession is
# MAGIC started by the project's session factory.

# COMMAND ----------

import os


def setting(name: str, env: str, default: str = "") -> str:
    """A notebook widget on Databricks, an environment variable elsewhere."""
    try:
        dbutils.widgets.text(name, os.environ.get(env, default))  # noqa: F821 (Databricks global)
        return dbutils.widgets.get(name)  # noqa: F821
    except NameError:
        return os.environ.get(env, default)


INDEX_ROOT = setting("index_root", "GRAPHRAG_INDEX_ROOT")
DATABASE = setting("database", "GRAPHRAG_DATABASE")
CONFIG = setting("config", "GRAPHRAG_CONFIG")
OVERRIDES = [o.strip() for o in setting("overrides", "GRAPHRAG_SET").split(";") if o.strip()]

# COMMAND ----------

from graphrag_spark.config import load_config
from graphrag_spark.query.api import GraphRagIndex

cfg = load_config(CONFIG or None, OVERRIDES)
if INDEX_ROOT:
    cfg.storage.root = INDEX_ROOT
if DATABASE:
    cfg.storage.database = DATABASE

try:
    spark  # noqa: B018 (defined on Databricks)
except NameError:
    from graphrag_spark.session import build_spark

    spark = build_spark(cfg.spark)

try:
    display  # noqa: B018 (defined on Databricks)
except NameError:
    def display(frame):
        print((frame.limit(50).toPandas() if hasattr(frame, "toPandas") else frame).to_string())

index = GraphRagIndex.load(spark, cfg)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Reports per level, and what one question costs at each level
# MAGIC Global search at level `Ci` reads every report of that level (the paper's Table 2); TS reads every text unit.

# COMMAND ----------

display(index.reports_per_level())
display(index.context_sizes())

# COMMAND ----------

# MAGIC %md
# MAGIC ## The most connected entities

# COMMAND ----------

display(index.top_entities(15))

# COMMAND ----------

# MAGIC %md
# MAGIC ## The root communities (C0), most significant first

# COMMAND ----------

root_reports = index.reports(level=0)
display(root_reports)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Drill down: one root community's report, its sub-communities, its source text

# COMMAND ----------

from pyspark.sql import functions as F

community = root_reports.first().community
report = index.table("community_reports").where(F.col("community") == community).first()
print(report.full_content)

# COMMAND ----------

sub_communities = index.sub_communities(community)
display(sub_communities)

# COMMAND ----------

source_text = index.source_text(community)
display(source_text.select("document_id", "chunk_index", "n_tokens", F.substring("text", 1, 300).alias("text")))
