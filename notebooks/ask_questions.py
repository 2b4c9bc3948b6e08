# Databricks notebook source
# MAGIC %md
# MAGIC # Ask questions with every method
# MAGIC
# MAGIC The paper's conditions side by side: global search at every level (C0..Cn), TS (map-reduce over the
# MAGIC source text), SS (`basic_search`, vector RAG) and local search (entity-centred), with the context each
# MAGIC one used, its size, its LLM calls and its latency.
# MAGIC
# MAGIC Answers come from the chat model when the config says `query.llm: true` (set `llm.chat` to your
# MAGIC endpoint); otherwise every method answers offline, extractively, without an LLM.
# MAGIC
# MAGIC **Settings** (widgets on Databricks, environment variables elsewhere): `index_root` /
# MAGIC `GRAPHRAG_INDEX_ROOT`, `database` / `GRAPHRAG_DATABASE` and `catalog` / `GRAPHRAG_CATALOG` (Unity Catalog
# MAGIC tables `<catalog>.<database>.<name>`), `config` / `GRAPHRAG_CONFIG`, `overrides` / `GRAPHRAG_SET`
# MAGIC (`;`-separated `section.key=value`), `question` / `GRAPHRAG_QUESTION`, and `secret_scope` /
# MAGIC `GRAPHRAG_SECRET_SCOPE`: on Databricks the API keys come from that secret scope, each under the name of
# MAGIC its `llm.*.api_key_env` (e.g. `OPENAI_API_KEY`); elsewhere from the environment.

# COMMAND ----------

from graphrag_spark.query.notebook import open_index, setting, show_answer, show_text, text_display

index = open_index(globals())
spark, cfg = index.spark, index.cfg
display = globals().get("display", text_display)  # Databricks defines display
QUESTION = setting("question", "GRAPHRAG_QUESTION", "What are the main themes and who are the key actors?",
                   dbutils=globals().get("dbutils"))
print(f"Answers from: {'the chat model ' + cfg.llm.chat.model if cfg.query.llm else 'offline extraction (no LLM)'}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Global search at every level (C0..Cn)
# MAGIC Exactly one level per search: its reports are shuffled, packed into map batches, mapped, scored and reduced.

# COMMAND ----------

results = {}
for level in index.levels():
    results[f"C{level}"] = index.global_search(QUESTION, level=level)
    show_answer(globals(), f"C{level}", results[f"C{level}"])

# COMMAND ----------

# MAGIC %md
# MAGIC ## TS, SS and local search

# COMMAND ----------

results["TS"] = index.text_summary_search(QUESTION)
results["SS"] = index.basic_search(QUESTION)
results["local"] = index.local_search(QUESTION)
for name in ("TS", "SS", "local"):
    show_answer(globals(), name, results[name])

# COMMAND ----------

# MAGIC %md
# MAGIC ## What each condition cost

# COMMAND ----------

import pandas as pd

comparison = pd.DataFrame([
    {"condition": name, "level": r.level, "context_units": r.context_units, "context_tokens": r.context_tokens,
     "llm_calls": r.llm_calls, "prompt_tokens": r.prompt_tokens, "malformed_map_answers": r.malformed_map_answers,
     "latency_s": round(r.latency_s, 2)}
    for name, r in results.items()
])
display(comparison)

# COMMAND ----------

# MAGIC %md
# MAGIC ## The context behind an answer
# MAGIC Global search: every report of the level with its best map score; local search: the entities,
# MAGIC relationships, claims, reports and sources it packed into its context.

# COMMAND ----------

display(results["C0"].as_spark(spark).orderBy("score", ascending=False))
display(results["local"].as_spark(spark))
show_text(globals(), "The context of local search", results["local"].context_text[:2000])
