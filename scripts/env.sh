# Sourced by the scripts: the venv's spark-submit with Delta's JARs by path (resolved once into
# .cache/ivy by scripts/setup.sh, so no run re-resolves them or reads ~/.m2).
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
SUBMIT=(.venv/bin/spark-submit --jars "$(.venv/bin/python -m graphrag_spark.session --jars)"
        --conf "spark.log.level=WARN" --driver-memory 4g)
