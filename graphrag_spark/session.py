"""The one SparkSession factory: Delta Lake, local by default, any master via spark-submit.

Precedence, highest first: what spark-submit or the cluster already set (``--conf``, ``--master``,
``spark-defaults.conf``), then this project's config (``spark.conf``, ``spark.master``), then the
defaults below. The small-machine defaults (shuffle partitions, driver memory, log level, the
driver's interpreter for Python workers) apply only to a local master: on a cluster they would cap
parallelism and break the packed-environment deployment (``spark.pyspark.python=./env/bin/python``).

Delta's JARs come from :mod:`graphrag_spark.jars` by path. Run ``python -m graphrag_spark.session``
to print what to pass to ``spark-submit``.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Iterator

from pyspark.sql import SparkSession

from graphrag_spark.compat import default_parallelism, is_connect
from graphrag_spark.config import SparkConfig
from graphrag_spark.errors import UserError
from graphrag_spark.jars import DELTA_EXTENSION_CLASS, delta_coordinate, resolve_jars, spark_home

DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"

# Safe on any master; each applies only where nobody set the key.
CLUSTER_DEFAULTS = {
    # Speculative copies of an LLM task would pay for the same calls twice.
    "spark.speculation": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Index stages that do not depend on each other run at once, each in a pool of its own
    # (index/pipeline.py): FAIR shares the cores between their jobs instead of queueing them.
    "spark.scheduler.mode": "FAIR",
    "spark.sql.adaptive.enabled": "true",
    "spark.ui.showConsoleProgress": "false",
    # One BLAS thread per Python worker: Spark already runs one worker per core.
    "spark.executorEnv.OPENBLAS_NUM_THREADS": "1",
    # Spark sizes memory pages from the heap (64 MiB with a 4g driver), and a hash aggregate
    # takes a whole page even for ten rows; executor threads keep their last sorter's pages,
    # so the heap filled within a few index runs. Small pages cost nothing at scale.
    "spark.buffer.pageSize": "4m",
}


def _is_local(master: str) -> bool:
    return master == "local" or master.startswith(("local[", "local-cluster["))


def plain_paths_are_local(cfg: SparkConfig, master: str | None = None) -> bool:
    """Whether a path without a scheme names this machine's files in the session ``build_spark`` would
    start: a local master, not under spark-submit, Spark Connect or Databricks, and no Hadoop setting
    that could make another file system the default (HDFS under YARN, say)."""
    if any(os.environ.get(name) for name in ("PYSPARK_GATEWAY_PORT", "SPARK_REMOTE", "DATABRICKS_RUNTIME_VERSION",
                                             "HADOOP_CONF_DIR", "YARN_CONF_DIR")):
        return False
    conf = {**_preset_conf(False), **cfg.conf}
    chosen_master = master or conf.get("spark.master") or cfg.master or "local[*]"
    return _is_local(chosen_master) and not {"spark.hadoop.fs.defaultFS", "spark.hadoop.fs.default.name"} & set(conf)


def _preset_conf(under_submit: bool) -> dict[str, str]:
    """Settings already made outside this code: spark-submit's (JVM properties) or spark-defaults.conf."""
    if under_submit:
        from pyspark import SparkConf, SparkContext

        # Connect to spark-submit's JVM first: its system properties hold --master and --conf, and a
        # SparkConf made before the gateway exists is empty (so spark-submit's master would be overridden).
        SparkContext._ensure_initialized()
        return dict(SparkConf().getAll())
    conf_dir = Path(os.environ.get("SPARK_CONF_DIR") or spark_home() / "conf")
    defaults = conf_dir / "spark-defaults.conf"
    preset = {}
    if defaults.is_file():
        for line in defaults.read_text(encoding="utf-8").splitlines():
            parts = line.strip().split(None, 1)
            if len(parts) == 2 and not parts[0].startswith("#"):
                preset[parts[0]] = parts[1].strip()
    return preset


