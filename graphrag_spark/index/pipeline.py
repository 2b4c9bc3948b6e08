"""The index job as a table of stages: documents -> text units -> instances -> graph -> communities -> reports -> embeddings.

Each stage reads its inputs from Delta and writes its outputs to Delta, so the stages talk only
through tables. ``STAGES`` declares, per stage, its inputs, its outputs and its incremental
contract: what a refresh (a run on a root that already holds a published index) recomputes and
what it keeps from the published run. A run holds the root's lock and publishes its tables in
one ``index_runs`` row at the end; until then readers keep seeing the previous run (runs.py).

Stages that do not depend on each other run at the same time (``run_stages``): a stage starts as
soon as the stages it comes ``after`` are done, in a driver thread of its own, with its Spark jobs
in a fair-scheduler pool of its own. Text-unit embeddings run while entities are extracted, and the
communities while descriptions are summarized. A stage may run ``beside`` one whose outputs it reads,
taking what that one publishes as it comes: the reports and the entity embeddings start with the
summaries and take each summary as it is answered.
No two concurrent stages write the same table, so the tables are those of the sequential order, and
every LLM result is committed per item as before.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable

import pandas as pd
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, StringType, StructField, StructType

from graphrag_spark import progress
from graphrag_spark import tables as T
from graphrag_spark.compat import in_parallel, inheriting, is_connect
from graphrag_spark.config import Config
from graphrag_spark.errors import UserError
from graphrag_spark.index import communities, extraction, graph, reports, retention, runs
from graphrag_spark.index.chunks import DRIVER_CHUNK_CHARS, build_text_units, text_units_on_driver
from graphrag_spark.index.documents import InputRead, build_documents, build_documents_from_changes, source_table_version
from graphrag_spark.index.embed import build_embeddings, embed_entities_beside_summaries
from graphrag_spark.index.graph_backend import resolve_backend
from graphrag_spark.index.refresh import DocumentDiff, diff_documents, keep_numbers, same_rows
from graphrag_spark.index.summarize import summarize_graph
from graphrag_spark.llm.secrets import check_ahead
from graphrag_spark.llm.stage import DRIVER_STAGE_ITEMS, Feed, FreshResults, StageUsage, append_usage, new_run_id
from graphrag_spark.session import warm_python_workers


def _utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


@dataclass
class RunSummary:
    counts: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    usage: list[StageUsage] = field(default_factory=list)
    run_id: str = ""
    mode: str = "full"
    wall_s: float | None = None  # the stages' wall time: less than their sum where they overlapped

    @contextmanager
    def stage(self, name: str):
        started = time.perf_counter()
        with progress.stage(name):
            yield
        self.seconds[name] = round(time.perf_counter() - started, 2)

    def render(self) -> str:
        lines = [f"Index summary (run {self.run_id}, {self.mode})", "-------------"]
        lines += [f"{key:<28} {value}" for key, value in self.counts.items()]
        lines += ["", "Wall time per stage (s)"]
        lines += [f"{key:<28} {value}" for key, value in self.seconds.items()]
        lines.append(f"{'total':<28} {round(sum(self.seconds.values()), 2)}")
        if self.wall_s is not None:
            lines.append(f"{'wall (stages overlap)':<28} {self.wall_s}")
        if self.usage:
            lines += ["", "LLM usage (this run)"] + [u.render() for u in self.usage]
            cost = sum(u.est_cost_usd for u in self.usage)
            lines.append(f"{'estimated cost':<24} ${cost:.4f} (from llm.*.price_per_1k_* in the config)")
        return "\n".join(lines)


@dataclass
class Run:
    """One run's state as the stages see it. ``previous`` is the published index (a refresh) or None
    (a full build); ``store`` holds the live tables this run writes."""

    spark: SparkSession
    cfg: Config
    store: T.TableStore
    previous: T.TableStore | None
    run_id: str
    summary: RunSummary
    previous_source_version: int | None = None
    diff: DocumentDiff | None = None
    source_version: int | None = None
    published_run_id: str | None = None  # the run a refresh starts from
    # The input as read before the lock and found to differ from the published run's: the documents
    # stage neither reads nor compares it again.
    input_read: InputRead | None = None
    # A full build's file input, read in a thread of its own while the lock was taken: the documents stage
    # takes its result (a file read depends on no published state).
    input_ahead: Future | None = None
    changed: dict[str, DataFrame | None] = field(default_factory=dict)  # None: every row is new (a full build)
    counted: dict[str, int] = field(default_factory=dict)  # rows of tables this run wrote, as they were written
    described: dict[str, DataFrame] | None = None  # the graph stage's description lists, for the summaries
    documents_written: bool = True  # False: the input was the published documents again, nothing written
    document_chars: int | None = None  # the characters of every document read, where the read counted them
    document_rows: pd.DataFrame | None = None  # the documents' (id, text) where the read was on the driver
    # Until the graph stage, a full build's text units and extracted instances where the driver holds them.
    unit_rows: pd.DataFrame | None = None
    instance_rows: pd.DataFrame | None = None  # as ``extraction.instances_from_results`` gives them
    # A full build's entity and relationship rows as the graph stage wrote them on the driver (small graphs),
    # so the communities do not read them back.
    graph_rows: tuple | None = None
    # Tables this run wrote, cached as written: a later stage reads them from memory, not back from Delta
    # (a read of a table just written costs a snapshot and a file-listing Spark job before any row).
    written: dict[str, DataFrame] = field(default_factory=dict)
    # Per (publisher, reader): what a stage publishes for a stage that runs ``beside`` it, closed when the
    # publisher ends (the summaries publish (element id, summary)). ``summarized_ids``: the ids the summaries
    # publish one by one as they are answered (a full build's driver-side graph and summaries), else None:
    # their readers wait for the close.
    feeds: dict[tuple[str, str], Feed] = field(default_factory=dict)
    summarized_ids: set[str] | None = None

    def table(self, name: str) -> DataFrame:
        """The rows of ``name`` as this run wrote them (cached), else the live table."""
        return self.written[name] if name in self.written else self.store.read(name)

    def write_cached(self, df: DataFrame, name: str, counted: bool = True) -> int | None:
        """Write ``df`` to ``name`` keeping its rows cached for the later stages; returns the rows written."""
        return self.store.write(self.hold(df, name), name, counted=counted)

    def write_behind(self, df: DataFrame, name: str, counted: bool = True) -> int | None:
        """A full build's ``df`` held cached as the rows of ``name`` for the later stages and written to the
        table in the background (``TableStore.in_background``): no stage waits for a write it does not read.
        Returns its rows where ``counted`` (a count of the cached rows, made before the write reads them)."""
        held = self.hold(df, name)
        rows = held.count() if counted else None
        self.store.in_background(name, lambda: self.store.write(held, name, counted=False))
        return rows

    def hold(self, df: DataFrame, name: str) -> DataFrame:
        """``df`` cached as the rows of ``name`` the later stages read; not written (a later stage writes them)."""
        self.written[name] = T.conform(df, name).persist()
        return self.written[name]

    def publish(self, publisher: str, events: list) -> None:
        for feed in self._feeds_of(publisher):
            feed.put(events)

    def close_feeds(self, publisher: str, failure: BaseException | None = None) -> None:
        for feed in self._feeds_of(publisher):
            feed.close(failure)

    def _feeds_of(self, publisher: str) -> list[Feed]:
        return [feed for (name, _), feed in self.feeds.items() if name == publisher]

    def feed(self, reader: str, publisher: str) -> Feed | None:
        """What ``publisher`` publishes for ``reader``; None where the publisher does not run."""
        return self.feeds.get((publisher, reader))

    def before(self, name: str) -> DataFrame | None:
        """The published table, or None on a full build."""
        return None if self.previous is None else self.previous.read(name)

    @property
    def llm(self) -> bool:
        return self.cfg.extraction.method == "llm"


@dataclass(frozen=True)
class Stage:
    name: str
    inputs: tuple[str, ...]
    # Every published table the stage writes: the run reads the version it publishes of a table as soon
    # as the last stage that lists it ends.
    outputs: tuple[str, ...]
    incremental: str  # what a refresh recomputes and what it keeps
    run: Callable[[Run], None]
    applies: Callable[[Config], bool] = lambda cfg: True
    # The stages this one waits for; None: every earlier stage that writes one of its inputs, but those it
    # runs ``beside``: it starts with them and takes what they publish as it comes (``Run.feeds``).
    after: tuple[str, ...] | None = None
    beside: tuple[str, ...] = ()


def _new_ids(current: DataFrame, before: DataFrame | None) -> DataFrame:
    ids = current.select("id")
    return ids if before is None else ids.join(before.select("id"), "id", "left_anti")


def _kept_rows(before: DataFrame | None, key: str, live_ids: DataFrame) -> DataFrame | None:
    """The published rows whose ``key`` is still among ``live_ids`` (None on a full build)."""
    return None if before is None else before.join(live_ids.select(F.col("id").alias(key)), key, "left_semi")


def _union(kept: DataFrame | None, new: DataFrame) -> DataFrame:
    return new if kept is None else kept.unionByName(new.select(kept.columns))


# ------------------------------------------------------------------ the stages


def documents_stage(run: Run) -> None:
    cfg, store = run.cfg, run.store
    before = run.before(T.DOCUMENTS)
    read = read_documents(run, before)
    documents, rejects, counts = read.documents, read.rejects, read.counts
    if (before is not None and counts["documents"] and run.input_read is None
            and _as_published(run, documents, rejects)):
        # The published rows again (a warm rerun): nothing is written and nothing downstream runs.
        run.documents_written = False
        run.diff = _unchanged_diff(run, counts)
        return

    def write_rejects() -> None:
        if counts["rejected"] or store.exists(T.INPUT_REJECTS):
            store.write(rejects, T.INPUT_REJECTS, counted=False)
        else:  # a first build without rejects
            store.create_empty(T.INPUT_REJECTS)

    # The documents are not counted again: their rows are the distinct documents the read counted.
    if before is None:
        store.in_background(T.INPUT_REJECTS, write_rejects)
        run.write_behind(documents, T.DOCUMENTS, counted=False)
    else:
        in_parallel(run.spark, write_rejects, lambda: run.write_cached(documents, T.DOCUMENTS, counted=False))
    n_documents, run.document_chars, run.document_rows = counts["documents"], counts.get("chars"), read.rows
    run.summary.counts.update({"documents": n_documents, "duplicate documents": counts["duplicates"],
                               "rejected inputs": counts["rejected"]})
    if n_documents == 0:
        raise UserError(f"No readable documents in '{cfg.input.path}': {counts['rejected']} inputs were skipped; "
                        f"see the '{T.INPUT_REJECTS}' table at {store.location(T.INPUT_REJECTS)} for the reasons.")
    if before is not None:
        run.diff = diff_documents(run.table(T.DOCUMENTS), before)
        run.summary.counts.update({f"documents {k}": v for k, v in run.diff.counts.items()})


def _unchanged_diff(run: Run, counts: dict) -> DocumentDiff:
    """The diff of documents read as the published ones, counted in the run summary."""
    diff = DocumentDiff({"new": 0, "changed": 0, "deleted": 0, "unchanged": counts["documents"] + counts["duplicates"]},
                        *(T.local_frame(run.spark, [], "id string") for _ in range(2)), 0, 0)
    run.summary.counts.update({"documents": counts["documents"], "duplicate documents": counts["duplicates"],
                               "rejected inputs": counts["rejected"]})
    run.summary.counts.update({f"documents {k}": v for k, v in diff.counts.items()})
    return diff


def _as_published(run: Run, documents: DataFrame, rejects: DataFrame) -> bool:
    """Whether the documents and rejects just read are the published tables' rows (one Spark job)."""
    pairs = []
    for name, frame in ((T.DOCUMENTS, documents), (T.INPUT_REJECTS, rejects)):
        columns = [f.name for f in T.SCHEMAS[name].fields]
        typed = frame.select([frame[f.name].cast(f.dataType).alias(f.name) for f in T.SCHEMAS[name].fields])
        pairs.append((typed, run.before(name), columns))
    return same_rows(pairs)


