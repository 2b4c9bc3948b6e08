"""RAPTOR answers (query method ``raptor``): tree nodes retrieved for the question, then one answer.

The question is embedded by the provider that embedded the tree; nodes are chosen by the
collapsed tree (default: every layer ranked together under ``raptor.max_context_tokens``) or by
tree traversal (``raptor.traversal_top_k`` per layer from the roots down). They are handed to the
answering LLM as the ``Sources`` table of the basic-search prompt (numbered in retrieval order),
or, with ``query.llm: false``, answered extractively from the same nodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.config import Config, RaptorConfig
from graphrag_spark.embeddings import Embedder
from graphrag_spark.errors import UserError
from graphrag_spark.query.answers import answer_all, single_context_results
from graphrag_spark.query.context import format_table
from graphrag_spark.query.global_search import SearchResult
from graphrag_spark.query.retrieval import require_model
from graphrag_spark.raptor.nodes import OK
from graphrag_spark.raptor.retrieval import collapsed_tree, tree_traversal

CONTEXT_COLUMNS = ["short_id", "id", "tree_id", "layer", "score", "n_tokens"]


@dataclass
class RaptorTree:
    """The successful nodes (with embeddings) and the edges of every stored tree, in driver memory."""

    nodes: pd.DataFrame
    edges: pd.DataFrame

    @classmethod
    def load(cls, store: T.TableStore, model_name: str) -> RaptorTree:
        if not store.exists(T.RAPTOR_NODES):
            raise UserError(f"No RAPTOR tree at '{store.location(T.RAPTOR_NODES)}'; build one with jobs/raptor.py "
                            f"(same storage.root).")
        nodes = (store.read(T.RAPTOR_NODES).where(F.col("status") == OK)
                 .select("tree_id", "id", "layer", "text", "n_tokens", "embedding", "model_name", "status").toPandas())
        require_model(nodes["model_name"], model_name, "The RAPTOR tree's embeddings", "the tree",
                      "it with jobs/raptor.py")
        return cls(nodes, store.read(T.RAPTOR_EDGES).select("parent", "child").toPandas())


def retrieve(tree: RaptorTree, query_embedding: np.ndarray, cfg: RaptorConfig) -> pd.DataFrame:
    """The nodes for one question: ``tree_id, id, layer, score, n_tokens, text``, in retrieval order."""
    if cfg.retrieval == "tree_traversal":
        chosen = tree_traversal(tree.nodes, tree.edges, query_embedding, cfg.traversal_top_k)
    else:
        chosen = collapsed_tree(tree.nodes, query_embedding, cfg.max_context_tokens)
    return chosen.merge(tree.nodes[["id", "tree_id"]], on="id", how="left", sort=False)


def raptor_search(spark: SparkSession, tree: RaptorTree, embedder: Embedder, questions: list[str],
                  cfg: Config) -> list[SearchResult]:
    """One answer per question; all answer calls run as one Spark job."""
    started = time.perf_counter()
    vectors = embedder.embed(questions) if questions else []
    chosen = [retrieve(tree, vector, cfg.raptor) for vector in vectors]
    contexts = [format_table("Sources", ["id", "text"], list(zip(range(1, len(c) + 1), c["text"]))) if len(c) else ""
                for c in chosen]
    passages = [[("Sources", i, text) for i, text in enumerate(c["text"], 1)] for c in chosen]
    answers = answer_all(spark, "basic_search", questions, contexts, passages, cfg,
                         lead="The RAPTOR tree nodes most similar to the question say:")
    frames = [c.assign(short_id=range(1, len(c) + 1))[CONTEXT_COLUMNS].reset_index(drop=True) for c in chosen]
    return single_context_results("raptor", None, answers,
                                  [(text, frame, int(frame["n_tokens"].sum())) for text, frame in zip(contexts, frames)],
                                  embedder, started)
