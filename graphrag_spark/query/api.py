"""The notebook API: one object for an index on Delta, to explore it and to ask questions with every method.

    index = GraphRagIndex.load(spark, "/mnt/graphrag/index")          # a Delta root, a YAML config or a Config
    index = GraphRagIndex.from_catalog(spark, "main.graphrag")         # metastore tables <database>.<name>
    display(index.reports(level=0))
    result = index.global_search("What are the main themes?", level=1)
    print(result.answer); display(result.as_spark(spark))

Methods: ``global`` (C0..Cn, one level), ``ts`` (map-reduce over text units), ``basic`` (SS, vector
RAG), ``local`` (entity-centred) and ``raptor`` (RAPTOR tree nodes of every layer, from jobs/raptor.py). Whether answers come from the chat model or are offline
extractive is ``query.llm`` in the config. Stored vectors are loaded once per object.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.config import Config, load_config
from graphrag_spark.embeddings import Embedder, get_embedder
from graphrag_spark.errors import UserError
from graphrag_spark.index.embed import build_embeddings, embedding_model_name
from graphrag_spark.index.runs import published_store
from graphrag_spark.query.basic_search import basic_search
from graphrag_spark.query.context_report import context_sizes
from graphrag_spark.query.global_search import SearchResult, global_search
from graphrag_spark.query.local_search import local_search
from graphrag_spark.query.retrieval import load_vector_index
from graphrag_spark.query.text_summary import text_summary_search
from graphrag_spark.query.vectors import SparkVectorIndex, VectorIndex
from graphrag_spark.raptor.search import RaptorTree, raptor_search

METHODS = ("global", "local", "basic", "ts", "raptor")
_REQUIRED = (T.TEXT_UNITS, T.ENTITIES, T.RELATIONSHIPS, T.COMMUNITIES, T.COMMUNITY_REPORTS)


class GraphRagIndex:
    def __init__(self, spark: SparkSession, cfg: Config, run_id: str | None = None) -> None:
        self.spark = spark
        self.cfg = cfg
        # The index as its last successful run published it (or as of ``run_id``): never a run in progress.
        self.store = published_store(spark, cfg.storage, run_id)
        # A root may hold only a RAPTOR tree (jobs/raptor.py); the GraphRAG methods then say what is missing.
        self._missing = [name for name in _REQUIRED if not self.store.exists(name)]
        if self._missing and not self.store.exists(T.RAPTOR_NODES):
            raise UserError(f"No GraphRAG index at '{self.store.location('')}': {', '.join(self._missing)} missing; "
                            f"build one with jobs/index.py (or point storage.root / storage.database at an index).")
        self._vectors: dict[str, VectorIndex | SparkVectorIndex] = {}
        self._raptor: RaptorTree | None = None
        self._embedder: Embedder | None = None

    @classmethod
    def load(cls, spark: SparkSession, source: str | Path | Config, overrides: Sequence[str] = (),
             run_id: str | None = None) -> GraphRagIndex:
        """From a Config, a YAML config file (with ``section.key=value`` overrides), or an index root path;
        ``run_id`` opens the index as that recorded run published it (see ``runs()``)."""
        if isinstance(source, Config):
            return cls(spark, source, run_id)
        if str(source).endswith((".yaml", ".yml")):
            return cls(spark, load_config(source, list(overrides)), run_id)
        cfg = load_config(None, list(overrides))
        cfg.storage.root = str(source)
        return cls(spark, cfg, run_id)

    @classmethod
    def from_catalog(cls, spark: SparkSession, database: str, config: str | Path | None = None,
                     overrides: Sequence[str] = (), run_id: str | None = None) -> GraphRagIndex:
        cfg = load_config(config, list(overrides))
        cfg.storage.database = database
        return cls(spark, cfg, run_id)

    # ------------------------------------------------------------------ exploring

    def table(self, name: str) -> DataFrame:
        return self.store.read(name)

    def runs(self) -> DataFrame:
        """The recorded runs of this root, newest first: mode, status, documents added/changed/deleted, calls, cost."""
        live = T.TableStore(self.spark, self.cfg.storage)
        return live.read_or_empty(T.INDEX_RUNS).where(F.col("status") != "running").orderBy(F.desc("ended_at"))

    def levels(self) -> list[int]:
        return sorted(r[0] for r in self.table(T.COMMUNITY_REPORTS).select("level").distinct().collect())

    def reports(self, level: int | None = None) -> DataFrame:
        """Reports (of one level, or all), most significant first."""
        reports = self.table(T.COMMUNITY_REPORTS)
        if level is not None:
            reports = reports.where(F.col("level") == level)
        return reports.select("community", "level", "title", "rating", "summary").orderBy(F.desc("rating"), "community")

    def reports_per_level(self) -> DataFrame:
        return self.table(T.COMMUNITY_REPORTS).groupBy("level").agg(F.count("*").alias("reports")).orderBy("level")

    def top_entities(self, n: int = 20) -> DataFrame:
        return (self.table(T.ENTITIES).select("human_readable_id", "title", "type", "degree", "frequency", "description")
                .orderBy(F.desc("degree"), "title").limit(n))

    def sub_communities(self, community: int) -> DataFrame:
        """Drill-down: the reports of a community's sub-communities."""
        children = self.table(T.COMMUNITIES).where(F.col("community") == community).select(F.explode("children").alias("community"))
        return self.table(T.COMMUNITY_REPORTS).join(children, "community").select("community", "level", "title", "rating", "summary")

    def source_text(self, community: int) -> DataFrame:
        """Drill-down: the text units a community's entities were extracted from."""
        units = self.table(T.COMMUNITIES).where(F.col("community") == community).select(F.explode("text_unit_ids").alias("id"))
        return self.table(T.TEXT_UNITS).join(units, "id").select("id", "document_id", "chunk_index", "n_tokens", "text")

    def context_sizes(self) -> pd.DataFrame:
        """The paper's Table 2 for this index: context units and tokens per level and for TS."""
        return context_sizes(self.spark, self.store, self.cfg)

    def build_embeddings(self) -> dict[str, int]:
        """(Re)compute the embeddings stage of an index built before it existed."""
        self._vectors.clear()
        counts = build_embeddings(self.spark, T.TableStore(self.spark, self.cfg.storage), self.cfg)[0]
        if self.store.versions is not None:  # published with the index's run: include the new tables
            self.store.versions.update({name: self.store.version(name) for name in (T.TEXT_UNIT_EMBEDDINGS, T.ENTITY_EMBEDDINGS)})
        return counts

    # ------------------------------------------------------------------ asking

    def global_search(self, question: str, level: int | None = None) -> SearchResult:
        return self.search("global", [question], level)[0]

    def local_search(self, question: str, level: int | None = None) -> SearchResult:
        return self.search("local", [question], level)[0]

    def basic_search(self, question: str) -> SearchResult:
        return self.search("basic", [question])[0]

    def text_summary_search(self, question: str) -> SearchResult:
        return self.search("ts", [question])[0]

    def raptor_search(self, question: str) -> SearchResult:
        """RAPTOR tree retrieval (raptor.retrieval: collapsed_tree or tree_traversal); ``context`` lists the
        nodes used with their layer (0 = leaf chunk) and score."""
        return self.search("raptor", [question])[0]

    def search(self, method: str, questions: Sequence[str], level: int | None = None) -> list[SearchResult]:
        """Many questions with one method; the LLM calls of all questions run in shared Spark jobs."""
        questions = list(questions)
        if method == "raptor":
            if self._raptor is None:
                self._raptor = RaptorTree.load(self.store, embedding_model_name(self.cfg))
            return raptor_search(self.spark, self._raptor, self.embedder, questions, self.cfg)
        if self._missing and method in METHODS:
            raise UserError(f"No GraphRAG index at '{self.store.location('')}' ({', '.join(self._missing)} missing), "
                            f"only a RAPTOR tree: use method 'raptor', or build the index with jobs/index.py.")
        if method == "global":
            return global_search(self.spark, self.table(T.COMMUNITY_REPORTS), questions, self.cfg, level)
        if method == "ts":
            return text_summary_search(self.spark, self.table(T.TEXT_UNITS), questions, self.cfg)
        if method == "basic":
            return basic_search(self.spark, self.table(T.TEXT_UNITS), self._vector_index(T.TEXT_UNIT_EMBEDDINGS),
                                self.embedder, questions, self.cfg)
        if method == "local":
            return local_search(self.spark, self.store, self._vector_index(T.ENTITY_EMBEDDINGS), self.embedder,
                                questions, self.cfg, level)
        raise UserError(f"Unknown query method '{method}'; use one of {', '.join(METHODS)}.")

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            e = self.cfg.embeddings
            self._embedder = get_embedder(e.provider, self.cfg.llm.embedding, e.batch_size)
        return self._embedder

    def _vector_index(self, table: str) -> VectorIndex | SparkVectorIndex:
        if table not in self._vectors:
            if not self.store.exists(table):
                raise UserError(f"The index has no '{table}' table (it was built before the embeddings stage); "
                                f"run GraphRagIndex.build_embeddings() or rebuild it with jobs/index.py.")
            self._vectors[table] = load_vector_index(self.table(table), embedding_model_name(self.cfg), table,
                                                      self.cfg.query.driver_vector_rows)
        return self._vectors[table]
