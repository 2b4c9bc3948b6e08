"""Table names, their schemas, and Delta read/write: the one place the index layout is defined.

Every persisted table is a Delta table, either a path ``<storage.root>/<name>`` (a Unity Catalog
Volume path ``/Volumes/<catalog>/<schema>/...`` too) or a catalog table ``<storage.database>.<name>``,
``<storage.catalog>.<storage.database>.<name>`` with a catalog (Unity Catalog's three-part names).
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import timezone
from typing import Callable, Iterable

import pandas as pd
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    TimestampType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from graphrag_spark.compat import analysis_condition, inheriting, is_connect, parse_schema
from graphrag_spark.config import StorageConfig


def _schema(*fields: tuple[str, object]) -> StructType:
    return StructType([StructField(name, dtype, True) for name, dtype in fields])


STR, INT, LONG, DBL = StringType(), IntegerType(), LongType(), DoubleType()
STRS = ArrayType(StringType())
INTS = ArrayType(IntegerType())


def local_frame(spark: SparkSession, rows: Iterable, schema: StructType | str) -> DataFrame:
    """Rows the driver holds (tuples in ``schema``'s column order, Rows or dicts) as a DataFrame, by Arrow;
    ``schema`` a StructType or a DDL string.

    ``createDataFrame`` of a Python list (an empty one too) pickles the rows through a Python job, and on
    a local master that job's worker comes from a Python worker daemon of its own, not the UDFs' one:
    about a second of CPU to start it as the index starts, and a Python task for every such frame after.
    A naive timestamp means local time, as it does to ``createDataFrame``."""
    schema = schema if isinstance(schema, StructType) else parse_schema(spark, schema)
    names = schema.fieldNames()
    frame = pd.DataFrame([[row.get(name) for name in names] if isinstance(row, dict) else
                          [row[name] for name in names] if isinstance(row, Row) and hasattr(row, "__fields__") else
                          list(row) for row in rows], columns=names, dtype=object)
    for field in schema.fields:
        if isinstance(field.dataType, TimestampType):
            frame[field.name] = pd.to_datetime([None if value is None else value.astimezone(timezone.utc)
                                                for value in frame[field.name]], utc=True)
    return spark.createDataFrame(frame, schema)

DOCUMENTS = "documents"
INPUT_REJECTS = "input_rejects"
TEXT_UNITS = "text_units"
ENTITY_INSTANCES = "entity_instances"
RELATIONSHIP_INSTANCES = "relationship_instances"
CLAIMS = "claims"
ENTITIES = "entities"
RELATIONSHIPS = "relationships"
COMMUNITIES = "communities"
COMMUNITY_REPORTS = "community_reports"
LLM_RESULTS = "llm_results"
LLM_USAGE = "llm_usage"
TEXT_UNIT_EMBEDDINGS = "text_unit_embeddings"
ENTITY_EMBEDDINGS = "entity_embeddings"
EMBEDDING_CACHE = "embedding_cache"
RAPTOR_NODES = "raptor_nodes"
RAPTOR_EDGES = "raptor_edges"
# The index's run log and publication record, and the lock that keeps one job at a time on a root.
INDEX_RUNS = "index_runs"
INDEX_LOCK = "index_lock"
# Not an index table: the Delta table that `jobs/query.py --questions ... --output PATH` writes.
QUERY_ANSWERS = "query_answers"
# The evaluation's tables (jobs/evaluate.py), under evaluation.root, with its own llm_results/llm_usage.
EVAL_QUESTIONS = "eval_questions"
EVAL_ANSWERS = "eval_answers"
EVAL_JUDGEMENTS = "eval_judgements"
EVAL_CLAIMS = "eval_claims"
EVAL_COMPARISONS = "eval_comparisons"

SCHEMAS: dict[str, StructType] = {
    DOCUMENTS: _schema(
        ("id", STR), ("title", STR), ("text", STR), ("source", STR), ("duplicate_sources", STRS),
        ("metadata", MapType(StringType(), StringType())), ("n_chars", LONG),
    ),
    # Inputs that were skipped, with the reason: counted, never silently dropped.
    INPUT_REJECTS: _schema(("source", STR), ("reason", STR), ("n_bytes", LONG)),
    TEXT_UNITS: _schema(("id", STR), ("document_id", STR), ("chunk_index", INT), ("text", STR), ("n_tokens", INT)),
    ENTITY_INSTANCES: _schema(
        ("id", STR), ("text_unit_id", STR), ("name", STR), ("type", STR), ("description", STR), ("method", STR),
    ),
    RELATIONSHIP_INSTANCES: _schema(
        ("id", STR), ("text_unit_id", STR), ("source", STR), ("target", STR), ("description", STR),
        ("strength", DBL), ("method", STR),
    ),
    CLAIMS: _schema(
        ("id", STR), ("human_readable_id", LONG), ("text_unit_id", STR), ("subject", STR), ("object", STR), ("type", STR), ("status", STR),
        ("start_date", STR), ("end_date", STR), ("description", STR), ("source_text", STR),
    ),
    ENTITIES: _schema(
        ("id", STR), ("human_readable_id", LONG), ("title", STR), ("type", STR), ("type_variants", STRS),
        ("description", STR), ("text_unit_ids", STRS), ("frequency", LONG), ("degree", LONG),
    ),
    RELATIONSHIPS: _schema(
        ("id", STR), ("human_readable_id", LONG), ("source", STR), ("target", STR), ("description", STR),
        ("weight", DBL), ("text_unit_ids", STRS), ("combined_degree", LONG),
    ),
    COMMUNITIES: _schema(
        ("id", STR), ("community", INT), ("level", INT), ("parent", INT), ("children", INTS), ("title", STR),
        ("entity_ids", STRS), ("relationship_ids", STRS), ("text_unit_ids", STRS), ("size", INT),
    ),
    COMMUNITY_REPORTS: _schema(
        ("id", STR), ("community", INT), ("level", INT), ("title", STR), ("summary", STR), ("rating", DBL),
        ("rating_explanation", STR), ("findings", ArrayType(_schema(("summary", STR), ("explanation", STR)))),
        ("full_content", STR), ("method", STR),
    ),
    # One row per LLM work item and run: the cache (successes are never paid again) and the
    # failure log (error rows are retried by the next run).
    LLM_RESULTS: _schema(
        ("item_key", STR), ("stage", STR), ("item_id", STR), ("model", STR), ("run_id", STR), ("result", STR),
        ("error", STR), ("n_calls", INT), ("attempts", INT), ("n_429", INT), ("prompt_tokens", LONG),
        ("completion_tokens", LONG), ("call_latencies", ArrayType(DoubleType())), ("created_at", TimestampType()),
        ("queue_waits", ArrayType(DoubleType())), ("n_cut", INT),
    ),
    LLM_USAGE: _schema(
        ("run_id", STR), ("stage", STR), ("items", LONG), ("cache_hits", LONG), ("calls", LONG), ("retries", LONG),
        ("failures", LONG), ("n_429", LONG), ("prompt_tokens", LONG), ("completion_tokens", LONG),
        ("latency_p50_s", DBL), ("latency_p95_s", DBL), ("est_cost_usd", DBL), ("wall_s", DBL),
        ("queue_p50_s", DBL), ("queue_p95_s", DBL), ("cut_at_max_tokens", LONG),
    ),
    # A null vector is an item whose embedding call failed (counted in the run summary).
    TEXT_UNIT_EMBEDDINGS: _schema(("id", STR), ("vector", ArrayType(FloatType())), ("model_name", STR)),
    ENTITY_EMBEDDINGS: _schema(("id", STR), ("vector", ArrayType(FloatType())), ("model_name", STR)),
    # Every vector an embeddings endpoint returned, keyed like llm_results by what determines it
    # (model, requested dimensions, 0 = the model's own; sha256 of the text): never paid twice.
    EMBEDDING_CACHE: _schema(("model", STR), ("dimensions", INT), ("text_hash", STR),
                             ("vector", ArrayType(FloatType())), ("created_at", TimestampType())),
    # RAPTOR trees (one per corpus, or one per document: tree_id). Layer 0 = leaf chunks (chunk_id and
    # document_id set); layer n = summaries of clusters of the nodes below, their children in raptor_edges.
    # A failed summary is a row with status 'failed', its error, no text and no embedding.
    RAPTOR_NODES: _schema(
        ("tree_id", STR), ("id", STR), ("layer", INT), ("text", STR), ("n_tokens", INT),
        ("embedding", ArrayType(FloatType())), ("model_name", STR), ("chunk_id", STR), ("document_id", STR),
        ("status", STR), ("error", STR),
    ),
    # probability: the child's cluster membership (product of its posteriors along the clustering passes).
    RAPTOR_EDGES: _schema(("tree_id", STR), ("parent", STR), ("child", STR), ("probability", DBL)),
    # One row when a run starts (status 'running') and one when it ends ('succeeded' or 'failed'). The
    # 'succeeded' row's table_versions is the published index: readers open every table at those versions.
    INDEX_RUNS: _schema(
        ("run_id", STR), ("mode", STR), ("status", STR), ("started_at", TimestampType()), ("ended_at", TimestampType()),
        ("job", STR), ("documents_new", LONG), ("documents_changed", LONG), ("documents_deleted", LONG),
        ("documents_unchanged", LONG), ("calls", LONG), ("prompt_tokens", LONG), ("completion_tokens", LONG),
        ("est_cost_usd", DBL), ("table_versions", MapType(StringType(), LongType())), ("source_version", LONG),
        ("config_fingerprint", STR), ("error", STR),
    ),
    # One row: who holds the root (run_id null = free). Taken and released by conflict-checked Delta commits.
    INDEX_LOCK: _schema(
        ("lock", STR), ("run_id", STR), ("job", STR), ("host", STR), ("pid", LONG), ("acquired_at", TimestampType()),
        ("heartbeat_at", TimestampType()),
    ),
    # latency_s is per question; in batch mode it is the batch's wall time shared equally by its questions.
    QUERY_ANSWERS: _schema(
        ("question", STR), ("method", STR), ("level", INT), ("answer", STR), ("context_units", INT),
        ("context_tokens", LONG), ("prompt_tokens", LONG), ("completion_tokens", LONG), ("llm_calls", INT),
        ("failed_llm_calls", INT), ("malformed_map_answers", INT), ("latency_s", DBL),
    ),
    # Every generated (or given) question; duplicate_of names the kept question a dropped one repeats.
    EVAL_QUESTIONS: _schema(
        ("id", STR), ("position", INT), ("persona", STR), ("task", STR), ("question", STR), ("duplicate_of", STR),
    ),
    # One judgement per (question, pair, criterion, order, repeat); score_a is the first condition's 100/50/0,
    # null with the error when the judgement failed (retried by the next run).
    EVAL_JUDGEMENTS: _schema(
        ("question_id", STR), ("condition_a", STR), ("condition_b", STR), ("criterion", STR), ("order", STR),
        ("repeat", INT), ("winner", INT), ("score_a", DBL), ("reasoning", STR), ("error", STR),
    ),
    # Claims of one answer after deduplication, and its cluster count at each threshold.
    EVAL_CLAIMS: _schema(
        ("question_id", STR), ("condition", STR), ("n_sentences", INT), ("n_selected", INT), ("claims", STRS),
        ("n_claims", INT), ("cluster_thresholds", ArrayType(DoubleType())), ("n_clusters", INTS), ("error", STR),
    ),
    # One row per metric (a criterion, `claims` or `clusters@<t>`) and condition pair: win rate of a over b
    # (judged: mean score; claims: questions where a has more, ties half), means, Wilcoxon and Holm.
    EVAL_COMPARISONS: _schema(
        ("metric", STR), ("condition_a", STR), ("condition_b", STR), ("n_questions", INT), ("win_rate", DBL),
        ("mean_a", DBL), ("mean_b", DBL), ("statistic", DBL), ("p_value", DBL), ("p_holm", DBL),
        ("significant", BooleanType()),
    ),
}

# One answer per (question, condition): query_answers' columns plus the two keys.
SCHEMAS[EVAL_ANSWERS] = _schema(("question_id", STR), ("condition", STR),
                                *((f.name, f.dataType) for f in SCHEMAS[QUERY_ANSWERS].fields))


# The conditions resolving a Delta path raises where there is no Delta table (a missing or a non-Delta folder).
_NOT_A_DELTA_TABLE = {"PATH_NOT_FOUND", "DELTA_TABLE_NOT_FOUND", "DELTA_MISSING_DELTA_TABLE", "DELTA_NOT_A_DELTA_TABLE",
                      "DELTA_PATH_DOES_NOT_EXIST"}


# What the second of two writers that both created a table gets (Delta's commit, or the catalog's).
_CREATED_CONCURRENTLY = ("DELTA_PROTOCOL_CHANGED", "DELTA_METADATA_CHANGED", "TABLE_OR_VIEW_ALREADY_EXISTS")


def _identifier(part: str) -> str:
    """``part`` as a SQL identifier: as is when plain, else in backticks."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part):
        return part
    return "`" + part.replace("`", "``") + "`"


# Set on every table this project creates. Delta writes a checkpoint every 10 commits by default: a
# Spark job that costs the write reaching it 5-10 s on 2 cores, while replaying 100 small JSON commits
# reads as fast as a checkpoint. llm_results, llm_usage and index_lock take several commits per run
# (98 appends: 132 s at 10, 81 s at 100). A table created by an older version keeps its own interval.
TABLE_PROPERTIES = {"delta.checkpointInterval": "100"}

# Up to this many rows (as the caller expects), TableStore.checkpoint keeps a frame in the driver: a
# scratch table costs a Delta write and a read back, 2-4 s on 2 cores for a few rows. An LLM stage of
# as many items keeps its rows on the driver anyway (llm.stage.DRIVER_STAGE_ITEMS).
LOCAL_CHECKPOINT_ROWS = 2_000

# Where TableStore.checkpoint materialises intermediate frames: <root>/_scratch/<name>, or <database>._scratch_<name>.
SCRATCH = "_scratch"

# The tables the index job writes and publishes together (the Delta versions of one run's index_runs row).
PUBLISHED = (DOCUMENTS, INPUT_REJECTS, TEXT_UNITS, ENTITY_INSTANCES, RELATIONSHIP_INSTANCES, CLAIMS, ENTITIES,
             RELATIONSHIPS, COMMUNITIES, COMMUNITY_REPORTS, TEXT_UNIT_EMBEDDINGS, ENTITY_EMBEDDINGS)


def conform(df: DataFrame, name: str) -> DataFrame:
    """``df`` as table ``name`` holds it: the declared schema's columns, in order, cast to their types."""
    return df.select([df[f.name].cast(f.dataType).alias(f.name) for f in SCHEMAS[name].fields])


def absolute_path(spark: SparkSession, location: str) -> str:
    """``location`` made absolute on the session's default file system, as Spark would resolve it (against
    the driver's working directory on a local one): Delta reads ``delta.`<path>``` in SQL as a table only
    for an absolute path, and fails on a relative one as an unsupported "direct query on files", so every
    SQL statement on the index (the lock's UPDATE, MERGEs) needs one. A URI or an absolute path is kept as
    written; on Spark Connect the server resolves paths, out of the client's reach."""
    if location.startswith("/") or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", location) or is_connect(spark):
        return location
    jvm = spark.sparkContext._jvm
    path = jvm.org.apache.hadoop.fs.Path(location)
    qualified = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()).makeQualified(path)
    uri = qualified.toUri()
    return uri.getPath() if uri.getScheme() == "file" else qualified.toString()


