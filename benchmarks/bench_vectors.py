"""Exact vector search latency at scale: ``python benchmarks/bench_vectors.py --n 1000000``.

Random normalised vectors (seeded) stand in for stored embeddings; exact search
cost depends only on n, dim, k and the number of queries, not on the values.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="vectors in the index")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--single", type=int, default=50, help="single-query searches timed")
    parser.add_argument("--batch", type=int, default=100, help="queries in the batched search")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

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
