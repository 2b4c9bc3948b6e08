#!/usr/bin/env bash
# One command: set everything up, index the sample corpus offline, ask one question.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
"${SUBMIT[@]}" jobs/index.py --config conf/local.yaml "$@"
"${SUBMIT[@]}" jobs/query.py --config conf/local.yaml --level 1 "What are the main themes?"
