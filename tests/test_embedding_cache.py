"""The embedding cache: an endpoint vector is paid once per (model, dimensions, text)."""

from __future__ import annotations

import pytest

from graphrag_spark import tables as T
from graphrag_spark.index.embed import embed_cached
from graphrag_spark.llm.server import start_server

pytestmark = pytest.mark.spark


def test_cached_vectors_are_not_requested_again_and_failures_are_not_cached(spark, make_config):
    texts = [("a", "Scrooge counts coal."), ("b", "Marley's ghost"), ("c", "Scrooge counts coal.")]
    frame = spark.createDataFrame(texts, "id string, text string")
    with start_server(seed=4) as server, start_server(error_rate=1.0) as failing:
        def run(base_url, *extra):
            cfg = make_config("embeddings.provider=openai", "embeddings.batch_size=1", "llm.embedding.max_retries=0",
                              f"llm.embedding.api_base={base_url}", *extra)
            vectors, requested = embed_cached(spark, T.TableStore(spark, cfg.storage), frame, cfg, len(texts))
            return {r.id: r.vector for r in vectors.collect()}, requested

        failed, requested = run(failing.base_url)
        assert requested == 2 and all(v is None for v in failed.values())
        first, requested = run(server.base_url)
        assert requested == 2, "the failed texts are asked again; the duplicate text once"
        assert server.stats()["served"]["embeddings"] == 2 and first["a"] == first["c"] and len(first["b"]) == 384
        again, requested = run(server.base_url)
        assert requested == 0 and again == first and server.stats()["served"]["embeddings"] == 2
        shorter, requested = run(server.base_url, "llm.embedding.dimensions=64")
        assert requested == 2 and {len(v) for v in shorter.values()} == {64}, "another size is another key"
