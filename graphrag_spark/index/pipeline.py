"""The index job: documents -> text units -> instances -> graph -> communities -> reports.

Each stage reads its inputs from Delta and writes its output to Delta, so the stages talk
only through tables (and a later stage can be rerun on its own).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.config import Config
from graphrag_spark.errors import UserError
from graphrag_spark.index import communities, extraction, graph, reports
from graphrag_spark.index.chunks import build_text_units
from graphrag_spark.index.documents import build_documents


@dataclass
class RunSummary:
    counts: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str):
        started = time.perf_counter()
        yield
        self.seconds[name] = round(time.perf_counter() - started, 2)

    def render(self) -> str:
        lines = ["Index summary", "-------------"]
        lines += [f"{key:<28} {value}" for key, value in self.counts.items()]
        lines += ["", "Wall time per stage (s)"]
        lines += [f"{key:<28} {value}" for key, value in self.seconds.items()]
        lines.append(f"{'total':<28} {round(sum(self.seconds.values()), 2)}")
        return "\n".join(lines)


def run_index(spark: SparkSession, cfg: Config) -> RunSummary:
    store = T.TableStore(spark, cfg.storage)
    summary = RunSummary()

    with summary.stage("documents"):
        documents, rejects, counts = build_documents(spark, cfg.input)
        store.write(rejects, T.INPUT_REJECTS)
        store.write(documents, T.DOCUMENTS)
        summary.counts.update({"documents": counts["documents"], "duplicate documents": counts["duplicates"],
                               "rejected inputs": counts["rejected"]})
        if counts["documents"] == 0:
            raise UserError(f"No readable documents in '{cfg.input.path}': {counts['rejected']} inputs were skipped; "
                            f"see the '{T.INPUT_REJECTS}' table at {store.location(T.INPUT_REJECTS)} for the reasons.")

    with summary.stage("text_units"):
        store.write(build_text_units(store.read(T.DOCUMENTS), cfg.chunking), T.TEXT_UNITS)
        summary.counts["text units"] = store.read(T.TEXT_UNITS).count()

    with summary.stage("extraction"):
        text_units = store.read(T.TEXT_UNITS)
        entity_instances, relationship_instances = extraction.extract_nlp_instances(text_units, cfg.extraction)
        store.write(entity_instances, T.ENTITY_INSTANCES)
        store.write(relationship_instances, T.RELATIONSHIP_INSTANCES)
        summary.counts["entity instances"] = store.read(T.ENTITY_INSTANCES).count()
        summary.counts["relationship instances"] = store.read(T.RELATIONSHIP_INSTANCES).count()

    with summary.stage("graph"):
        min_mentions = cfg.extraction.nlp.min_entity_mentions if cfg.extraction.method == "nlp" else 1
        entities = graph.build_entities(store.read(T.ENTITY_INSTANCES), cfg.graph, min_mentions).persist()
        relationships = graph.build_relationships(store.read(T.RELATIONSHIP_INSTANCES), entities, cfg.graph)
        entities, relationships = graph.add_degrees(entities, relationships)
        store.write(entities, T.ENTITIES)
        store.write(relationships, T.RELATIONSHIPS)
        entities.unpersist()
        summary.counts["entities"] = store.read(T.ENTITIES).count()
        summary.counts["relationships"] = store.read(T.RELATIONSHIPS).count()

    with summary.stage("communities"):
        table, counts = communities.cluster_graph(spark, store.read(T.ENTITIES), store.read(T.RELATIONSHIPS),
                                                  cfg.communities, cfg.graph.largest_component_only)
        store.write(table, T.COMMUNITIES)
        summary.counts["communities per level"] = counts["communities_per_level"]
        summary.counts["entities not clustered"] = (summary.counts["entities"] - counts["clustered_entities"])

    with summary.stage("community_reports"):
        summary.counts["reports per level"] = build_reports(spark, store, cfg)

    return summary


def build_reports(spark: SparkSession, store: T.TableStore, cfg: Config) -> dict[int, int]:
    """Bottom-up: the deepest level first, each level's reports written before the next level starts."""
    all_communities = store.read(T.COMMUNITIES)
    entities, relationships = store.read(T.ENTITIES), store.read(T.RELATIONSHIPS)
    levels = sorted((r[0] for r in all_communities.select("level").distinct().collect()), reverse=True)
    max_findings = cfg.reports.max_findings
    per_level: dict[int, int] = {}
    finer = None
    for level in levels:
        contexts = reports.community_contexts(all_communities.where(F.col("level") == level), entities, relationships, finer)
        level_reports = reports.generate_level_reports(contexts, lambda row: reports.extractive_report(row, max_findings))
        store.write(level_reports, T.COMMUNITY_REPORTS, mode="overwrite" if level == levels[0] else "append")
        finer = store.read(T.COMMUNITY_REPORTS).where(F.col("level") == level)
        per_level[level] = finer.count()
    if not levels:
        store.write(spark.createDataFrame([], T.SCHEMAS[T.COMMUNITY_REPORTS]), T.COMMUNITY_REPORTS)
    return dict(sorted(per_level.items()))
