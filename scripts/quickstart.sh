#!/usr/bin/env bash
# One command: set everything up, index the sample corpus offline, ask one question.
# graphrag-spark runs the jobs through spark-submit (as scripts/env.sh's SUBMIT does), quietly:
# one progress line per stage, then the summary; pass --verbose for Spark's own log.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/graphrag-spark index --config conf/local.yaml "$@"
.venv/bin/graphrag-spark query --config conf/local.yaml --level 1 "What are the main themes?"
