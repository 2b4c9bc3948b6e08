"""The index's stage schedule (pipeline.run_stages): independent stages overlap, a stage never starts
before the stages it depends on, and a failure stops the schedule. Pure: no Spark."""

import threading
import time

import pytest

from graphrag_spark import tables as T
from graphrag_spark.config import Config
from graphrag_spark.index.pipeline import STAGES, Stage, run_stages, stage_predecessors


def _stage(name, inputs, outputs, after=None, beside=()):
    return Stage(name, inputs, outputs, "", lambda run: None, after=after, beside=beside)


def test_the_index_stages_wait_only_for_what_they_read():
    llm = Config.model_validate({"extraction": {"method": "llm"}})
    needs = stage_predecessors(tuple(s for s in STAGES if s.applies(llm)))
    assert needs["text_unit_embeddings"] == {"text_units"}  # runs while entities are extracted
    assert needs["communities"] == {"graph"}  # runs while descriptions are summarized
    # Beside the summaries: they take the summaries' answers as they come (the pipeline's Run.feeds).
    assert needs["community_reports"] == {"extraction", "graph", "communities"}
    assert needs["entity_embeddings"] == {"graph"}
    written = [table for stage in STAGES for table in stage.outputs]
    # Tables written by two stages (graph, summaries) are written by stages that never overlap.
    assert {t for t in written if written.count(t) > 1} == {T.ENTITIES, T.RELATIONSHIPS}
    assert "graph" in needs["summarize_descriptions"]


def test_independent_stages_run_at_the_same_time_and_dependents_after_them():
    stages = (_stage("a", (), ("x",)), _stage("b", ("x",), ("y",)), _stage("c", ("x",), ("z",)),
              _stage("d", ("y", "z"), ("w",)))
    both_running = threading.Barrier(2, timeout=10)
    log, lock = [], threading.Lock()

    def start(stage):
        with lock:
            log.append(("start", stage.name))
        if stage.name in ("b", "c"):
            both_running.wait()  # deadlocks (times out) unless b and c run at once
        with lock:
            log.append(("end", stage.name))

    assert run_stages(stages, start)
    assert log.index(("end", "a")) < min(log.index(("start", "b")), log.index(("start", "c")))
    assert log.index(("start", "d")) > max(log.index(("end", "b")), log.index(("end", "c")))


def test_a_stage_beside_another_starts_with_it_and_never_without_it():
    stages = (_stage("a", (), ("x",)), _stage("slow", ("x",), ("s",)), _stage("publisher", ("s",), ("y",)),
              _stage("reader", ("x", "y"), ("z",), beside=("publisher",)))
    assert stage_predecessors(stages)["reader"] == {"a"}
    both_running = threading.Barrier(2, timeout=10)
    started = []

    def start(stage):
        started.append(stage.name)
        if stage.name in ("publisher", "reader"):
            both_running.wait()  # times out unless the reader runs while its publisher does

    assert run_stages(stages, start)
    assert started.index("reader") > started.index("publisher"), "ready after a, it waits for its publisher to start"
    # The publisher never starts (a failure before it): nor does the stage beside it, which would wait for it.
    started.clear()

    def slow_fails(stage):
        started.append(stage.name)
        if stage.name == "slow":
            raise ValueError("slow failed")

    with pytest.raises(ValueError):
        run_stages(stages, slow_fails)
    assert started == ["a", "slow"]


def test_a_failure_starts_nothing_more_and_is_raised_after_the_running_stages_end():
    stages = (_stage("a", (), ("x",)), _stage("slow", ("x",), ("y",)), _stage("bad", ("x",), ("z",)),
              _stage("after_bad", ("z",), ("w",)))
    ran, slow_ended = [], threading.Event()

    def start(stage):
        ran.append(stage.name)
        if stage.name == "bad":
            raise ValueError("bad stage")
        if stage.name == "slow":
            time.sleep(0.3)
            slow_ended.set()

    with pytest.raises(ValueError, match="bad stage"):
        run_stages(stages, start)
    assert slow_ended.is_set() and "after_bad" not in ran


def test_stop_after_a_stage_starts_nothing_more():
    stages = (_stage("a", (), ("x",)), _stage("b", ("x",), ("y",)))
    ran = []
    assert not run_stages(stages, lambda stage: ran.append(stage.name), stop_after=lambda stage: stage.name == "a")
    assert ran == ["a"]
