"""The index and query jobs through spark-submit on a real standalone cluster (a master and two
workers, each its own JVM, with a bare environment), the executors running Python only from the
environment archive built by scripts/pack_env.sh, the API key reaching them only through the
project's mechanism, and the key nowhere in the event log or any executor's output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from graphrag_spark.config import SparkConfig
from graphrag_spark.llm.server import start_server
from graphrag_spark.session import C1_ONLY, local_jars

from conftest import REPO, SAMPLE_CORPUS, run_process, track
from standalone_cluster import (SPARK_PYTHON_PATH, ProcessWatch, SeenProcess, StandaloneCluster, kill_process_tree,
                                proc_stat, start_cluster, submit_command, submit_env)
from tiny_data import TINY_DATA_CONF

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

SECRET = "sk-test-CLUSTER-KEY-MUST-NEVER-LEAK-9d41c7e0b2a6"
KEY_ENV = "GRAPHRAG_CLUSTER_TEST_KEY"
JOB_TIMEOUT_S = 900
REPLACEMENT_TIMEOUT_S = 90  # a standalone master relaunches lost executors within seconds
# A user's --conf for a tiny input: Delta reads its log in 50 tasks and Spark shuffles into 200 by default;
# code generation costs more than it saves on a few kilobytes, and C2 in a driver that runs one job (a local
# driver compiles with C1 only by default; a cluster's is the user's to set).
SMALL_CLUSTER_CONF = {"spark.sql.shuffle.partitions": "2", "spark.databricks.delta.snapshotPartitions": "2",
                      "spark.driver.extraJavaOptions": " ".join(C1_ONLY), **TINY_DATA_CONF}


def _pack_env(tmp: Path) -> Path:
    """The archive, as a user builds it (cached under .cache/env by content hash; a fresh clone builds it)."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "pack_env.sh"), str(tmp / "env.tar.gz")],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Path(proc.stdout.strip().splitlines()[-1])


def _corpus(folder: Path) -> Path:
    """Two sample files: enough for several tasks, communities and reports; few stages' worth of work."""
    folder.mkdir()
    for name in ("lumen_cells_factory.txt", "seals_report.md"):
        shutil.copy(SAMPLE_CORPUS / name, folder / name)
    return folder


def _driver_env() -> dict[str, str]:
    """The submitting user's shell: the key exported, nothing that would point executors at the venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env[KEY_ENV] = SECRET
    return env


def _command(cluster, archive, tmp: Path, script: str, args: list[str], **kwargs) -> list[str]:
    return submit_command(cluster, REPO / "jobs" / script, args, archive=archive, event_log=tmp / "events",
                          jars=local_jars(SparkConfig(ivy_cache=str(REPO / ".cache" / "ivy"))),
                          driver_python=sys.executable, extra_conf=SMALL_CLUSTER_CONF, **kwargs)


def _submit(cluster, archive, tmp: Path, script: str, args: list[str], **kwargs) -> subprocess.CompletedProcess:
    return run_process(_command(cluster, archive, tmp, script, args, **kwargs), timeout=JOB_TIMEOUT_S,
                       env=submit_env(_driver_env()), cwd=REPO)


def _alive(pid: int, started_at: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat[0] != "Z" and int(stat[19]) == started_at


def _kill_every_executor(executors: list[SeenProcess]) -> list[tuple[int, int]]:
    """SIGKILL every live executor JVM with its Python workers, as the loss of every node would; the JVMs'
    (pid, start time)."""
    killed = []
    for executor in executors:
        if _alive(executor.pid, executor.started_at):
            kill_process_tree(executor.pid)
            killed.append((executor.pid, executor.started_at))
    return killed


def _resubmitted_stages(events: Path) -> list[int]:
    """The stages the index job's event log shows submitted again (a stage attempt after the first)."""
    lines = [line for log in events.glob("*-0000/events_*") for line in log.read_text().splitlines()]  # the index job
    submitted = [json.loads(line) for line in lines if '"SparkListenerStageSubmitted"' in line]
    return [e["Stage Info"]["Stage ID"] for e in submitted if e["Stage Info"]["Stage Attempt ID"] > 0]


