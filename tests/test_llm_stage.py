"""run_llm_stage on its own: cache hits within and across calls, and what the usage row counts."""

from __future__ import annotations

import math
import os
import threading
import time

import pandas as pd
import pytest

from graphrag_spark import tables as T
from graphrag_spark.llm.server import start_server
from graphrag_spark.llm.stage import FreshResults, LlmWork, connect_waves, new_run_id, run_llm_stage

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


def test_a_run_that_found_no_results_table_reads_it_only_for_keys_it_committed(spark, make_config):
    from graphrag_spark.llm.stage import FreshResults

    with start_server(seed=1) as server:
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model")
        store = T.TableStore(spark, cfg.storage)
        store.fresh_results, run_id, reads = FreshResults(), new_run_id(), []
        read_or_empty = store.read_or_empty
        store.read_or_empty = lambda name: reads.append(name) or read_or_empty(name)
        echo = _echo_fn()

        def run(stage, payloads):
            items = spark.createDataFrame([(f"i{i}", p) for i, p in enumerate(payloads)], "item_id string, payload string")
            return run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, stage, items, echo, run_id, "v1", {})[1]

        first = run("echo", ["apples", "pears"])
        assert (first.cache_hits, first.calls, reads) == (0, 2, [])  # no table when the run began
        again = run("echo", ["apples", "plums"])  # one of its keys was committed: the table is read
        assert (again.cache_hits, again.calls, reads) == (1, 1, [T.LLM_RESULTS])
        other = run("other", ["apples"])  # no key of this stage was committed
        assert (other.cache_hits, other.calls, reads) == (0, 1, [T.LLM_RESULTS])

        later_run = T.TableStore(spark, cfg.storage)  # the table exists as this run begins: every lookup reads
        later_run.fresh_results = FreshResults()
        items = spark.createDataFrame([("i0", "apples")], "item_id string, payload string")
        rerun = run_llm_stage(spark, later_run, cfg.llm, cfg.llm.chat, "other", items, echo, new_run_id(), "v1", {})[1]
        assert (rerun.cache_hits, rerun.calls) == (1, 0)
        assert server.stats()["served"]["chat"] == 4


def test_switching_claims_on_later_pays_only_for_the_claims(spark, make_config):
    from graphrag_spark.index.extraction import extract_llm_instances

    texts = ["Alice Smith founded Acme Corp in Berlin.", "Bob Jones sued Acme Corp in Paris.",
             "Acme Corp hired Alice Smith and Bob Jones."]
    with start_server(seed=2) as server:
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model",
                          "extraction.method=llm", "extraction.max_gleanings=0")
        store = T.TableStore(spark, cfg.storage)
        units = spark.createDataFrame([(f"u{i}", t) for i, t in enumerate(texts)], "id string, text string")
        extracted = extract_llm_instances(spark, store, units, cfg.extraction, cfg.llm, new_run_id())
        claims, usages = extracted.claims, extracted.usages
        assert [u.stage for u in usages] == ["extract"] and usages[0].calls == 3 and claims.count() == 0

        with_claims = cfg.extraction.model_copy(update={"claims": True})
        extracted = extract_llm_instances(spark, store, units, with_claims, cfg.llm, new_run_id())
        entities, claims, usages = extracted.entities, extracted.claims, extracted.usages
        extract, claims_usage = usages
        assert (extract.cache_hits, extract.calls) == (3, 0), "entity extraction is not paid again"
        assert (claims_usage.stage, claims_usage.items, claims_usage.calls) == ("extract_claims", 3, 1 * 3)
        assert server.stats()["served"]["chat"] == 6
        assert entities.count() > 0 and claims.count() > 0

def test_answers_cut_at_their_max_tokens_are_counted_per_item_and_in_the_stage_usage(spark, make_config):
    """An answer that stops at max_tokens (finish_reason "length") lost what it would have said past it: the
    item's row and the stage's usage count it, so a max_tokens set low (it costs rate where the provider counts
    it) shows what it cut. A gleaning check's one-token answer stops there by design and is not counted."""
    from graphrag_spark.index.extraction import extract_llm_instances

    texts = ["Alice Smith founded Acme Corp in Berlin.", "Bob Jones sued Acme Corp in Paris."]
    with start_server(seed=3) as server:
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model",
                          "extraction.method=llm", "extraction.max_gleanings=1", "extraction.gleaning_check=before_each",
                          "llm.chat.max_tokens=8")
        store = T.TableStore(spark, cfg.storage)
        run_id = new_run_id()
        units = spark.createDataFrame([(f"u{i}", t) for i, t in enumerate(texts)], "id string, text string")
        extract = extract_llm_instances(spark, store, units, cfg.extraction, cfg.llm, run_id).usages[0]
        kinds = server.stats()["by_kind"]
        checks = kinds.get("gleaning_loop_check", 0)
        assert checks == 2 and extract.calls == 2 + checks + kinds.get("gleaning_continue", 0), kinds
        assert extract.cut_at_max_tokens == extract.calls - checks > 2  # the first passes and any gleaning
        per_item = store.read(T.LLM_RESULTS).where(f"run_id = '{run_id}'").select("n_cut").collect()
        assert sum(r.n_cut for r in per_item) == extract.cut_at_max_tokens
        usage_row = store.read(T.LLM_USAGE).where(f"run_id = '{run_id}' and stage = 'extract'").first()
        assert usage_row.cut_at_max_tokens == extract.cut_at_max_tokens
        assert f"cut at max_tokens {extract.cut_at_max_tokens:>4}" in extract.render()



def _echo_items(spark, n):
    return spark.createDataFrame([(f"i{i}", f"thing {i}") for i in range(n)], "item_id string, payload string")


def _echo_fn():
    """A work function defined in a function: pickled by value for the Python workers (this module is not importable there)."""
    async def echo(client, item: dict) -> LlmWork:
        call = await client.chat([{"role": "user", "content": f"Say something about {item['payload']}."}],
                                 max_tokens=20, item_id=item["item_id"], stage="echo", prompt_version="v1")
        return LlmWork(call.text, [call], call.error)
    return echo