class TableStore:
    """Reads and writes the index's Delta tables under one root (path or database).

    With ``versions`` (a published run's ``table_versions``) the published tables are read as of
    those Delta versions (time travel): the index exactly as that run left it, whatever a later or
    running job has written since. Tables outside ``PUBLISHED`` (RAPTOR trees, the LLM cache) are
    always read at their latest version.
    """

    def __init__(self, spark: SparkSession, storage: StorageConfig, versions: dict[str, int] | None = None):
        self.spark = spark
        self.storage = storage if storage.database else storage.model_copy(update={"root": absolute_path(spark, storage.root)})
        self.versions = versions
        self._scratch: set[str] = set()
        # Set to a list by a job that appends its llm_usage rows at its end, in one commit (llm.stage).
        self.deferred_usage: list[dict] | None = None
        # Set by an index run: the llm_results rows it committed, where it found no table (llm.stage.FreshResults).
        self.fresh_results = None
        self._behind: dict[str, Future] = {}  # in_background: the table's write still running
        self._behind_pool: ThreadPoolExecutor | None = None
        self._writing = threading.local()  # the table a background thread is writing now

    def in_background(self, name: str, write: Callable[[], object]) -> None:
        """Run ``write``, a write of the table ``name``, in a thread of its own. Until it has ended, anything
        this store does with the table (an existence check, a read, a write, its version) waits for it, and
        raises its error. An index's full build writes the tables its later stages hold cached this way, so
        no stage waits for a Delta write it does not read; the run publishes only after ``settle``."""
        self._settled(name)
        if self._behind_pool is None:
            self._behind_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="write-behind")

        def run() -> object:
            self._writing.name = name
            try:
                return write()
            finally:
                self._writing.name = None

        self._behind[name] = self._behind_pool.submit(inheriting(self.spark, run))

    def settle(self) -> None:
        """Wait for every background write (``in_background``); the first failure is raised once all have ended."""
        futures = list(self._behind.values())
        wait(futures)
        if self._behind_pool is not None:
            self._behind_pool.shutdown()
            self._behind_pool = None
        for future in futures:
            future.result()

    def raise_background_failure(self) -> None:
        """Raise the error of a background write that has failed, if any (``in_background``): a run stops at
        its next stage, not once every stage has run."""
        for future in list(self._behind.values()):
            if future.done() and future.exception() is not None:
                raise future.exception()

    def _settled(self, name: str) -> None:
        future = self._behind.get(name)
        if future is not None and getattr(self._writing, "name", None) != name:
            future.result()

    def location(self, name: str) -> str:
        if self.storage.database:
            return f"{self.namespace()}.{_identifier(name)}" if name else f"{self.namespace()}."
        return f"{self.storage.root.rstrip('/')}/{name}"

    def namespace(self) -> str:
        """``[catalog.]database`` (``database`` may itself be ``catalog.schema``), each part quoted where it
        needs it: Unity Catalog names may hold hyphens."""
        parts = ([self.storage.catalog] if self.storage.catalog else []) + self.storage.database.split(".")
        return ".".join(_identifier(part) for part in parts)

    def _pinned(self, name: str) -> bool:
        return self.versions is not None and name in PUBLISHED

    def sql_name(self, name: str) -> str:
        """The table in SQL: ``db.name`` or ``delta.`<path>```."""
        return self.location(name) if self.storage.database else f"delta.`{self.location(name)}`"

    def exists(self, name: str) -> bool:
        """Through the catalog or by resolving the Delta path: Delta's Python ``DeltaTable`` API would
        need Delta Connect on a Spark Connect server, plain reads need nothing."""
        self._settled(name)
        if self._pinned(name):
            return name in self.versions
        if self.storage.database:
            return self.spark.catalog.tableExists(self.location(name))
        try:
            self.spark.read.format("delta").load(self.location(name)).schema
        except Exception as exc:  # noqa: BLE001 - only "no Delta table here" means False
            if analysis_condition(exc) in _NOT_A_DELTA_TABLE:
                return False
            raise
        return True

    def read(self, name: str) -> DataFrame:
        self._settled(name)
        if self._pinned(name):
            if name not in self.versions:
                return local_frame(self.spark, [], SCHEMAS[name])
            return self.spark.sql(f"SELECT * FROM {self.sql_name(name)} VERSION AS OF {int(self.versions[name])}")
        if self.storage.database:
            return self.spark.table(self.location(name))
        return self.spark.read.format("delta").load(self.location(name))

    def checkpoint(self, df: DataFrame, name: str, expected_rows: int | None = None) -> DataFrame:
        """``df`` written to the scratch Delta table ``name`` and read back. The lineage is cut as with
        ``localCheckpoint``, but the rows live in the index's storage, not in executors: a lost executor
        loses nothing, so no LLM call behind them is made (or paid) again, and it works on Spark Connect
        (no RDD API). A later call with the same name replaces the rows: one name per frame in use.
        :meth:`drop_scratch` removes them after a successful run; a crashed run's are replaced by the rerun.

        ``expected_rows``: about how many rows ``df`` holds, where the caller knows (an LLM stage's distinct
        items, say). Up to ``LOCAL_CHECKPOINT_ROWS`` the rows are kept in the driver instead (one collect,
        no table): the same cut lineage, and a lost executor loses nothing either."""
        if expected_rows is not None and expected_rows <= LOCAL_CHECKPOINT_ROWS:
            return local_frame(self.spark, df.collect(), df.schema)
        table = f"{SCRATCH}_{name}" if self.storage.database else f"{SCRATCH}/{name}"
        self.write(df, table, counted=False)
        self._scratch.add(table)
        return self.read(table)

    def drop_scratch(self) -> None:
        """Remove the scratch tables this store wrote. A catalog table is dropped; a path is deleted through
        Hadoop's file system, or on Spark Connect (no file system API) emptied, its files left to VACUUM.

        Every cached plan that reads one is uncached first: Spark re-plans the cached frames over a table after
        each write to it, and one left over a deleted scratch table fails the next MERGE into that table
        (``DELTA_SCHEMA_CHANGE_SINCE_ANALYSIS``: the deleted path's snapshot has no columns). A cached frame
        can outlive its ``unpersist``: CacheManager re-plans a cached entry outside its lock after a write
        to a table the entry reads, and an ``unpersist`` from another thread in that window finds nothing
        to remove, so the re-planned entry comes back (two LLM stages run at once, each with a cached frame
        over ``llm_results``, which both write)."""
        for table in sorted(self._scratch):
            self._uncache_readers(table)
            if self.storage.database:
                self.spark.sql(f"DROP TABLE IF EXISTS {self.location(table)}")
            elif is_connect(self.spark):
                self.spark.sql(f"DELETE FROM {self.sql_name(table)}")
            else:
                self._delete_path(self.location(table))
        if self._scratch and not self.storage.database and not is_connect(self.spark):
            self._delete_path(self.location(SCRATCH), only_if_empty=True)
        self._scratch.clear()

    def _uncache_readers(self, table: str) -> None:
        """Uncache every cached plan that reads ``table`` (a cascade ``unpersist``). On Spark Connect the
        server's cache is out of reach; there the scratch table is emptied, not deleted, so a plan over it
        still resolves."""
        if is_connect(self.spark) or not self.exists(table):
            return
        self.spark._jsparkSession.sharedState().cacheManager().uncacheQuery(self.read(table)._jdf, True)

    def _delete_path(self, location: str, only_if_empty: bool = False) -> None:
        jvm = self.spark.sparkContext._jvm
        path = jvm.org.apache.hadoop.fs.Path(location)
        fs = path.getFileSystem(self.spark.sparkContext._jsc.hadoopConfiguration())
        if fs.exists(path) and not (only_if_empty and len(fs.listStatus(path)) > 0):
            fs.delete(path, True)

    def read_or_empty(self, name: str) -> DataFrame:
        return self.read(name) if self.exists(name) else local_frame(self.spark, [], SCHEMAS[name])

    def write(self, df: DataFrame, name: str, mode: str = "overwrite", counted: bool = True) -> int | None:
        """Write with the declared schema (column order and types enforced here, once); returns the
        number of rows written (with ``overwrite``: the table's rows), from the commit's metrics, or
        None where not ``counted`` (reading the history is a Spark job of its own)."""
        self._settled(name)
        if name in SCHEMAS:
            df = conform(df, name)
        writer = (df.write.format("delta").mode(mode).options(**TABLE_PROPERTIES)  # taken at creation only
                  .option("overwriteSchema", "true" if mode == "overwrite" else "false"))
        if mode == "append":  # a table written by an older version gains the columns added since
            writer = writer.option("mergeSchema", "true")
        if self.storage.database and not self.spark.catalog.databaseExists(self.namespace()):
            # An existing schema is used as is: creating one needs a catalog privilege users often lack.
            self.spark.sql(f"CREATE SCHEMA IF NOT EXISTS {self.namespace()}")
        save = (lambda: writer.saveAsTable(self.location(name))) if self.storage.database else (
            lambda: writer.save(self.location(name)))
        try:
            save()
        except Exception as exc:  # noqa: BLE001
            # Two appends to a table neither found (two stages' first rows of the embedding cache, say): both
            # create it, and the second commit is rejected. Nothing of it was committed: its rows are appended
            # to the table it finds now.
            if mode != "append" or not any(condition in str(exc) for condition in _CREATED_CONCURRENTLY):
                raise
            save()
        return self.rows_written(name, df) if counted else None

    def create_empty(self, name: str) -> None:
        """Create the table ``name`` (not there yet) empty, with its declared schema: one metadata
        commit, where writing an empty DataFrame still runs its Spark jobs."""
        self._settled(name)
        if self.storage.database and not self.spark.catalog.databaseExists(self.namespace()):
            self.spark.sql(f"CREATE SCHEMA IF NOT EXISTS {self.namespace()}")
        columns = ", ".join(f"{_identifier(f.name)} {f.dataType.simpleString()}" for f in SCHEMAS[name].fields)
        properties = ", ".join(f"'{key}' = '{value}'" for key, value in TABLE_PROPERTIES.items())
        self.spark.sql(f"CREATE TABLE {self.sql_name(name)} ({columns}) USING delta TBLPROPERTIES ({properties})")

    def rows_written(self, name: str, df: DataFrame | None = None) -> int:
        """The rows the table's last commit wrote, read from its history: a count of the table just
        written without a Spark job over it. Where the commit has no metrics, ``df`` (or the table) is counted."""
        last = self.spark.sql(f"DESCRIBE HISTORY {self.sql_name(name)} LIMIT 1").collect()[0]
        written = (last["operationMetrics"] or {}).get("numOutputRows")
        if written is not None:
            return int(written)
        return (df if df is not None else self.read(name)).count()

    def version(self, name: str) -> int:
        """The latest Delta version of a table."""
        self._settled(name)
        return int(self.spark.sql(f"DESCRIBE HISTORY {self.sql_name(name)} LIMIT 1").collect()[0]["version"])

    def version_or_none(self, name: str) -> int | None:
        """The latest Delta version of a table, or None where there is none: for a path, one history
        read that may fail rather than an existence check (a read of its own) and then the history."""
        self._settled(name)
        if self.storage.database:
            return self.version(name) if self.exists(name) else None
        try:
            return self.version(name)
        except Exception as exc:  # noqa: BLE001 - only "no Delta table here" means None
            if analysis_condition(exc) in _NOT_A_DELTA_TABLE | {"DELTA_TABLE_ONLY_OPERATION"}:  # DESCRIBE HISTORY's
                return None
            raise

    def merge(self, df: DataFrame, name: str, key: str = "id") -> int:
        """Make the table equal to ``df`` with one MERGE: rows with a new key are inserted, rows whose
        values changed updated, rows whose key is gone deleted; unchanged rows are not rewritten.
        Returns the table's rows."""
        self._settled(name)
        if not self.exists(name):
            return self.write(df, name)
        schema = SCHEMAS[name]
        source = df.select([df[f.name].cast(f.dataType).alias(f.name) for f in schema.fields])
        view = f"merge_source_{name}"
        source.createOrReplaceTempView(view)
        changed = " OR ".join(f"NOT (t.`{f.name}` <=> s.`{f.name}`)" for f in schema.fields if f.name != key)
        self.spark.sql(f"MERGE INTO {self.sql_name(name)} t USING {view} s ON t.`{key}` = s.`{key}` "
                       f"WHEN MATCHED AND ({changed}) THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT * "
                       f"WHEN NOT MATCHED BY SOURCE THEN DELETE")
        self.spark.catalog.dropTempView(view)
        return self.read(name).count()

    def update_columns(self, df: DataFrame, name: str, columns: list[str], current: DataFrame | None = None,
                       key: str = "id") -> DataFrame | None:
        """Set ``columns`` of the rows ``df`` names (by ``key``) to ``df``'s values; other rows are untouched.
        One overwrite of the table joined with ``df``: a MERGE costs more Spark jobs, and it rewrites
        every file holding a matched row anyway, which is most files when descriptions are summarized.

        ``current``: the table's rows as the caller holds them (cached, as last written) instead of a read;
        the rows written are then returned, cached, and written in the background (``in_background``; else
        None)."""
        updates = df.select(key, *(F.col(c).alias(f"_new_{c}") for c in columns)).withColumn("_matched", F.lit(True))
        rows = self.read(name) if current is None else current
        updated = rows.join(updates, key, "left").select(*(
            F.when(F.col("_matched"), F.col(f"_new_{c}")).otherwise(F.col(c)).alias(c) if c in columns else F.col(c)
            for c in rows.columns))
        if current is None:
            self.write(updated, name, counted=False)
            return None
        updated = updated.persist()
        self.in_background(name, lambda: self.write(updated, name, counted=False))
        return updated
