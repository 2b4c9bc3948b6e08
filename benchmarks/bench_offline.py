"""The offline method at corpus scale: ``python benchmarks/bench_offline.py`` (War and Peace, 2 cores).

Indexes ``../shared/corpora/war_and_peace.txt`` end to end with ``conf/local.yaml`` (nlp
extraction, extractive reports, offline MiniLM embeddings) on ``local[2]`` into a temporary
folder, then prints the run summary (wall time per stage), the total wall time including
session start, the Spark jobs each stage ran (fixed cost per job, whatever the load) and the
graph's shape. ``--corpus ../shared/corpora/a_christmas_carol.txt --set chunking.size=1200``
is the 42-chunk corpus of the stage-overhead target. ``--encoder N`` instead times the offline encoder alone
on the corpus' first N chunks in this process (no Spark), and prints the BLAS kernel that ran.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared" / "corpora" / "war_and_peace.txt"


def _blas() -> str:
    from threadpoolctl import threadpool_info

    return ", ".join(f"{i['internal_api']} {i.get('version')} {i.get('architecture')} x{i['num_threads']}"
                     for i in threadpool_info() if i["user_api"] == "blas")


def time_encoder(corpus: Path, n: int, threads: int) -> None:
    from threadpoolctl import threadpool_limits

    from graphrag_spark.config import ChunkingConfig
    from graphrag_spark.embeddings import OfflineMiniLM
    from graphrag_spark.index.chunks import chunk_text

    size = ChunkingConfig().size
    chunks = [text for text, _ in chunk_text(corpus.read_text(encoding="utf-8"), size, ChunkingConfig().overlap)][:n]
    model = OfflineMiniLM()
    model.embed(chunks[:2])  # load the weights
    with threadpool_limits(threads):
        started, cpu = time.perf_counter(), time.process_time()
        model.embed(chunks)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        print(f"encoder: {len(chunks)} chunks of {size} tokens in {wall:.2f} s = {len(chunks) / wall:.1f} texts/s wall, "
              f"{len(chunks) / cpu:.1f} texts per CPU second; BLAS: {_blas()}")


def _tree_cpu_seconds() -> float:
    """CPU seconds of this process and all its descendants (the JVM, Python workers, reaped children
    included): unlike wall time, roughly independent of what else the machine runs."""
    ticks = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry.name)] = (int(fields[1]), sum(int(f) for f in fields[11:15]))  # ppid; u/s/cu/cs time
    tree, frontier = set(), {os.getpid()}
    while frontier:
        tree |= frontier
        frontier = {pid for pid, (ppid, _) in stats.items() if ppid in frontier} - tree
    return sum(stats[pid][1] for pid in tree if pid in stats) / ticks


def _peak_rss_mb() -> float:
    """This process's peak resident memory (the driver's Python, not its JVM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@contextmanager
def _jobs_per_stage(spark, jobs: dict[str, int], cpu: dict[str, float]):
    """Counts the Spark jobs started inside each ``RunSummary.stage`` (one job group per stage) and
    the CPU seconds the stage used."""
    from graphrag_spark.index import pipeline

    timed = pipeline.RunSummary.stage

    @contextmanager
    def stage(self, name: str):
        spark.sparkContext.setJobGroup(name, name)
        before = _tree_cpu_seconds()
        with timed(self, name):
            yield
        cpu[name] = round(_tree_cpu_seconds() - before, 1)
        jobs[name] = len(spark.sparkContext.statusTracker().getJobIdsForGroup(name))

    pipeline.RunSummary.stage = stage
    try:
        yield
    finally:
        pipeline.RunSummary.stage = timed


def index_corpus(corpus: Path, cores: int, keep: Path | None, overrides: list[str]) -> None:
    from pyspark.sql import functions as F

    from graphrag_spark import tables as T
    from graphrag_spark.config import load_config
    from graphrag_spark.index.pipeline import run_index
    from graphrag_spark.session import build_spark

    work = Path(tempfile.mkdtemp(prefix="bench_offline_")) if keep is None else keep
    (work / "input").mkdir(parents=True, exist_ok=True)
    shutil.copy(corpus, work / "input" / corpus.name)
    started = time.perf_counter()
    cfg = load_config(REPO / "conf" / "local.yaml",
                      [f"storage.root={work / 'index'}", f"input.path={work / 'input'}", *overrides])
    spark = build_spark(cfg.spark, master=f"local[{cores}]")
    session_s = time.perf_counter() - started
    try:
        jobs: dict[str, int] = {}
        cpu: dict[str, float] = {}
        with _jobs_per_stage(spark, jobs, cpu):
            summary = run_index(spark, cfg)
        total_s = time.perf_counter() - started
        print(summary.render())
        print(f"\nSpark jobs per stage: {jobs} ({sum(jobs.values())} in all)")
        print(f"CPU seconds per stage (driver, JVM and Python workers): {cpu} ({sum(cpu.values()):.1f} in all)")
        store = T.TableStore(spark, cfg.storage)
        entities, relationships = store.read(T.ENTITIES), store.read(T.RELATIONSHIPS)
        degree = entities.agg(F.max("degree").alias("max"), F.avg("degree").alias("mean"),
                              F.sum((F.col("degree") == 0).cast("int")).alias("isolated")).collect()[0]
        n_entities, n_relationships = entities.count(), relationships.count()
        print(f"\ngraph: {n_entities} entities, {n_relationships} relationships, degree max {degree['max']}, "
              f"mean {degree['mean']:.2f}, {degree['isolated']} isolated; communities per level "
              f"{summary.counts.get('communities per level')}")
        print(f"wall: session start {session_s:.1f} s, index {total_s - session_s:.1f} s, "
              f"total {total_s:.1f} s on local[{cores}]; driver BLAS: {_blas()}")
        print(f"driver Python peak memory: {_peak_rss_mb():.0f} MB (the graph stage's rows held there up to "
              f"graph.driver_max_instances)")
    finally:
        spark.stop()
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--cores", type=int, default=2, help="local[N] (the target is 2)")
    parser.add_argument("--encoder", type=int, metavar="N", help="only time the encoder on the first N chunks")
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads for --encoder")
    parser.add_argument("--keep", type=Path, help="index into this folder and keep it")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="config override")
    args = parser.parse_args()
    if not args.corpus.is_file():
        raise SystemExit(f"No corpus at {args.corpus}; the shared folder holds war_and_peace.txt.")
    if args.encoder:
        time_encoder(args.corpus, args.encoder, args.threads)
    else:
        index_corpus(args.corpus, args.cores, args.keep, args.set)


if __name__ == "__main__":
    main()