def read_documents(run: Run, before: DataFrame | None) -> InputRead:
    """The input's documents. With ``input.change_data_feed`` on a refresh of a Delta input: the
    published documents with only the rows changed since the processed version applied."""
    if run.input_read is not None:
        return run.input_read
    if run.input_ahead is not None:
        return run.input_ahead.result()
    cfg = run.cfg.input
    if cfg.format not in ("delta", "table"):
        return build_documents(run.spark, cfg)
    run.source_version = source_table_version(run.spark, cfg)
    if cfg.change_data_feed and before is not None and run.previous_source_version is not None:
        return build_documents_from_changes(run.spark, cfg, before, run.previous_source_version)
    return build_documents(run.spark, cfg)


def text_units_stage(run: Run) -> None:
    before = run.before(T.TEXT_UNITS)
    documents = run.table(T.DOCUMENTS)
    if before is None and run.document_chars is not None and run.document_chars <= DRIVER_CHUNK_CHARS:
        # A small full build: cut and counted on the driver, no Spark job before extraction's own (none
        # at all where the documents were read on the driver too).
        rows = documents.select("id", "text").toPandas() if run.document_rows is None else run.document_rows
        units, run.unit_rows = text_units_on_driver(run.spark, rows, run.cfg.chunking)
        n_units, run.document_rows = len(run.unit_rows), None
        run.write_behind(units, T.TEXT_UNITS, counted=False)
    else:
        todo = documents if run.diff is None else documents.join(run.diff.added, "id", "left_semi")
        units = _union(_kept_rows(before, "document_id", documents), build_text_units(todo, run.cfg.chunking))
        n_units = run.write_cached(units, T.TEXT_UNITS) if before is not None else run.write_behind(units, T.TEXT_UNITS)
    # A full build extracts every unit (no join of the table with its own ids).
    run.changed[T.TEXT_UNITS] = None if before is None else _new_ids(run.table(T.TEXT_UNITS), before)
    run.summary.counts["text units"] = n_units


