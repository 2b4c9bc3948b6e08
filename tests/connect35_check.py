"""By hand, not in CI (minutes on 2 cores): Spark Connect with Spark 3.5, as a Databricks Runtime 15.4 LTS shared
cluster or serverless notebook has it (a pyspark 3.5 Connect client). In .venv-spark35, a local Spark 3.5 Connect
server with Delta 3.3 (no Delta Connect there, so nothing may use the ``DeltaTable`` API) runs ``connect_job.py``:
the offline index of data/sample, a RAPTOR tree and the notebook API's answers. Then a classic Spark 3.5 session
builds the same index here and answers the same; every row count and answer must match. Exit 1 names what differs.

    bash scripts/check_connect_spark35.sh
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from connect_job import api_answers, config, plain
from connect_server import connect_server

from graphrag_spark.llm.server import start_server

REPO = Path(__file__).resolve().parent.parent
SAMPLE_CORPUS = REPO / "data" / "sample"
IVY_CACHE = REPO / ".cache" / "ivy"


def on_connect(work: Path, llm_base_url: str) -> dict:
    """connect_job.py in its own process (a Connect and a classic session cannot share one)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests"), "OPENBLAS_NUM_THREADS": "1"}
    with connect_server(IVY_CACHE, work / "server.log") as url:
        done = subprocess.run([sys.executable, str(REPO / "tests" / "connect_job.py"), "--remote", url,
                               "--root", str(work / "connect_index"), "--input", str(SAMPLE_CORPUS),
                               "--out", str(work / "connect.json"), "--llm", llm_base_url],
                              cwd=REPO, env=env, timeout=1800, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"the Connect client failed (server log {work / 'server.log'}):\n{done.stderr[-4000:]}")
    return json.loads((work / "connect.json").read_text())


def on_classic(work: Path, llm_base_url: str) -> dict:
    from graphrag_spark.index.pipeline import run_index
    from graphrag_spark.query.api import GraphRagIndex
    from graphrag_spark.raptor.build import build_raptor
    from graphrag_spark.session import build_spark

    cfg = config(str(work / "classic_index"), str(SAMPLE_CORPUS), f"spark.ivy_cache={IVY_CACHE}")
    cfg.spark.conf["spark.ui.enabled"] = "false"
    spark = build_spark(cfg.spark)
    summary = run_index(spark, cfg)
    raptor = build_raptor(spark, cfg)
    verdict = {"spark": spark.version, "summary_counts": {k: str(v) for k, v in summary.counts.items()},
               "raptor_nodes_per_layer": raptor.shape.nodes_per_layer,
               **api_answers(GraphRagIndex.load(spark, cfg), llm_base_url)}
    spark.stop()
    return json.loads(json.dumps(verdict, default=plain))


def main(work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with start_server() as llm:
        connect = on_connect(work, llm.base_url)
        connect_s = time.monotonic() - started
        classic = on_classic(work, llm.base_url)
    print(f"Spark {classic.pop('spark')}: on Connect (server and client) {connect_s:.0f} s, classic {time.monotonic() - started - connect_s:.0f} s")
    differ = [key for key in classic if connect.get(key) != classic[key]]
    for key in classic:
        print(f"{'DIFFERS' if key in differ else 'same'}: {key}")
    for key in differ:
        print(f"{key}\n  classic: {classic[key]}\n  connect: {connect.get(key)}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
