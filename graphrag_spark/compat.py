"""Classic and Spark Connect sessions behind one set of helpers.

Databricks serverless and Unity Catalog shared clusters run PySpark through Spark Connect:
no ``sparkContext``, no ``_jvm``, no RDDs, no broadcast. Code that needs one of those asks
here first and takes the Connect-safe path when it must.
"""

from __future__ import annotations

import math
import re
import warnings
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable

from pyspark import inheritable_thread_target
from pyspark.sql import SparkSession

# Under Connect with neither setting given (Databricks serverless sizes shuffles itself): the slots assumed.
CONNECT_FALLBACK_PARALLELISM = 8
# A task's LLM items are in its Python worker's memory; more items make more tasks, not bigger ones.
LLM_ITEMS_PER_TASK = 2000
# pyspark 4 warns on every classic wrap given the function (see ``inheriting``). A filter set once:
# catch_warnings is not thread-safe, and stages wrap from several threads.
warnings.filterwarnings("ignore", message="Spark session is not provided", category=UserWarning, module="pyspark")
_MESSAGE_CONDITION = re.compile(r"\[([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)\]")


def is_connect(spark: SparkSession) -> bool:
    """True for a Spark Connect session; tested on the class so no Connect module is imported."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def default_parallelism(spark: SparkSession) -> int:
    """Task slots to spread a job over. A Connect client cannot ask the cluster, so it reads
    ``spark.default.parallelism``, else an integer ``spark.sql.shuffle.partitions``."""
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    for key in ("spark.default.parallelism", "spark.sql.shuffle.partitions"):
        value = spark.conf.get(key, None)
        if value and value.isdigit() and int(value) > 0:
            return int(value)
    return CONNECT_FALLBACK_PARALLELISM


def llm_tasks(spark: SparkSession, n_items: int) -> int:
    """Tasks for a job that calls an LLM endpoint on ``n_items`` items, each task throttling to one over the
    tasks of the budget. Classic: a task per slot, at most one per item. A Connect client cannot see the
    slots (it reads a setting: 200 shuffle partitions on a shared cluster), and tasks beyond them would
    wait while the running ones keep only their share of the budget (four tasks on a two-slot server
    filled 43% of a tokens/min limit); a task's calls are async, so one task carries the whole budget:
    there, the fewest tasks the items' memory allows."""
    if is_connect(spark):
        return max(1, math.ceil(n_items / LLM_ITEMS_PER_TASK))
    return max(1, min(n_items, default_parallelism(spark)))


def parse_schema(spark: SparkSession, ddl: str):
    """A DDL schema string parsed as ``createDataFrame`` parses it: by the session itself on pyspark 4 (classic or
    Connect; pyspark 4's module-level parser would pick Connect for the whole process once any Connect session
    was made), by the active context's JVM on pyspark 3.5."""
    if hasattr(spark, "_parse_ddl"):
        return spark._parse_ddl(ddl)
    from pyspark.sql.types import _parse_datatype_string

    return _parse_datatype_string(ddl)


def analysis_condition(exc: BaseException) -> str | None:
    """The error condition (e.g. ``PATH_NOT_FOUND``) of a Spark analysis error, classic or Connect; None otherwise."""
    from pyspark.errors import AnalysisException

    if not isinstance(exc, AnalysisException):
        return None
    condition = (getattr(exc, "getCondition", None) or exc.getErrorClass)()  # getErrorClass: pyspark 3.5
    if condition is None:  # a pyspark 3.5 Connect client gets only the server's message, "[CONDITION] ..."
        named = _MESSAGE_CONDITION.match(str(exc))
        condition = named.group(1) if named else None
    return condition


def inheriting(spark: SparkSession, fn: Callable) -> Callable:
    """``fn`` run in another thread with this thread's local properties (classic: its scheduler pool)
    or session tags (Connect). The classic wrapper is given the function, which pyspark 3.5 requires
    (pyspark 4 warns that the session's tags, which this project does not set, are not inherited)."""
    return inheritable_thread_target(spark)(fn) if is_connect(spark) else inheritable_thread_target(fn)


def in_parallel(spark: SparkSession, *work: Callable[[], object]) -> list:
    """Each function in a thread of its own (independent Spark jobs: table writes, say); their results
    in order. The threads keep the caller's local properties (its scheduler pool). The first failure is
    raised once all have ended."""
    with ThreadPoolExecutor(max_workers=len(work), thread_name_prefix="parallel") as pool:
        futures = [pool.submit(inheriting(spark, fn)) for fn in work]
        wait(futures)
    return [future.result() for future in futures]