def extraction_stage(run: Run) -> None:
    spark, store, cfg = run.spark, run.store, run.cfg
    units = run.table(T.TEXT_UNITS)
    new_ids = run.changed[T.TEXT_UNITS]
    todo = units if new_ids is None else units.join(new_ids, "id", "left_semi")
    if run.llm:
        extracted = extraction.extract_llm_instances(spark, store, todo, cfg.extraction, cfg.llm, run.run_id,
                                                     run.summary.counts, unit_rows=run.unit_rows if new_ids is None else None)
        entity_instances, relationship_instances, claims = extracted.entities, extracted.relationships, extracted.claims
        run.summary.usage += extracted.usages
        # A full build's instances parsed on the driver: counted there, and aggregated by the graph stage as they are.
        run.instance_rows = extracted.rows if run.previous is None else None
        nlp_instances = None
    else:
        # Persisted: both tables come from one extraction pass, not one pass per table written.
        nlp_instances = extraction.nlp_instances(todo, cfg.extraction).persist()
        entity_instances, relationship_instances = extraction.split_instances(nlp_instances)
        claims = T.local_frame(spark, [], T.SCHEMAS[T.CLAIMS])
    # The instances and claims of units that are gone are retracted; the others are kept as extracted.
    kept = {name: _kept_rows(run.before(name), "text_unit_id", units)
            for name in (T.ENTITY_INSTANCES, T.RELATIONSHIP_INSTANCES, T.CLAIMS)}
    # Kept cached for the graph stage. The LLM instances are read from extraction's checkpoint (a scratch
    # table), not from llm_results, which later stages write (Spark re-plans a cached frame on each
    # write to a table it reads).

    def all_claims() -> DataFrame:
        kept_claims = None if kept[T.CLAIMS] is None else kept[T.CLAIMS].drop("human_readable_id")
        keyed_claims = graph.key_claims(claims, cfg.graph)  # the entities' name key, so claims find their entity
        return keep_numbers(_union(kept_claims, keyed_claims.drop("human_readable_id")), run.before(T.CLAIMS), ["id"])

    entity_instances = _union(kept[T.ENTITY_INSTANCES], entity_instances)
    relationship_instances = _union(kept[T.RELATIONSHIP_INSTANCES], relationship_instances)
    if run.previous is None:
        rows = run.instance_rows
        n_entity_instances = run.write_behind(entity_instances, T.ENTITY_INSTANCES, counted=rows is None)
        n_relationship_instances = run.write_behind(relationship_instances, T.RELATIONSHIP_INSTANCES, counted=rows is None)
        if rows is not None:
            n_entity_instances, n_relationship_instances = (int((rows["kind"] == kind).sum())
                                                            for kind in ("entity", "relationship"))
        if not (run.llm and cfg.extraction.claims):  # no claims: on a new root one metadata commit, no Spark job
            store.in_background(T.CLAIMS, lambda: store.write(all_claims(), T.CLAIMS, counted=False)
                                if store.exists(T.CLAIMS) else store.create_empty(T.CLAIMS))
            run.counted[T.CLAIMS] = 0
        else:
            run.counted[T.CLAIMS] = run.write_behind(all_claims(), T.CLAIMS)
    else:
        # The three tables are independent: written at once, their Delta commits (mostly the driver's
        # own latency on a small corpus) overlap.
        n_entity_instances, n_relationship_instances, run.counted[T.CLAIMS] = in_parallel(
            spark, lambda: run.write_cached(entity_instances, T.ENTITY_INSTANCES),
            lambda: run.write_cached(relationship_instances, T.RELATIONSHIP_INSTANCES),
            lambda: store.write(all_claims(), T.CLAIMS))
    if nlp_instances is not None:
        nlp_instances.unpersist()
    run.summary.counts["entity instances"] = n_entity_instances
    run.summary.counts["relationship instances"] = n_relationship_instances