def test_a_driver_crash_loses_at_most_the_calls_in_flight(spark, make_config, monkeypatch):
    from graphrag_spark.llm import stage

    _echo, n_items = _echo_fn(), 40
    # 40 calls of 1 s, 4 at a time: 10 s of calls. The driver dies at the first commit with rows: most
    # calls are still to be made then, even on a loaded machine.
    with start_server(seed=6, latency_s=1.0) as server:
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model",
                          "llm.commit_interval_s=0.5", "llm.max_in_flight=4")
        store = T.TableStore(spark, cfg.storage)
        original = stage._commit

        def crashing_commit(spark, store, rows):
            if rows:  # calls have returned, some are in flight: the driver dies here
                raise KeyboardInterrupt("simulated driver crash")
            return original(spark, store, rows)

        monkeypatch.setattr(stage, "_commit", crashing_commit)
        with pytest.raises(KeyboardInterrupt):
            run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, "echo", _echo_items(spark, n_items), _echo, new_run_id(),
                          "v1", {})
        monkeypatch.setattr(stage, "_commit", original)
        time.sleep(1.5)  # calls in flight at the crash finish (paid, lost)
        paid_before = server.stats()["served"]["chat"]
        journal = stage.journal_dir(cfg.storage.root) / "echo.jsonl"
        returned = len(stage.read_journal(journal))
        assert 0 < returned < n_items and paid_before - returned <= 4, "only calls in flight were lost"

        rerun_llm = cfg.llm.model_copy(update={"max_in_flight": 32})
        _, usage = run_llm_stage(spark, store, rerun_llm, cfg.llm.chat, "echo", _echo_items(spark, n_items), _echo,
                                 new_run_id(), "v1", {})
        assert (usage.cache_hits, usage.calls) == (returned, n_items - returned), "every returned call was kept"
        assert server.stats()["served"]["chat"] == paid_before + n_items - returned
        results = store.read(T.LLM_RESULTS)
        assert results.count() == results.select("item_key").distinct().count() == n_items
        assert not journal.exists()


def test_results_are_committed_to_delta_while_the_stage_still_calls(spark, make_config, monkeypatch):
    from graphrag_spark.llm import stage

    _echo, n_items = _echo_fn(), 40
    with start_server(seed=8, latency_s=1.0) as server:  # 40 calls of 1 s, 4 at a time: about 10 s
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model",
                          "llm.commit_interval_s=1", "llm.max_in_flight=4")
        store = T.TableStore(spark, cfg.storage)
        original, served_after_commits = stage._commit, []

        def watched_commit(spark, store, rows):
            original(spark, store, rows)
            if rows:
                served_after_commits.append(server.stats()["served"]["chat"])

        monkeypatch.setattr(stage, "_commit", watched_commit)
        run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, "echo", _echo_items(spark, n_items), _echo, new_run_id(),
                      "v1", {})
    # A commit is a Spark job: it must not wait for the calling tasks to free a task slot.
    assert len(served_after_commits) >= 2 and served_after_commits[0] < n_items - 8, served_after_commits


def test_a_retried_task_pays_again_for_nothing_that_returned(spark, make_config):
    with start_server(seed=7) as server:
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model", "llm.max_in_flight=2")
        store = T.TableStore(spark, cfg.storage)
        returned_here = {"n": 0}
        echo = _echo_fn()

        async def dies_after_two(client, item: dict) -> LlmWork:
            import os
            import signal

            from pyspark import TaskContext

            work = await echo(client, item)
            if TaskContext.get().attemptNumber() == 0 and returned_here["n"] == 2:
                os.kill(os.getpid(), signal.SIGKILL)  # the Python worker dies with a paid call in hand
            returned_here["n"] += 1
            return work

        outcome, usage = run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, "echo", _echo_items(spark, 8),
                                       dies_after_two, new_run_id(), "v1", {})
        served = server.stats()
        # On local[2] one task calls (the other slot is left to the commits), at most two in flight;
        # its first attempt dies when its third call returns: the retry pays again only what was in
        # flight then (1-2 calls), never the two items that had returned.
        repeated = sum(1 for n in served["served_hashes"].values() if n > 1)
        assert max(served["served_hashes"].values()) == 2 and 1 <= repeated <= 2
        assert served["served"]["chat"] == 8 + repeated
        assert usage.calls == 8 and outcome.where("result is null").count() == 0


def test_budget_reservations_hold_the_rate_for_any_number_of_callers():
    from graphrag_spark.llm.throttle import JobBudget, in_flight_target

    now = {"t": 0.0}
    budget = JobBudget(600, 10**9, headroom=1.0, clock=lambda: now["t"])
    waits = [budget.reserve(10) for _ in range(100)]  # 100 callers at once, e.g. 50 tasks x 2
    assert waits[0] == 0 and waits == sorted(waits)
    assert waits[-1] == pytest.approx(99 / 10.0, abs=0.11), "10 requests/s, one after the other"
    tokens = JobBudget(10**6, 6000, headroom=1.0, token_headroom=1.0, burst_s=1.0, clock=lambda: now["t"])
    assert tokens.reserve(50) == 0 and tokens.reserve(100) == pytest.approx(0.5, abs=0.01)  # 100 tokens/s
    # An overestimate's refund comes back at 1% of the rate, not at once; an underestimate is charged at once.
    tokens.settle(-100)
    assert tokens.reserve(100) == pytest.approx(1.5, abs=0.01)
    now["t"] = 1.0
    assert tokens.reserve(0) == pytest.approx(0.5 - 0.01, abs=0.001)
    tokens.settle(100)
    assert tokens.reserve(0) == pytest.approx(1.5 - 0.01, abs=0.001)
    # Little's law: 10 calls/s at 10 s each keep 100 in flight (twice that with the margin for the
    # items waiting at the budget, plus 2 s of calls for the items' own work); 1 s keeps ~40.
    assert in_flight_target(600, 10.0, 1000) == 221 and in_flight_target(600, 1.0, 1000) == 41
    assert in_flight_target(120, 1.0, 1000) == 9, "at 2 calls/s and 1 s, more than Little's 2 must wait at the budget"
    assert in_flight_target(600, 10.0, 64) == 64


