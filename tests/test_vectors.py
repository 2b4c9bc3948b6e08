"""Exact cosine top-k: same answers as brute force, whatever the blocking."""

import numpy as np
import pandas as pd
import pytest

from graphrag_spark.query import vectors
from graphrag_spark.query.vectors import VectorIndex


def _brute_force(matrix, queries, k):
    unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    sims = (queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ unit.T
    order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(sims, order, axis=1)


@pytest.fixture
def data():
    rng = np.random.default_rng(7)
    return rng.standard_normal((500, 24)).astype(np.float32), rng.standard_normal((13, 24)).astype(np.float32)


@pytest.mark.parametrize("block_scores, query_chunk", [(1 << 24, 1024), (64, 4)])
def test_top_k_equals_brute_force(data, monkeypatch, block_scores, query_chunk):
    # The second case forces many row blocks and query chunks, exercising the candidate merge.
    monkeypatch.setattr(vectors, "_BLOCK_SCORES", block_scores)
    monkeypatch.setattr(vectors, "_QUERY_CHUNK", query_chunk)
    matrix, queries = data
    ids = np.array([f"chunk-{i}" for i in range(len(matrix))])
    found_ids, scores = VectorIndex.from_arrays(ids, matrix).search(queries, k=7)
    expected_rows, expected_scores = _brute_force(matrix, queries, 7)
    assert (found_ids == ids[expected_rows]).all()
    np.testing.assert_allclose(scores, expected_scores, atol=1e-5)


def test_single_query_gives_one_dimensional_results(data):
    matrix, queries = data
    index = VectorIndex.from_arrays(np.arange(len(matrix)), matrix)
    ids, scores = index.search(queries[0], k=3)
    assert ids.shape == scores.shape == (3,)
    assert ids.tolist() == _brute_force(matrix, queries[:1], 3)[0][0].tolist()


def test_scores_are_cosine_whatever_the_vector_lengths(data):
    matrix, queries = data
    ids = np.arange(len(matrix))
    scaled = matrix * np.random.default_rng(1).uniform(0.1, 10, (len(matrix), 1)).astype(np.float32)
    a = VectorIndex.from_arrays(ids, matrix).search(queries, 5)
    b = VectorIndex.from_arrays(ids, scaled).search(queries * 3, 5)
    assert (a[0] == b[0]).all()
    np.testing.assert_allclose(a[1], b[1], atol=1e-5)
    assert np.all(np.abs(b[1]) <= 1 + 1e-6)


def test_k_larger_than_index_returns_everything_sorted(data):
    matrix, queries = data
    ids, scores = VectorIndex.from_arrays(np.arange(10), matrix[:10]).search(queries, k=50)
    assert ids.shape == (len(queries), 10)
    assert all(sorted(row) == list(range(10)) for row in ids.tolist())
    assert np.all(np.diff(scores, axis=1) <= 0)


def test_empty_index_returns_no_results():
    index = VectorIndex.from_pandas(pd.DataFrame({"id": [], "vector": []}))
    ids, scores = index.search(np.ones((2, 384), dtype=np.float32), k=5)
    assert len(index) == 0 and ids.shape == scores.shape == (2, 0)


def test_from_pandas_reads_array_column(data):
    matrix, queries = data
    df = pd.DataFrame({"chunk_id": [f"c{i}" for i in range(len(matrix))], "embedding": list(matrix)})
    ids, _ = VectorIndex.from_pandas(df, id_col="chunk_id", vector_col="embedding").search(queries, 4)
    assert (ids == np.array(df["chunk_id"])[_brute_force(matrix, queries, 4)[0]]).all()


def test_wrong_query_dimension_is_rejected(data):
    matrix, _ = data
    with pytest.raises(ValueError, match="24 columns"):
        VectorIndex.from_arrays(np.arange(len(matrix)), matrix).search(np.ones(10), 3)


def _arrow_batches(ids, matrix, sizes):
    """(id, vector) Arrow batches of the given row counts, as a task receives them."""
    import pyarrow as pa

    out, start = [], 0
    for size in sizes:
        rows = slice(start, start + size)
        vectors = pa.array([list(map(float, v)) for v in matrix[rows]], pa.list_(pa.float32()))
        out.append(pa.RecordBatch.from_arrays([pa.array(ids[rows].tolist()), vectors], ["id", "vector"]))
        start += size
    return out


@pytest.mark.parametrize("block_scores", [1 << 24, 64])
def test_executor_top_k_over_tasks_equals_brute_force(data, monkeypatch, block_scores):
    # Three "tasks" of uneven Arrow batches, one with a null vector: the merged candidates give the
    # brute-force answer over the non-null rows (the second case scores each batch in blocks of 7 rows).
    import pyarrow as pa

    monkeypatch.setattr(vectors, "_BLOCK_SCORES", block_scores)
    matrix, queries = data
    ids = np.array([f"u{i:03d}" for i in range(len(matrix))])
    unit_queries = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    tasks = [_arrow_batches(ids[:200], matrix[:200], [3, 150, 47]), _arrow_batches(ids[200:205], matrix[200:205], [5]),
             _arrow_batches(ids[205:], matrix[205:], [295])]
    with_null = pa.RecordBatch.from_arrays([pa.array(["null-row"]), pa.array([None], pa.list_(pa.float32()))], ["id", "vector"])
    tasks[1].insert(0, with_null)
    candidates = pd.concat([b.to_pandas() for task in tasks for b in vectors.top_k_candidates(iter(task), unit_queries, 7)])
    assert len(candidates) == len(queries) * (7 + 5 + 7)  # a task of 5 rows sends them all
    found_ids, scores = vectors.merge_candidates(candidates, len(queries), 7)
    expected_rows, expected_scores = _brute_force(matrix, queries, 7)
    assert (found_ids == ids[expected_rows]).all()
    np.testing.assert_allclose(scores, expected_scores, atol=1e-5)


@pytest.mark.spark
def test_spark_vector_index_answers_like_the_driver_index(spark, data):
    matrix, queries = data
    ids = np.array([f"e{i}" for i in range(len(matrix))])
    frame = spark.createDataFrame(pd.DataFrame({"id": ids, "vector": [v.tolist() for v in matrix]}),
                                  "id string, vector array<float>")
    index = vectors.SparkVectorIndex(frame, len(matrix), matrix.shape[1])
    found_ids, scores = index.search(queries, k=6)
    expected_ids, expected_scores = VectorIndex.from_arrays(ids, matrix).search(queries, k=6)
    assert (found_ids == expected_ids).all()
    np.testing.assert_allclose(scores, expected_scores, atol=1e-5)
    one_id, one_score = index.search(queries[0], k=600)
    assert one_id.shape == (500,) and one_id[0] == expected_ids[0][0]