def local_jars(cfg: SparkConfig) -> list[str]:
    """Delta's JARs (plus ``spark.packages`` and ``spark.jars``) as local paths, resolved once into the cache."""
    resolved = resolve_jars([delta_coordinate(), *cfg.packages], cfg.ivy_cache, cfg.maven_repository)
    missing = [jar for jar in cfg.jars if not Path(jar).expanduser().is_file()]
    if missing:
        raise UserError(f"spark.jars names '{missing[0]}', which is not a file; fix the path or drop it from spark.jars.")
    return [str(p) for p in resolved] + [str(Path(jar).expanduser().resolve()) for jar in cfg.jars]


def session_settings(cfg: SparkConfig, master: str, preset: dict[str, str],
                     extra_conf: dict[str, str] | None = None) -> dict[str, str]:
    """Builder settings for ``master``: never a key already in ``preset``; local defaults only locally."""
    local = _is_local(master)
    wanted: dict[str, str] = dict(CLUSTER_DEFAULTS)
    if local:
        wanted.update({
            "spark.sql.shuffle.partitions": str(cfg.shuffle_partitions),
            "spark.driver.memory": cfg.driver_memory,
            "spark.log.level": cfg.log_level,
            "spark.databricks.delta.snapshotPartitions": "2",
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
        })
    else:
        # An explicit setting in the project's config is the user's wish on any master.
        explicit = cfg.model_fields_set
        if "shuffle_partitions" in explicit:
            wanted["spark.sql.shuffle.partitions"] = str(cfg.shuffle_partitions)
        if "driver_memory" in explicit:
            wanted["spark.driver.memory"] = cfg.driver_memory
        if "log_level" in explicit:
            wanted["spark.log.level"] = cfg.log_level
    wanted.update(cfg.conf)
    wanted.update(extra_conf or {})
    settings = {key: value for key, value in wanted.items() if key not in preset}
    extensions = [e for e in preset.get("spark.sql.extensions", "").split(",") if e]
    if DELTA_EXTENSION_CLASS not in extensions:
        settings["spark.sql.extensions"] = ",".join([*extensions, DELTA_EXTENSION_CLASS])
    settings.setdefault("spark.sql.catalog.spark_catalog", preset.get("spark.sql.catalog.spark_catalog", DELTA_CATALOG))
    return settings


def build_spark(cfg: SparkConfig, master: str | None = None, extra_conf: dict[str, str] | None = None) -> SparkSession:
    """Create (or reuse) the session. ``master`` wins over config; spark-submit's master wins over both defaults.
    An ``sc://host:port`` master (or ``SPARK_REMOTE``) is a Spark Connect server; on a Databricks runtime
    the platform's own session is used."""
    remote = next((m for m in (master, cfg.master) if m and m.startswith("sc://")), os.environ.get("SPARK_REMOTE"))
    if remote or "DATABRICKS_RUNTIME_VERSION" in os.environ:
        return _platform_session(cfg, remote, extra_conf)
    # Under spark-submit the JVM already runs with the user's --master, --jars and --conf.
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ
    preset = _preset_conf(under_submit)
    chosen_master = master or preset.get("spark.master") or cfg.master or "local[*]"
    builder = SparkSession.builder.appName(cfg.app_name)
    if master or "spark.master" not in preset:
        builder = builder.master(chosen_master)
    settings = session_settings(cfg, chosen_master, preset, extra_conf)
    if not under_submit and "spark.jars" not in preset:
        settings["spark.jars"] = ",".join(local_jars(cfg))
        if _is_local(chosen_master) and "spark.driver.extraJavaOptions" not in preset:
            settings["spark.driver.extraJavaOptions"] = " ".join(
                local_driver_options(cfg, settings.get("spark.driver.extraJavaOptions")))
    if _is_local(chosen_master):
        # Local Python workers inherit the driver's environment: this interpreter, one BLAS thread.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if is_connect(spark):
        return spark
    if not _class_loadable(spark, DELTA_EXTENSION_CLASS):
        raise UserError("Delta Lake's JARs are not on this Spark's classpath; pass "
                        "`--jars $(python -m graphrag_spark.session --jars)` to spark-submit "
                        "(or `--packages $(python -m graphrag_spark.session --packages)` where Maven Central is reachable).")
    if not chosen_master.startswith("local["):
        # Executors on a real cluster import the driver's exact library version, prompts included.
        spark.sparkContext.addPyFile(_package_zip(Path(cfg.ivy_cache).expanduser().resolve().parent))
    return spark


