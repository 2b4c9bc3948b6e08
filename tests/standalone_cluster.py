"""A real Spark standalone cluster for tests: one master and N workers, each its own JVM started
with pyspark's ``spark-class``, bound to 127.0.0.1 on free ports. The daemons get a bare
environment (no virtualenv on PATH, no PYTHONPATH, no API key), so the executors they launch see
only what an application ships to them.

Also here: ``spark_submit`` (a client-mode job run against the cluster) and ``ProcessWatch``, which
records the executor JVMs and their Python workers from ``/proc`` while a job runs: the outside view
of which interpreter, working directory and PYTHONPATH the executors really used."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).resolve().parent
# What Spark itself puts on its Python workers' PYTHONPATH: its pyspark.zip, py4j and spark-core's JAR.
SPARK_PYTHON_PATH = {str(p) for p in [*(SPARK_HOME / "python" / "lib").glob("*.zip"), *(SPARK_HOME / "jars").glob("spark-core_*.jar")]}
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free now (all sockets held until every port is picked)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    return free_ports(1)[0]


def bare_env(tmp: Path) -> dict[str, str]:
    """What a cluster node's daemons run with: Java and the system tools, nothing of the driver's venv."""
    java = shutil.which("java")
    path = ["/usr/local/bin", "/usr/bin", "/bin"]
    if java:
        path.insert(0, str(Path(java).resolve().parent))
    conf_dir = tmp / "conf"  # an empty conf dir: no spark-defaults.conf or spark-env.sh of this machine
    conf_dir.mkdir(parents=True, exist_ok=True)
    env = {"PATH": ":".join(path), "HOME": str(tmp), "LANG": "C.UTF-8", "SPARK_HOME": str(SPARK_HOME),
           "SPARK_CONF_DIR": str(conf_dir), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_MEMORY": "256m",
           "SPARK_LOG_DIR": str(tmp / "logs"), "SPARK_NO_DAEMONIZE": "1",
           # No REST submission server: it binds a fixed port (6066), and the tests submit through the RPC port.
           "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
    if "JAVA_HOME" in os.environ:
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    return env


@dataclass
class StandaloneCluster:
    master_url: str
    web_url: str
    work_dirs: list[Path]
    processes: list[subprocess.Popen] = field(default_factory=list)

    def master_status(self) -> dict:
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as answer:
            return json.load(answer)

    def alive_workers(self) -> int:
        return int(self.master_status().get("aliveworkers", 0))

    def _master_log(self) -> str:
        log = self.work_dirs[0].parent / "master.log"
        return log.read_text() if log.exists() else ""

    def executor_launches(self) -> list[str]:
        """The master's own record of the executors it launched, oldest first, as "app-…/N on worker …"
        (ground truth, where a process watch sees only the processes that got as far as starting)."""
        return re.findall(r"Launching executor (\S+ on worker \S+)", self._master_log())

    def master_executor_log(self) -> str:
        """The master's log lines about executors (launches, removals and why), for a failure's message."""
        return "\n".join(line for line in self._master_log().splitlines() if "xecutor" in line)

    def executor_logs(self) -> list[Path]:
        """Every file an executor wrote under the workers' work dirs (stdout, stderr), archive excluded."""
        return [p for d in self.work_dirs for p in d.glob("app-*/*/std*") if p.is_file()]

    def stop(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.processes:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.processes.clear()  # all ended; a stopped cluster's record also travels to a test worker (pickled)


def start_cluster(tmp: Path, workers: int = 2, cores: int = 1, memory: str = "1g",
                  ready_timeout_s: float = 120.0) -> StandaloneCluster:
    env = bare_env(tmp)
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, web_port, *worker_web_ports = free_ports(2 + workers)
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web_port}",
                                [tmp / f"worker{i}" for i in range(workers)])

    def launch(name: str, *args: str) -> None:
        log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed when the process ends
        cluster.processes.append(subprocess.Popen([spark_class, *args], env=env, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, cwd=tmp))

    def wait_for(what: str, ready) -> None:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            dead = [p.args[1] for p in cluster.processes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead[0]} exited: see {tmp}/*.log")
            try:
                if ready():
                    return
            except (OSError, ValueError):
                pass  # the master's web UI is not up yet (or answers its status page empty while it starts)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready within {ready_timeout_s:.0f} s: see {tmp}/*.log")
            time.sleep(0.5)

    try:
        launch("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
               "--webui-port", str(web_port))
        wait_for("the master", lambda: cluster.master_status() is not None)
        # The port the master really bound (another process may have taken the free one meanwhile: Spark then
        # takes the next) is in its status; its web UI port was held distinct from the others.
        cluster.master_url = cluster.master_status()["url"]
        for i, work_dir in enumerate(cluster.work_dirs):
            work_dir.mkdir(parents=True)
            launch(f"worker{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                   "--webui-port", str(worker_web_ports[i]), "--cores", str(cores), "--memory", memory,
                   "--work-dir", str(work_dir), cluster.master_url)
        wait_for(f"{workers} workers", lambda: cluster.alive_workers() == workers)
        return cluster
    except BaseException:
        cluster.stop()
        raise


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, parent, ..., start time at index 19),
    or None once the pid is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def kill_process_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants at once, as the loss of its machine would. Each is stopped
    before its children are read, so none forks one unseen; a child outliving its parent even briefly (a
    Python worker after its executor JVM) could still act, e.g. deliver an answer."""
    stopped, frontier = [], [pid]
    try:
        while frontier:
            parent = frontier.pop()
            try:
                os.kill(parent, signal.SIGSTOP)
            except ProcessLookupError:
                continue
            stopped.append(parent)
            for entry in Path("/proc").iterdir():
                stat = proc_stat(int(entry.name)) if entry.name.isdigit() else None
                if stat is not None and int(stat[1]) == parent:
                    frontier.append(int(entry.name))
    finally:  # never leaves a process stopped
        for stopped_pid in stopped:
            try:
                os.kill(stopped_pid, signal.SIGKILL)
            except ProcessLookupError:
                continue


@dataclass
class SeenProcess:
    pid: int
    # Clock ticks since boot: with the pid it names one process, also once the pid is reused (pid_max is
    # 32768 on some machines, and a busy test run wraps it within the minutes a job takes).
    started_at: int
    parent: int
    argv: list[str]
    cwd: str
    environ: dict[str, str]


class ProcessWatch:
    """Polls /proc while a job runs for executor JVMs and Python workers (``pyspark.daemon`` / ``pyspark.worker``)."""

    def __init__(self, interval_s: float = 0.3) -> None:
        self.interval_s = interval_s
        self.executors: dict[tuple[int, int], SeenProcess] = {}  # by (pid, start time)
        self.python_workers: dict[tuple[int, int], SeenProcess] = {}
        self._lock = threading.Lock()  # of_cluster reads from another thread while _run adds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                pid, stat = int(entry.name), proc_stat(int(entry.name))
                if stat is None:
                    continue
                key = (pid, int(stat[19]))
                if key in self.executors or key in self.python_workers:
                    continue
                try:
                    argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
                except OSError:
                    continue
                if EXECUTOR_CLASS in argv:
                    target = self.executors
                elif "pyspark.daemon" in argv or "pyspark.worker" in argv:
                    target = self.python_workers
                else:
                    continue
                try:
                    cwd = os.readlink(entry / "cwd")
                    raw = (entry / "environ").read_bytes().split(b"\0")
                except OSError:
                    continue
                environ = dict(item.decode(errors="replace").partition("=")[::2] for item in raw if b"=" in item)
                with self._lock:
                    target[key] = SeenProcess(pid, key[1], int(stat[1]), argv, cwd, environ)
            self._stop.wait(self.interval_s)

    def of_cluster(self, cluster: StandaloneCluster) -> tuple[list[SeenProcess], list[SeenProcess]]:
        """The executors launched by ``cluster``'s workers and their Python workers (other Spark
        processes on the machine are not descendants of them)."""
        roots = [str(d) for d in cluster.work_dirs]
        with self._lock:
            all_executors, all_python_workers = list(self.executors.values()), list(self.python_workers.values())
        seen = [p for p in all_executors if any(p.cwd.startswith(r) for r in roots)]
        # A JVM's child caught between its spawn and its exec still shows the JVM's command line: an executor's
        # Python daemon, seen that early, looks like an executor whose parent is one.
        ours = {p.pid for p in seen}
        executors = [p for p in seen if p.parent not in ours]
        workers: list[SeenProcess] = []
        grew = True
        while grew:  # pyspark.daemon is a child of the executor JVM, the forked workers are children of the daemon
            found = [p for p in all_python_workers if p.parent in ours and p.pid not in ours]
            workers += found
            ours |= {p.pid for p in found}
            grew = bool(found)
        return executors, workers

    def __enter__(self) -> ProcessWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def submit_command(cluster: StandaloneCluster, script: Path, args: list[str], *, archive: Path, event_log: Path,
                   jars: list[str], driver_python: str, deploy_mode: str = "client",
                   extra_conf: dict[str, str] | None = None) -> list[str]:
    """spark-submit of a Python job the documented way: the packed environment as an archive, its Python for
    the executors, the driver's own Python on the driver. Run it with ``submit_env``."""
    conf = {"spark.pyspark.python": "./env/bin/python", "spark.pyspark.driver.python": driver_python,
            "spark.executor.memory": "640m", "spark.executor.cores": "1", "spark.cores.max": str(len(cluster.work_dirs)),
            "spark.eventLog.enabled": "true", "spark.eventLog.dir": event_log.as_uri(),
            "spark.eventLog.compress": "false", "spark.ui.port": str(free_port()), **(extra_conf or {})}
    command = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster.master_url, "--deploy-mode", deploy_mode,
               "--driver-memory", "1g", "--archives", f"{archive}#env", "--jars", ",".join(jars)]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, str(script), *args]


def submit_env(env: dict[str, str]) -> dict[str, str]:
    return {**env, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1"}