def test_llm_results_is_compacted_once_it_has_more_files_than_the_bound(spark, make_config, monkeypatch, tmp_path):
    from graphrag_spark.llm import stage

    echo = _echo_fn()
    with start_server(seed=8) as server:
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model", "llm.max_result_files=2")
        store = T.TableStore(spark, cfg.storage)
        files = []
        for n in range(1, 5):  # each stage commits one file of results
            run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, "echo", _echo_items(spark, n), echo, new_run_id(), "v1", {})
            files.append(spark.sql(f"DESCRIBE DETAIL {store.sql_name(T.LLM_RESULTS)}").collect()[0]["numFiles"])
        operations = [r.operation for r in spark.sql(f"DESCRIBE HISTORY {store.sql_name(T.LLM_RESULTS)}").collect()]
        assert "OPTIMIZE" in operations and max(files) <= 2, files
        assert store.read(T.LLM_RESULTS).select("item_key").distinct().count() == 4

    # Files are counted at a process's first stage, then only after a quarter of the bound in commits.
    location, counted, original = store.location(T.LLM_RESULTS), [], spark.sql
    monkeypatch.setattr(spark, "sql", lambda query, *a, **k: counted.append(query) or original(query, *a, **k))
    for commits in (0, 15):
        stage._commits_since_count[location] = commits
        stage._compact(spark, store, 64)
    assert counted == []
    stage._commits_since_count[location] = 16
    stage._compact(spark, store, 64)
    assert len(counted) == 1 and stage._commits_since_count[location] == 0

    # A table the run created (an index run's FreshResults found none) is never counted: its files are the
    # run's own commits, so its first stage ends without a Delta job for the count.
    counted.clear()
    with start_server(seed=8) as server:
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model", "llm.max_result_files=64",
                          f"storage.root={tmp_path / 'fresh'}")
        fresh = T.TableStore(spark, cfg.storage)
        fresh.fresh_results = FreshResults()
        for n in (1, 2):
            run_llm_stage(spark, fresh, cfg.llm, cfg.llm.chat, "echo", _echo_items(spark, n), echo, new_run_id(), "v1", {})
    assert stage._commits_since_count[fresh.location(T.LLM_RESULTS)] == 2
    assert not [query for query in counted if "DESCRIBE DETAIL" in query], counted[1:]


def test_the_driver_side_bookkeeping_equals_the_spark_path(spark, make_config, monkeypatch, tmp_path):
    """Small stages find their cache hits and build their outcome on the driver (``DRIVER_STAGE_ITEMS``);
    large ones in Spark joins. Both give the same outcome and counts for new, cached, duplicated and
    failing items, an item that failed before and succeeds now included; so do items the driver holds
    already (a pandas frame, keyed in Python), below and above the bound."""
    from graphrag_spark.llm import stage

    def answer_fn(failing: str):
        async def answer(client, item: dict) -> LlmWork:  # no HTTP: the bookkeeping is what is tested
            if failing in item["payload"]:
                return LlmWork(None, [], f"no answer for {item['payload']}")
            return LlmWork({"upper": item["payload"].upper()}, [], None)
        return answer

    def run(cfg, payloads, failing: str, driver_items: int, held: bool):
        monkeypatch.setattr(stage, "DRIVER_STAGE_ITEMS", driver_items)
        items = pd.DataFrame([(f"i{i}", p) for i, p in enumerate(payloads)], columns=["item_id", "payload"])
        if not held:
            items = spark.createDataFrame(items, "item_id string, payload string")
        outcome, usage = run_llm_stage(spark, T.TableStore(spark, cfg.storage), cfg.llm, cfg.llm.chat, "upper", items,
                                       answer_fn(failing), new_run_id(), "v1", {})
        rows = sorted((r.item_id, r.item_key, r.result, r.error) for r in outcome.collect())
        return rows, (usage.items, usage.cache_hits, usage.failures)

    monkeypatch.setattr(stage, "ensure_api_key", lambda model: None)
    first = ["ash", "birch", "cedar", "ash"]  # a duplicate: one key, both item ids answered
    seen = {}
    for driver_items, root, held in ((0, "spark", False), (1000, "driver", False), (1000, "held", True),
                                     (0, "held-spark", True)):
        cfg = make_config("llm.chat.api_base=http://127.0.0.1:9", "llm.chat.model=local-model",
                          "llm.max_failed_share=1.0", f"storage.root={tmp_path / root}")
        # Run 2: ash cached, birch failed before and succeeds now, cedar cached, dogwood new and failing.
        seen[root] = [run(cfg, first, "birch", driver_items, held),
                      run(cfg, first + ["dogwood"], "dogwood", driver_items, held)]
    assert seen["driver"] == seen["spark"] == seen["held"] == seen["held-spark"]
    (rows, counts), (rows2, counts2) = seen["driver"]
    assert counts == (3, 0, 1) and counts2 == (4, 2, 1)
    assert [r[2] is None for r in rows] == [False, True, False, False]  # i1 (birch) failed
    assert {r[0]: (r[2], r[3]) for r in rows2}["i1"] == ('{"upper": "BIRCH"}', None)
    assert {r[0]: (r[2], r[3]) for r in rows2}["i4"] == (None, "no answer for dogwood")


def _chain_follow_up():
    """i0's answer makes 'i0-next' ready, whose answer makes 'i0-last' ready; nothing else follows."""
    def follow_up(item_id: str, result, error) -> list[tuple[str, str]]:
        if result is None:
            return []
        return {"i0": [("i0-next", f"what follows {result[:40]}")], "i0-next": [("i0-last", "the end")]}.get(item_id, [])
    return follow_up