_warmed_applications: set[str] = set()


def _importing(modules: tuple[str, ...], encoding: str):
    def warm(batches: Iterator) -> Iterator:
        for name in modules:
            importlib.import_module(name)
        from graphrag_spark.tokens import get_encoding

        get_encoding(encoding)
        yield from batches

    return warm


def warm_python_workers(spark: SparkSession, modules: tuple[str, ...], encoding: str) -> threading.Thread | None:
    """On a local master, once per application: start Python workers in the background, with ``modules``
    imported and the token ``encoding`` loaded, while the driver's first Delta commits run. A cold
    worker costs the first Python job of a JVM about 3 s, and the LLM client's imports 1 s more, all
    on an index's critical path. One slot is left to the driver's own jobs (so none on ``local[1]``).
    Returns the thread to join (a failed warm-up costs nothing: the stages start their workers themselves)."""
    if is_connect(spark) or not _is_local(spark.sparkContext.master):
        return None
    application, tasks = spark.sparkContext.applicationId, default_parallelism(spark) - 1
    if application in _warmed_applications or tasks < 1:  # local[1]: the warm-up would hold the only slot
        return None
    _warmed_applications.add(application)

    def warm() -> None:
        try:
            spark.range(tasks, numPartitions=tasks).mapInPandas(_importing(modules, encoding), "id long").collect()
        except Exception:  # noqa: BLE001 - see above
            pass

    thread = threading.Thread(target=warm, name="python-worker-warm-up", daemon=True)
    thread.start()
    return thread


def class_archive(cfg: SparkConfig) -> Path:
    """Where the driver JVM's class-data-sharing archive for this JDK and pyspark lives (``python -m
    graphrag_spark.session --warm`` makes it; setup runs that). A change to either names another file, so
    a JVM never meets an archive made for another class path; classes of other JARs (``spark.jars``, loaded
    by Spark's own class loader) are used from it only where their bytes are the same, which the JVM checks."""
    import pyspark

    java = Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else Path(shutil.which("java") or "java")
    java = java.resolve() if java.exists() else java
    stamp = java.stat().st_mtime_ns if java.exists() else 0
    key = hashlib.sha256("\n".join([str(java), str(stamp), pyspark.__version__]).encode()).hexdigest()[:16]
    return Path(cfg.ivy_cache).expanduser().resolve().parent / "jvm" / f"driver-{key}.jsa"


# C1 only, with the code cache the tiered JIT would have: a JVM held to C1 shrinks it to 48 MB, which a
# driver's compiled code fills within minutes; the JVM then stops compiling, runs interpreted at a
# quarter of its speed, and fails ("Out of space in CodeCache for adapters").
C1_ONLY = ["-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m"]


def local_driver_options(cfg: SparkConfig, user_options: str | None = None) -> list[str]:
    """JVM options of a local driver this process starts: the JIT ``cfg.driver_jit`` names, the user's own
    options (later, so they win), and the class archive setup made, where it exists."""
    archive = class_archive(cfg)
    return [*(C1_ONLY if cfg.driver_jit == "quick" else []), *filter(None, [user_options]),
            *(_sharing_options(archive) if archive.is_file() else [])]


def _sharing_options(archive: Path, create: bool = False) -> list[str]:
    # The JVM's class-data-sharing notes (a class it could not archive, say) are no user's concern.
    return [f"-XX:{'ArchiveClassesAtExit' if create else 'SharedArchiveFile'}={archive}", "-Xlog:cds*=off"]


