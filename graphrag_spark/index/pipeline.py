"""The index job: documents -> text units -> instances -> graph -> communities -> reports.

Each stage reads its inputs from Delta and writes its output to Delta, so the stages talk
only through tables (and a later stage can be rerun on its own).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as F

from graphrag_spark import progress
from graphrag_spark import tables as T
from graphrag_spark.config import Config
from graphrag_spark.errors import UserError
from graphrag_spark.index import communities, extraction, graph, reports
from graphrag_spark.index.chunks import build_text_units
from graphrag_spark.index.documents import build_documents
from graphrag_spark.index.graph_backend import resolve_backend
from graphrag_spark.index.summarize import summarize_graph
from graphrag_spark.llm.stage import StageUsage, new_run_id
from graphrag_spark.index.embed import build_embeddings


@dataclass
class RunSummary:
    counts: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    usage: list[StageUsage] = field(default_factory=list)

    @contextmanager
    def stage(self, name: str):
        started = time.perf_counter()
        with progress.stage(name):
            yield
        self.seconds[name] = round(time.perf_counter() - started, 2)

    def render(self) -> str:
        lines = ["Index summary", "-------------"]
        lines += [f"{key:<28} {value}" for key, value in self.counts.items()]
        lines += ["", "Wall time per stage (s)"]
        lines += [f"{key:<28} {value}" for key, value in self.seconds.items()]
        lines.append(f"{'total':<28} {round(sum(self.seconds.values()), 2)}")
        if self.usage:
            lines += ["", "LLM usage (this run)"] + [u.render() for u in self.usage]
            cost = sum(u.est_cost_usd for u in self.usage)
            lines.append(f"{'estimated cost':<24} ${cost:.4f} (from llm.*.price_per_1k_* in the config)")
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

    run_id = new_run_id()
    with summary.stage("extraction"):
        text_units = store.read(T.TEXT_UNITS)
        nlp_instances = None
        if cfg.extraction.method == "llm":
            entity_instances, relationship_instances, claims, usages = extraction.extract_llm_instances(
                spark, store, text_units, cfg.extraction, cfg.llm, run_id)
            summary.usage += usages
        else:
            # Persisted: both tables come from one extraction pass, not one pass per table written.
            nlp_instances = extraction.nlp_instances(text_units, cfg.extraction).persist()
            entity_instances, relationship_instances = extraction.split_instances(nlp_instances)
            claims = spark.createDataFrame([], T.SCHEMAS[T.CLAIMS])
        store.write(entity_instances, T.ENTITY_INSTANCES)
        store.write(relationship_instances, T.RELATIONSHIP_INSTANCES)
        if nlp_instances is not None:
            nlp_instances.unpersist()
        claims = graph.key_claims(claims, cfg.graph)  # the entities' name key, so claims find their entity
        store.write(claims.withColumn("human_readable_id", F.row_number().over(Window.orderBy("id")) - 1), T.CLAIMS)
        summary.counts["entity instances"] = store.read(T.ENTITY_INSTANCES).count()
        summary.counts["relationship instances"] = store.read(T.RELATIONSHIP_INSTANCES).count()

    with summary.stage("graph"):
        min_mentions = cfg.extraction.nlp.min_entity_mentions if cfg.extraction.method == "nlp" else 1
        text_units = store.read(T.TEXT_UNITS)
        nodes = graph.build_entities(store.read(T.ENTITY_INSTANCES), cfg.graph, min_mentions, text_units).persist()
        # Persisted too: the degrees, the entities and the relationships written all read the edges.
        edges = graph.build_relationships(store.read(T.RELATIONSHIP_INSTANCES), nodes, cfg.graph, text_units).persist()
        entities, relationships = graph.add_degrees(nodes, edges, resolve_backend(spark, cfg.graph.backend))
        store.write(entities, T.ENTITIES)
        store.write(relationships, T.RELATIONSHIPS)
        summary.counts["relationships dropped (endpoint not an entity)"] = graph.dropped_relationships(
            store.read(T.RELATIONSHIP_INSTANCES), nodes, cfg.graph)
        nodes.unpersist()  # the persisted frames, not add_degrees' results
        edges.unpersist()
        summary.counts["entities"] = store.read(T.ENTITIES).count()
        summary.counts["relationships"] = store.read(T.RELATIONSHIPS).count()
        # No edge: in no community (Leiden partitions the edge graph), so in no report; kept in the
        # entities table and its embeddings, so local search still finds them.
        summary.counts["isolated entities (no relationship)"] = store.read(T.ENTITIES).where(F.col("degree") == 0).count()
        summary.counts["claims"] = store.read(T.CLAIMS).count()

    if cfg.extraction.method == "llm" and cfg.extraction.summarize_descriptions:
        with summary.stage("summarize_descriptions"):
            summary.usage += summarize_graph(spark, store, cfg, run_id)

    with summary.stage("communities"):
        table, counts = communities.cluster_graph(spark, store.read(T.ENTITIES), store.read(T.RELATIONSHIPS),
                                                  cfg.communities, cfg.graph.largest_component_only,
                                                  resolve_backend(spark, cfg.graph.backend))
        store.write(table, T.COMMUNITIES)
        summary.counts["communities per level"] = counts["communities_per_level"]
        summary.counts["entities not clustered"] = (summary.counts["entities"] - counts["clustered_entities"])

    with summary.stage("community_reports"):
        build_reports(spark, store, cfg, run_id, summary)

    with summary.stage("embeddings"):
        summary.counts.update(build_embeddings(spark, store, cfg))

    return summary


def build_reports(spark: SparkSession, store: T.TableStore, cfg: Config, run_id: str, summary: RunSummary) -> None:
    """Bottom-up: the deepest level first, each level's reports written before the next level starts,
    so a higher level's context can substitute the finished reports of its sub-communities."""
    use_llm = cfg.reports.method == "llm" or (cfg.reports.method == "auto" and cfg.extraction.method == "llm")
    all_communities = store.read(T.COMMUNITIES)
    entities, relationships = store.read(T.ENTITIES), store.read(T.RELATIONSHIPS)
    claims = store.read(T.CLAIMS) if use_llm and store.exists(T.CLAIMS) else None
    levels = sorted((r[0] for r in all_communities.select("level").distinct().collect()), reverse=True)
    max_findings = cfg.reports.max_findings
    per_level, substituted = {}, {}
    finer = None
    for level in levels:
        contexts = reports.community_contexts(all_communities.where(F.col("level") == level), entities, relationships,
                                              finer, claims, all_communities.where(F.col("level") == level + 1))
        if use_llm:
            level_reports, built, usage = reports.llm_level_reports(spark, store, cfg, contexts, run_id)
            summary.usage.append(usage)
            substituted[level] = built.where(F.size("substituted") > 0).count()
        else:
            level_reports = reports.generate_level_reports(contexts, lambda row: reports.extractive_report(row, max_findings))
        store.write(level_reports, T.COMMUNITY_REPORTS, mode="overwrite" if level == levels[0] else "append")
        finer = store.read(T.COMMUNITY_REPORTS).where(F.col("level") == level)
        per_level[level] = finer.count()
    if not levels:
        store.write(spark.createDataFrame([], T.SCHEMAS[T.COMMUNITY_REPORTS]), T.COMMUNITY_REPORTS)
    summary.counts["reports per level"] = dict(sorted(per_level.items()))
    if use_llm:
        summary.counts["contexts with substituted sub-reports"] = dict(sorted(substituted.items()))


