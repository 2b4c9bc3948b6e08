"""Stage 6, community reports: built bottom-up, one Spark job per level, deepest level first.

Each community arrives at the report function as one row holding its entities, its internal
relationships and the finished reports of its sub-communities (so higher levels can build
on finer ones). The offline method writes *extractive* reports (no LLM): title from the most
connected entities, summary from their descriptions (the most central text), findings from
the heaviest relationships with ``[Data: Entities (...); Relationships (...)]`` references,
and a rating from internal connection strength. Columns match the LLM reports exactly.
"""

from __future__ import annotations

import math
from typing import Callable, Iterator

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.ids import content_id
from graphrag_spark.index.report_json import format_data_refs, render_full_content

REPORT_COLUMNS = [f.name for f in T.SCHEMAS[T.COMMUNITY_REPORTS].fields]
OFFLINE_METHOD = "extractive"


def _first_sentence(text: str | None, limit: int = 300) -> str:
    text = " ".join((text or "").split("\n")[0].split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _names(titles: list[str]) -> str:
    titles = [t.title() for t in titles]
    return titles[0] if len(titles) == 1 else ", ".join(titles[:-1]) + " and " + titles[-1]


def as_list(value) -> list:
    """Arrow hands array columns to pandas as numpy arrays (or None for a missing join)."""
    return [] if value is None else list(value)


def extractive_report(community: dict, max_findings: int) -> dict:
    """Pure: an offline report from one community context row (see ``community_contexts``)."""
    entities = sorted(as_list(community["entities"]), key=lambda e: (-e["degree"], e["title"]))
    relationships = sorted(as_list(community["relationships"]), key=lambda r: (-r["weight"], -r["combined_degree"], r["id"]))
    sub_reports = sorted(as_list(community["sub_reports"]), key=lambda r: r["community"])
    top = [e["title"] for e in entities[:3]]
    by_title = {e["title"]: e for e in entities}
    central = [f"{e['title'].title()}: {_first_sentence(e['description'])}" for e in entities[:3] if e["description"]]
    summary = f"This community of {len(entities)} entities centres on {_names(top)}. " + " ".join(central)
    if sub_reports:
        summary += " It groups the sub-communities " + "; ".join(f"{r['title']} [Data: Reports ({r['community']})]" for r in sub_reports[:5]) + "."
    findings = []
    for rel in relationships[:max_findings]:
        refs = format_data_refs({"Entities": [by_title[t]["human_readable_id"] for t in (rel["source"], rel["target"]) if t in by_title],
                                 "Relationships": [rel["human_readable_id"]]})
        findings.append({"summary": f"{rel['source'].title()} and {rel['target'].title()}",
                         "explanation": f"{_first_sentence(rel['description'], 600)} (seen {int(rel['weight'])} times) {refs}"})
    internal_weight = sum(r["weight"] for r in relationships)
    rating = round(10 * (1 - math.exp(-internal_weight / (10 * max(1, len(entities))))), 1)
    report = {"title": _names(top), "summary": summary, "rating": rating,
              "rating_explanation": f"Offline estimate from internal connection strength: {internal_weight:g} weighted links among {len(entities)} entities.",
              "findings": findings}
    return {"id": content_id("report", community["id"], OFFLINE_METHOD), "community": community["community"],
            "level": community["level"], **report, "full_content": render_full_content(report), "method": OFFLINE_METHOD}


def community_contexts(level_communities: DataFrame, entities: DataFrame, relationships: DataFrame,
                       finer_reports: DataFrame | None) -> DataFrame:
    """One row per community: its entities, internal relationships and sub-community reports as arrays of structs."""
    entity_rows = (level_communities.select("community", F.explode("entity_ids").alias("id"))
                   .join(entities.select("id", "human_readable_id", "title", "type", "description", "degree"), "id")
                   .groupBy("community").agg(F.collect_list(F.struct("id", "human_readable_id", "title", "type",
                                                                     "description", "degree")).alias("entities")))
    relationship_rows = (level_communities.select("community", F.explode("relationship_ids").alias("id"))
                         .join(relationships.select("id", "human_readable_id", "source", "target", "description",
                                                    "weight", "combined_degree"), "id")
                         .groupBy("community").agg(F.collect_list(F.struct(
                             "id", "human_readable_id", "source", "target", "description", "weight",
                             "combined_degree")).alias("relationships")))
    contexts = (level_communities.select("id", "community", "level", "size", "children")
                .join(entity_rows, "community").join(relationship_rows, "community", "left"))
    if finer_reports is None:
        return contexts.withColumn("sub_reports", F.lit(None).cast(
            "array<struct<community:int,title:string,summary:string,full_content:string>>"))
    subs = (contexts.select("community", F.explode("children").alias("child"))
            .join(finer_reports.select(F.col("community").alias("child"), "title", "summary", "full_content"), "child")
            .groupBy("community").agg(F.collect_list(F.struct(F.col("child").alias("community"), "title", "summary",
                                                               "full_content")).alias("sub_reports")))
    return contexts.join(subs, "community", "left")


def generate_level_reports(contexts: DataFrame, report_fn: Callable[[dict], dict]) -> DataFrame:
    """Apply a per-community report function in executors (mapInPandas over context rows)."""
    schema = T.SCHEMAS[T.COMMUNITY_REPORTS]

    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            rows = [report_fn(row) for row in batch.to_dict("records")]
            yield pd.DataFrame(rows, columns=REPORT_COLUMNS, dtype=object)

    return contexts.mapInPandas(run, schema)
