"""A local Spark Connect server with Delta, as Databricks serverless and shared clusters present one.

pyspark 4 ships the server (``pyspark/jars/spark-connect_*.jar``); pyspark 3.5 does not, so its JAR is
resolved from Maven Central (``SPARK3_CONNECT_SERVER_VERSION``). It runs as its own JVM with its own
Python workers (the project's interpreter, so UDFs and ``mapInPandas`` import this library), bound
to 127.0.0.1 on a free port, and is stopped with its whole process group.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pyspark

from graphrag_spark.config import SparkConfig
from graphrag_spark.jars import resolve_jars, scala_version
from graphrag_spark.session import C1_ONLY, local_jars

# Maven Central, as reached from here, lists spark-connect_2.12 up to 3.5.7 (3.5.9's POM is not found). One 3.5
# Connect protocol: this server JAR on pyspark 3.5.9's Spark JARs serves a pyspark 3.5.9 client.
SPARK3_CONNECT_SERVER_VERSION = "3.5.7"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def server_jars(spark_home: Path, ivy_cache: Path) -> list[str]:
    """Delta's JARs, and under pyspark 3.5 the Connect server's, which pip's pyspark 3.5 leaves out."""
    jars = local_jars(SparkConfig(ivy_cache=str(ivy_cache)))
    if any((spark_home / "jars").glob("spark-connect_*.jar")):
        return jars
    coordinate = f"org.apache.spark:spark-connect_{scala_version(spark_home)}:{SPARK3_CONNECT_SERVER_VERSION}"
    return [*jars, *map(str, resolve_jars([coordinate], ivy_cache))]


@contextmanager
def connect_server(ivy_cache: Path, log_path: Path, startup_s: float = 180.0,
                   conf: dict[str, str] | None = None) -> Iterator[str]:
    """Yields the server's ``sc://127.0.0.1:PORT`` URL once it accepts connections; ``conf``: more settings."""
    spark_home = Path(pyspark.__file__).parent
    port = _free_port()
    command = [
        str(spark_home / "bin" / "spark-submit"),
        "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--master", "local[2]", "--driver-memory", "2g",
        # It serves one test module, then exits: C1 only, as for a local job's driver (spark.driver_jit).
        "--driver-java-options", " ".join(C1_ONLY),
        "--jars", ",".join(server_jars(spark_home, ivy_cache)),
        "--conf", f"spark.connect.grpc.binding.port={port}",
        "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf", "spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension",
        "--conf", "spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "--conf", f"spark.pyspark.python={sys.executable}",
        "--conf", "spark.speculation=false",
        "--conf", "spark.ui.enabled=false",
        # As build_spark sets on a local classic session: Delta rebuilds a table's state in 50 tasks by
        # default, a stage per new table version (most of this server's tasks); INFO logs every task.
        "--conf", "spark.databricks.delta.snapshotPartitions=2",
        "--conf", "spark.log.level=WARN",
        "--conf", "spark.buffer.pageSize=4m",
        "--conf", "spark.sql.catalogImplementation=in-memory",
        "--conf", f"spark.sql.warehouse.dir={log_path.parent / 'warehouse'}",
        *(arg for key, value in (conf or {}).items() for arg in ("--conf", f"{key}={value}")),
    ]
    env = {**os.environ, "SPARK_HOME": str(spark_home), "PYSPARK_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1", "OPENBLAS_NUM_THREADS": "1"}
    env.pop("SPARK_REMOTE", None)
    log = log_path.open("wb")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + startup_s
        while not _accepts(port):
            if server.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"Spark Connect server did not start (exit {server.poll()}); log tail:\n{tail}")
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=30)
        log.close()