def test_follow_ups_are_called_in_the_same_job_as_soon_as_their_answer_returns(spark, make_config):
    from graphrag_spark.llm.stage import item_key, with_item_keys

    echo, follow_up = _echo_fn(), _chain_follow_up()
    items = spark.createDataFrame([("x", "any payload \u00e9")], "item_id string, payload string")
    spark_key = with_item_keys(items, "echo", "local-model", "v1", {"a": 1}).first()["item_key"]
    assert item_key("echo", "local-model", "v1", {"a": 1}, "any payload \u00e9") == spark_key
    # Ten items of 0.5 s, two at a time (about 2.5 s): the chain's two follow-ups start as soon as their
    # answer returns, ahead of the items not yet started, so they return before the last of the ten.
    with start_server(seed=9, latency_s=0.5) as server:
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model", "llm.max_in_flight=2")
        store = T.TableStore(spark, cfg.storage)
        outcome, usage = run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, "echo", _echo_items(spark, 10), echo,
                                       new_run_id(), "v1", {}, follow_up=follow_up)
        rows = {r.item_id: r for r in outcome.collect()}
        assert set(rows) == {f"i{i}" for i in range(10)} | {"i0-next", "i0-last"}
        assert all(r.result is not None for r in rows.values())
        assert (usage.items, usage.cache_hits, usage.calls) == (12, 0, 12)
        created = {r.item_id: r.created_at for r in store.read(T.LLM_RESULTS).collect()}
        assert created["i0-last"] < max(created[f"i{i}"] for i in range(10)), created
        # Again: every answer is a cache hit, the follow-ups' too (found from their cached answers).
        again, usage = run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, "echo", _echo_items(spark, 10), echo,
                                     new_run_id(), "v1", {}, follow_up=follow_up)
        assert (usage.items, usage.cache_hits, usage.calls) == (12, 12, 0)
        assert {r.item_id: r.result for r in again.collect()} == {i: r.result for i, r in rows.items()}
        assert server.stats()["served"]["chat"] == 12


def test_a_retried_task_is_handed_again_the_follow_ups_it_had_not_returned(spark, make_config, tmp_path):
    echo, follow_up = _echo_fn(), _chain_follow_up()
    killed = str(tmp_path / "killed")

    async def dies_on_a_follow_up(client, item: dict) -> LlmWork:
        import os
        import signal

        from pyspark import TaskContext

        if item["item_id"] == "i0-next" and TaskContext.get().attemptNumber() == 0:
            open(killed, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)  # the worker dies holding the follow-up, before calling it
        return await echo(client, item)

    with start_server(seed=10, latency_s=0.2) as server:
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model", "llm.max_in_flight=2")
        store = T.TableStore(spark, cfg.storage)
        outcome, usage = run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, "echo", _echo_items(spark, 6),
                                       dies_on_a_follow_up, new_run_id(), "v1", {}, follow_up=follow_up)
        served = server.stats()
    assert os.path.exists(killed), "the first attempt died holding the follow-up"
    assert {r.item_id for r in outcome.where("result is not null").collect()} == (
        {f"i{i}" for i in range(6)} | {"i0-next", "i0-last"})
    assert usage.items == 8 and usage.failures == 0
    # The retry pays again at most what was in flight when the worker died (two calls), and the
    # follow-ups once each.
    assert 8 <= served["served"]["chat"] <= 10 and max(served["served_hashes"].values()) <= 2


def test_a_fed_stage_calls_what_another_stage_publishes_as_it_comes_and_ends_once_it_is_closed(spark, make_config):
    from graphrag_spark.llm.stage import Feed

    echo, follow_up = _echo_fn(), _chain_follow_up()

    def to_items(events: list) -> list[tuple[str, str]]:
        return [(f"i{event}", f"payload of {event}") for event in events]

    def publish(feed: Feed, events: list, pause_s: float, failure: Exception | None = None,
                closes_after=lambda: True) -> threading.Thread:
        def run() -> None:
            for event in events:
                time.sleep(pause_s)
                feed.put([event])
            deadline = time.monotonic() + 60
            while not closes_after() and time.monotonic() < deadline:
                time.sleep(0.1)
            closed_early.append(closes_after())
            feed.close(failure)
        thread = threading.Thread(target=run)
        thread.start()
        return thread

    no_items = spark.createDataFrame([], "item_id string, payload string")
    with start_server(seed=11, latency_s=0.2) as server:
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model", "llm.max_in_flight=4")
        store = T.TableStore(spark, cfg.storage)
        feed, closed_early = Feed(), []
        feed.put([0])  # published before the stage starts: among its first items
        # The feed is closed only once all six calls were served: they are made as their items come.
        publisher = publish(feed, [1, 2, 3], 0.5, closes_after=lambda: server.stats()["served"]["chat"] >= 6)
        outcome, usage = run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, "echo", no_items, echo, new_run_id(), "v1",
                                       {}, follow_up=follow_up, feed=feed, feed_items=to_items)
        publisher.join()
        rows = {r.item_id: r for r in outcome.collect()}
        # The fed items and the follow-up chain of one of them, each called once, all in the stage.
        assert set(rows) == {"i0", "i1", "i2", "i3", "i0-next", "i0-last"}
        assert all(r.result is not None for r in rows.values())
        assert (usage.items, usage.cache_hits, usage.calls) == (6, 0, 6)
        assert closed_early == [True], "the items were called while the feed was open"
        # Again, the feed closed before the stage starts: every answer is a cache hit.
        again = Feed()
        publish(again, [0, 1, 2, 3], 0.0).join()
        _, usage = run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, "echo", no_items, echo, new_run_id(), "v1", {},
                                 follow_up=follow_up, feed=again, feed_items=to_items)
        assert (usage.items, usage.cache_hits, usage.calls) == (6, 6, 0)
        # A publisher that fails: the stage raises once its calls have returned.
        failing = Feed()
        publisher = publish(failing, [4], 0.5, RuntimeError("summaries broke"),
                            closes_after=lambda: server.stats()["served"]["chat"] >= 7)
        with pytest.raises(RuntimeError, match="feeding this one failed: summaries broke"):
            run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, "echo", no_items, echo, new_run_id(), "v1", {},
                          feed=failing, feed_items=to_items)
        publisher.join()
        assert server.stats()["served"]["chat"] == 7


