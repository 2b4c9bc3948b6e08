"""The embedding cache: an endpoint vector is paid once per (model, dimensions, text)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.errors import StageFailed
from graphrag_spark.index import embed
from graphrag_spark.index.embed import embed_cached
from graphrag_spark.llm.coordinator import Journal, read_journal
from graphrag_spark.llm.server import start_server
from graphrag_spark.llm.stage import stage_journal

pytestmark = pytest.mark.spark


def test_cached_vectors_are_not_requested_again_and_failures_are_not_cached(spark, make_config):
    texts = [("a", "Scrooge counts coal."), ("b", "Marley's ghost"), ("c", "Scrooge counts coal.")]
    frame = spark.createDataFrame(texts, "id string, text string")
    with start_server(seed=4) as server, start_server(error_rate=1.0) as failing:
        def run(base_url, *extra):
            cfg = make_config("embeddings.provider=openai", "embeddings.batch_size=1", "llm.embedding.max_retries=0",
                              f"llm.embedding.api_base={base_url}", *extra)
            vectors, requested = embed_cached(spark, T.TableStore(spark, cfg.storage), frame, cfg, len(texts),
                                              T.TEXT_UNIT_EMBEDDINGS)
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


# The driver path (a stage of at most DRIVER_EMBED_ROWS rows) against the executor path.

UNITS = [("u1", "Scrooge counts coal."), ("u2", "Marley's ghost"), ("u3", "Scrooge counts coal."), ("u4", None),
         ("u5", "Café — naïve ☃ " * 40)]
ENTITIES = [("e1", "SCROOGE", "A miser."), ("e2", "MARLEY", ""), ("e3", "FEZZIWIG", None)]


def _store_with_inputs(spark, cfg, units=UNITS):
    store = T.TableStore(spark, cfg.storage)
    store.write(spark.createDataFrame([(i, "d", n, text, 1) for n, (i, text) in enumerate(units)],
                                      T.SCHEMAS[T.TEXT_UNITS]), T.TEXT_UNITS, counted=False)
    store.write(spark.createDataFrame([(i, n, title, "PERSON", [], description, [], 1, 1)
                                       for n, (i, title, description) in enumerate(ENTITIES)],
                                      T.SCHEMAS[T.ENTITIES]), T.ENTITIES, counted=False)
    return store


def _tables(store, names=embed.EMBEDDED):
    return {name: {r.id: (r.vector, r.model_name) for r in store.read(name).collect()} for name in names}


def _spy(function, calls):
    def spied(*args, **kwargs):
        calls.append(args)
        return function(*args, **kwargs)

    return spied


def _text_units_until_the_driver_dies_writing(spark, store, cfg, monkeypatch, table):
    """The text units' embeddings stage, its driver dying as it writes ``table``, once that frame's calls ran."""
    write = T.TableStore.write

    def crash(self, df, name, *args, **kwargs):
        if name == table:
            df.collect()  # the calls run (lazily, in executors on that path); then the driver dies
            raise RuntimeError("driver lost")
        return write(self, df, name, *args, **kwargs)

    monkeypatch.setattr(T.TableStore, "write", crash)
    with pytest.raises(RuntimeError, match="driver lost"):
        embed.build_embeddings(spark, store, cfg, names=(T.TEXT_UNIT_EMBEDDINGS,))
    monkeypatch.setattr(T.TableStore, "write", write)


def test_python_and_spark_text_hashes_agree(spark):
    texts = [None, "", "Scrooge", "Café — naïve ☃", "x" * 5000, "tab\tnew\nline"]
    frame = spark.createDataFrame([(t,) for t in texts], "text string")
    in_spark = [r.h for r in frame.select(embed.text_hash(F.col("text")).alias("h")).collect()]
    assert in_spark == [embed.python_text_hash(t) for t in texts] and embed.python_text_hash(None) == embed.python_text_hash("")


def test_driver_path_writes_what_the_executor_path_writes_also_on_refresh(spark, make_config, tmp_path, monkeypatch):
    changed = [("u1", "Scrooge counts coal."), ("u2", "Marley's ghost walks"), ("u6", "Tiny Tim")]
    with start_server(seed=4) as server:
        results = {}
        for path, threshold in (("executors", 0), ("driver", embed.DRIVER_EMBED_ROWS)):
            monkeypatch.setattr(embed, "DRIVER_EMBED_ROWS", threshold)
            driver_calls = []
            monkeypatch.setattr(embed, "_build_on_driver", _spy(embed._build_on_driver, driver_calls))
            run = []
            for step, units in (("full", UNITS), ("refresh", changed)):
                cfg = make_config("embeddings.provider=openai", f"llm.embedding.api_base={server.base_url}",
                                  f"storage.root={tmp_path / path / step}")
                store = _store_with_inputs(spark, cfg, units)
                previous = T.TableStore(spark, make_config(f"storage.root={tmp_path / path / 'full'}").storage)
                counts = embed.build_embeddings(spark, store, cfg, previous if step == "refresh" else None)[0]
                run.append((counts, _tables(store)))
            assert len(driver_calls) == (4 if path == "driver" else 0), "each stage took the path the threshold says"
            results[path] = run
    assert results["driver"] == results["executors"]
    (full, tables), (refresh, _) = results["driver"]
    assert full["text_unit_embeddings texts embedded"] == 4 and full["entity_embeddings rows"] == 3
    assert {len(v) for v, _ in tables[T.TEXT_UNIT_EMBEDDINGS].values()} == {384}
    # The refresh (own root, own empty cache): u1 keeps its vector, the changed u2 and the new u6 are embedded.
    assert refresh["text_unit_embeddings texts embedded"] == 2 and refresh["entity_embeddings texts embedded"] == 0


def test_offline_driver_path_matches_the_executors(spark, make_config, tmp_path, monkeypatch):
    vectors = {}
    for path, threshold in (("executors", 0), ("driver", embed.DRIVER_EMBED_ROWS)):
        monkeypatch.setattr(embed, "DRIVER_EMBED_ROWS", threshold)
        cfg = make_config(f"storage.root={tmp_path / path}")
        store = _store_with_inputs(spark, cfg)
        counts = embed.build_embeddings(spark, store, cfg, names=(T.TEXT_UNIT_EMBEDDINGS,))[0]
        assert counts == {"text_unit_embeddings rows": 5, "text_unit_embeddings texts embedded": 5,
                          "text_unit_embeddings failed": 0}
        vectors[path] = _tables(store, (T.TEXT_UNIT_EMBEDDINGS,))[T.TEXT_UNIT_EMBEDDINGS]
    assert vectors["driver"].keys() == vectors["executors"].keys()
    for key, (vector, model) in vectors["driver"].items():
        assert model == "sentence-transformers/all-MiniLM-L6-v2"
        np.testing.assert_allclose(vector, vectors["executors"][key][0], atol=1e-5)


def test_driver_path_pays_a_text_once_caches_it_before_the_table_and_counts_failures(spark, make_config, monkeypatch):
    with start_server(seed=4) as server, start_server(error_rate=1.0) as failing:
        def config(base_url, *extra):
            return make_config("embeddings.provider=openai", "embeddings.batch_size=1", "llm.embedding.max_retries=0",
                               f"llm.embedding.api_base={base_url}", *extra)

        store = _store_with_inputs(spark, config(failing.base_url))
        counts = embed.build_embeddings(spark, store, config(failing.base_url, "llm.max_failed_share=1"),
                                        names=(T.TEXT_UNIT_EMBEDDINGS,))[0]
        assert counts == {"text_unit_embeddings rows": 5, "text_unit_embeddings texts embedded": 4,
                          "text_unit_embeddings failed": 5}, "a failed text fails each row that holds it"
        cfg = config(failing.base_url)
        with pytest.raises(StageFailed, match="5 of 5 rows of text_unit_embeddings"):
            embed.build_embeddings(spark, store, cfg, names=(T.TEXT_UNIT_EMBEDDINGS,))
        assert store.read(T.TEXT_UNIT_EMBEDDINGS).where("vector is null").count() == 5, "failed rows written as null"
        assert not store.exists(T.EMBEDDING_CACHE) or store.read(T.EMBEDDING_CACHE).count() == 0, "failures not cached"

        # The table's write fails after the calls: the cache already holds what was paid for.
        cfg = config(server.base_url)
        _text_units_until_the_driver_dies_writing(spark, store, cfg, monkeypatch, T.TEXT_UNIT_EMBEDDINGS)
        assert server.stats()["served"]["embeddings"] == 4, "distinct texts only, the null one as the empty text"

        counts = embed.build_embeddings(spark, store, cfg)[0]
        assert server.stats()["served"]["embeddings"] == 4 + 3, "the text units' vectors come from the cache"
        assert counts == {"text_unit_embeddings rows": 5, "text_unit_embeddings texts embedded": 0,
                          "text_unit_embeddings failed": 0, "entity_embeddings rows": 3,
                          "entity_embeddings texts embedded": 3, "entity_embeddings failed": 0}
        tables = _tables(store)
        assert tables[T.TEXT_UNIT_EMBEDDINGS]["u1"] == tables[T.TEXT_UNIT_EMBEDDINGS]["u3"]
        assert store.read(T.EMBEDDING_CACHE).count() == 7


@pytest.mark.parametrize("path", ["driver", "executors"])
def test_an_embedding_stage_records_its_calls_429s_tokens_timings_and_cost_in_llm_usage(spark, make_config, tmp_path,
                                                                                        monkeypatch, path):
    """The endpoint's batches are paid calls: each embedding stage has its ``llm_usage`` row as a chat stage has,
    on the driver path and on the executor path (where the batches' outcomes come back with the job that
    writes their vectors), with what the server saw: calls answered, 429s, prompt tokens."""
    monkeypatch.setattr(embed, "DRIVER_EMBED_ROWS", embed.DRIVER_EMBED_ROWS if path == "driver" else 0)
    with start_server(seed=7, rate_429=0.4, retry_after_s=0.05, latency_s=0.05) as server:
        cfg = make_config("embeddings.provider=openai", "embeddings.batch_size=1", "llm.embedding.max_retries=20",
                          f"llm.embedding.api_base={server.base_url}", "llm.embedding.price_per_1k_prompt=0.5",
                          f"storage.root={tmp_path}")
        store = _store_with_inputs(spark, cfg)
        counts, [usage] = embed.build_embeddings(spark, store, cfg, names=(T.TEXT_UNIT_EMBEDDINGS,), run_id="first")
        stats = server.stats()
        _, [again] = embed.build_embeddings(spark, store, cfg, names=(T.TEXT_UNIT_EMBEDDINGS,), run_id="again")
    assert counts["text_unit_embeddings texts embedded"] == 4 and counts["text_unit_embeddings failed"] == 0
    assert (usage.stage, usage.items, usage.cache_hits) == (T.TEXT_UNIT_EMBEDDINGS, 5, 1), "5 rows, 4 distinct texts"
    assert usage.calls == stats["served"]["embeddings"] == 4 and usage.failures == 0
    assert usage.n_429 == usage.retries == stats["injected"]["429"] > 0, "seed 7 injects 429s into these calls"
    assert usage.prompt_tokens == stats["prompt_tokens"] > 0 and usage.completion_tokens == 0
    assert usage.est_cost_usd == round(usage.prompt_tokens / 1000 * 0.5, 6)
    assert usage.latency_p50_s >= 0.05 and usage.queue_p95_s >= 0.05, "service time apart from the 429s' waits"
    assert (again.calls, again.cache_hits, again.prompt_tokens) == (0, 5, 0), "a rerun's vectors all from the cache"
    rows = {r.run_id: r for r in store.read(T.LLM_USAGE).collect()}
    assert rows.keys() == {"first", "again"} and rows["first"].asDict() == {"run_id": "first", **usage.__dict__}


def test_a_connect_client_that_cannot_read_observed_metrics_records_no_embedding_usage_rather_than_a_wrong_one(
        make_config, monkeypatch, caplog):
    """A pyspark 3.5 Connect client's ``Observation`` cannot be read: the executor path's batches are unseen, so
    the stage has no ``llm_usage`` row (a row of zero calls would be wrong), and a warning says why."""
    monkeypatch.setattr(embed, "is_connect", lambda spark: True)
    monkeypatch.setattr(embed.pyspark, "__version__", "3.5.6")
    calls = embed.EmbeddingCalls()
    frame = SimpleNamespace(sparkSession=None)
    observed, collect = calls.observing(frame)
    collect()
    assert observed is frame and calls.usage(T.TEXT_UNIT_EMBEDDINGS, 10, 0, make_config()) is None
    assert "not in llm_usage" in caplog.text


def test_executor_tasks_in_waves_share_the_budget_of_the_tasks_that_run_at_once(spark, make_config):
    """Eight embedding tasks on two slots run in four waves: each task throttles to half the budget (the two
    that run at once), not an eighth, so the endpoint sees about the configured rate (an eighth each: a quarter)."""
    assert embed.task_share(spark, 8) == 0.5 and embed.task_share(spark, 1) == 1.0
    frame = spark.createDataFrame([(str(i), f"text number {i}") for i in range(32)], "id string, text string")
    with start_server(seed=5) as server:
        cfg = make_config("embeddings.provider=openai", "embeddings.batch_size=1",
                          f"llm.embedding.api_base={server.base_url}", "llm.embedding.requests_per_minute=120")
        rows = embed.embed_texts(frame, cfg, partitions=8).collect()
        served = sorted(start for start, _ in server.served_intervals("embeddings"))
    assert len(rows) == 32 and all(r.vector is not None for r in rows) and len(served) == 32
    rate_per_minute = (len(served) - 1) / (served[-1] - served[0]) * 60
    assert rate_per_minute > 0.6 * 120, f"{rate_per_minute:.0f} calls/min against a budget of 120"


@pytest.mark.parametrize("path", ["driver", "executors"])
def test_a_crash_before_the_cache_commit_pays_for_no_returned_batch_again(spark, make_config, tmp_path, monkeypatch,
                                                                          path):
    """Each endpoint batch is journaled on the driver as it returns (the executors post theirs to it): the
    driver dies after the calls and before the cache's commit, and its rerun commits the journal and
    pays for nothing again, with the vectors a clean run writes."""
    monkeypatch.setattr(embed, "DRIVER_EMBED_ROWS", embed.DRIVER_EMBED_ROWS if path == "driver" else 0)
    with start_server(seed=4) as server:
        def config(root):
            return make_config("embeddings.provider=openai", "embeddings.batch_size=2",
                               f"llm.embedding.api_base={server.base_url}", f"storage.root={root}")

        cfg = config(tmp_path / "crashed")
        store = _store_with_inputs(spark, cfg)
        _text_units_until_the_driver_dies_writing(spark, store, cfg, monkeypatch, T.EMBEDDING_CACHE)
        paid = server.stats()["served"]["embeddings"]
        journal = stage_journal(store, f"embeddings-{T.TEXT_UNIT_EMBEDDINGS}")
        assert paid > 0 and journal.exists()

        counts = embed.build_embeddings(spark, store, cfg, names=(T.TEXT_UNIT_EMBEDDINGS,))[0]
        assert server.stats()["served"]["embeddings"] == paid, "the rerun paid again for journaled batches"
        assert counts["text_unit_embeddings texts embedded"] == 0 and not journal.exists()
        assert store.read(T.EMBEDDING_CACHE).count() == 4

        clean_cfg = config(tmp_path / "clean")
        clean = _store_with_inputs(spark, clean_cfg)
        embed.build_embeddings(spark, clean, clean_cfg, names=(T.TEXT_UNIT_EMBEDDINGS,))
    assert _tables(store, (T.TEXT_UNIT_EMBEDDINGS,)) == _tables(clean, (T.TEXT_UNIT_EMBEDDINGS,))


def test_a_retried_executor_task_takes_back_what_its_first_attempt_journaled(spark, make_config, tmp_path):
    """One task embeds two texts one call at a time. The driver loses the post of the second batch (its
    handler raises), so the task fails and Spark retries it: the retry takes back the first vector from
    the journal and pays only for the second (whose vector never reached the journal)."""
    texts = ["The first text, journaled.", "The second text, lost with its post."]
    frame = spark.createDataFrame([(embed.python_text_hash(t), t) for t in texts], "id string, text string")

    class LosesTheSecondPost(embed.VectorJournal):
        posts = 0

        def add(self, body):
            LosesTheSecondPost.posts += 1
            if LosesTheSecondPost.posts == 2:
                raise RuntimeError("the post of a batch is lost")
            return super().add(body)

    with start_server(seed=6) as server:
        cfg = make_config("embeddings.provider=openai", "embeddings.batch_size=1", "llm.embedding.concurrency=1",
                          f"llm.embedding.api_base={server.base_url}")
        journal = Journal(tmp_path / "vectors.jsonl")
        endpoint = LosesTheSecondPost(spark, journal, cfg)
        try:
            retried = {r.id: r.vector for r in embed.embed_texts(frame, cfg, 1, endpoint.url).collect()}
        finally:
            endpoint.close()
            journal.close()
        served = server.stats()["served"]["embeddings"]
        clean = {r.id: r.vector for r in embed.embed_texts(frame, cfg, 1).collect()}
    assert LosesTheSecondPost.posts == 3, "two posts by the first attempt, one by the retry"
    assert served == 3, "the first text once, the second twice (its first vector was lost with the post)"
    assert retried == clean and len(read_journal(journal.path)) == 2
