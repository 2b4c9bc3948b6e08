"""Spark 3.5, the Spark of Databricks Runtime 15.4 and 16.4 LTS: the offline index of data/sample and a local and a
global question, run in .venv-spark35 (pyspark 3.5 + delta-spark 3.3, built or reused by scripts/setup_spark35.sh),
must give the Spark 4 session's index and answers."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import REPO, SAMPLE_CORPUS
from graphrag_spark.query.api import GraphRagIndex
from spark35_job import answers

pytestmark = pytest.mark.spark
VENV_PYTHON = REPO / ".venv-spark35" / "bin" / "python"


def test_spark_3_5_builds_the_spark_4_index_and_answers(spark, sample_index, tmp_path):
    setup = subprocess.run(["bash", str(REPO / "scripts" / "setup_spark35.sh")], cwd=REPO, capture_output=True,
                           text=True, timeout=1200)
    assert setup.returncode == 0, setup.stdout[-2000:] + setup.stderr[-3000:]
    # This process's Spark settings (its Python for workers, a SPARK_HOME) must not reach the 3.5 job.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME", "PYTHONPATH", "SPARK_REMOTE")}
    out = tmp_path / "verdict.json"
    done = subprocess.run([str(VENV_PYTHON), str(REPO / "tests" / "spark35_job.py"), "--root", str(tmp_path / "index"),
                           "--input", str(SAMPLE_CORPUS), "--ivy-cache", str(REPO / ".cache" / "ivy"), "--out", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    verdict = json.loads(out.read_text())
    assert verdict["pyspark"].startswith("3.5.") and verdict["spark"].startswith("3.5."), verdict["spark"]

    cfg, summary = sample_index
    assert verdict["summary_counts"] == {k: str(v) for k, v in summary.counts.items()}
    expected = answers(GraphRagIndex.load(spark, cfg))
    assert verdict["rows"] == expected["rows"] and all(expected["rows"].values())
    assert verdict["local"] == expected["local"] and verdict["local"]["context_units"] > 0
    assert verdict["global"] == expected["global"] and "Harbour Authority" in verdict["global"]["answer"]