def test_a_feed_gathers_events_until_its_time_is_up_or_what_the_reader_awaits_has_come():
    from graphrag_spark.llm.stage import Feed

    feed = Feed()
    for event in ("a", "b"):
        threading.Timer(0.2, feed.put, [[event]]).start()
    started = time.monotonic()
    events, closed = feed.take(gather_s=30, enough=lambda events: {"a", "b"} <= set(events))
    assert sorted(events) == ["a", "b"] and not closed and time.monotonic() - started < 5
    feed.put(["c"])
    started = time.monotonic()
    assert feed.take(gather_s=0.3, enough=lambda events: "d" in events) == (["c"], False)
    assert time.monotonic() - started >= 0.3, "what the reader awaits did not come: the whole gather time"
    threading.Timer(0.2, feed.close).start()
    assert feed.take(gather_s=30, enough=lambda events: False) == ([], True)


def test_no_minute_of_budget_sends_sees_the_limit_and_a_long_stretch_runs_at_it():
    from bisect import bisect_left

    from graphrag_spark.llm.throttle import JobBudget

    # Callers keep about 20 reservations ahead for 300 s, with two idle gaps (the budget refills: bursts).
    now = {"t": 0.0}
    budget = JobBudget(600, 10**9, clock=lambda: now["t"])
    sends: list[float] = []
    for step in range(30_000):
        now["t"] = step / 100
        idle = 70 <= now["t"] < 75 or 140 <= now["t"] < 200
        while not idle and sum(1 for sent in sends[-40:] if sent > now["t"]) < 20:
            sends.append(now["t"] + budget.reserve(10))
    sends.sort()
    busiest = max(bisect_left(sends, start + 60.0) - i for i, start in enumerate(sends))
    assert busiest <= 0.99 * 600, "a 60 s window at the provider stays below the limit, with room for jitter"
    assert bisect_left(sends, 270.0) - bisect_left(sends, 210.0) >= 0.98 * 600, "a long busy stretch runs at the limit"


def test_a_fed_stage_takes_only_the_window_its_feeding_stages_leave(tmp_path):
    """The reports (fed by the summaries) yield the model's in-flight target to the summaries while those
    have more items out than the target, take what is left as they return, and all of it once they end."""
    from graphrag_spark.llm.coordinator import Coordinator, ModelBudget
    from graphrag_spark.llm.throttle import JobBudget, in_flight_target

    model = ModelBudget(JobBudget(120, 10**9), threading.Lock(), latency_s=1.0)
    target = in_flight_target(120, 1.0, 64)
    feeding = Coordinator("127.0.0.1", model, 64, tmp_path / "summaries.jsonl", expected=target + 3)
    fed = Coordinator("127.0.0.1", model, 64, tmp_path / "reports.jsonl", fed=True)
    alone = Coordinator("127.0.0.1", ModelBudget(JobBudget(120, 10**9), threading.Lock(), latency_s=1.0),
                        64, tmp_path / "other.jsonl", fed=True)
    try:
        assert feeding.window() == target and alone.window() == target
        assert fed.window() == 1
        for i in range(5):
            feeding.result({"item_key": f"k{i}", "item_id": f"i{i}"})
        assert feeding.outstanding() == target - 2 and fed.window() == 2
        feeding.close()
        assert fed.window() == target
    finally:
        for coordinator in (fed, alone):
            coordinator.close()


def test_at_a_tokens_per_minute_limit_calls_charge_their_expected_completion_and_the_window_follows_tokens(tmp_path):
    """A tokens/min limit that binds: before any answer the window follows the rate tokens/min allows at a
    typical call's size, then at the prompts seen, and a call is charged its prompt alone; then a reservation
    charges the prompt and the completion expected of its kind (at most its max_tokens), the answer settles
    the difference, and the window follows the calls' size."""
    from graphrag_spark.llm.coordinator import Coordinator, ModelBudget
    from graphrag_spark.llm.throttle import JobBudget, in_flight_target

    model = ModelBudget(JobBudget(10_000, 120_000), threading.Lock(), latency_s=1.0)
    stage = Coordinator("127.0.0.1", model, 256, tmp_path / "extraction.jsonl", tasks=2)
    try:
        assert stage.window() == math.ceil(in_flight_target(60, 1.0, 256) / 2), "2,000-token calls, 2 tasks"
        first = stage.acquire(1500, [], [], [])
        assert first["charged"] == 1500 and first["window"] == math.ceil(in_flight_target(80, 1.0, 256) / 2)
        answer = stage.acquire(1500, [], [1.0], [["extract", 800, 800], ["extract", 400, 400], ["extract", 400, 400]],
                               "extract", 4000)
        assert answer["charged"] == 1500 + 533
        # The fourth answer: the extractions' mean completion is 500 tokens, each call 2,000 tokens, 60 a minute.
        answer = stage.acquire(1500, [], [1.0], [["extract", 400, -133]], "extract", 4000)
        assert answer["charged"] == 2000
        assert answer["window"] == math.ceil(in_flight_target(60, 1.0, 256) / 2) < in_flight_target(10_000, 1.0, 256) / 2
        assert stage.acquire(1500, [], [], [], "extract", 100)["charged"] == 1600, "capped by max_tokens"
        assert stage.acquire(1500, [], [], [], "glean", 4000)["charged"] == 1500, "a kind not answered yet"
    finally:
        stage.close()
    # Where tokens/min cannot bind, the window follows requests/min.
    roomy = Coordinator("127.0.0.1", ModelBudget(JobBudget(120, 10**9), threading.Lock(), latency_s=1.0), 256,
                        tmp_path / "roomy.jsonl")
    try:
        assert roomy.window() == in_flight_target(120, 1.0, 256)
    finally:
        roomy.close()


