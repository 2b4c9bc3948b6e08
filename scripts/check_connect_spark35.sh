#!/usr/bin/env bash
# By hand, not in CI (about 10 minutes on 2 cores): the offline index job and the notebook API on a Spark 3.5
# Connect session (Databricks Runtime 15.4 LTS shared clusters, serverless) against a classic Spark 3.5 session,
# in .venv-spark35 with a local Connect server (tests/connect35_check.py). Exit 0 when every row count and answer match.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_spark35.sh
work=$(mktemp -d)
echo "work folder: $work"
env -u PYSPARK_PYTHON -u PYSPARK_DRIVER_PYTHON -u SPARK_HOME -u SPARK_REMOTE OPENBLAS_NUM_THREADS=1 \
  PYTHONPATH=tests .venv-spark35/bin/python tests/connect35_check.py "$work"
