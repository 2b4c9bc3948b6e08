"""Stored embeddings as an exact index (driver memory, or executors for large tables), and questions
matched against it (SS and local search)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from graphrag_spark.embeddings import Embedder
from graphrag_spark.errors import UserError
from graphrag_spark.query.vectors import SparkVectorIndex, VectorIndex


def load_vector_index(embeddings: DataFrame, model_name: str, table: str,
                      driver_max_rows: int) -> VectorIndex | SparkVectorIndex:
    """The table's vectors (failed rows, with a null vector, left out); they must come from the question's model.

    Up to ``driver_max_rows`` vectors are collected into driver memory; a larger table is searched
    in executors, scanned once per batch of questions, and never collected."""
    stored = embeddings.where(F.col("vector").isNotNull())
    summary = stored.groupBy("model_name").agg(F.count(F.lit(1)).alias("rows"), F.max(F.size("vector")).alias("dim")).collect()
    require_model([row["model_name"] for row in summary], model_name, f"The vectors in '{table}'", "the index", "the index")
    rows = sum(row["rows"] for row in summary)
    if rows > driver_max_rows:
        return SparkVectorIndex(stored, rows, summary[0]["dim"])
    return VectorIndex.from_pandas(stored.select("id", "vector").toPandas())


def require_model(stored_models, model_name: str, what: str, target: str, rebuild: str) -> None:
    """Questions must be embedded by the model that embedded the stored vectors."""
    models = set(stored_models)
    if models - {model_name}:
        raise UserError(f"{what} were made by {sorted(models)}, but questions would be embedded by '{model_name}'; "
                        f"set embeddings.provider (and llm.embedding.model) to match {target}, or rebuild {rebuild}.")


def nearest(index: VectorIndex | SparkVectorIndex, embedder: Embedder, questions: list[str], k: int) -> list[list[tuple[str, float]]]:
    """Per question, the ``k`` most similar ids with their cosine similarity, best first."""
    if not len(index) or not questions:
        return [[] for _ in questions]
    ids, scores = index.search(embedder.embed(questions), k)
    return [[(str(i), float(s)) for i, s in zip(row_ids, row_scores)] for row_ids, row_scores in zip(ids, scores)]