def test_a_task_starts_more_items_as_soon_as_the_first_answer_widens_its_window(tmp_path, monkeypatch):
    """A model that answers slower than its window guessed: the first answer's latency widens the window at
    the task's next reservation, and the task's next items start then, not once an item in flight (two calls
    long) has ended. No item ends before the widened window started one more, so a task that started items
    only as others end would start none: the items wait for it (30 s at most) and fail. The order is so
    checked without racing the machine's load (a loaded CI machine once answered a second call before the
    event loop had started the next item)."""
    import asyncio

    from graphrag_spark.config import LlmModelConfig
    from graphrag_spark.llm.coordinator import Coordinator, ModelBudget
    from graphrag_spark.llm.stage import _run_task
    from graphrag_spark.llm.throttle import JobBudget, in_flight_target

    monkeypatch.setenv("GRAPHRAG_TEST_KEY", "test-key")
    events: list[tuple[str, str]] = []
    guessed = in_flight_target(1200, 0.05, 256)
    items = guessed + 4
    one_more_started = asyncio.Event()

    async def two_calls(client, record) -> LlmWork:
        events.append(("start", record["item_id"]))
        if record["item_id"] == f"i{guessed}":
            one_more_started.set()
        calls = []
        for turn in (1, 2):
            calls.append(await client.chat([{"role": "user", "content": f"{record['item_id']} {turn}"}],
                                           item_id=record["item_id"], stage=f"turn{turn}"))
            events.append((f"answer {turn}", record["item_id"]))
        try:
            await asyncio.wait_for(one_more_started.wait(), 30)
        except TimeoutError:
            raise AssertionError("no item beyond the guessed window started before the items in flight ended")
        events.append(("end", record["item_id"]))
        return LlmWork("done", calls)

    model = ModelBudget(JobBudget(1200, 10**9, headroom=1.0), threading.Lock(), latency_s=0.05)  # 20 calls/s
    with start_server(latency_s=0.5) as server:
        stage = Coordinator("127.0.0.1", model, 256, tmp_path / "extraction.jsonl")
        try:
            records = [{"item_key": f"k{i}", "item_id": f"i{i}"} for i in range(items)]
            cfg = LlmModelConfig(model="local-model", api_base=server.base_url, api_key_env="GRAPHRAG_TEST_KEY")
            asyncio.run(_run_task(records, stage.url, two_calls, cfg,
                                  lambda record, work: {"item_key": record["item_key"], "item_id": record["item_id"]}))
        finally:
            stage.close()
    assert stage.returned() == items
    first_answer = min(i for i, (event, _) in enumerate(events) if event == "answer 1")
    assert max(events.index(("start", f"i{i}")) for i in range(guessed)) < first_answer, "the guessed window at once"
    assert first_answer < events.index(("start", f"i{guessed}")), "the wider window came with the first answer"


def test_a_task_keeps_the_latest_window_when_its_reservations_answer_out_of_order():
    """A task's reservations run concurrently: the answer computed first (the probe's narrow window) may
    arrive after the one that widened it, and must not narrow the window back."""
    import asyncio

    from graphrag_spark.llm.coordinator import RemoteBudget

    async def run() -> RemoteBudget:
        budget = RemoteBudget("unused", 4)
        answers = {"third answer": (0.2, {"wait": 0, "charged": 1, "refusals": 0, "window": 4, "window_number": 3}),
                   "fourth answer": (0.0, {"wait": 0, "charged": 1, "refusals": 0, "window": 42, "window_number": 4})}

        async def post(route: str, body: dict) -> dict:
            delay, answer = answers[body["kind"]]
            await asyncio.sleep(delay)
            return answer

        budget.post = post
        await asyncio.wait_for(asyncio.gather(budget.acquire(1, "third answer"), budget.acquire(1, "fourth answer"),
                                              budget.widened()), timeout=5)
        return budget

    assert asyncio.run(run()).window == 42


def test_reservations_waiting_in_a_task_when_a_burst_of_429s_comes_are_made_again_after_its_pause(tmp_path):
    """With a coordinator, a reservation waits in the task, then asks whether it still holds: a burst of 429s
    told meanwhile (by any task) gave it back, and it is made again, after the pause and at the lowered rate."""
    import asyncio

    from graphrag_spark.llm.coordinator import Coordinator, ModelBudget, RemoteBudget
    from graphrag_spark.llm.throttle import JobBudget

    stage = Coordinator("127.0.0.1", ModelBudget(JobBudget(240, 10**9, headroom=1.0), threading.Lock(), latency_s=1.0),
                        64, tmp_path / "extraction.jsonl")  # four calls a second

    async def run() -> list[float]:
        budget = RemoteBudget(stage.url, 8)
        started = time.monotonic()

        async def call() -> float:
            await budget.acquire(100)
            return time.monotonic() - started

        async def a_429() -> None:  # once the five have their turns: now, then 0.25 s apart
            await asyncio.sleep(0.02)
            budget.on_rate_limited(1.0)  # told the coordinator by the task's next post, at the first turn's end

        sent = await asyncio.gather(*[call() for _ in range(5)], a_429())
        return sorted(sent[:5])

    try:
        sent = asyncio.run(run())
    finally:
        stage.close()
    assert sent[0] < 0.2 and sent[1] >= 1.2, "the four that waited waited out the 429's pause from its first post"
    assert sent[-1] - sent[1] >= 0.8 * 3 / 2, "then went at the halved rate: two a second"


