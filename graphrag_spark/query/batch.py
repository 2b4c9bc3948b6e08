"""Batch questions: a file or Delta table of questions in, a Delta table of answers out.

All questions go through one method together, so their LLM calls share Spark jobs (all map
calls of all questions in one job, all reduce or answer calls in another). ``latency_s`` of a
row is therefore the batch's wall time divided by its questions.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from pyspark.sql import DataFrame, SparkSession

from graphrag_spark import tables as T
from graphrag_spark.errors import UserError
from graphrag_spark.query.global_search import SearchResult

if TYPE_CHECKING:
    from graphrag_spark.query.api import GraphRagIndex

_TABLE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*){1,2}$")


def _is_table(spark: SparkSession, name: str) -> bool:
    """``db.table`` (or ``catalog.db.table``) whose database exists, rather than a relative path like ``out.delta``."""
    return bool(_TABLE_NAME.match(name)) and spark.catalog.databaseExists(name.rsplit(".", 1)[0])


def parse_question_file(path: Path) -> list[str]:
    """``.jsonl`` / ``.csv`` with a ``question`` field, else plain text: one question per line (# = comment)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        questions = [row.get("question") for row in rows]
    elif path.suffix == ".csv":
        frame = pd.read_csv(path)
        if "question" not in frame.columns:
            raise UserError(f"'{path}' has no 'question' column; name the column of questions 'question'.")
        questions = frame["question"].tolist()
    else:
        questions = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return [q.strip() for q in questions if isinstance(q, str) and q.strip()]


def read_questions(spark: SparkSession, source: str) -> list[str]:
    """From a file, a Delta path or a catalog table (a ``question`` column)."""
    path = Path(source)
    if path.is_dir() and (path / "_delta_log").is_dir():
        frame = spark.read.format("delta").load(source)
    elif path.is_file():
        return parse_question_file(path)
    elif _is_table(spark, source):
        frame = spark.table(source)
    else:
        raise UserError(f"No questions at '{source}': give a text, .jsonl or .csv file, a Delta path or a table name.")
    if "question" not in frame.columns:
        raise UserError(f"'{source}' has no 'question' column; name the column of questions 'question'.")
    return [r.question for r in frame.select("question").collect() if r.question and r.question.strip()]


def answers_frame(spark: SparkSession, questions: list[str], results: list[SearchResult]) -> DataFrame:
    rows = [(q, r.method, r.level, r.answer, r.context_units, r.context_tokens, r.prompt_tokens, r.completion_tokens,
             r.llm_calls, r.failed_llm_calls, r.malformed_map_answers, float(r.latency_s)) for q, r in zip(questions, results)]
    return T.local_frame(spark, rows, T.SCHEMAS[T.QUERY_ANSWERS])


def write_answers(spark: SparkSession, frame: DataFrame, output: str, mode: str = "append") -> None:
    """To a Delta path, or to a catalog table when ``output`` names one in an existing database."""
    writer = frame.write.format("delta").mode(mode)
    if _is_table(spark, output):
        writer.saveAsTable(output)
    else:
        writer.save(output)


@dataclass
class BatchRun:
    questions: int
    seconds: float
    llm_calls: int
    llm_tokens: int  # prompt + completion: with llm.chat.tokens_per_minute, what bounds throughput


def answer_batch(index: GraphRagIndex, source: str, output: str, method: str, level: int | None = None,
                 mode: str = "append") -> BatchRun:
    """Read the questions, answer them all with ``method``, write one row per answer to ``output``."""
    questions = read_questions(index.spark, source)
    if not questions:
        raise UserError(f"'{source}' holds no questions.")
    started = time.perf_counter()
    results = index.search(method, questions, level)
    write_answers(index.spark, answers_frame(index.spark, questions, results), output, mode)
    return BatchRun(len(questions), time.perf_counter() - started, sum(r.llm_calls for r in results),
                    sum(r.prompt_tokens + r.completion_tokens for r in results))
