#!/usr/bin/env bash
# One command: set everything up and run the default test suite (benchmarks are separate).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
exec .venv/bin/python -m pytest -m "not bench" "$@"
