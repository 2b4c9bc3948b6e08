# Databricks notebook source
# MAGIC %md
# MAGIC # Explore a GraphRAG index
# MAGIC
# MAGIC Community reports per level, the most connected entities, and a drill-down from a root community's report
# MAGIC to its sub-communities and to the source text its entities were extracted from.
# MAGIC
# MAGIC **Where the index is.** On Databricks: the `index_root` widget (a Delta root, e.g. a `/Volumes/...` path), or
# MAGIC `database` (metastore tables `<database>.<name>`) with optionally `catalog` (Unity Catalog tables
# MAGIC `<catalog>.<database>.<name>`), and optionally `config` (a YAML file of the project). Elsewhere the same
# MAGIC settings come from the environment: `GRAPHRAG_INDEX_ROOT`, `GRAPHRAG_DATABASE`, `GRAPHRAG_CATALOG`, `GRAPHRAG_CONFIG`, and
# MAGIC `GRAPHRAG_SET` (`;`-separated `section.key=value` overrides). Outside Databricks a local SparkSession is
# MAGIC started by the project's session factory.

# COMMAND ----------

from graphrag_spark.query.notebook import open_index, show_text, text_display

index = open_index(globals())
spark, cfg = index.spark, index.cfg
display = globals().get("display", text_display)  # Databricks defines display

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
show_text(globals(), report.title, report.full_content, f"community {community}, level {report.level}")

# COMMAND ----------

sub_communities = index.sub_communities(community)
display(sub_communities)

# COMMAND ----------

source_text = index.source_text(community)
display(source_text.select("document_id", "chunk_index", "n_tokens", F.substring("text", 1, 300).alias("text")))

# COMMAND ----------

# MAGIC %md
# MAGIC ## The interactive explorer
# MAGIC The static explorer of `graphrag-spark explore` (levels, reports, drill-down, entity search, community graph)
# MAGIC with its data inlined, shown through `displayHTML`. For a large index, write it to a folder instead:
# MAGIC `graphrag_spark.explore.write_explorer(spark, cfg, "/dbfs/tmp/explorer")`.

# COMMAND ----------

from graphrag_spark.explore import explorer_html

explorer_page = explorer_html(spark, cfg)
if "displayHTML" in globals():
    displayHTML(explorer_page)  # noqa: F821 - defined by Databricks
else:
    print(f"Explorer page of {len(explorer_page):,} characters (displayHTML shows it on Databricks).")