def _carry_descriptions(current: DataFrame, before: DataFrame | None) -> DataFrame:
    """An element whose text units are unchanged keeps its published description (its summary)."""
    if before is None:
        return current
    kept = before.select("id", "text_unit_ids", F.col("description").alias("_kept"))
    return (current.join(kept, ["id", "text_unit_ids"], "left")
            .withColumn("description", F.coalesce("_kept", "description")).drop("_kept"))


def graph_stage(run: Run) -> None:
    store, cfg = run.store, run.cfg
    min_mentions = cfg.extraction.nlp.min_entity_mentions if cfg.extraction.method == "nlp" else 1
    instances = run.summary.counts.get("entity instances", 0) + run.summary.counts.get("relationship instances", 0)
    on_driver = instances <= cfg.graph.driver_max_instances
    built = (_driver_graph if on_driver else _spark_graph)(run, min_mentions)
    run.unit_rows = run.instance_rows = None
    entities, relationships = built.entities, built.relationships

    def write(name: str, frame: DataFrame) -> int:
        if run.graph_rows is not None:  # a full build's rows from the driver: written as they are, held cached
            if _llm_summaries(cfg):  # the summaries write the whole table from the held rows: one write, theirs
                run.hold(frame, name)
            else:
                run.write_behind(frame, name, counted=False)
            return len(run.graph_rows[(T.ENTITIES, T.RELATIONSHIPS).index(name)])
        before = run.before(name)
        if before is not None:  # published numbers kept; new elements numbered after them, in rank order
            frame = keep_numbers(frame.withColumnRenamed("human_readable_id", "_rank"), before, ["_rank"]).drop("_rank")
        written = store.merge(_carry_descriptions(frame, before), name)
        if before is not None:  # elements whose instance set changed: the only ones a refresh summarizes
            current = store.read(name).select("id", "text_unit_ids")
            run.changed[name] = current.join(before.select("id", "text_unit_ids"), ["id", "text_unit_ids"], "left_anti")
        return written

    rows = dict(zip((T.ENTITIES, T.RELATIONSHIPS), in_parallel(run.spark, lambda: write(T.ENTITIES, entities),
                                                                 lambda: write(T.RELATIONSHIPS, relationships))))
    if _llm_summaries(cfg):
        # The lists the summaries are written from; only elements with two or more descriptions are
        # summarized. Spark SQL's are kept (scratch tables) so the summary stage does not aggregate the
        # instances again; the driver's are rows in the plan already, so they are used as they are.
        several = F.size("descriptions") >= 2
        described = {T.ENTITIES: built.nodes.where(several).select("id", "title", "descriptions"),
                     T.RELATIONSHIPS: built.edges.where(several).select("id", "source", "target", "descriptions")}
        run.described = described if on_driver else {
            name: store.checkpoint(frame, f"described_{name}") for name, frame in described.items()}
        if built.several is not None and run.previous is None and not is_connect(run.spark) and all(
                len(ids) <= DRIVER_STAGE_ITEMS for ids in built.several):  # the summaries publish them one by one
            run.summarized_ids = set().union(*built.several)
    run.summary.counts["graph aggregated"] = "on the driver" if on_driver else "in Spark SQL"
    run.summary.counts.update(built.dropped())
    isolated = built.isolated()
    for frame in built.persisted:
        frame.unpersist()
    run.summary.counts["entities"] = rows[T.ENTITIES]
    run.summary.counts["relationships"] = rows[T.RELATIONSHIPS]
    run.summary.counts["claims"] = run.counted[T.CLAIMS] if T.CLAIMS in run.counted else store.read(T.CLAIMS).count()
    # No edge: in no community (Leiden partitions the edge graph), so in no report; kept in the
    # entities table and its embeddings, so local search still finds them.
    run.summary.counts["isolated entities (no relationship)"] = isolated


@dataclass
class BuiltGraph:
    """The graph stage's frames before they are written: ``nodes`` and ``edges`` carry the description
    lists; ``dropped`` and ``isolated`` give the summary's counts once the tables are written."""

    entities: DataFrame
    relationships: DataFrame
    nodes: DataFrame
    edges: DataFrame
    dropped: Callable[[], dict[str, int]]
    isolated: Callable[[], int]
    persisted: tuple[DataFrame, ...] = ()
    several: tuple[list[str], list[str]] | None = None  # on the driver: the ids of entities, relationships with 2+ descriptions


def _spark_graph(run: Run, min_mentions: int) -> BuiltGraph:
    """Spark SQL over the instance tables (a corpus of any size)."""
    store, cfg = run.store, run.cfg
    text_units = run.table(T.TEXT_UNITS)
    all_nodes = graph.entity_nodes(run.table(T.ENTITY_INSTANCES), cfg.graph, text_units).persist()
    nodes = all_nodes.where(F.col("frequency") >= min_mentions).drop("_cut", "_mentions")
    # Persisted too: the degrees, the entities and the relationships written all read the edges, and
    # the drop counts read the candidates (the instances are keyed once, not again to count).
    candidates = graph.counted_relationships(run.table(T.RELATIONSHIP_INSTANCES), cfg.graph, text_units).persist()
    edges = graph.between_entities(candidates, nodes).persist()
    entities, relationships = graph.add_degrees(nodes, edges.drop("_cut", "_instances"),
                                                resolve_backend(run.spark, cfg.graph.backend))
    counts = run.summary.counts
    return BuiltGraph(entities, relationships, nodes, edges,
                      dropped=lambda: graph.drop_counts(all_nodes, candidates, edges, min_mentions,
                                                        counts["entity instances"], counts["relationship instances"]),
                      isolated=lambda: store.read(T.ENTITIES).where(F.col("degree") == 0).count(),
                      persisted=(all_nodes, candidates, edges))


