# Sourced by the scripts: the venv's spark-submit with the Delta package and the local Ivy cache.
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
SUBMIT=(.venv/bin/spark-submit --packages "$(.venv/bin/python -m graphrag_spark.session)"
        --conf "spark.jars.ivy=$PWD/.cache/ivy" --conf "spark.log.level=WARN" --driver-memory 4g)
