"""The one SparkSession factory: Delta Lake, local by default, any master via spark-submit."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

from pyspark.sql import SparkSession

from graphrag_spark.config import SparkConfig

def _package_zip(cache_dir: Path) -> str:
    """Zip the library so executors on a real cluster can import it (local modes share the venv)."""
    package_dir = Path(__file__).resolve().parent
    target = cache_dir / "graphrag_spark.zip"
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(package_dir.rglob("*.py")):
            archive.write(path, path.relative_to(package_dir.parent))
    return str(target)


def build_spark(cfg: SparkConfig, master: str | None = None, extra_conf: dict[str, str] | None = None) -> SparkSession:
    """Create (or reuse) the session. ``master`` wins over config; spark-submit's master wins over both defaults."""
    from delta import configure_spark_with_delta_pip

    ivy = Path(cfg.ivy_cache).expanduser().resolve()
    # Python workers must run the interpreter that has this project's packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # local mode: workers inherit the driver's environment
    builder = SparkSession.builder.appName(cfg.app_name)
    # Under spark-submit the JVM already runs with the user's --master and --packages.
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    chosen_master = master or cfg.master
    if chosen_master or not under_submit:
        builder = builder.master(chosen_master or "local[*]")
    settings = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.jars.ivy": str(ivy),
        # Speculative copies of an LLM task would pay for the same calls twice.
        "spark.speculation": "false",
        "spark.sql.shuffle.partitions": str(cfg.shuffle_partitions),
        "spark.driver.memory": cfg.driver_memory,
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": "false",
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.databricks.delta.snapshotPartitions": "2",
        # One BLAS thread per Python worker: Spark already runs one worker per core.
        "spark.executorEnv.OPENBLAS_NUM_THREADS": "1",
        "spark.sql.adaptive.enabled": "true",
        # Spark sizes memory pages from the heap (64 MiB with a 4g driver), and a hash aggregate
        # takes a whole page even for ten rows; executor threads keep their last sorter's pages,
        # so the heap filled within a few index runs. Small pages cost nothing at scale.
        "spark.buffer.pageSize": "4m",
        "spark.log.level": cfg.log_level,
    }
    settings.update(cfg.conf)
    settings.update(extra_conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    builder = configure_spark_with_delta_pip(builder)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(cfg.log_level)
    if not spark.sparkContext.master.startswith("local["):
        spark.sparkContext.addPyFile(_package_zip(ivy.parent))
    return spark


def submit_packages() -> str:
    """The --packages value for spark-submit: the Delta artifact built for this pyspark."""
    import importlib.metadata

    import pyspark

    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    delta_version = importlib.metadata.version("delta_spark")
    return f"io.delta:delta-spark_{spark_minor}_2.13:{delta_version}"


if __name__ == "__main__":
    if sys.argv[1:] == ["--warm"]:
        build_spark(SparkConfig()).stop()
    else:
        print(submit_packages())