def _driver_graph(run: Run, min_mentions: int) -> BuiltGraph:
    """``graph.driver_graph`` over the instances (a small corpus): the rows the run holds, else one collect per table."""
    spark, store, cfg = run.spark, run.store, run.cfg
    if run.instance_rows is not None:
        entity_rows, relationship_rows = extraction.graph_inputs(run.instance_rows)
    else:
        entity_rows = run.table(T.ENTITY_INSTANCES).select(extraction.ENTITY_GRAPH_COLUMNS).toPandas()
        relationship_rows = run.table(T.RELATIONSHIP_INSTANCES).select(extraction.RELATIONSHIP_GRAPH_COLUMNS).toPandas()
    unit_columns = ["id", "document_id", "chunk_index"]
    built = graph.driver_graph(entity_rows, relationship_rows, cfg.graph, min_mentions,
                               run.table(T.TEXT_UNITS).select(unit_columns).toPandas() if run.unit_rows is None
                               else run.unit_rows[unit_columns])
    descriptions = StructField("descriptions", ArrayType(StringType()))

    def frame(rows, name: str) -> DataFrame:
        schema = StructType(T.SCHEMAS[name].fields + [descriptions])
        return spark.createDataFrame(rows[schema.fieldNames()], schema)

    entities, relationships = frame(built.entities, T.ENTITIES), frame(built.relationships, T.RELATIONSHIPS)
    isolated = int((built.entities["degree"] == 0).sum())
    if run.previous is None:  # written as they are (a refresh renumbers them)
        run.graph_rows = (built.entities[["human_readable_id", "id", "title", "degree"]],
                          built.relationships[["id", "source", "target", "weight", "text_unit_ids"]])
    several = tuple(list(rows.loc[rows["descriptions"].map(len) >= 2, "id"])
                    for rows in (built.entities, built.relationships))
    return BuiltGraph(entities, relationships, entities, relationships, dropped=lambda: built.dropped,
                      isolated=lambda: isolated, several=several)


def summarize_stage(run: Run) -> None:
    # A full build summarizes every element with several descriptions: no join with the changed ids.
    only = None if run.previous is None else {name: run.changed[name].select("id") for name in (T.ENTITIES, T.RELATIONSHIPS)}
    usages = summarize_graph(run.spark, run.store, run.cfg, run.run_id, only, run.described, run.written,
                             None if run.summarized_ids is None else lambda events: run.publish(SUMMARIES, events))
    run.summary.usage += usages
    run.summary.counts["summaries failed (descriptions kept joined, retried next run)"] = sum(u.failures for u in usages)


def communities_stage(run: Run) -> None:
    store, cfg = run.store, run.cfg
    table, counts = communities.cluster_graph(run.spark, run.table(T.ENTITIES), run.table(T.RELATIONSHIPS),
                                              cfg.communities, cfg.graph.largest_component_only,
                                              resolve_backend(run.spark, cfg.graph.backend),
                                              previous=run.before(T.COMMUNITIES),
                                              previous_relationships=run.before(T.RELATIONSHIPS),
                                              on_driver=run.summary.counts["entities"] + run.summary.counts["relationships"]
                                              <= cfg.graph.driver_max_instances, collected=run.graph_rows)
    if run.graph_rows is not None:  # built from the driver's rows: kept cached, the reports read no Delta back
        run.write_behind(table, T.COMMUNITIES, counted=False)
    else:  # it reads the entities, which the summaries rewrite: a cached copy would be planned again
        store.write(table, T.COMMUNITIES, counted=False)
    run.summary.counts["communities per level"] = counts["communities_per_level"]
    run.summary.counts["entities not clustered"] = run.summary.counts["entities"] - counts["clustered_entities"]
    if run.previous is not None:
        kept = store.read(T.COMMUNITIES).join(run.before(T.COMMUNITIES).select("id"), "id", "left_semi").count()
        run.summary.counts["communities kept"] = f"{kept} of {counts['communities']}"


def reports_stage(run: Run) -> None:
    build_reports(run.spark, run.store, run.cfg, run.run_id, run.summary, run.table,
                  run.feed("community_reports", SUMMARIES), run.summarized_ids)


def _record_embeddings(run: Run, built: tuple[dict[str, int], list[StageUsage]]) -> None:
    counts, usages = built
    run.summary.counts.update(counts)
    run.summary.usage += usages


def text_unit_embeddings_stage(run: Run) -> None:
    _record_embeddings(run, build_embeddings(run.spark, run.store, run.cfg, run.previous,
                                             (T.TEXT_UNIT_EMBEDDINGS,), run_id=run.run_id))


def entity_embeddings_stage(run: Run) -> None:
    summaries = run.feed("entity_embeddings", SUMMARIES)
    if summaries is not None and run.summarized_ids is not None and run.cfg.embeddings.provider == "openai":
        entities = [row.asDict() for row in run.table(T.ENTITIES).select("id", "title", "description").collect()]
        _record_embeddings(run, embed_entities_beside_summaries(run.spark, run.store, run.cfg, entities,
                                                                run.summarized_ids, summaries, run.run_id))
        return
    if summaries is not None:
        summaries.all()  # the entities as the summaries leave them
    _record_embeddings(run, build_embeddings(run.spark, run.store, run.cfg, run.previous,
                                             (T.ENTITY_EMBEDDINGS,), run_id=run.run_id))


SUMMARIES = "summarize_descriptions"


def _llm_summaries(cfg: Config) -> bool:
    return cfg.extraction.method == "llm" and cfg.extraction.summarize_descriptions


