"""JAR resolution that a used ~/.m2 cannot poison, and session settings that respect the cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from graphrag_spark.config import SparkConfig
from graphrag_spark.session import DELTA_EXTENSION_CLASS, _preset_conf, class_archive, session_settings

POISONED = ["com.google.code.findbugs:jsr305:3.0.2", "org.xerial.snappy:snappy-java:1.1.10.7",
            "commons-logging:commons-logging:1.3.0"]


def test_resolution_ignores_pom_only_m2_entries(tmp_path):
    """A ~/.m2 holding only POMs for jsr305, snappy-java and commons-logging (what any `mvn` build
    leaves) made Spark's --packages fail with JAVA_GATEWAY_EXITED; the project's resolver never reads it."""
    import pyspark

    home = tmp_path / "home"
    for coordinate in POISONED:
        group, artifact, version = coordinate.split(":")
        pom = home / ".m2" / "repository" / group.replace(".", "/") / artifact / version / f"{artifact}-{version}.pom"
        pom.parent.mkdir(parents=True)
        pom.write_text(f"<project><modelVersion>4.0.0</modelVersion><groupId>{group}</groupId><artifactId>{artifact}"
                       f"</artifactId><version>{version}</version><packaging>jar</packaging></project>")
    # A Spark home that ships no JARs but Ivy, so none of the three is dropped as already provided.
    spark_home = tmp_path / "spark"
    (spark_home / "jars").mkdir(parents=True)
    ivy = next((Path(pyspark.__file__).parent / "jars").glob("ivy-*.jar"))
    (spark_home / "jars" / ivy.name).symlink_to(ivy)
    script = ("import sys; from graphrag_spark.jars import resolve_jars\n"
              f"coords = {POISONED!r}\n"
              "first = resolve_jars(coords, sys.argv[1])\n"
              "import graphrag_spark.jars as j; j._run_ivy = None  # a second call must not resolve again\n"
              "assert resolve_jars(coords, sys.argv[1]) == first\n"
              "print('\\n'.join(p.name for p in first))")
    # Java takes ~ from the password database, not $HOME: user.home is what Spark's Ivy reads.
    env = {**os.environ, "HOME": str(home), "JAVA_TOOL_OPTIONS": f"-Duser.home={home}", "SPARK_HOME": str(spark_home)}
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "cache")], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["com.google.code.findbugs_jsr305-3.0.2.jar",
                                   "commons-logging_commons-logging-1.3.0.jar",
                                   "org.xerial.snappy_snappy-java-1.1.10.7.jar"]
    assert not (home / ".ivy2").exists() and not (home / ".ivy2.5.2").exists()


def test_resolved_delta_jars_exclude_what_spark_ships():
    from graphrag_spark.session import local_jars

    jars = local_jars(SparkConfig(ivy_cache=str(REPO / ".cache" / "ivy")))
    names = [os.path.basename(j) for j in jars]
    assert any(n.startswith("io.delta_delta-spark_") for n in names)
    assert not any("hadoop-client" in n or "scala-library" in n or "log4j" in n for n in names), names
    assert all(os.path.isfile(j) for j in jars)


def test_local_defaults_apply_only_to_a_local_master():
    cfg = SparkConfig()
    local = session_settings(cfg, "local[2]", preset={})
    assert local["spark.sql.shuffle.partitions"] == "8" and local["spark.driver.memory"] == "4g"
    assert local["spark.pyspark.python"] == sys.executable and local["spark.log.level"] == "ERROR"
    cluster = session_settings(cfg, "spark://10.0.0.1:7077", preset={})
    for key in ("spark.sql.shuffle.partitions", "spark.driver.memory", "spark.pyspark.python",
                "spark.pyspark.driver.python", "spark.log.level"):
        assert key not in cluster, key
    assert "spark.ui.enabled" not in local and "spark.ui.enabled" not in cluster
    assert cluster["spark.speculation"] == "false"


def test_nothing_the_cluster_set_is_overridden():
    preset = {"spark.pyspark.python": "./env/bin/python", "spark.sql.shuffle.partitions": "400",
              "spark.speculation": "true", "spark.ui.enabled": "false",
              "spark.sql.extensions": "com.example.Ext"}
    cfg = SparkConfig(conf={"spark.sql.shuffle.partitions": "16", "spark.executor.cores": "4"}, shuffle_partitions=32)
    settings = session_settings(cfg, "yarn", preset, extra_conf={"spark.ui.enabled": "true"})
    assert not {"spark.pyspark.python", "spark.sql.shuffle.partitions", "spark.speculation",
                "spark.ui.enabled"} & settings.keys()
    assert settings["spark.executor.cores"] == "4"
    assert settings["spark.sql.extensions"] == f"com.example.Ext,{DELTA_EXTENSION_CLASS}"


def test_explicit_config_applies_on_a_cluster_when_unset_there():
    settings = session_settings(SparkConfig(shuffle_partitions=200), "k8s://https://api:6443", preset={})
    assert settings["spark.sql.shuffle.partitions"] == "200" and "spark.driver.memory" not in settings


def test_spark_defaults_conf_counts_as_preset(tmp_path, monkeypatch):
    (tmp_path / "spark-defaults.conf").write_text("# comment\nspark.master   spark://h:7077\n"
                                                  "spark.sql.shuffle.partitions 64\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert _preset_conf(under_submit=False) == {"spark.master": "spark://h:7077", "spark.sql.shuffle.partitions": "64"}


def test_the_class_archive_is_named_by_the_jdk_and_pyspark(tmp_path, monkeypatch):
    cfg = SparkConfig(ivy_cache=str(tmp_path / "cache" / "ivy"))
    for home in ("jdk-a", "jdk-b"):
        (tmp_path / home / "bin").mkdir(parents=True)
        (tmp_path / home / "bin" / "java").write_text("")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk-a"))
    first = class_archive(cfg)
    assert first.parent == tmp_path / "cache" / "jvm" and first == class_archive(cfg)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk-b"))
    assert class_archive(cfg) != first, "another JDK never meets this one's archive"


def test_a_local_driver_compiles_with_c1_only_unless_asked_for_the_full_jit(tmp_path):
    from graphrag_spark.session import local_driver_options

    cfg = SparkConfig(ivy_cache=str(tmp_path / "ivy"))
    c1_only = ["-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=240m"]  # C1 alone would shrink the cache to 48 MB
    assert local_driver_options(cfg) == c1_only  # no archive made under tmp_path
    # The user's own options come after ours, so a JIT flag of theirs wins.
    assert local_driver_options(cfg, "-XX:TieredStopAtLevel=4 -Dx=1") == [*c1_only, "-XX:TieredStopAtLevel=4 -Dx=1"]
    assert local_driver_options(SparkConfig(ivy_cache=str(tmp_path / "ivy"), driver_jit="full")) == []
    # The JVM held to C1 keeps the tiered JIT's code cache (its own default would be 48 MB).
    java = Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
    flags = subprocess.run([str(java), *c1_only, "-XX:+PrintFlagsFinal", "-version"], capture_output=True, text=True).stdout
    reserved = next(line.split("=")[1].split()[0] for line in flags.splitlines() if " ReservedCodeCacheSize " in line)
    assert int(reserved) == 240 * 1024 * 1024
    archive = class_archive(cfg)
    archive.parent.mkdir(parents=True)
    archive.touch()
    assert local_driver_options(cfg)[-2:] == [f"-XX:SharedArchiveFile={archive}", "-Xlog:cds*=off"]


def test_the_cli_passes_the_local_driver_options_to_spark_submit_and_none_to_a_cluster(tmp_path):
    from graphrag_spark.cli import JOBS, submit_command
    from graphrag_spark.session import local_driver_options

    settings = tmp_path / "settings.yaml"
    settings.write_text(f"spark:\n  ivy_cache: {REPO / '.cache' / 'ivy'}\n", encoding="utf-8")
    local = submit_command(JOBS["index"], [], str(settings), [], verbose=False)
    options = local[local.index("--driver-java-options") + 1]
    assert options == " ".join(local_driver_options(SparkConfig(ivy_cache=str(REPO / ".cache" / "ivy"))))
    assert "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m" in options
    remote = submit_command(JOBS["index"], [], str(settings), ["spark.master=spark://host:7077"], verbose=False)
    assert "--driver-java-options" not in remote
    (tmp_path / "ivy").mkdir()  # no class archive there: the full JIT has no option to pass, and passes none
    bare = submit_command(JOBS["index"], [], str(settings), [f"spark.ivy_cache={tmp_path / 'ivy'}", "spark.driver_jit=full"],
                          verbose=False)
    assert "--driver-java-options" not in bare and "--driver-memory" in bare



def test_the_cli_keeps_the_driver_options_spark_defaults_set(tmp_path, monkeypatch):
    from graphrag_spark.cli import JOBS, submit_command

    (tmp_path / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions -Dmine=1\n", encoding="utf-8")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    settings = tmp_path / "settings.yaml"
    settings.write_text(f"spark:\n  ivy_cache: {REPO / '.cache' / 'ivy'}\n", encoding="utf-8")
    assert "--driver-java-options" not in submit_command(JOBS["index"], [], str(settings), [], verbose=False)


@pytest.mark.spark
def test_a_local_session_maps_the_class_archive_setup_made(spark):
    archive = class_archive(SparkConfig(ivy_cache=str(REPO / ".cache" / "ivy")))
    options = spark.sparkContext.getConf().get("spark.driver.extraJavaOptions", "")
    # The test session lives for the whole suite: the full JIT (C2) pays for itself there.
    arguments = list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-XX:TieredStopAtLevel=1" not in arguments
    if not archive.is_file():
        pytest.skip(f"no class archive at {archive} (scripts/setup.sh makes it)")
    assert f"-XX:SharedArchiveFile={archive}" in options and f"-XX:SharedArchiveFile={archive}" in arguments


@pytest.mark.spark
def test_python_workers_are_warmed_once_per_application_with_the_modules_imported(spark, monkeypatch):
    import pandas as pd

    from graphrag_spark import session

    monkeypatch.setattr(session, "_warmed_applications", set())
    module = "json.tool"  # imported by no task of the project
    with monkeypatch.context() as single_slot:  # local[1]: no slot to spare, no warm-up
        single_slot.setattr(session, "default_parallelism", lambda spark: 1)
        assert session.warm_python_workers(spark, (module,), "cl100k_base") is None
    warming = session.warm_python_workers(spark, (module,), "cl100k_base")
    assert warming is not None
    warming.join(timeout=120)
    assert not warming.is_alive()
    assert session.warm_python_workers(spark, (module,), "cl100k_base") is None  # once per application

    def probe(batches):
        import sys

        for _ in batches:
            pass
        yield pd.DataFrame({"warm": [module in sys.modules]})

    # The warmed worker is idle, so one of the probe's tasks is handed to it.
    assert any(row.warm for row in spark.range(4, numPartitions=4).mapInPandas(probe, "warm boolean").collect())


@pytest.mark.spark
def test_session_loads_delta_from_jars_by_path(spark):
    conf = spark.sparkContext.getConf()
    assert "io.delta_delta-spark_" in conf.get("spark.jars") and not conf.get("spark.jars.packages", "")


@pytest.mark.parametrize("pyspark_version, delta_version, scala_jar, expected", [
    ("3.5.9", "3.3.2", "scala-library-2.12.18.jar", "io.delta:delta-spark_2.12:3.3.2"),  # Databricks 15.4/16.4 LTS line
    ("3.5.2", None, "scala-library-2.12.18.jar", "io.delta:delta-spark_2.12:3.3.2"),  # no delta-spark: the tested 3.x
    ("4.0.1", "4.0.0", "scala-library-2.13.16.jar", "io.delta:delta-spark_2.13:4.0.0"),  # Delta 4.0: Scala suffix only
    ("4.0.1", "4.4.0", "scala-library-2.13.16.jar", "io.delta:delta-spark_4.0_2.13:4.4.0"),
    ("4.1.1", None, "scala-library-2.13.17.jar", "io.delta:delta-spark_4.1_2.13:4.4.0"),
])
def test_the_delta_artifact_matches_the_running_spark(monkeypatch, tmp_path, pyspark_version, delta_version, scala_jar, expected):
    import importlib.metadata

    import pyspark

    from graphrag_spark import jars

    (tmp_path / "jars").mkdir()
    (tmp_path / "jars" / scala_jar).touch()
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    monkeypatch.setattr(pyspark, "__version__", pyspark_version)

    def installed(name):
        if name == "delta_spark" and delta_version:
            return delta_version
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(jars.importlib.metadata, "version", installed)
    assert jars.delta_coordinate() == expected