def test_the_limits_a_task_hears_the_provider_state_lower_the_job_budget_at_the_coordinator(tmp_path):
    """With a coordinator, the limits the provider states on a task's answers ride on its next post and lower
    the job's budget for every task (told once; the whole key's limit, not a task's share of it)."""
    import asyncio

    from graphrag_spark.llm.coordinator import Coordinator, ModelBudget, RemoteBudget
    from graphrag_spark.llm.throttle import JobBudget

    model = ModelBudget(JobBudget(1200, 10**9, headroom=1.0, burst_s=0.0), threading.Lock(), latency_s=1.0)
    stage = Coordinator("127.0.0.1", model, 64, tmp_path / "extraction.jsonl")
    posted: list[dict] = []

    async def run() -> list[float]:
        budget = RemoteBudget(stage.url, 8)
        post = budget.post

        async def recording(route: str, body: dict) -> dict:
            posted.append(body)
            return await post(route, body)

        budget.post = recording
        started = time.monotonic()
        await budget.acquire(100)
        budget.observe_limits(240, None)  # the first answer's headers
        budget.observe_limits(240, None)  # and every answer's after it: told once
        sent = []
        for _ in range(3):
            await budget.acquire(100)
            sent.append(time.monotonic() - started)
        return sent

    try:
        sent = asyncio.run(run())
    finally:
        stage.close()
    assert model.budget.requests_per_minute == 240 and model.stated_limits == (240, None)
    assert [body["stated_limits"] for body in posted if body.get("stated_limits")] == [[240, None]]
    assert sent[-1] >= 0.9 * 2 / 4, "four calls a second after it, not twenty"


def test_the_token_headroom_keeps_a_minutes_estimate_errors_below_the_limit():
    """The budget aims below tokens/min by one call and three standard deviations of a minute's summed
    completion errors: close to the limit where a minute holds many calls, lower where it holds few,
    and at the default until twenty answers say how far the charges miss. A task's budget keeps its share
    of the deviations of the whole limit's minute."""
    from graphrag_spark.llm.throttle import CallTokens, JobBudget

    tokens = CallTokens()
    tokens.observe_prompt(1900)
    for i in range(19):
        tokens.observe_completion(300 if i % 2 else 500, "extract", -100 if i % 2 else 100)
    assert tokens.token_headroom(1_000_000) is None, "too few answers"
    for i in range(200):
        tokens.observe_completion(300 if i % 2 else 500, "extract", -100 if i % 2 else 100)
    many, few = tokens.token_headroom(1_000_000), tokens.token_headroom(200_000)
    # Calls of ~2,300 tokens charged 100 off either way: 435 a minute at 1M, 87 at 200k.
    assert 0.975 == many > few
    assert few == pytest.approx(1 - (2300 + 3 * 100 * math.sqrt(200_000 / 2300)) / 200_000, abs=0.001)
    wild = CallTokens()
    wild.observe_prompt(1900)
    for i in range(200):
        wild.observe_completion(0 if i % 2 else 6000, "extract", -3000 if i % 2 else 3000)
    assert wild.token_headroom(200_000) == 0.80, "at its lower bound"
    biased = CallTokens()  # the provider counts each prompt 150 tokens more than the estimate: a bias counts too
    biased.observe_prompt(1900)
    for i in range(200):
        biased.observe_completion(300 if i % 2 else 500, "extract", 150 + (-100 if i % 2 else 100))
    assert biased.token_headroom(200_000) < few
    # Four tasks with a quarter of 200k each (a Spark Connect wave, a query's map step): their errors add up in
    # the provider's minute as twice one task's, so together they keep the margin of one budget of 200k for
    # the errors, and a call each.
    quarter = tokens.token_headroom(50_000, share=0.25)
    assert quarter > tokens.token_headroom(50_000)
    assert 4 * 50_000 * (1 - quarter) == pytest.approx(4 * 2300 + 3 * 100 * math.sqrt(200_000 / 2300), rel=0.01)

    now = {"t": 0.0}
    budget = JobBudget(10**6, 6000, token_headroom=1.0, burst_s=1.0, clock=lambda: now["t"])
    assert budget.reserve(100) == 0 and budget.reserve(100) == pytest.approx(1.0, abs=0.01)  # 100 tokens/s
    budget.aim_tokens(0.5)
    assert budget.reserve(0) == pytest.approx(2.0, abs=0.01), "the debt now repaid at 50 tokens/s"