def make_class_archive(cfg: SparkConfig) -> Path:
    """Start a local JVM that records the classes Spark and Delta load for a small index-like workload,
    and write them to ``class_archive`` as it exits (JDK 13+ dynamic archive). A later local session
    maps them instead of loading and verifying each class again: seconds off the start of every job
    on a small machine. Nothing happens where the archive exists."""
    from pyspark import SparkContext

    archive = class_archive(cfg)
    if archive.is_file():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f"{archive.stem}.{os.getpid()}.part")
    spark = build_spark(cfg, master="local[1]", extra_conf={
        "spark.ui.enabled": "false", "spark.driver.extraJavaOptions": " ".join(_sharing_options(partial, create=True))})
    with tempfile.TemporaryDirectory(prefix="graphrag-cds-") as work:
        table = f"delta.`{work}/t`"
        rows = spark.range(200).selectExpr("cast(id as string) as id", "id % 7 as k", "array(cast(id as string)) as ids")
        rows.write.format("delta").save(f"{work}/t")
        rows.write.format("delta").mode("append").save(f"{work}/t")
        spark.sql(f"UPDATE {table} SET k = 0 WHERE id = '1'")
        spark.sql(f"MERGE INTO {table} t USING (SELECT '2' AS id, 1L AS k, array('2') AS ids) s ON t.id = s.id "
                  "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
        read = spark.read.format("delta").load(f"{work}/t")
        read.join(read.groupBy("k").count(), "k").select("id", "count").toPandas()
        spark.sql(f"DESCRIBE HISTORY {table} LIMIT 1").collect()
        jvm = SparkContext._gateway.proc
        spark.stop()
    # The gateway JVM exits once its stdin closes, and writes the archive as it exits.
    jvm.stdin.close()
    jvm.wait(timeout=600)
    if partial.is_file():
        partial.replace(archive)
    return archive


def _class_loadable(spark: SparkSession, name: str) -> bool:
    """Whether a JVM class loads through Spark's context class loader (where spark.jars land; py4j's own
    ``Class.forName`` does not see them)."""
    try:
        spark._jvm.org.apache.spark.util.Utils.classForName(name, True, False)
        return True
    except Exception:  # py4j raises Py4JJavaError wrapping ClassNotFoundException
        return False


def _platform_session(cfg: SparkConfig, remote: str | None, extra_conf: dict[str, str] | None) -> SparkSession:
    """A Spark Connect client, or the Databricks runtime's session (itself Connect on serverless and shared
    clusters). The server owns the JVM, Delta and the cluster, so only session settings are applied, and
    shuffle partitions only where the project's config sets them explicitly."""
    spark = (SparkSession.builder.remote(remote) if remote else SparkSession.builder).getOrCreate()
    settings = {"spark.sql.shuffle.partitions": str(cfg.shuffle_partitions)} if "shuffle_partitions" in cfg.model_fields_set else {}
    settings.update(cfg.conf)
    settings.update(extra_conf or {})
    for key, value in settings.items():
        spark.conf.set(key, value)
    return spark


def _package_zip(cache_dir: Path) -> str:
    """Zip the library, with its package data, so executors import the same code as the driver."""
    package_dir = Path(__file__).resolve().parent
    target = cache_dir / "graphrag_spark.zip"
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        # followlinks: in a checkout, resources/ links to the repository's prompts/, conf/ and jobs/.
        for folder, subfolders, files in sorted(os.walk(package_dir, followlinks=True)):
            subfolders[:] = [name for name in subfolders if name != "__pycache__"]
            for name in sorted(files):
                path = Path(folder) / name
                archive.write(path, path.relative_to(package_dir.parent))
    return str(target)


def _main(argv: list[str]) -> None:
    """``--jars`` (default): the comma-separated local JAR paths; ``--packages``: the Maven coordinate;
    ``--warm`` (setup runs it): resolve what is not resolved, and make the driver JVM's class-data-sharing
    archive where there is none, in one local session that also proves the JARs load."""
    cfg = SparkConfig()
    if argv == ["--warm"]:
        if class_archive(cfg).is_file():
            local_jars(cfg)
        elif not make_class_archive(cfg).is_file():
            print("note: no class-data-sharing archive for this JDK; Spark starts without it.", file=sys.stderr)
    elif argv == ["--packages"]:
        print(",".join([delta_coordinate(), *cfg.packages]))
    elif argv in ([], ["--jars"]):
        print(",".join(local_jars(cfg)))
    else:
        raise SystemExit("usage: python -m graphrag_spark.session [--jars | --packages | --warm]")


if __name__ == "__main__":
    _main(sys.argv[1:])
