"""The console progress line: its content, ETA, and a live LLM stage feeding it through the local server."""

from __future__ import annotations

import io
import re

import pytest

from graphrag_spark import progress
from graphrag_spark.progress import LlmCounts, eta_seconds, format_line


def test_llm_line_shows_items_calls_429s_tokens_cost_and_eta():
    counts = LlmCounts(items_done=30, items_total=120, calls=41, n_429=3, prompt_tokens=90_000,
                       completion_tokens=12_345, cost_usd=0.0209)
    line = format_line("extraction: extract", 75, tasks=(2, 8), llm=counts, llm_elapsed_s=60)
    assert line == ("[extraction: extract]  1:15  items 30/120  calls 41  429s 3  tokens 102,345  $0.0209  "
                    "ETA 3:00  spark tasks 2/8")


def test_eta_waits_for_a_rate_and_ends_at_zero():
    assert eta_seconds(0, 10, 5.0) is None
    assert eta_seconds(5, 10, 5.0) == 5.0
    assert eta_seconds(10, 10, 5.0) == 0.0
    assert format_line("graph", 3725) == "[graph]  1:02:05"


def test_without_an_open_progress_stages_print_nothing(capsys):
    with progress.stage("documents"):
        pass
    assert capsys.readouterr() == ("", "")


@pytest.mark.spark
def test_a_failing_stage_leaves_the_console_to_its_error_sentence(spark):
    stream = io.StringIO()
    console = progress.ConsoleProgress(spark, stream, "log", every_s=60)
    with pytest.raises(ValueError):
        with console.stage("documents"):
            raise ValueError("no input")
    with console.stage("text_units"):
        pass
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[text_units] done")


@pytest.mark.spark
def test_a_stage_that_ends_shows_none_of_the_spark_tasks_of_the_stages_still_running(spark):
    import threading
    import time

    def slow(frames):
        time.sleep(3)
        yield from frames

    stream = io.StringIO()
    console = progress.ConsoleProgress(spark, stream, "log", every_s=60)
    with console.stage("embeddings"):
        with console.stage("graph"):
            job = threading.Thread(target=spark.range(2, numPartitions=2).mapInPandas(slow, "id long").collect)
            job.start()
            while not spark.sparkContext.statusTracker().getActiveStageIds():
                time.sleep(0.05)
        job.join()
    graph_line = stream.getvalue().splitlines()[0]
    assert graph_line.startswith("[graph] done") and "spark tasks" not in graph_line, graph_line


@pytest.mark.spark
def test_llm_stage_progress_lines_show_each_items_calls_and_tokens_as_it_returns(spark, make_config, monkeypatch):
    """The stage's one task lasts the whole stage: its items' calls and tokens are on the line as each item
    returns, not only when the task ends (which showed items moving with 0 calls and 0 tokens)."""
    from graphrag_spark import tables as T
    from graphrag_spark.llm.server import start_server
    from graphrag_spark.llm.stage import LlmWork, new_run_id, run_llm_stage

    monkeypatch.setenv("GRAPHRAG_SPARK_PROGRESS", "log")
    monkeypatch.setenv("GRAPHRAG_SPARK_PROGRESS_EVERY_S", "0.2")
    out = io.StringIO()
    with start_server(seed=3, latency_s=0.4, latency_jitter_s=0.3) as server:
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model",
                          "llm.chat.concurrency=2", "llm.items_per_commit=3", "llm.chat.price_per_1k_prompt=0.5")

        async def echo(client, item: dict) -> LlmWork:
            call = await client.chat([{"role": "user", "content": f"Say something about {item['payload']}."}],
                                     max_tokens=20, item_id=item["item_id"], stage="echo", prompt_version="v1")
            return LlmWork(call.text, [call], call.error)

        items = spark.createDataFrame([(f"i{i}", f"fruit {i}") for i in range(6)], "item_id string, payload string")
        with progress.console_progress(spark, out), progress.stage("reports"):
            _, usage = run_llm_stage(spark, T.TableStore(spark, cfg.storage), cfg.llm, cfg.llm.chat, "echo", items,
                                     echo, new_run_id(), "v1", {})
    lines = out.getvalue().splitlines()
    final = lines[-1]
    assert final.startswith("[reports: echo] done")
    assert f"items 6/6  calls 6  429s 0  tokens {usage.prompt_tokens + usage.completion_tokens:,}" in final
    assert f"${usage.prompt_tokens / 1000 * 0.5:.4f}" in final and "ETA 0:00" in final
    # Live while the stage runs: two calls at a time for about 1.2 s, a line every 0.2 s.
    partial = [line for line in lines[:-1] if re.search(r"items [1-5]/6", line)]
    assert partial, lines
    for line in partial:
        items, calls, tokens = (int(re.search(pattern, line)[1].replace(",", ""))
                                for pattern in (r"items (\d+)/", r"calls (\d+)", r"tokens ([\d,]+)"))
        assert calls == items and tokens > 0, line
