"""Spark 3.5 as on Databricks Runtime 15.4 LTS: the offline index of data/sample and a local and a global question,
run in .venv-spark35 (pyspark 3.5 + delta-spark 3.3 and the runtime's numpy 1.23.5, pandas 1.5.3, pyarrow 14.0.1,
scipy and scikit-learn; built or reused by scripts/setup_spark35.sh from constraints-dbr-15.4.txt), must give the
Spark 4 session's index and answers."""

from __future__ import annotations

import json
import os

import pytest

from conftest import REPO, SAMPLE_CORPUS, run_process
from graphrag_spark.query.api import GraphRagIndex
from spark35_job import RUNTIME_LIBRARIES, answers

pytestmark = pytest.mark.spark
VENV_PYTHON = REPO / ".venv-spark35" / "bin" / "python"


def EARLY_JOB(workdir):
    """The 3.5 side, while other tests run (see conftest): the venv, then the index and answers in it."""
    setup = run_process(["bash", str(REPO / "scripts" / "setup_spark35.sh")], timeout=1200, cwd=REPO)
    assert setup.returncode == 0, setup.stdout[-2000:] + setup.stderr[-3000:]
    # This process's Spark settings (its Python for workers, a SPARK_HOME) must not reach the 3.5 job.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME", "PYTHONPATH", "SPARK_REMOTE")}
    out = workdir / "verdict.json"
    done = run_process([str(VENV_PYTHON), str(REPO / "tests" / "spark35_job.py"), "--root", str(workdir / "index"),
                        "--input", str(SAMPLE_CORPUS), "--ivy-cache", str(REPO / ".cache" / "ivy"), "--out", str(out)],
                       timeout=1200, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def test_spark_3_5_builds_the_spark_4_index_and_answers(spark, sample_index, early_result):
    verdict = early_result
    assert verdict["pyspark"].startswith("3.5.") and verdict["spark"].startswith("3.5."), verdict["spark"]
    pins = dict(line.split("==") for line in (REPO / "constraints-dbr-15.4.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    assert verdict["libraries"] == {name: pins[name] for name in RUNTIME_LIBRARIES}, verdict["libraries"]

    cfg, summary = sample_index
    assert verdict["summary_counts"] == {k: str(v) for k, v in summary.counts.items()}
    expected = answers(GraphRagIndex.load(spark, cfg))
    assert verdict["rows"] == expected["rows"] and all(expected["rows"].values())
    assert verdict["local"] == expected["local"] and verdict["local"]["context_units"] > 0
    assert verdict["global"] == expected["global"] and "Harbour Authority" in verdict["global"]["answer"]
