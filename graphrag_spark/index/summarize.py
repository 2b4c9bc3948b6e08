"""Description summarization (paper step 5): one LLM-written description per node and edge that was
described differently in several chunks. Runs as cached LLM stages (see llm.stage); a failed
summary keeps the joined instance descriptions, so no fact is lost.

Only elements with two or more distinct descriptions are summarized; the summarizer gets the
graph stage's description list itself (``graph.build_entities``: most frequent first, then in
source order, within ``graph.max_description_tokens``), never a text split back into lines.
"""

from __future__ import annotations

import json
from typing import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.compat import in_parallel
from graphrag_spark.config import Config
from graphrag_spark.index import graph
from graphrag_spark.index.extract_llm import summarize_descriptions
from graphrag_spark.llm.stage import LlmWork, StageUsage, run_llm_stage
from graphrag_spark.prompts import load_prompt


def summary_items(described: DataFrame, name_col) -> DataFrame:
    """``(item_id, payload)`` for the elements with two or more distinct descriptions."""
    return (described.where(F.size("descriptions") >= 2)
            .select(F.col("id").alias("item_id"),
                    F.to_json(F.struct(name_col.alias("name"), F.col("descriptions"))).alias("payload")))


def _summarize(spark: SparkSession, store: T.TableStore, cfg: Config, run_id: str,
               described: DataFrame, name_col, stage: str, only: DataFrame | None,
               publish: Callable[[list[tuple[str, str | None]]], None] | None) -> tuple[DataFrame, StageUsage]:
    prompt = load_prompt("summarize_descriptions")
    max_tokens = cfg.extraction.summary_max_tokens
    max_input_tokens = cfg.graph.max_description_tokens
    if only is not None:
        described = described.join(only, "id", "left_semi")
    items = summary_items(described, name_col)

    async def work(client, item: dict) -> LlmWork:
        payload = json.loads(item["payload"])
        text, call = await summarize_descriptions(client, payload["name"], payload["descriptions"], max_tokens,
                                                  prompt=prompt, max_input_tokens=max_input_tokens,
                                                  item_id=item["item_id"])
        return LlmWork({"text": text}, [call], call.error)

    def answered(item_id: str, result: str | None, error: str | None) -> list:
        publish([(item_id, None if result is None else json.loads(result)["text"])])
        return []

    outcome, usage = run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, stage, items, work, run_id, prompt.version,
                                   {"max_tokens": max_tokens, "temperature": cfg.llm.chat.temperature,
                                    "max_input_tokens": max_input_tokens}, answered if publish else None)
    summaries = outcome.where(F.col("result").isNotNull()).select(
        F.col("item_id").alias("id"), F.get_json_object("result", "$.text").alias("summary"))
    return summaries.withColumnRenamed("summary", "description"), usage


def summarize_graph(spark: SparkSession, store: T.TableStore, cfg: Config, run_id: str,
                    only: dict[str, DataFrame] | None = None,
                    described: dict[str, DataFrame] | None = None,
                    held: dict[str, DataFrame] | None = None,
                    publish: Callable[[list[tuple[str, str | None]]], None] | None = None) -> list[StageUsage]:
    """Replace multi-description entities' and relationships' descriptions with their LLM summaries
    (the table rewritten once with them). ``only``: per table, the ids to consider (a refresh passes the
    elements whose instances changed; the others keep their description and cost nothing).
    ``described``: per table, the elements' ``descriptions`` lists with their ids and names, as the graph
    stage built them (the pipeline passes them); without it they are built again from the instances.
    ``held``: tables as the caller wrote them, cached (``Run.written``): a table held there is rewritten
    from those rows rather than read back, and its rewritten rows replace them there, cached.
    ``publish``: called with each summary as it is answered, cache hits first ((element id, summary); None
    where the call failed and the description stays), where the stages run on the driver (``run_llm_stage``'s
    follow-ups: up to ``DRIVER_STAGE_ITEMS`` items, not on Spark Connect)."""
    if described is None:
        text_units = store.read(T.TEXT_UNITS)
        described = {
            T.ENTITIES: graph.build_entities(store.read(T.ENTITY_INSTANCES), cfg.graph, 1, text_units),
            T.RELATIONSHIPS: graph.build_relationships(store.read(T.RELATIONSHIP_INSTANCES), store.read(T.ENTITIES),
                                                       cfg.graph, text_units),
        }
    stages = ((T.ENTITIES, F.col("title"), "summarize_entities"),
              (T.RELATIONSHIPS, F.concat_ws(" -> ", "source", "target"), "summarize_relationships"))

    def summarize(table, name_col, stage) -> StageUsage:
        summaries, usage = _summarize(spark, store, cfg, run_id, described[table], name_col, stage,
                                      (only or {}).get(table), publish)
        # Materialised (in Delta: a lost executor loses nothing) before merging into the table the plan reads from.
        summaries = store.checkpoint(summaries, f"summaries_{table}", expected_rows=usage.items)
        current = (held or {}).get(table)
        updated = store.update_columns(summaries, table, ["description"], current)
        if current is not None:
            held[table] = updated
            current.unpersist()
        return usage

    # The two stages are independent: run at once, they share the model's budget (llm.coordinator),
    # so one's Spark work before and after its calls is not dead time for the rate limit; each merges
    # its own table as soon as its calls are done, while the other may still be calling.
    return in_parallel(spark, *(lambda spec=spec: summarize(*spec) for spec in stages))
