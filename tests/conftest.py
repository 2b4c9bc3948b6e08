"""Shared fixtures: one local SparkSession for every Spark test (starting one costs ~20 s)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
SAMPLE_CORPUS = REPO / "data" / "sample"

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def spark():
    from graphrag_spark.config import SparkConfig
    from graphrag_spark.session import build_spark

    # One session runs hundreds of Spark jobs (several full index builds); with the 4g default
    # the driver heap filled during the LLM index tests and the JVM spent its time in full GCs.
    ui_limits = {"spark.ui.enabled": "false", "spark.sql.ui.retainedExecutions": "20", "spark.ui.retainedJobs": "50",
                 "spark.ui.retainedStages": "50"}
    session = build_spark(SparkConfig(shuffle_partitions=2, driver_memory="8g", ivy_cache=str(REPO / ".cache" / "ivy"),
                                      conf=ui_limits), master="local[2]")
    yield session
    session.stop()


@pytest.fixture
def make_config(tmp_path):
    """A config writing its index under this test's tmp dir; keyword overrides as 'section.key=value' strings."""
    from graphrag_spark.config import load_config

    def make(*overrides: str, input_path: str | Path = SAMPLE_CORPUS):
        return load_config(REPO / "conf" / "local.yaml",
                           [f"storage.root={tmp_path / 'index'}", f"input.path={input_path}",
                            f"spark.ivy_cache={REPO / '.cache' / 'ivy'}", *overrides])

    return make


@pytest.fixture(scope="session")
def sample_index(spark, tmp_path_factory):
    """The offline index of data/sample, built once per test session: (config, run summary)."""
    from graphrag_spark.config import load_config
    from graphrag_spark.index.pipeline import run_index

    root = tmp_path_factory.mktemp("sample") / "index"
    cfg = load_config(REPO / "conf" / "local.yaml", [f"storage.root={root}", f"input.path={SAMPLE_CORPUS}",
                                                     f"spark.ivy_cache={REPO / '.cache' / 'ivy'}"])
    return cfg, run_index(spark, cfg)