def _a_later_report_is_out(server) -> bool:
    """Whether a community report's call is out after two have returned: the sample's third report, whose
    context waited on its entities' summaries, so the coordinator handed it to the running task (``/more``) and
    must hand it again to that task's retry."""
    return server.stats()["by_kind"].get("community_report", 0) >= 2 and (
        "community_report" in server.requests_in_progress().values())


def _index_losing_every_executor(cluster, archive, tmp: Path, args: list[str], server, watch: ProcessWatch):
    """Run the index job; while a community report's call is out, hold the server's answers and SIGKILL every
    executor JVM: the task calling is lost with the follow-ups it was handed, and so is the shuffle output its
    stage read, so its retry runs in a resubmitted stage. Answers stay held until a replacement executor runs, so
    that nothing ends first. Returns the finished job and the killed processes as (pid, start time)."""
    stdout, stderr = tmp / "index.out", tmp / "index.err"
    with open(stdout, "w") as out, open(stderr, "w") as err:
        job = track(subprocess.Popen(_command(cluster, archive, tmp, "index.py", args), stdout=out, stderr=err,
                                     env=submit_env(_driver_env()), cwd=REPO, start_new_session=True))
        killed: list[tuple[int, int]] = []
        deadline = time.monotonic() + JOB_TIMEOUT_S

        def running() -> bool:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the index job ran past {JOB_TIMEOUT_S} s")
            return job.poll() is None

        try:
            # The third report's call stays out until the executors are gone: a poll cannot miss it on a slow
            # machine (answered in its 0.5 s latency, it once went by between two polls).
            with server.holding_calls_of("community_report", after=2):
                while not killed and running():
                    if _a_later_report_is_out(server):
                        with server.holding_answers():
                            killed = _kill_every_executor(watch.of_cluster(cluster)[0])
                            given_up = time.monotonic() + REPLACEMENT_TIMEOUT_S
                            # Not the killed ones: a JVM takes a moment to die, and still looks alive meanwhile.
                            while time.monotonic() < given_up and not any(
                                    (p.pid, p.started_at) not in killed and _alive(p.pid, p.started_at)
                                    for p in watch.of_cluster(cluster)[0]):
                                time.sleep(0.2)
                    time.sleep(0.1)
            while running():
                time.sleep(0.1)
        finally:
            if job.poll() is None:
                job.kill()
                job.wait(timeout=30)
    return subprocess.CompletedProcess(job.args, job.returncode, stdout.read_text(), stderr.read_text()), killed


@dataclass
class ClusterRun:
    """What the jobs on the cluster did, for the tests to check."""
    cluster: StandaloneCluster
    tmp: Path
    refused: subprocess.CompletedProcess
    index: subprocess.CompletedProcess
    query: subprocess.CompletedProcess
    killed: list[tuple[int, int]]
    executors: list[SeenProcess]
    python_workers: list[SeenProcess]
    stats: dict
    seconds: dict[str, float]


