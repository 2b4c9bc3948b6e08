"""Prompt tuning: the pure helpers, and a run through the local server that writes prompts the config then uses."""

from __future__ import annotations

import pytest

from graphrag_spark import prompt_tune as tune
from graphrag_spark.prompts import DEFAULT_PROMPT_DIR, load_prompt, use_prompt_dir


def test_samples_spread_over_the_corpus():
    assert tune.sample_evenly(list("abcdefghij"), 4) == ["a", "d", "g", "j"]
    assert tune.sample_evenly(["x", "y"], 5) == ["x", "y"]


def test_entity_types_are_cleaned_from_what_a_model_writes():
    answer = "1. Person\n2. Military unit,\n- battle; Person\n\"Location\"."
    assert tune.parse_entity_types(answer) == ["person", "military unit", "battle", "location"]


def test_tuned_extraction_prompt_keeps_its_slots_and_writes_the_types_in():
    template = (DEFAULT_PROMPT_DIR / "entity_extraction.txt").read_text()
    text = tune.tuned_extraction_prompt(template, "Napoleonic war novels", "You are a historian.", ["person", "battle"])
    assert text.startswith("-Goal-\nYou are a historian. The texts come from this domain: Napoleonic war novels.\n")
    assert "{entity_types}" not in text and "[person, battle]" in text
    assert "{examples}" in text and "{input_text}" in text


@pytest.mark.spark
def test_prompt_tune_writes_prompts_the_index_then_reads_and_a_rerun_pays_nothing(spark, make_config, tmp_path):
    from graphrag_spark.index.extract_llm import ExtractionPrompts, parse_extraction
    from graphrag_spark.llm.server import start_server

    prompt_dir = tmp_path / "my-prompts"
    with start_server(seed=4) as server:
        cfg = make_config(f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model",
                          f"prompts.dir={prompt_dir}", "prompts.tune_chunks=4", "prompts.tune_examples=2")
        try:
            tuned = tune.tune_prompts(spark, cfg)
            calls = server.stats()["served"]["chat"]
            assert calls == 1 + 2 + 2  # domain; persona and types; one extraction per example
            assert tuned.domain.startswith("documents about ") and tuned.persona.startswith("You are an expert analyst")
            assert tuned.entity_types[:4] == ["person", "organization", "location", "event"]
            assert sorted(p.name for p in prompt_dir.iterdir()) == [
                "community_report.txt", "entity_extraction.txt", "entity_extraction_examples.txt"]

            prompts = ExtractionPrompts.load()  # what the next index run reads: the tuned files
            assert tuned.persona in prompts.extraction.text and ", ".join(tuned.entity_types) in prompts.extraction.text
            examples = prompts.examples.text.split("Example ")[1:]
            assert len(examples) == tuned.examples == 2
            for example in examples:
                assert parse_extraction(example.split("Output:\n", 1)[1]).entities
            assert load_prompt("community_report").text.startswith(f"-Goal-\n{tuned.persona}\n")
            assert load_prompt("global_map").text == (DEFAULT_PROMPT_DIR / "global_map.txt").read_text()

            again = tune.tune_prompts(spark, cfg)
            assert server.stats()["served"]["chat"] == calls, "a rerun is answered from the LLM cache"
            assert sum(u.cache_hits for u in again.usage) == 5 and again.persona == tuned.persona
        finally:
            use_prompt_dir(None)
