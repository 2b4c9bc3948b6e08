"""Exact vector search latency at scale: ``python benchmarks/bench_vectors.py --n 1000000``.

Random normalised vectors (seeded) stand in for stored embeddings; exact search
cost depends only on n, dim, k and the number of queries, not on the values.
``--spark`` measures the executor search instead (``SparkVectorIndex``, what the query
API uses above ``query.driver_vector_rows``): the vectors are generated in executors
into a Delta table, which is then searched without collecting it, one scan per call;
a sample of answers is checked against an exact driver-side search of the same rows.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from graphrag_spark.query.vectors import VectorIndex


def _random_unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    out = np.empty((n, dim), dtype=np.float32)
    for start in range(0, n, 100_000):  # chunked: never hold a float64 copy of the whole matrix
        block = rng.standard_normal((min(100_000, n - start), dim), dtype=np.float32)
        out[start : start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def _spark_benchmark(args: argparse.Namespace) -> None:
    import shutil
    import tempfile

    import pyarrow as pa

    from graphrag_spark.config import SparkConfig
    from graphrag_spark.query.vectors import SparkVectorIndex
    from graphrag_spark.session import build_spark

    n, dim, seed, per_task = args.n, args.dim, args.seed, 50_000
    spark = build_spark(SparkConfig(shuffle_partitions=4), master=f"local[{args.cores}]")
    location = tempfile.mkdtemp(prefix="bench_vectors_")

    def generate(batches):
        for batch in batches:
            for start in batch.column("id").to_numpy():
                rows = min(per_task, n - int(start))
                vectors = _random_unit(np.random.default_rng([seed, int(start)]), rows, dim)
                yield pa.RecordBatch.from_arrays(
                    [pa.array([f"v{i}" for i in range(int(start), int(start) + rows)]),
                     pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), dim).cast(pa.list_(pa.float32()))],
                    ["id", "vector"])

    try:
        t0 = time.perf_counter()
        starts = spark.range(0, n, per_task, numPartitions=max(1, n // per_task))
        starts.mapInArrow(generate, "id string, vector array<float>").write.format("delta").save(location)
        print(f"table: {n:,} x {dim} float32 vectors in Delta, written in {time.perf_counter() - t0:.1f} s")
        frame = spark.read.format("delta").load(location)
        index = SparkVectorIndex(frame, n, dim)
        queries = _random_unit(np.random.default_rng(seed + 1), max(args.single, args.batch), dim)
        latencies = []
        for q in queries[: args.single]:
            t0 = time.perf_counter()
            ids, scores = index.search(q, args.k)
            latencies.append(time.perf_counter() - t0)
        print(f"single query (k={args.k}, {args.single} runs, one table scan each): "
              f"p50 {np.percentile(latencies, 50) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms")
        t0 = time.perf_counter()
        batch_ids, batch_scores = index.search(queries[: args.batch], args.k)
        batch_s = time.perf_counter() - t0
        print(f"batch of {args.batch} queries in one scan: {batch_s:.1f} s "
              f"({args.batch / batch_s:.1f} queries/s, {batch_s / args.batch * 1000:.0f} ms/query)")
        # Exact check of the single-query path: the best row's score equals the driver's exact search over its block.
        best = int(ids[0][1:])
        block = _random_unit(np.random.default_rng([seed, best // per_task * per_task]), min(per_task, n - best // per_task * per_task), dim)
        assert abs(float(block[best % per_task] @ queries[args.single - 1]) - float(scores[0])) < 1e-5
        assert (batch_ids[args.single - 1] == ids).all(), "batched and single answers differ"
        print(f"checked: top score of the last single query recomputed exactly; batch == single for it; "
              f"executors {args.cores} cores")
    finally:
        spark.stop()
        shutil.rmtree(location, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="vectors in the index")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--single", type=int, default=50, help="single-query searches timed")
    parser.add_argument("--batch", type=int, default=100, help="queries in the batched search")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spark", action="store_true", help="search in executors (SparkVectorIndex) instead")
    parser.add_argument("--cores", type=int, default=2, help="local[N] for --spark")
    args = parser.parse_args()
    if args.spark:
        _spark_benchmark(args)
        return

    rng = np.random.default_rng(args.seed)
    vectors = _random_unit(rng, args.n, args.dim)
    ids = np.arange(args.n, dtype=np.int64)
    t0 = time.perf_counter()
    index = VectorIndex.from_arrays(ids, vectors)
    build_s = time.perf_counter() - t0
    del vectors
    queries = _random_unit(rng, max(args.single, args.batch), args.dim)
    print(f"index: {args.n:,} x {args.dim} float32 ({index.vectors.nbytes / 2**30:.2f} GiB), build {build_s:.2f} s")

    index.search(queries[0], args.k)  # warm-up: page in the matrix
    latencies = []
    for q in queries[: args.single]:
        t0 = time.perf_counter()
        index.search(q, args.k)
        latencies.append(time.perf_counter() - t0)
    p50, p95 = np.percentile(latencies, [50, 95]) * 1000
    print(f"single query (k={args.k}, {args.single} runs): p50 {p50:.1f} ms, p95 {p95:.1f} ms")

    t0 = time.perf_counter()
    index.search(queries[: args.batch], args.k)
    batch_s = time.perf_counter() - t0
    print(
        f"batch of {args.batch} queries: {batch_s * 1000:.0f} ms "
        f"({args.batch / batch_s:.0f} queries/s, {batch_s / args.batch * 1000:.1f} ms/query)"
    )


if __name__ == "__main__":
    main()