def EARLY_JOB(tmp: Path) -> ClusterRun:
    """Everything on the cluster, once, while other tests run (see conftest): the archive, a master and
    two workers, a cluster-mode submit, then the LLM index job (an executor killed mid-reports) and a
    global query, both through spark-submit in client mode."""
    seconds, started = {}, time.monotonic()

    def lap(what: str) -> None:
        nonlocal started
        seconds[what], started = round(time.monotonic() - started), time.monotonic()

    archive = _pack_env(tmp)
    lap("pack_env.sh")
    cluster = start_cluster(tmp / "standalone", workers=2, cores=1, memory="1g")
    lap("master + 2 workers up")
    try:
        (tmp / "events").mkdir()
        refused = _submit(cluster, tmp / "unused.tar.gz", tmp, "index.py", ["--help"], deploy_mode="cluster")
        # Every call without the key is a 401. At most two calls in flight job-wide, so a lost task can have at
        # most two calls in flight.
        with start_server(api_key=SECRET, latency_s=0.5) as server:
            # A root relative to the jobs' working directory, as the quickstart's is: resolved on the driver,
            # whatever the executors' own working directories.
            settings = [f"storage.root={os.path.relpath(tmp / 'index', REPO)}", f"input.path={_corpus(tmp / 'corpus')}",
                        "chunking.size=200", "chunking.overlap=20", "extraction.method=llm", "extraction.max_gleanings=0",
                        "embeddings.provider=openai", f"llm.chat.api_base={server.base_url}",
                        f"llm.chat.api_key_env={KEY_ENV}", "llm.chat.model=local-model",
                        f"llm.embedding.api_base={server.base_url}", f"llm.embedding.api_key_env={KEY_ENV}",
                        "llm.max_in_flight=2"]
            set_args = [arg for setting in settings for arg in ("--set", setting)]
            lap("cluster deploy mode refused")
            with ProcessWatch() as watch:
                index, killed = _index_losing_every_executor(cluster, archive, tmp,
                                                             ["--config", "conf/local.yaml", *set_args], server, watch)
            lap("index job")
            query = _submit(cluster, archive, tmp, "query.py",
                            ["--config", "conf/local.yaml", *set_args, "--method", "global", "--level", "0",
                             "What does the Lumen Cells factory make?"])
            lap("query job")
            stats = server.stats()
    finally:
        cluster.stop()
    return ClusterRun(cluster, tmp, refused, index, query, killed, *watch.of_cluster(cluster), stats, seconds)


@pytest.fixture(scope="module")
def run(early_result) -> ClusterRun:
    return early_result


def test_standalone_refuses_cluster_deploy_mode_for_python(run):
    """Only client mode exists for Python on a standalone master (YARN and Kubernetes have cluster mode)."""
    assert run.refused.returncode != 0
    assert "Cluster deploy mode is currently not supported for python applications on standalone clusters" in run.refused.stderr


