"""The JVM side of Delta Lake (and optional packages such as GraphFrames), resolved once into the
project's cache and handed to Spark by path.

Spark's own ``--packages`` resolution also searches ``~/.m2``; a POM-only entry there (left by
any ``mvn`` build) is "found", its JAR download fails and the JVM exits, and the failure is then
remembered in the Ivy cache. So resolution here runs Ivy (the copy inside pyspark) with settings
that know only one Maven repository, into a cache of its own, once per set of coordinates, and
records the resulting JAR paths in a manifest. Every later session reads the manifest: no run
re-resolves, none prints Ivy output, and ``~/.m2`` is never consulted.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
from pathlib import Path
from xml.sax.saxutils import quoteattr

from graphrag_spark.errors import UserError

MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"
TESTED_DELTA_VERSION = "4.4.0"
TESTED_DELTA_VERSION_SPARK3 = "3.3.2"
GRAPHFRAMES_CLASS = "org.graphframes.GraphFrame"
DELTA_EXTENSION_CLASS = "io.delta.sql.DeltaSparkSessionExtension"

_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+?)-\d[^-]*(-[A-Za-z0-9.]+)?\.jar$")


def spark_home() -> Path:
    """The Spark distribution this Python uses: ``SPARK_HOME`` if it has jars, else the pyspark package."""
    configured = os.environ.get("SPARK_HOME")
    if configured and (Path(configured) / "jars").is_dir():
        return Path(configured)
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def delta_coordinate() -> str:
    """The Delta artifact for this pyspark at the installed delta-spark version (or the tested one where only
    the cluster's Spark is installed): Delta 3.x for Spark 3.5, 4.x for Spark 4. Up to Delta 4.0 the artifact is
    named by Scala version only (``delta-spark_2.12``); from 4.1 by Spark minor too (``delta-spark_4.1_2.13``)."""
    import pyspark

    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    try:
        version = importlib.metadata.version("delta_spark")
    except importlib.metadata.PackageNotFoundError:
        version = TESTED_DELTA_VERSION_SPARK3 if spark_minor.startswith("3.") else TESTED_DELTA_VERSION
    scala = scala_version(spark_home())
    if _major_minor(version) < (4, 1):
        return f"io.delta:delta-spark_{scala}:{version}"
    return f"io.delta:delta-spark_{spark_minor}_{scala}:{version}"


def scala_version(home: Path) -> str:
    """The Scala binary version of this Spark's JARs (pip's pyspark 3.5 is built for 2.12, Spark 4 for 2.13)."""
    for jar in (home / "jars").glob("scala-library-*.jar"):
        return ".".join(jar.name.removeprefix("scala-library-").split(".")[:2])
    return "2.12" if _major_minor(importlib.metadata.version("pyspark")) < (4, 0) else "2.13"


def _major_minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(re.match(r"\d+", minor).group())


def _spark_artifacts(home: Path) -> set[str]:
    """Artifact names (no version) that Spark already ships; resolving them again only duplicates classes."""
    names = set()
    for jar in (home / "jars").glob("*.jar"):
        match = _VERSIONED_JAR.match(jar.name)
        if match:
            names.add(match.group("artifact"))
    return names


def _ivy_settings(repository: str, cache: Path) -> str:
    return (
        "<ivysettings>\n"
        '  <settings defaultResolver="only-repository"/>\n'
        f"  <caches defaultCacheDir={quoteattr(str(cache))}/>\n"
        "  <resolvers>\n"
        f'    <ibiblio name="only-repository" m2compatible="true" root={quoteattr(repository)}/>\n'
        "  </resolvers>\n"
        "</ivysettings>\n"
    )


def _ivy_module(coordinates: list[str]) -> str:
    lines = ['<ivy-module version="2.0">', '  <info organisation="graphrag-spark" module="jars"/>',
             '  <configurations><conf name="default"/></configurations>', "  <dependencies>"]
    for coordinate in coordinates:
        group, artifact, version = coordinate.split(":")
        lines.append(f'    <dependency org={quoteattr(group)} name={quoteattr(artifact)} rev={quoteattr(version)}'
                     ' conf="default->default(runtime)"/>')
    lines += ["  </dependencies>", "</ivy-module>"]
    return "\n".join(lines) + "\n"


def _check_coordinates(coordinates: list[str]) -> None:
    for coordinate in coordinates:
        if coordinate.count(":") != 2 or not all(coordinate.split(":")):
            raise UserError(f"Maven coordinate '{coordinate}' must be 'group:artifact:version'.")


def resolve_jars(coordinates: list[str], cache_dir: str | Path, repository: str = MAVEN_CENTRAL) -> list[Path]:
    """Local JAR paths for the coordinates and their runtime dependencies (minus what Spark ships).

    The first call for a set of coordinates downloads them (seconds, needs the repository);
    every later call reads the manifest. Concurrent first calls wait on a file lock.
    """
    _check_coordinates(coordinates)
    home = spark_home()
    cache = Path(cache_dir).expanduser().resolve()
    key = hashlib.sha256("\n".join([repository, *sorted(coordinates)]).encode()).hexdigest()[:16]
    target = cache / "resolved" / key
    manifest = target / "jars.txt"
    cached = _read_manifest(manifest)
    if cached is not None:
        return cached
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = _read_manifest(manifest)
        if cached is not None:
            return cached
        retrieved = target / "retrieved"
        shutil.rmtree(retrieved, ignore_errors=True)
        (target / "ivysettings.xml").write_text(_ivy_settings(repository, cache / "ivy-only-repository"))
        (target / "ivy.xml").write_text(_ivy_module(coordinates))
        _run_ivy(home, target, retrieved, repository)
        shipped = _spark_artifacts(home)
        jars = sorted(p.rename(target / p.name.split("__", 1)[1])
                      for p in retrieved.glob("*.jar") if p.name.split("__")[0] not in shipped)
        shutil.rmtree(retrieved, ignore_errors=True)
        manifest.write_text("".join(f"{p}\n" for p in jars))
        return jars


def _read_manifest(manifest: Path) -> list[Path] | None:
    if not manifest.is_file():
        return None
    jars = [Path(line) for line in manifest.read_text().splitlines() if line]
    return jars if jars and all(p.is_file() for p in jars) else None


def _run_ivy(home: Path, target: Path, retrieved: Path, repository: str) -> None:
    ivy_jars = sorted((home / "jars").glob("ivy-*.jar"))
    if not ivy_jars:
        raise UserError(f"No Ivy JAR in '{home / 'jars'}'; set SPARK_HOME to a Spark 3.5 or 4 distribution or reinstall pyspark.")
    java = Path(os.environ["JAVA_HOME"]) / "bin" / "java" if os.environ.get("JAVA_HOME") else shutil.which("java")
    if java is None:
        raise UserError("Java 17+ is required by Spark; install a JDK (e.g. apt-get install openjdk-17-jre-headless).")
    command = [str(java), "-Djava.net.useSystemProxies=true", "-cp", str(ivy_jars[-1]), "org.apache.ivy.Main",
               "-settings", str(target / "ivysettings.xml"), "-ivy", str(target / "ivy.xml"), "-confs", "default",
               # "__" separates the artifact name (compared with Spark's own JARs) from the file name kept.
               "-retrieve", f"{retrieved}/[artifact]__[organisation]_[artifact]-[revision](-[classifier]).[ext]"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not any(retrieved.glob("*.jar")):
        tail = " | ".join(line.strip() for line in (proc.stdout + proc.stderr).splitlines()[-6:])
        raise UserError(f"Could not download the Spark JARs from {repository} "
                        f"(check network access or set spark.maven_repository to a mirror): {tail}")