def estimate_extraction(spark: SparkSession, cfg: Config) -> dict:
    """``--dry-run``: what LLM extraction would spend, without calling anything or writing tables.

    Chunks already in the LLM cache cost nothing. Per chunk: one extraction call, up to two calls
    per gleaning round (check + continuation), one claims call (a stage of its own); prompt
    tokens count the rendered
    template plus the chunk for each call (gleaning calls also resend the conversation, so this
    is a lower bound for them); completion tokens are estimated at half the chunk per call.
    """
    from graphrag_spark.index.extract_llm import ExtractionPrompts
    from graphrag_spark.llm.stage import with_item_keys
    from graphrag_spark.tokens import count_tokens

    store = T.TableStore(spark, cfg.storage)
    documents, _, counts = build_documents(spark, cfg.input)
    units = build_text_units(documents, cfg.chunking)
    prompts = ExtractionPrompts.load()
    items = with_item_keys(units.select(F.col("id").alias("item_id"), F.col("text").alias("payload"), "n_tokens"),
                           extraction.EXTRACTION_STAGE, cfg.llm.chat.model, prompts.version,
                           extraction.extraction_params(cfg.extraction, cfg.llm.chat))
    results = store.read_or_empty(T.LLM_RESULTS).where(F.col("error").isNull())
    done = results.select("item_key")
    pending = items.dropDuplicates(["item_key"]).join(done, "item_key", "left_anti")
    row = pending.agg(F.count("*").alias("n"), F.sum("n_tokens").alias("tokens")).collect()[0]
    n_chunks, chunk_tokens = int(row.n), int(row.tokens or 0)
    template = count_tokens(prompts.extraction.render(entity_types=", ".join(cfg.extraction.entity_types),
                                                      examples=prompts.examples.text, input_text=""))
    calls_per_chunk = 1 + 2 * cfg.extraction.max_gleanings
    prompt_tokens = calls_per_chunk * (n_chunks * template + chunk_tokens)
    completion_tokens = calls_per_chunk * chunk_tokens // 2
    calls = n_chunks * calls_per_chunk
    if cfg.extraction.claims:
        # A claims item's key depends on the names extraction finds; a chunk without any claims
        # result counts as pending.
        claimed = results.where(F.col("stage") == extraction.CLAIMS_STAGE).select(F.col("item_id").alias("id"))
        claim_row = (units.select("id", "n_tokens").dropDuplicates(["id"]).join(claimed, "id", "left_anti")
                     .agg(F.count("*").alias("n"), F.sum("n_tokens").alias("tokens")).collect()[0])
        claim_template = count_tokens(prompts.claims.render(claim_description=cfg.extraction.claim_description,
                                                            entity_specs="", input_text=""))
        calls += int(claim_row.n)
        prompt_tokens += int(claim_row.n) * claim_template + int(claim_row.tokens or 0)
        completion_tokens += int(claim_row.tokens or 0) // 2
    cost = prompt_tokens / 1000 * cfg.llm.chat.price_per_1k_prompt + completion_tokens / 1000 * cfg.llm.chat.price_per_1k_completion
    return {"documents": counts["documents"], "chunks to extract": n_chunks,
            "chunks already cached": items.select("item_key").distinct().count() - n_chunks,
            "extraction calls (at most)": calls, "prompt tokens (estimate)": prompt_tokens,
            "completion tokens (estimate)": completion_tokens, "estimated cost USD": round(cost, 4),
            "not included": "description summaries (1 call per multi-description node/edge) and "
                            "reports (1-2 calls per community), known only after extraction"}