def test_index_and_query_jobs_run_on_a_standalone_cluster_from_the_shipped_environment(run, spark):
    cluster, index, query, killed, stats = run.cluster, run.index, run.query, run.killed, run.stats
    executors, python_workers = run.executors, run.python_workers
    root, events = run.tmp / "index", run.tmp / "events"
    print(f"on the standalone cluster, seconds: {run.seconds}\nthe master's executors:\n{cluster.master_executor_log()}")
    assert index.returncode == 0, index.stderr[-4000:]
    assert query.returncode == 0, query.stderr[-4000:]

    # The executors were the cluster's, and their Python came from the archive: the interpreter ./env/bin/python
    # in each executor's work dir, Spark's own pyspark.zip, nothing of the driver's venv or the repository.
    work_dirs = [str(d) for d in cluster.work_dirs]
    assert len({p.cwd for p in executors}) >= 2, "the job ran in the cluster's two executors"
    # Executor loss: both were killed while a report's call was out, the master launched replacements, and the job
    # finished, the calling task's retry handed again the follow-ups it had taken.
    assert len(killed) == 2 and not any(_alive(*k) for k in killed), "every executor was killed mid-stage"
    # At least one replacement: the job needs one to finish. How many the master launches, and when, is its own
    # business (a CI run once saw one replacement only; the master's log is printed above).
    launches = cluster.executor_launches()
    index_app = launches[0].split("/")[0]
    assert sum(launch.startswith(f"{index_app}/") for launch in launches) > len(killed), "a replacement was launched"
    assert len(executors) > len(killed), "the replacement was seen running"
    assert _resubmitted_stages(events), "the lost tasks' retries ran in resubmitted stages (their shuffle input lost)"
    assert python_workers, "no Python worker was seen in an executor"
    for worker in python_workers:
        interpreter = os.path.normpath(os.path.join(worker.cwd, worker.argv[0]))
        assert worker.argv[0] == "./env/bin/python" and any(interpreter.startswith(w) for w in work_dirs), worker.argv
        assert (Path(interpreter).parent.parent / "pyvenv.cfg").is_file(), "the archive's venv is unpacked there"
        python_path = [p for p in worker.environ.get("PYTHONPATH", "").split(":") if p]
        assert all(p in SPARK_PYTHON_PATH or any(p.startswith(w) for w in work_dirs) for p in python_path), python_path
        assert str(REPO / ".venv" / "bin") not in worker.environ.get("PATH", "")
        assert "VIRTUAL_ENV" not in worker.environ
    unpacked = {Path(os.path.normpath(os.path.join(w.cwd, "env"))) for w in python_workers}
    for env_dir in unpacked:  # the archive carries the dependencies, not pyspark (the cluster's Spark provides it)
        site = env_dir / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
        assert (site / "openai").is_dir() and (site / "graphrag_spark").is_dir() and not (site / "pyspark").exists()

    # The key reached the executors (every call was authorised) through the task closure alone.
    assert stats["served"]["chat"] > 0 and stats["served"]["embeddings"] > 0 and stats["unauthorized"] == 0
    # Nothing paid twice but the calls in flight in the killed task (two at most, job-wide): their Python worker
    # died with its node, so the retry pays for them again. The embeddings of so few texts are made on the driver.
    repaid = stats["repaid"]
    assert 1 <= repaid["chat"] <= 2 and repaid["embeddings"] == 0, f"requests paid twice: {repaid}"
    for process in [*executors, *python_workers]:
        assert SECRET not in " ".join(process.argv) and SECRET not in "".join(process.environ.values())

    # Cluster-side secret leak: not in the event log (environment tab, SQL plans, task events), not in any
    # executor's stdout/stderr, not in the daemons' logs, not in the jobs' own output.
    logs = [p for p in events.rglob("*") if p.is_file()]
    executor_logs = cluster.executor_logs()
    assert logs and len(executor_logs) >= 4, (logs, executor_logs)
    assert any(b"CoarseGrainedExecutorBackend" in p.read_bytes() for p in executor_logs), "executor stderr was captured"
    daemon_logs = list(cluster.work_dirs[0].parent.glob("*.log"))
    for path in [*logs, *executor_logs, *daemon_logs]:
        assert SECRET.encode() not in path.read_bytes(), f"the key leaked into {path}"
    assert SECRET not in index.stdout + index.stderr + query.stdout + query.stderr

    # What the user gets: an LLM-built index and an answer from it.
    count = lambda name: spark.read.format("delta").load(str(root / name)).count()  # noqa: E731
    assert count("text_units") >= 3 and count("entities") > 5 and count("relationships") > 0
    results = spark.read.format("delta").load(str(root / "llm_results"))
    assert results.where("error is not null").count() == 0
    kept_calls = results.agg({"n_calls": "sum"}).first()[0]
    assert kept_calls == stats["served"]["chat"] - repaid["chat"], "every paid answer is kept"
    # No item lost: every text unit extracted, every community reported by the LLM (none fell back).
    units = {r.id for r in spark.read.format("delta").load(str(root / "text_units")).select("id").collect()}
    assert units == {r.item_id for r in results.where("stage = 'extract'").select("item_id").collect()}
    reports = spark.read.format("delta").load(str(root / "community_reports"))
    assert reports.count() > 0 and reports.where("method != 'llm'").count() == 0
    assert not (root / "_scratch").exists(), "the run's checkpoint tables were removed after it succeeded"
    answer = query.stdout.strip()
    assert "[global search, level 0:" in answer and "LLM calls" in answer, answer
    assert "Lumen" in answer.split("\n[global search")[0], answer
