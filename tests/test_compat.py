"""Connect-safe helpers and catalog names: what runs the same on a classic session, a Spark Connect
session and Unity Catalog's three-part names (tested through the local session catalog)."""

from __future__ import annotations

import pytest

from graphrag_spark import tables as T
from graphrag_spark.compat import (CONNECT_FALLBACK_PARALLELISM, LLM_ITEMS_PER_TASK, analysis_condition,
                                   default_parallelism, in_parallel, is_connect, llm_tasks)
from graphrag_spark.config import StorageConfig
from graphrag_spark.errors import UserError
from graphrag_spark.query.api import GraphRagIndex


class _Conf:
    def __init__(self, values):
        self.values = values

    def get(self, key, default=None):
        return self.values.get(key, default)


def _connect_like(conf: dict):
    """An object whose class lives in a ``pyspark.sql.connect`` module, as a Connect session's does."""
    cls = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})
    session = cls()
    session.conf = _Conf(conf)
    return session


def test_connect_parallelism_comes_from_the_session_conf():
    assert is_connect(_connect_like({}))
    assert default_parallelism(_connect_like({"spark.default.parallelism": "6", "spark.sql.shuffle.partitions": "3"})) == 6
    assert default_parallelism(_connect_like({"spark.sql.shuffle.partitions": "3"})) == 3
    # Databricks serverless: "auto" shuffle partitions, no default parallelism.
    assert default_parallelism(_connect_like({"spark.sql.shuffle.partitions": "auto"})) == CONNECT_FALLBACK_PARALLELISM


def test_a_connect_llm_job_runs_the_fewest_tasks_its_items_allow_whatever_the_settings_say(spark):
    """Each LLM task keeps one over the tasks of the budget: on Connect, where the slots are only a setting
    (200 shuffle partitions on a shared cluster), tasks beyond them would leave the budget idle."""
    shared_cluster = _connect_like({"spark.sql.shuffle.partitions": "200"})
    assert llm_tasks(shared_cluster, 500) == 1
    assert llm_tasks(shared_cluster, 2 * LLM_ITEMS_PER_TASK + 1) == 3, "bounded in memory by the items per task"
    assert llm_tasks(spark, 500) == spark.sparkContext.defaultParallelism, "classic: the slots are known"
    assert llm_tasks(spark, 1) == 1


def test_an_error_condition_is_read_from_the_message_where_the_client_gets_only_that():
    """A pyspark 3.5 Connect client's AnalysisException has no condition, only the server's "[CONDITION] ..." text."""
    from pyspark.errors import AnalysisException

    assert analysis_condition(AnalysisException("[PATH_NOT_FOUND] Path does not exist: /x.")) == "PATH_NOT_FOUND"
    assert analysis_condition(AnalysisException("[DELTA_MISSING_DELTA_TABLE.SUB] x")) == "DELTA_MISSING_DELTA_TABLE.SUB"
    assert analysis_condition(AnalysisException("Path [PATH_NOT_FOUND] quoted later")) is None
    assert analysis_condition(ValueError("[PATH_NOT_FOUND] not an analysis error")) is None


@pytest.mark.spark
def test_classic_parallelism_is_the_context_s(spark):
    assert not is_connect(spark) and default_parallelism(spark) == spark.sparkContext.defaultParallelism


@pytest.mark.spark
def test_work_in_parallel_keeps_its_order_the_callers_pool_and_raises_after_all_ended(spark):
    import threading
    import time

    sc = spark.sparkContext
    sc.setLocalProperty("spark.scheduler.pool", "a-stage")
    finished = []

    def slow_then_done():
        time.sleep(0.3)
        finished.append("slow")
        return threading.current_thread().name

    try:
        names = in_parallel(spark, slow_then_done, lambda: sc.getLocalProperty("spark.scheduler.pool"),
                            lambda: spark.range(3).count())
        assert names[1:] == ["a-stage", 3] and names[0] != threading.current_thread().name

        def fail():
            raise ValueError("one of them failed")
        with pytest.raises(ValueError, match="one of them failed"):
            in_parallel(spark, fail, slow_then_done)
        assert finished == ["slow", "slow"], "the failure is raised once the others have ended"
    finally:
        sc.setLocalProperty("spark.scheduler.pool", None)


def test_a_delta_table_is_found_without_the_delta_table_api(spark, tmp_path):
    store = T.TableStore(spark, StorageConfig(root=str(tmp_path)))
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "x.txt").write_text("not delta")
    assert not store.exists(T.ENTITIES) and not store.exists("plain")
    assert store.read_or_empty(T.ENTITIES).count() == 0
    store.write(spark.createDataFrame([("a", "b", 1)], "source string, reason string, n_bytes long"), T.INPUT_REJECTS)
    assert store.exists(T.INPUT_REJECTS)


def test_catalog_needs_a_database():
    with pytest.raises(ValueError, match="storage.catalog needs storage.database"):
        StorageConfig(catalog="main")


def test_three_part_names_are_quoted_where_unity_catalog_names_need_it():
    store = T.TableStore(None, StorageConfig(catalog="dev-catalog", database="graphrag"))
    assert store.location(T.ENTITIES) == "`dev-catalog`.graphrag.entities"
    assert T.TableStore(None, StorageConfig(database="main.graph rag")).location(T.ENTITIES) == "main.`graph rag`.entities"


@pytest.mark.spark
def test_an_index_at_three_part_names_answers_as_the_same_index_at_paths(spark, sample_index, tmp_path):
    classic_cfg, _ = sample_index
    paths = T.TableStore(spark, classic_cfg.storage)
    cfg = classic_cfg.model_copy(deep=True)
    cfg.storage = StorageConfig(catalog="spark_catalog", database="graphrag_uc")
    spark.sql(f"CREATE SCHEMA spark_catalog.graphrag_uc LOCATION '{tmp_path / 'schema'}'")
    try:
        catalog = T.TableStore(spark, cfg.storage)
        with pytest.raises(UserError, match=r"No GraphRAG index at 'spark_catalog\.graphrag_uc\."):
            GraphRagIndex.load(spark, cfg)
        for name in (T.TEXT_UNITS, T.ENTITIES, T.RELATIONSHIPS, T.COMMUNITIES, T.COMMUNITY_REPORTS):
            catalog.write(paths.read(name), name)
        assert spark.catalog.tableExists(f"spark_catalog.graphrag_uc.{T.ENTITIES}")
        question = "Who opposes the harbour dredging near the estuary?"
        by_name = GraphRagIndex.load(spark, cfg).global_search(question, level=0)
        assert by_name.answer == GraphRagIndex.load(spark, classic_cfg).global_search(question, level=0).answer
        assert by_name.context_units == paths.read(T.COMMUNITY_REPORTS).where("level = 0").count()
    finally:
        spark.sql("DROP SCHEMA IF EXISTS spark_catalog.graphrag_uc CASCADE")


def test_an_environment_older_than_spark_3_5_is_told_which_runtime_to_use(tmp_path):
    import subprocess
    import sys

    from conftest import REPO

    fake = tmp_path / "pyspark"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "3.4.1"\n')
    done = subprocess.run([sys.executable, "-c", "import graphrag_spark"], capture_output=True, text=True,
                          env={"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert done.returncode == 1
    assert "needs Spark 3.5 or later and this environment has pyspark 3.4.1" in done.stderr
    assert "Databricks Runtime 15.4 LTS and later" in done.stderr