def test_at_a_tokens_per_minute_limit_the_first_latency_calls_at_the_rate_and_no_minute_exceeds_the_limit(monkeypatch):
    """Before the first answers at 10 s latency, calls go out at the rate tokens/min allows at their prompts'
    size (nothing waits for a first answer: the first minute holds nearly a minute of the limit), early by
    their completions, and the answers' debt holds the next calls back: no 60 s window of what was sent
    (prompts and completions) holds more than the limit. A discrete-time run of a task's ``RateLimiter``:
    an item reserves when the window lets it in, is sent after its wait, and answers a latency later."""
    import asyncio
    import heapq

    from graphrag_spark.llm import throttle

    waits: list[float] = []

    async def told_wait(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(throttle.asyncio, "sleep", told_wait)
    limit, latency, prompt = 200_000, 10.0, 1900
    now = [0.0]
    limiter = throttle.RateLimiter(10_000, limit, clock=lambda: now[0])
    completions = [200 + (i * 7919) % 500 for i in range(400)]  # 200-699 tokens, ~450 on average
    sends: list[tuple[float, int]] = []
    in_flight: list[tuple[float, int, int]] = []
    for completion in completions:
        while len(in_flight) >= limiter.calls_in_flight(256):
            now[0], charged, used = heapq.heappop(in_flight)
            limiter.observe_latency(latency)
            limiter.settle(charged, prompt, used, "extract")
        waits.clear()
        charged = asyncio.run(limiter.acquire(prompt, "extract"))
        sent_at = now[0] + sum(waits)
        sends.append((sent_at, prompt + completion))
        heapq.heappush(in_flight, (sent_at + latency, charged, completion))
    times = [at for at, _ in sends]
    assert times == sorted(times), "sent in the order reserved"
    fullest = max(sum(tokens for at, tokens in sends if start <= at < start + 60) for start in times)
    first_minute = sum(tokens for at, tokens in sends if at < 60)
    assert fullest <= limit, fullest
    assert first_minute >= 0.9 * limit, first_minute


def test_connect_waves_split_every_row_once_each_wave_as_big_as_asked_when_it_starts(spark):
    """Connect's waves split the rows by a hash of their key, sized as each wave starts (the first
    ``llm.items_per_commit``, the next from what it measured): every row in one wave, the last the rest."""
    frame = spark.range(2000).selectExpr("cast(id as string) as item_key")
    sizes = iter([100, 600])
    waves = [(wave.collect(), expected)
             for wave, expected in connect_waves(frame, "item_key", 2000, lambda: next(sizes, 600))]
    keys = [row.item_key for rows, _ in waves for row in rows]
    assert sorted(keys) == sorted(str(i) for i in range(2000)), "every row once"
    assert [expected for _, expected in waves] == [100, 600, 600, 700]
    for rows, expected in waves:
        assert abs(len(rows) - expected) <= 4 * math.sqrt(expected), (len(rows), expected)
    assert list(connect_waves(frame, "item_key", 0, lambda: 1)) == []


def test_a_connect_wave_starts_no_item_after_its_time_and_the_next_wave_takes_those_left(spark, make_config,
                                                                                          monkeypatch):
    """Spark Connect's waves (run here on the classic session, the stage's routing patched): the first wave
    holds every item (a high limit), its tasks start none once ``llm.connect_wave_s`` has passed since they
    began and finish those started (their second calls too), and the items left lead the next wave: every
    item returns once, each call paid once."""
    from graphrag_spark.llm import stage as stage_module

    waves: list[int] = []
    split = stage_module.connect_waves

    def counted(*args, **kwargs):
        for wave, expected in split(*args, **kwargs):
            waves.append(expected)
            yield wave, expected

    monkeypatch.setattr(stage_module, "is_connect", lambda session: True)
    monkeypatch.setattr(stage_module, "connect_waves", counted)
    with start_server(latency_s=0.2) as server:
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model",
                          "llm.chat.requests_per_minute=100000", "llm.chat.tokens_per_minute=100000000",
                          "llm.chat.concurrency=2", "llm.items_per_commit=1", "llm.connect_wave_s=1.0")
        store = T.TableStore(spark, cfg.storage)

        async def twice(client, item: dict) -> LlmWork:  # defined here: pickled by value for the Python workers
            calls = [await client.chat([{"role": "user", "content": f"{item['payload']} {turn}"}], max_tokens=20,
                                       item_id=item["item_id"], stage="twice") for turn in (1, 2)]
            return LlmWork(calls[-1].text, calls)

        items = spark.createDataFrame([(f"i{i}", f"p{i}") for i in range(24)], "item_id string, payload string")
        outcome, usage = run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, "twice", items, twice, new_run_id(),
                                       "v1", {})
        stats = server.stats()
    # Two tasks of 12 items, two calls in flight each: about 5 items a second, so a second starts about half.
    assert waves[0] == 24 and len(waves) >= 2 and waves[1] < 24, waves
    assert outcome.where("result is null").count() == 0 and outcome.count() == 24
    assert usage.calls == stats["served"]["chat"] == 48 and set(stats["served_hashes"].values()) == {1}


def test_a_connect_stages_first_wave_starts_from_what_the_stage_before_learned(spark, make_config, monkeypatch):
    """On Spark Connect (run here on the classic session, the stage's routing patched) each task keeps its own
    budget, and a wave's tasks start from what the previous wave learned. A stage's first wave starts from the
    last wave of the model's stage before (as the classic path's coordinator keeps one budget a model): its
    latency, token means and the rate 429s left are not guessed again, stage after stage."""
    from graphrag_spark.llm import stage as stage_module

    seeds: list[dict | None] = []
    sized = stage_module.llm_wave_items

    def recorded(llm, model, learned, calls_per_item):
        seeds.append(learned)
        return sized(llm, model, learned, calls_per_item)

    monkeypatch.setattr(stage_module, "is_connect", lambda session: True)
    monkeypatch.setattr(stage_module, "llm_wave_items", recorded)
    monkeypatch.setattr(stage_module, "_CONNECT_LEARNED", {})  # this test's alone
    with start_server(latency_s=0.2) as server:
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model",
                          "llm.chat.requests_per_minute=100000", "llm.chat.tokens_per_minute=100000000")
        store = T.TableStore(spark, cfg.storage)

        async def once(client, item: dict) -> LlmWork:  # defined here: pickled by value for the Python workers
            call = await client.chat([{"role": "user", "content": item["payload"]}], max_tokens=20,
                                     item_id=item["item_id"], stage="once")
            return LlmWork(call.text, [call])

        items = spark.createDataFrame([(f"i{i}", f"p{i}") for i in range(8)], "item_id string, payload string")
        for stage in ("first", "second"):
            seeds.clear()
            outcome, _ = run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, stage, items, once, new_run_id(), "v1", {})
            assert outcome.where("result is null").count() == 0
            if stage == "first":
                assert seeds[0] is None, "a job's first wave guesses"
    assert seeds[0] is not None and 0.2 <= seeds[0]["latency_s"] < 1.0, seeds[0]
    assert seeds[0]["call_tokens"]["seen"]["completion"] >= 4, "the first stage's answers (of its busiest task)"


def test_connect_waves_lead_with_the_rows_an_earlier_wave_left(spark):
    """The rows a wave's deadline left unstarted lead the next wave in place of as many new rows, and a wave
    of them alone follows the last range: every row in some wave, the new ones once."""
    frame = spark.range(1000).selectExpr("cast(id as string) as item_key")
    left: list[str] = []
    waves = []
    for wave, expected in connect_waves(frame, "item_key", 1000, lambda: 500, lambda: left):
        keys = sorted(row.item_key for row in wave.collect())
        waves.append((keys, expected, list(left)))
        left = keys[:100] if len(waves) < 3 else []  # each of the first two waves leaves 100 rows
    assert [expected for _, expected, _ in waves] == [500, 600, 100], "the last range takes its few rows more"
    assert all(set(carried) <= set(keys) for keys, _, carried in waves), "the rows left lead the next wave"
    assert sorted(waves[2][0]) == sorted(waves[1][0][:100]), "then a wave of them alone"
    new_rows = [key for keys, _, carried in waves for key in keys if key not in carried]
    assert sorted(new_rows) == sorted(str(i) for i in range(1000)), "every new row once"
