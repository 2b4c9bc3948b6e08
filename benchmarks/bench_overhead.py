"""Fixed Spark overhead of the non-LLM stages: ``python benchmarks/bench_overhead.py``.

Indexes A Christmas Carol (``../shared/corpora/a_christmas_carol.txt``, chunks 1200/100: 42 text
units) on ``local[2]``, once with the offline method (``conf/local.yaml``) and once with the LLM
method (extraction, summaries, reports and embeddings) through the local OpenAI-compatible server
at 0 s latency and no rate limit, so what is timed is Spark's own work. Per run it prints the wall
time and the Spark jobs of every stage, the non-LLM stages' total (documents, text units, graph,
communities, retention; the offline method's extraction is no LLM call either, but is shown apart)
and its ratio to the 10 s goal. ``--jobs`` also prints each job's call site per stage (from Spark's
event log), to see which line of the stage starts them, and every job's start and length in time order. ``--method`` runs one of the two only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from bench_offline import _jobs_per_stage  # benchmarks/ is on the path of a script run from it

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared" / "corpora" / "a_christmas_carol.txt"
GOAL_S = 10.0
NON_LLM = ("documents", "text_units", "graph", "communities", "retention")
LLM_STAGES = {"extraction", "summarize_descriptions", "community_reports", "text_unit_embeddings", "entity_embeddings"}


def _call_sites(event_dir: Path) -> dict[str, dict[str, int]]:
    """Per job group (stage): how many jobs each call site started, from the event log."""
    sites: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for log in (path for path in event_dir.rglob("*") if path.is_file()):
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            event = json.loads(line)
            if event.get("Event") != "SparkListenerJobStart":
                continue
            props = event.get("Properties") or {}
            group = props.get("spark.jobGroup.id", "-")
            site = props.get("callSite.short", "?")
            sites[group][site] += 1
    return {group: dict(sorted(per.items(), key=lambda kv: -kv[1])) for group, per in sites.items()}


def _timeline(event_dir: Path) -> list[tuple[float, float, str, str]]:
    """Every job as (start s, seconds, scheduler pool (stage), call site), in start order, from the event log."""
    started: dict[int, tuple[int, str, str]] = {}
    jobs = []
    for log in (path for path in event_dir.rglob("*") if path.is_file()):
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            event = json.loads(line)
            if event.get("Event") == "SparkListenerJobStart":
                props = event.get("Properties") or {}
                started[event["Job ID"]] = (event["Submission Time"], props.get("spark.scheduler.pool", "-"),
                                            props.get("callSite.short", "?"))
            elif event.get("Event") == "SparkListenerJobEnd" and event["Job ID"] in started:
                at, pool, site = started.pop(event["Job ID"])
                jobs.append((at, event["Completion Time"] - at, pool, site))
    first = min((at for at, *_ in jobs), default=0)
    return [((at - first) / 1000, took / 1000, pool, site) for at, took, pool, site in sorted(jobs)]


def index_once(method: str, cores: int, show_jobs: bool, overrides: list[str]) -> dict:
    from graphrag_spark.config import load_config
    from graphrag_spark.index.pipeline import run_index
    from graphrag_spark.llm.server import start_server
    from graphrag_spark.session import build_spark

    work = Path(tempfile.mkdtemp(prefix=f"bench_overhead_{method}_"))
    (work / "input").mkdir()
    shutil.copy(CORPUS, work / "input" / CORPUS.name)
    events = work / "events"
    events.mkdir()
    settings = [f"storage.root={work / 'index'}", f"input.path={work / 'input'}", "chunking.size=1200",
                "chunking.overlap=100", f"spark.ivy_cache={REPO / '.cache' / 'ivy'}"]
    extra = ({"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(events), "spark.eventLog.compress": "false",
              "spark.eventLog.rolling.enabled": "false"} if show_jobs else {})
    server = None
    try:
        if method == "llm":
            server = start_server(latency_s=0.0, seed=1, limit_per_endpoint=True)
            os.environ.setdefault("OPENAI_API_KEY", "bench-local")
            settings += ["extraction.method=llm", "reports.method=llm", "embeddings.provider=openai",
                         f"llm.chat.api_base={server.base_url}", f"llm.embedding.api_base={server.base_url}",
                         "llm.chat.requests_per_minute=100000", "llm.embedding.requests_per_minute=100000",
                         "llm.chat.tokens_per_minute=1000000000", "llm.embedding.tokens_per_minute=1000000000"]
        cfg = load_config(REPO / "conf" / "local.yaml", settings + overrides)
        started = time.perf_counter()
        spark = build_spark(cfg.spark, master=f"local[{cores}]", extra_conf=extra)
        session_s = time.perf_counter() - started
        jobs: dict[str, int] = {}
        try:
            with _jobs_per_stage(spark, jobs, {}):  # CPU seconds per stage unused here
                summary = run_index(spark, cfg)
        finally:
            spark.stop()
        sites = _call_sites(events) if show_jobs else {}
        timeline = _timeline(events) if show_jobs else []
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return {"method": method, "summary": summary, "jobs": jobs, "sites": sites, "timeline": timeline, "session_s": session_s}


def report(result: dict, show_jobs: bool) -> None:
    summary, jobs = result["summary"], result["jobs"]
    seconds = summary.seconds
    print(f"\n=== {result['method']} method (session start {result['session_s']:.1f} s) ===")
    print(f"{'stage':<26} {'s':>7} {'jobs':>5}")
    for name, value in seconds.items():
        kind = "non-LLM" if name in NON_LLM else ("LLM" if result["method"] == "llm" or name not in LLM_STAGES - {"extraction"}
                                                  else "model")
        print(f"{name:<26} {value:>7.2f} {jobs.get(name, 0):>5}  {kind}")
    non_llm = sum(seconds.get(name, 0.0) for name in NON_LLM)
    non_llm_jobs = sum(jobs.get(name, 0) for name in NON_LLM)
    print(f"non-LLM stages: {non_llm:.2f} s in {non_llm_jobs} Spark jobs = {non_llm / GOAL_S:.2f}x the {GOAL_S:.0f} s goal "
          f"(all stages {sum(seconds.values()):.1f} s, {sum(jobs.values())} jobs; wall {summary.wall_s} s)")
    drops = {key: value for key, value in summary.counts.items() if "dropped" in key}
    print(f"graph drops: {drops}")
    if show_jobs:
        for group, per in result["sites"].items():
            print(f"  jobs of {group}: {per}")
        print("job timeline (start s from the first job, seconds, stage, call site):")
        for at, took, pool, site in result["timeline"]:
            print(f"  {at:7.2f} {took:6.2f}  {pool:<24} {site}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=["nlp", "llm", "both"], default="both")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--jobs", action="store_true", help="print each stage's jobs by call site (event log)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="config override")
    args = parser.parse_args()
    if not CORPUS.is_file():
        raise SystemExit(f"No corpus at {CORPUS}; the shared folder holds a_christmas_carol.txt.")
    print(f"load average {os.getloadavg()}")
    for method in (["nlp", "llm"] if args.method == "both" else [args.method]):
        report(index_once(method, args.cores, args.jobs, args.set), args.jobs)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