STAGES: tuple[Stage, ...] = (
    Stage("documents", ("input",), (T.DOCUMENTS, T.INPUT_REJECTS),
          "read every source (or, with input.change_data_feed, only the Delta rows changed since the processed "
          "version) before the lock; the published documents again end the run there (no lock, nothing written); "
          "else diff by source and content hash against the published documents", documents_stage),
    Stage("text_units", (T.DOCUMENTS,), (T.TEXT_UNITS,),
          "chunk only documents whose content is new; drop the units of documents whose content is gone",
          text_units_stage),
    Stage("extraction", (T.TEXT_UNITS,), (T.ENTITY_INSTANCES, T.RELATIONSHIP_INSTANCES, T.CLAIMS),
          "extract only new units; retract the instances and claims of units that are gone; claims keep their numbers",
          extraction_stage),
    Stage("text_unit_embeddings", (T.TEXT_UNITS,), (T.TEXT_UNIT_EMBEDDINGS,),
          "embed only new or changed text units; the others keep their vectors", text_unit_embeddings_stage),
    Stage("graph", (T.ENTITY_INSTANCES, T.RELATIONSHIP_INSTANCES), (T.ENTITIES, T.RELATIONSHIPS),
          "aggregate all instances in SQL, MERGE by id; an element whose text units did not change keeps its "
          "description; numbers kept, new elements numbered after the largest", graph_stage),
    Stage(SUMMARIES, (T.ENTITIES, T.RELATIONSHIPS), (T.ENTITIES, T.RELATIONSHIPS),
          "summarize only elements whose instance set changed (the table rewritten once with their descriptions)", summarize_stage,
          _llm_summaries),
    # After the graph only: the communities read no description, the one thing summaries change.
    Stage("communities", (T.ENTITIES, T.RELATIONSHIPS), (T.COMMUNITIES,),
          "Leiden seeded with the published level-0 partition; a published community whose edges did not change "
          "is kept whole; ids from members, numbers kept", communities_stage, after=("graph",)),
    # Beside the summaries: a full build's driver-side report context is built and called as soon as the
    # summaries of its elements are answered; otherwise the stage waits for the summaries to end.
    Stage("community_reports", (T.COMMUNITIES, T.ENTITIES, T.RELATIONSHIPS, T.CLAIMS), (T.COMMUNITY_REPORTS,),
          "bottom-up; a context already reported is a cache hit, so only changed contexts are paid for",
          reports_stage, beside=(SUMMARIES,)),
    # Beside the summaries too: a full build's endpoint vectors of final descriptions are cached while the
    # others are summarized, each summary's as it comes; the table is written once the last summary came.
    Stage("entity_embeddings", (T.ENTITIES,), (T.ENTITY_EMBEDDINGS,),
          "embed only new or changed descriptions; the others keep their vectors", entity_embeddings_stage,
          beside=(SUMMARIES,)),
)


# ------------------------------------------------------------------ one run


def _totals(summary: RunSummary) -> dict:
    return {"calls": sum(u.calls for u in summary.usage), "prompt_tokens": sum(u.prompt_tokens for u in summary.usage),
            "completion_tokens": sum(u.completion_tokens for u in summary.usage),
            "est_cost_usd": float(round(sum(u.est_cost_usd for u in summary.usage), 6))}


# What the stages' Python tasks import, per extraction method (imported ahead by the worker warm-up).
_WORKER_MODULES = {"llm": ("graphrag_spark.index.chunks", "graphrag_spark.llm.stage", "graphrag_spark.index.extract_llm"),
                   "nlp": ("graphrag_spark.index.chunks", "graphrag_spark.index.extract_nlp")}


def run_index(spark: SparkSession, cfg: Config, full: bool = False) -> RunSummary:
    """Index ``cfg.input`` into ``cfg.storage``: a full build on a new root (or with ``full``), else a
    refresh of the published index. Holds the root's lock; publishes the result in ``index_runs``.

    A refresh reads its input before it takes the lock: input that reads as the published documents
    (a scheduled rerun with nothing new) ends the run there, with no lock taken and nothing written or
    recorded, so it never waits for, or blocks, another job. Otherwise the locked run reuses that read
    while the published run is still the one it was compared with."""
    store = T.TableStore(spark, cfg.storage)
    run_id = new_run_id()
    ahead, warming = _read_input_ahead(spark, cfg), None
    try:
        checked = None if full else _check_input(spark, cfg, store, run_id, ahead)
        if checked is not None and checked.diff is not None:
            return checked.summary
        # The run goes on (a rerun that ends at its input read needs no worker): workers start, and the API keys
        # are checked, beside the lock's commit. It is the JVM's first Delta write and ~0.7 s slower beside the
        # workers on 2 cores, but extraction's first call, which waits on a worker, comes ~1.5 s sooner (A
        # Christmas Carol, 120 RPM).
        warming = warm_python_workers(spark, _WORKER_MODULES[cfg.extraction.method], cfg.chunking.encoding)
        check_ahead([model for model, called in ((cfg.llm.chat, "llm" in (cfg.extraction.method, cfg.reports.method)),
                                                 (cfg.llm.embedding, cfg.embeddings.provider == "openai")) if called])
        with runs.IndexLock(store, run_id, cfg.refresh):
            return _locked_run(spark, cfg, store, run_id, full, checked, ahead)
    finally:
        # A run that ends early (the root locked, say) leaves none of its Spark jobs running behind it.
        if warming is not None:
            warming.join()
        if ahead is not None:
            wait([ahead])


def _read_input_ahead(spark: SparkSession, cfg: Config) -> Future | None:
    """A file input's documents, read in a thread of their own from the start of the run: the files read
    the same whatever the published run, so the read overlaps the lookup of that run and the lock
    (a table input's read depends on the version the published run processed). None for a table."""
    if cfg.input.format in ("delta", "table"):
        return None
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="input")
    try:
        return pool.submit(inheriting(spark, build_documents), spark, cfg.input)
    finally:
        pool.shutdown(wait=False)


def _plan_run(spark: SparkSession, cfg: Config, store: T.TableStore, run_id: str, full: bool) -> tuple[Run, Row | None]:
    """The run against the root's published state: a refresh of the last succeeded run, or a full build."""
    published = runs.published_run(store)
    summary = RunSummary(run_id=run_id)
    if published is not None and not full and published["config_fingerprint"] != runs.config_fingerprint(cfg):
        summary.counts["note"] = "index settings changed since the published run: full rebuild (cached LLM results reused)"
        full = True
    previous = None if published is None or full else T.TableStore(spark, cfg.storage, dict(published["table_versions"]))
    summary.mode = "refresh" if previous is not None else "full"
    run = Run(spark, cfg, store, previous, run_id, summary,
              published_run_id=None if previous is None else published["run_id"],
              previous_source_version=None if published is None else published["source_version"])
    return run, published


