"""Description merging: which elements are summarized, what their summarizer reads, in what order."""

from __future__ import annotations

import asyncio

import pytest
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.config import GraphConfig
from graphrag_spark.index.extract_llm import summarize_descriptions
from graphrag_spark.index.graph import build_entities, build_relationships, keep_within_budget
from graphrag_spark.index.summarize import summary_items
from graphrag_spark.llm.client import CallResult
from graphrag_spark.tokens import count_tokens

WRAPPED = "Scrooge is a miser\nwho lives alone in\nhis late partner's rooms."


class RecordingClient:
    """Stands in for LlmClient.chat: records the prompt, answers with a fixed summary (or fails)."""

    def __init__(self, fail: bool = False):
        self.prompts: list[str] = []
        self.fail = fail

    async def chat(self, messages, **kwargs) -> CallResult:
        self.prompts.append(messages[-1]["content"])
        return CallResult(error="boom") if self.fail else CallResult(text="A summary.")


def test_budget_keeps_a_prefix_in_order_and_always_the_first():
    descriptions = ["zeta " * 10, "alpha", "beta " * 50, "gamma"]
    first = count_tokens(descriptions[0])
    assert keep_within_budget(descriptions, first + count_tokens("alpha")) == descriptions[:2]
    assert keep_within_budget(descriptions, 1) == descriptions[:1]
    assert keep_within_budget(descriptions, 10_000) == descriptions


def test_summarizer_reads_every_description_whole_in_the_given_order():
    client = RecordingClient()
    descriptions = ["Zed runs the mill.", WRAPPED, "Alpha: a line\n- not a bullet", "Zed runs the mill."]
    text, _ = asyncio.run(summarize_descriptions(client, "X", descriptions, 100))
    prompt = client.prompts[0]
    listed = prompt[prompt.index("- Zed"):]
    # Kept whole (line breaks inside a description are its own), in order, exact repeats once.
    assert listed.index("- Zed") < listed.index(f"- {WRAPPED}") < listed.index("- Alpha: a line\n- not a bullet")
    assert listed.count("Zed runs the mill.") == 1 and text == "A summary."
    failed, call = asyncio.run(summarize_descriptions(RecordingClient(fail=True), "X", descriptions[:2], 100))
    assert call.error and failed == f"Zed runs the mill.\n{WRAPPED}", "a failed summary keeps every description"


@pytest.mark.spark
def test_descriptions_keep_all_distinct_most_frequent_then_source_order(spark):
    # Seven distinct descriptions of one entity: two repeated, the rest once, listed out of source order.
    rows = [("e", "u5", "g"), ("e", "u1", "zz frequent"), ("e", "u2", "zz frequent"), ("e", "u4", "c"),
            ("e", "u3", "b"), ("e", "u6", "a"), ("e", "u0", "y twice"), ("e", "u7", "y twice"),
            ("e", "u8", "zz frequent"), ("e", "u9", "f"), ("lone", "u0", WRAPPED)]
    instances = spark.createDataFrame([(f"i{n}", u, name, "T", d, "llm") for n, (name, u, d) in enumerate(rows)],
                                      T.SCHEMAS[T.ENTITY_INSTANCES])
    units = spark.createDataFrame([(f"u{i}", "doc", i, "", 1) for i in range(10)], T.SCHEMAS[T.TEXT_UNITS])
    nodes = {r.title: r for r in build_entities(instances, GraphConfig(), 1, units).collect()}
    ordered = ["zz frequent", "y twice", "b", "c", "g", "a", "f"]  # frequency, then first appearance (u3, u4, u5, ...)
    assert list(nodes["E"].descriptions) == ordered
    assert nodes["E"].description == "\n".join(ordered)
    assert list(nodes["LONE"].descriptions) == [WRAPPED] and nodes["LONE"].description == WRAPPED

    summarized = {r.item_id for r in summary_items(build_entities(instances, GraphConfig(), 1, units), F.col("title")).collect()}
    assert summarized == {nodes["E"].id}, "one description with line breaks is not summarized"

    budget = sum(count_tokens(d) for d in ordered[:3])
    tight = {r.title: r for r in build_entities(instances, GraphConfig(max_description_tokens=budget), 1, units).collect()}
    assert list(tight["E"].descriptions) == ordered[:3]


@pytest.mark.spark
def test_edge_descriptions_follow_the_same_rules(spark):
    entities = spark.createDataFrame([(f"n{i}", "u0", n, "T", None, "llm") for i, n in enumerate("AB")],
                                     T.SCHEMAS[T.ENTITY_INSTANCES])
    edges = spark.createDataFrame(
        [("r0", "u2", "A", "B", "late", 1.0, "llm"), ("r1", "u1", "B", "A", WRAPPED, 1.0, "llm"),
         ("r2", "u3", "A", "B", "late", 1.0, "llm"), ("r3", "u0", "A", "B", "early", 1.0, "llm")],
        T.SCHEMAS[T.RELATIONSHIP_INSTANCES])
    units = spark.createDataFrame([(f"u{i}", "doc", i, "", 1) for i in range(4)], T.SCHEMAS[T.TEXT_UNITS])
    cfg = GraphConfig()
    edge = build_relationships(edges, build_entities(entities, cfg, 1, units), cfg, units).collect()[0]
    assert list(edge.descriptions) == ["late", "early", WRAPPED]
