#!/usr/bin/env bash
# One command: set everything up and run the default test suite (benchmarks are separate).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
# Two workers, a test file each at a time (loadfile keeps a module with its module-scoped fixtures), in
# the order tests/conftest.py gives: one pytest process leaves a core idle while it waits on JVM start-ups,
# subprocess jobs and LLM latency, which the other worker fills.
exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not bench" "$@"
