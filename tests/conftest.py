"""Shared fixtures: one local SparkSession for every Spark test (starting one costs ~20 s)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from llm_budget import UNTHROTTLED

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
SAMPLE_CORPUS = REPO / "data" / "sample"
GRAPHFRAMES_JAR = SHARED / "jars" / "graphframes-spark4_2.13-0.11.0.jar"

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1")


def shared_path(relative: str) -> Path:
    """A file or folder of ``../shared`` (next to the repository). Missing, the test fails under
    ``CI=true`` (where the folder always exists, so a silent skip would hide lost coverage) and is
    skipped elsewhere."""
    path = SHARED / relative
    if not path.exists():
        message = f"{path} is missing: the shared folder must sit next to the repository ({SHARED})"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    from graphrag_spark.config import SparkConfig
    from graphrag_spark.session import build_spark

    # A job's main() run in-process by an earlier test leaves its own session active, and getOrCreate
    # would hand that one back. Its JVM was started without this session's JARs, so it goes too
    # (the gateway JVM exits when its stdin closes) and build_spark starts a fresh one.
    leftover = SparkSession.getActiveSession()
    if leftover is not None:
        from pyspark import SparkContext

        leftover.stop()
        SparkContext._gateway.proc.stdin.close()
        SparkContext._gateway.shutdown()
        SparkContext._gateway = SparkContext._jvm = None
    # No UI: eight test sessions may share a machine, and the UI's plan history costs driver heap.
    # The GraphFrames JAR is on the classpath so both graph backends can be compared in one session.
    # local[2,2]: a failed task is retried once, as on a cluster (tests kill Python workers mid-task).
    session = build_spark(SparkConfig(shuffle_partitions=2, ivy_cache=str(REPO / ".cache" / "ivy"), driver_jit="full",
                                      jars=[str(GRAPHFRAMES_JAR)] if GRAPHFRAMES_JAR.is_file() else [],
                                      conf={"spark.ui.enabled": "false"}), master="local[2,2]")
    yield session
    session.stop()


@pytest.fixture
def make_config(tmp_path):
    """A config writing its index under this test's tmp dir; keyword overrides as 'section.key=value' strings."""
    from graphrag_spark.config import load_config

    def make(*overrides: str, input_path: str | Path = SAMPLE_CORPUS):
        return load_config(REPO / "conf" / "local.yaml",
                           [f"storage.root={tmp_path / 'index'}", f"input.path={input_path}",
                            f"spark.ivy_cache={REPO / '.cache' / 'ivy'}", *UNTHROTTLED, *overrides])

    return make


@pytest.fixture(scope="session")
def sample_index(spark, tmp_path_factory):
    """The offline index of data/sample, built once per test session: (config, run summary)."""
    from graphrag_spark.config import load_config
    from graphrag_spark.index.pipeline import run_index

    root = tmp_path_factory.mktemp("sample") / "index"
    cfg = load_config(REPO / "conf" / "local.yaml", [f"storage.root={root}", f"input.path={SAMPLE_CORPUS}",
                                                     f"spark.ivy_cache={REPO / '.cache' / 'ivy'}"])
    return cfg, run_index(spark, cfg)


# Early jobs: a test module may define ``EARLY_JOB(workdir)``, work done in other processes only (a Spark
# Connect server and its client, say) that takes minutes. It starts in a background thread as soon as
# the module's tests are collected, so its processes run while the in-process tests do; those modules
# run last, and their ``early_result`` fixture waits for the job's value (or its exception).
_early_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="early-job")
_early: dict[str, Future] = {}
_early_dir = Path(tempfile.mkdtemp(prefix="graphrag-spark-early-"))
_early_processes: list[subprocess.Popen] = []


def track(process: subprocess.Popen) -> subprocess.Popen:
    """An early job's process, started in its own session: its group is killed if the test session ends first."""
    _early_processes.append(process)
    return process


def run_process(command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` for early jobs (see ``track``)."""
    with track(subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, **kwargs)) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def pytest_collection_modifyitems(items):
    """Modules with an early job run last, when their job is done, not waiting for it at their turn."""
    items.sort(key=lambda item: getattr(getattr(item, "module", None), "EARLY_JOB", None) is not None)


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return
    for module in dict.fromkeys(item.module for item in session.items if hasattr(item, "module")):
        job = getattr(module, "EARLY_JOB", None)
        if job is not None and module.__name__ not in _early:
            workdir = _early_dir / module.__name__
            workdir.mkdir()
            _early[module.__name__] = _early_pool.submit(job, workdir)


def pytest_sessionfinish(session):
    for process in _early_processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    _early_pool.shutdown(wait=True, cancel_futures=True)
    shutil.rmtree(_early_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def early_result(request):
    """The value of this module's EARLY_JOB, started at collection."""
    return _early[request.module.__name__].result()
