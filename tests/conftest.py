"""Shared fixtures: one local SparkSession for every Spark test (starting one costs ~20 s)."""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from llm_budget import UNTHROTTLED
from tiny_data import TINY_DATA_CONF

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
SAMPLE_CORPUS = REPO / "data" / "sample"
GRAPHFRAMES_JAR = SHARED / "jars" / "graphframes-spark4_2.13-0.11.0.jar"

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

# A folder that every process of this test run shares: scripts/test.sh runs two pytest-xdist workers, which
# inherit the variable from their controller (or a plain pytest process makes its own).
_RUN_DIR_VARIABLE = "GRAPHRAG_SPARK_TEST_RUN_DIR"
_IN_WORKER = "PYTEST_XDIST_WORKER" in os.environ
if not _IN_WORKER:
    os.environ[_RUN_DIR_VARIABLE] = tempfile.mkdtemp(prefix="graphrag-spark-test-run-")
_run_dir = Path(os.environ[_RUN_DIR_VARIABLE])


def table_rows(store, name: str, columns: list[str] | None = None) -> list[tuple]:
    """A table's rows (``columns``, else all its schema's), sorted and each value as JSON: comparable as lists."""
    from graphrag_spark import tables as T

    columns = columns or T.SCHEMAS[name].fieldNames()
    return sorted(tuple(json.dumps(list(v) if hasattr(v, "__iter__") and not isinstance(v, str) else v) for v in r)
                  for r in store.read(name).select(*columns).collect())


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
                                      conf={"spark.ui.enabled": "false", **TINY_DATA_CONF}), master="local[2,2]")
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
    """The offline index of data/sample, built once per test run: (config, run summary). Each test process
    gets a copy of its own (tests write next to it), so under xdist the first worker to need it builds it,
    under a file lock, and the other copies it: a Delta table's log names its files relative to the table."""
    from graphrag_spark.config import load_config
    from graphrag_spark.index.pipeline import run_index

    def config(root: Path):
        return load_config(REPO / "conf" / "local.yaml", [f"storage.root={root}", f"input.path={SAMPLE_CORPUS}",
                                                         f"spark.ivy_cache={REPO / '.cache' / 'ivy'}"])

    built, summary_file = _run_dir / "sample-index", _run_dir / "sample-index.pickle"
    with (_run_dir / "sample-index.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not summary_file.exists():
            summary_file.write_bytes(pickle.dumps(run_index(spark, config(built))))
    root = tmp_path_factory.mktemp("sample") / "index"
    shutil.copytree(built, root)
    return config(root), pickle.loads(summary_file.read_bytes())


# Early jobs: a test module may define ``EARLY_JOB(workdir)``, work done in other processes only (a Spark
# Connect server and its client, say) that takes minutes. It starts in a background thread as soon as
# the module's tests are collected, so its processes run while the in-process tests do; those modules
# run last, and their ``early_result`` fixture waits for the job's value (or its exception).
# Under pytest-xdist the controller starts the jobs, once, when the first worker has collected; the value
# reaches the worker that runs the module as a pickle in the run's shared folder.
_early_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="early-job")
_early: dict[str, Future] = {}
_early_processes: list[subprocess.Popen] = []
_EARLY_JOB_TIMEOUT_S = 3600


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


# Seconds the longest modules took in one xdist worker (fresh-clone CI, 2 cores; the first ones beside the
# early jobs). xdist hands out whole files in collection order (scripts/test.sh turns off its reordering by
# test count), so the longest go first and the two workers end together. A stale figure costs minutes, never
# a result.
_MODULE_SECONDS = {"test_refresh": 1000, "test_refresh_llm": 530, "test_llm_index": 450, "test_llm_stage": 160,
                   "test_embedding_cache": 130, "test_graph_driver": 100, "test_raptor_spark": 80, "test_llm_client": 70,
                   "test_evaluation_e2e": 60, "test_graph_spark": 60, "test_bad_input": 50, "test_cluster": 45,
                   "test_secret_leak": 40, "test_session": 35, "test_checkpoint": 35, "test_query_search": 25}


def pytest_collection_modifyitems(items):
    """The longest modules first; modules with an early job last, when their job is done, not waiting for it
    at their turn. The sort is stable: a module's tests, and the unlisted modules, keep their order."""
    def order(item):
        module = getattr(item, "module", None)
        return getattr(module, "EARLY_JOB", None) is not None, -_MODULE_SECONDS.get(getattr(module, "__name__", ""), 0)
    items.sort(key=order)


def _early_outcome_file(module_name: str) -> Path:
    return _run_dir / f"{module_name}.pickle"


def _run_early_job(module_name: str, job, workdir: Path) -> None:
    """Run one early job and leave its value, or its exception, where any worker can read it."""
    try:
        outcome = ("value", job(workdir), None)
    except BaseException as exc:  # noqa: BLE001 - handed to the module's tests, which fail with it
        # A pickled exception loses its traceback: the text travels with it, so a failure says where it arose.
        outcome = ("error", exc, "".join(traceback.format_exception(exc)))
    try:
        payload = pickle.dumps(outcome)
        pickle.loads(payload)  # an exception class that cannot be rebuilt fails here, not in the worker
    except Exception as exc:  # noqa: BLE001
        detail = outcome[2] if outcome[0] == "error" else repr(exc)
        payload = pickle.dumps(("error", RuntimeError(f"{outcome[0]} not picklable"), detail))
    partial = _run_dir / f"{module_name}.partial"
    partial.write_bytes(payload)
    partial.replace(_early_outcome_file(module_name))


def _start_early_jobs(modules) -> None:
    for module in dict.fromkeys(modules):
        job = getattr(module, "EARLY_JOB", None)
        if job is not None and module.__name__ not in _early:
            workdir = _run_dir / module.__name__
            workdir.mkdir()
            _early[module.__name__] = _early_pool.submit(_run_early_job, module.__name__, job, workdir)


def pytest_collection_finish(session):
    if session.config.option.collectonly or _IN_WORKER:
        return
    _start_early_jobs(item.module for item in session.items if hasattr(item, "module"))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """The xdist controller collects nothing itself: the first worker's collection names the modules."""
    if _early:
        return
    files = dict.fromkeys(nodeid.split("::", 1)[0] for nodeid in ids)
    _start_early_jobs(importlib.import_module(Path(file).stem) for file in files)


def pytest_sessionfinish(session):
    for process in _early_processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    _early_pool.shutdown(wait=True, cancel_futures=True)
    if not _IN_WORKER:
        shutil.rmtree(_run_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def early_result(request):
    """The value of this module's EARLY_JOB, started at collection (by this process or the xdist controller)."""
    name = request.module.__name__
    if name in _early:
        _early[name].result()
    outcome_file, deadline = _early_outcome_file(name), time.monotonic() + _EARLY_JOB_TIMEOUT_S
    while not outcome_file.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the early job of {name} left no outcome in {_EARLY_JOB_TIMEOUT_S} s ({outcome_file})")
        time.sleep(1)
    kind, value, where = pickle.loads(outcome_file.read_bytes())
    if kind == "error":
        raise RuntimeError(f"the early job of {name} failed:\n{where}") from value
    return value