def _check_input(spark: SparkSession, cfg: Config, store: T.TableStore, run_id: str,
                 ahead: Future | None) -> Run | None:
    """A refresh's input read (``ahead``, or the table's) and compared with the published documents,
    without the lock; its ``diff`` is set only where nothing changed. None for a full build."""
    if not store.exists(T.INDEX_RUNS):
        return None  # a new root
    run, _ = _plan_run(spark, cfg, store, run_id, full=False)
    if run.previous is None:
        return None
    with run.summary.stage("input_check"):
        run.input_read = ahead.result() if ahead is not None else read_documents(run, run.before(T.DOCUMENTS))
        read = run.input_read
        if read.counts["documents"] and _as_published(run, read.documents, read.rejects):
            run.diff = _unchanged_diff(run, read.counts)
            run.summary.counts["nothing changed"] = (f"the input reads as published run {run.published_run_id}: "
                                                     "no lock taken, nothing written")
    return run


def _locked_run(spark: SparkSession, cfg: Config, store: T.TableStore, run_id: str, full: bool,
                checked: Run | None, ahead: Future | None) -> RunSummary:
    run, published = _plan_run(spark, cfg, store, run_id, full)
    summary, fingerprint = run.summary, runs.config_fingerprint(cfg)
    if checked is not None and run.previous is not None and run.published_run_id == checked.published_run_id:
        run.input_read, run.source_version = checked.input_read, checked.source_version
        summary.seconds.update(checked.summary.seconds)
    elif run.previous is None:
        run.input_ahead = ahead
    started = _utcnow()
    common = {"run_id": run_id, "mode": summary.mode, "started_at": started, "job": runs.describe_job(),
              "config_fingerprint": fingerprint}
    store.deferred_usage = []  # one llm_usage commit for the run, not one per LLM stage
    store.fresh_results = FreshResults()  # no cache lookup reads a table this run created
    in_background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="run-record")
    # The RUNNING row only tells monitors: appended while the first stages run, and done before the outcome is.
    running = in_background.submit(inheriting(spark, runs.record_run), store, status=runs.RUNNING,
                                   **common)
    try:
        versions = _run_stages(run, published)
        store.settle()
        running.result()
    except BaseException as exc:
        with suppress(Exception):  # the stages' error is the one to report; no write outlives the run
            store.settle()
        with suppress(Exception):
            running.result()
        with suppress(Exception):
            _append_deferred_usage(store)
        runs.record_run(store, status=runs.FAILED, ended_at=_utcnow(), error=f"{type(exc).__name__}: {str(exc)[:500]}",
                        **common, **_totals(summary))
        raise
    finally:
        in_background.shutdown(wait=True)
        for frame in run.written.values():
            frame.unpersist()
    diff = run.diff.counts if run.diff is not None else {"new": summary.counts["documents"]}
    # Independent appends (usage is not a published table): at once.
    in_parallel(spark, lambda: _append_deferred_usage(store), lambda: runs.record_run(
        store, status=runs.SUCCEEDED, ended_at=_utcnow(), table_versions=versions, source_version=run.source_version,
        documents_new=diff.get("new", 0), documents_changed=diff.get("changed", 0),
        documents_deleted=diff.get("deleted", 0), documents_unchanged=diff.get("unchanged", 0), **common,
        **_totals(summary)))
    store.drop_scratch()
    with summary.stage("retention"):
        summary.counts.update(retention.apply(run))
    return summary


def _append_deferred_usage(store: T.TableStore) -> None:
    rows, store.deferred_usage = store.deferred_usage or [], None
    append_usage(store.spark, store, rows)


def stage_predecessors(stages: tuple[Stage, ...]) -> dict[str, set[str]]:
    """Per stage, the stages it waits for: its declared ``after``, else every earlier stage that
    writes one of its inputs (each stage reads its inputs only once those writers are done) but the
    ones it runs ``beside``."""
    names = {stage.name for stage in stages}
    return {stage.name: ({name for name in stage.after if name in names} if stage.after is not None else
                         {earlier.name for earlier in stages[:i]
                          if set(earlier.outputs) & set(stage.inputs) and earlier.name not in stage.beside})
            for i, stage in enumerate(stages)}


def run_stages(stages: tuple[Stage, ...], start: Callable[[Stage], None],
               stop_after: Callable[[Stage], bool] = lambda stage: False,
               interrupted: Callable[[], None] = lambda: None) -> bool:
    """Run every stage, each as soon as its predecessors are done, the ready ones at the same time
    in threads of their own, in table order. After a stage fails no other one starts; the running
    ones finish (what they paid for is committed), then the first failure is raised. Returns False
    where ``stop_after`` a finished stage said to start nothing more. ``interrupted`` runs when the
    driver itself is interrupted while stages run (Ctrl-C)."""
    waiting = stage_predecessors(stages)
    by_name = {stage.name: stage for stage in stages}
    done: set[str] = set()
    running: dict[Future, Stage] = {}
    failure: BaseException | None = None
    stopped = False
    with ThreadPoolExecutor(max_workers=len(stages) or 1, thread_name_prefix="index-stage") as pool:
        try:
            while True:
                if failure is None and not stopped:
                    started = set(done) | {stage.name for stage in running.values()}
                    for name, needs in waiting.items():
                        # A stage beside another starts once that one has: it never waits for one that does not run.
                        if name not in started and needs <= done and set(by_name[name].beside) & set(by_name) <= started:
                            running[pool.submit(start, by_name[name])] = by_name[name]
                            started.add(name)
                if not running:
                    return not stopped
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in sorted(finished, key=lambda f: stages.index(running[f])):
                    stage = running.pop(future)
                    if future.exception() is not None:
                        failure = failure or future.exception()
                    else:
                        done.add(stage.name)
                        stopped = stopped or stop_after(stage)
                if failure is not None and not running:
                    raise failure
        except BaseException as exc:
            if exc is not failure:
                interrupted()
            raise


