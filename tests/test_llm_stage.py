"""run_llm_stage on its own: cache hits within and across calls, and what the usage row counts."""

from __future__ import annotations

import pytest

from graphrag_spark import tables as T
from graphrag_spark.llm.server import start_server
from graphrag_spark.llm.stage import LlmWork, new_run_id, run_llm_stage

pytestmark = pytest.mark.spark


def test_a_second_pass_in_the_same_run_counts_only_its_own_calls(spark, make_config):
    with start_server(seed=1) as server:
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model", "llm.items_per_commit=2")
        store = T.TableStore(spark, cfg.storage)
        run_id = new_run_id()

        async def echo(client, item: dict) -> LlmWork:  # defined here: pickled by value for the Python workers
            call = await client.chat([{"role": "user", "content": f"Say something about {item['payload']}."}],
                                     max_tokens=20, item_id=item["item_id"], stage="echo", prompt_version="v1")
            return LlmWork(call.text, [call], call.error)

        def run(payloads):
            items = spark.createDataFrame([(f"i{i}", p) for i, p in enumerate(payloads)], "item_id string, payload string")
            return run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, "echo", items, echo, run_id, "v1", {})

        first_outcome, first = run(["apples", "pears", "apples"])  # a duplicate item shares one call
        assert (first.items, first.cache_hits, first.calls) == (2, 0, 2)
        assert first_outcome.where("result is null").count() == 0 and first_outcome.count() == 3
        _, second = run(["apples", "pears", "plums"])
        assert (second.items, second.cache_hits, second.calls) == (3, 2, 1)
        assert server.stats()["served"]["chat"] == 3
        usage = store.read(T.LLM_USAGE).where(f"run_id = '{run_id}'").orderBy("calls", ascending=False)
        assert [r.calls for r in usage.collect()] == [2, 1]


def test_switching_claims_on_later_pays_only_for_the_claims(spark, make_config):
    from graphrag_spark.index.extraction import extract_llm_instances

    texts = ["Alice Smith founded Acme Corp in Berlin.", "Bob Jones sued Acme Corp in Paris.",
             "Acme Corp hired Alice Smith and Bob Jones."]
    with start_server(seed=2) as server:
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model",
                          "extraction.method=llm", "extraction.max_gleanings=0")
        store = T.TableStore(spark, cfg.storage)
        units = spark.createDataFrame([(f"u{i}", t) for i, t in enumerate(texts)], "id string, text string")
        _, _, claims, usages = extract_llm_instances(spark, store, units, cfg.extraction, cfg.llm, new_run_id())
        assert [u.stage for u in usages] == ["extract"] and usages[0].calls == 3 and claims.count() == 0

        with_claims = cfg.extraction.model_copy(update={"claims": True})
        entities, _, claims, usages = extract_llm_instances(spark, store, units, with_claims, cfg.llm, new_run_id())
        extract, claims_usage = usages
        assert (extract.cache_hits, extract.calls) == (3, 0), "entity extraction is not paid again"
        assert (claims_usage.stage, claims_usage.items, claims_usage.calls) == ("extract_claims", 3, 1 * 3)
        assert server.stats()["served"]["chat"] == 6
        assert entities.count() > 0 and claims.count() > 0