def _run_stages(run: Run, published) -> dict[str, int]:
    """Every applicable stage, overlapping where they are independent; returns the table versions to publish."""
    stages = tuple(stage for stage in STAGES if stage.applies(run.cfg))
    pools = not is_connect(run.spark)
    last_writer = {name: stage.name for stage in stages for name in stage.outputs}  # a later writer wins
    final_versions: dict[str, Future] = {}

    names = {stage.name for stage in stages}
    run.feeds = {(publisher, stage.name): Feed() for stage in stages for publisher in stage.beside if publisher in names}

    def start(stage: Stage) -> None:
        if pools:  # this thread's jobs share the cores fairly with the other stages' (spark.scheduler.mode=FAIR)
            run.spark.sparkContext.setLocalProperty("spark.scheduler.pool", stage.name)
        try:
            with run.summary.stage(stage.name):
                run.store.raise_background_failure()
                stage.run(run)
                run.store.raise_background_failure()
        except BaseException as exc:
            run.close_feeds(stage.name, exc)
            raise
        run.close_feeds(stage.name)
        # Tables no later stage writes are final now: their versions are read while the other stages
        # run, not one after the other once all are done.
        for name in stage.outputs:
            if last_writer[name] == stage.name:
                final_versions[name] = reading.submit(run.store.version_or_none, name)

    def nothing_changed(stage: Stage) -> bool:
        # The published content again: nothing downstream can change (0 calls).
        return stage.name == "documents" and run.diff is not None and run.diff.empty

    def cancel() -> None:  # the running stages' threads cannot be stopped, their jobs can
        if pools:
            run.spark.sparkContext.cancelAllJobs()

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="table-version") as reading:
        finished = run_stages(stages, start, nothing_changed, cancel)
    run.summary.wall_s = round(time.perf_counter() - started, 2)
    if not finished:
        # The other tables stay published as they are, whatever a failed run may have written since.
        run.summary.counts["nothing changed"] = "published tables kept"
        documents = next(stage for stage in stages if stage.name == "documents")
        written = documents.outputs if run.documents_written else ()
        return {**dict(published["table_versions"]), **{name: run.store.version(name) for name in written}}
    return runs.current_versions(run.store, {name: version.result() for name, version in final_versions.items()})


def build_reports(spark: SparkSession, store: T.TableStore, cfg: Config, run_id: str, summary: RunSummary,
                  read: Callable[[str], DataFrame], summaries: Feed | None = None,
                  summarized_ids: set[str] | None = None) -> None:
    """Bottom-up: the deepest level first, each level's reports written before the next level starts,
    so a higher level's context can substitute the finished reports of its sub-communities. LLM
    reports are scheduled across levels (``reports.build_llm_reports``, which takes ``summaries`` and
    ``summarized_ids`` as they come); the others wait for ``summaries`` to end."""
    use_llm = cfg.reports.method == "llm" or (cfg.reports.method == "auto" and cfg.extraction.method == "llm")
    if use_llm:
        claims = store.read(T.CLAIMS) if store.exists(T.CLAIMS) else None
        counts, usages = reports.build_llm_reports(spark, store, cfg, run_id, claims, read, summaries, summarized_ids)
        summary.usage += usages
        summary.counts.update(counts)
        return
    if summaries is not None:
        summaries.all()
    all_communities = read(T.COMMUNITIES)
    entities, relationships = read(T.ENTITIES), read(T.RELATIONSHIPS)
    levels = sorted((r[0] for r in all_communities.select("level").distinct().collect()), reverse=True)
    max_findings = cfg.reports.max_findings
    per_level = {}
    finer = None
    for level in levels:
        contexts = reports.community_contexts(all_communities.where(F.col("level") == level), entities, relationships,
                                              finer, None, all_communities.where(F.col("level") == level + 1))
        level_reports = reports.generate_level_reports(contexts, lambda row: reports.extractive_report(row, max_findings))
        store.write(level_reports, T.COMMUNITY_REPORTS, mode="overwrite" if level == levels[0] else "append",
                    counted=False)
        finer = store.read(T.COMMUNITY_REPORTS).where(F.col("level") == level)
        per_level[level] = finer.count()
    if not levels:
        store.write(T.local_frame(spark, [], T.SCHEMAS[T.COMMUNITY_REPORTS]), T.COMMUNITY_REPORTS, counted=False)
    summary.counts["reports per level"] = dict(sorted(per_level.items()))


def estimate_extraction(spark: SparkSession, cfg: Config) -> dict:
    """``--dry-run``: what LLM extraction would spend, without calling anything or writing tables.

    Chunks already in the LLM cache cost nothing. Per chunk: one extraction call, the gleanings and
    their checks (``extraction_calls_at_most``), one claims call (a stage of its own); prompt
    tokens count the rendered
    template plus the chunk for each call (gleaning calls also resend the conversation, so this
    is a lower bound for them); completion tokens are estimated at half the chunk per call.
    """
    from graphrag_spark.index.extract_llm import ExtractionPrompts, extraction_calls_at_most
    from graphrag_spark.llm.stage import with_item_keys
    from graphrag_spark.tokens import count_tokens

    store = T.TableStore(spark, cfg.storage)
    read = build_documents(spark, cfg.input)
    units = build_text_units(read.documents, cfg.chunking)
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
    calls_per_chunk = extraction_calls_at_most(cfg.extraction)
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
    return {"documents": read.counts["documents"], "chunks to extract": n_chunks,
            "chunks already cached": items.select("item_key").distinct().count() - n_chunks,
            "extraction calls (at most)": calls, "prompt tokens (estimate)": prompt_tokens,
            "completion tokens (estimate)": completion_tokens, "estimated cost USD": round(cost, 4),
            "not included": "description summaries (1 call per multi-description node/edge) and "
                            "reports (1-2 calls per community), known only after extraction"}
