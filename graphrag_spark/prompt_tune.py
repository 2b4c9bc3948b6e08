"""Prompt tuning: the configured model adapts the extraction prompts to the user's corpus.

From text units sampled evenly over the corpus the model proposes, in three cached LLM stages:

1. ``tune_domain``: the domain of the documents (one call);
2. ``tune_profile``: a persona for that domain, and the entity types worth extracting (two calls);
3. ``tune_examples``: few-shot examples in the project's tuple format: the extraction prompt
   itself, run with the proposed types on ``prompts.tune_examples`` sampled units; an answer
   that does not parse into at least one entity is not used.

The results are written into ``prompts.dir`` as ``entity_extraction.txt`` (persona and domain
in its goal, the proposed types written in, so the examples and the prompt always agree),
``entity_extraction_examples.txt`` and ``community_report.txt`` (persona in its goal); every
later index run with that config reads them. Each stage goes through ``run_llm_stage``: a rerun
after a crash, or with the same sample, pays for nothing already answered.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.config import Config
from graphrag_spark.errors import StageFailed, UserError
from graphrag_spark.index.extract_llm import ExtractionPrompts, parse_extraction
from graphrag_spark.llm.stage import LlmWork, StageUsage, new_run_id, run_llm_stage
from graphrag_spark.prompts import DEFAULT_PROMPT_DIR, load_prompt
from graphrag_spark.tokens import count_tokens

SAMPLE_TOKENS = 6000     # passages shown to the domain and entity-type prompts
MAX_TYPES = 8


@dataclass
class TunedPrompts:
    domain: str
    persona: str
    entity_types: list[str]
    examples: int
    files: list[Path]
    usage: list[StageUsage]

    def render(self) -> str:
        lines = ["Prompt tuning", "-------------", f"{'domain':<14} {self.domain}", f"{'persona':<14} {self.persona}",
                 f"{'entity types':<14} {', '.join(self.entity_types)}", f"{'examples':<14} {self.examples}", ""]
        lines += [f"wrote {path}" for path in self.files]
        lines += ["", "LLM usage (this run)"] + [u.render() for u in self.usage]
        return "\n".join(lines)


def sample_evenly(texts: list[str], n: int) -> list[str]:
    """``n`` texts spread over the whole list (first, last and evenly between), in order."""
    if len(texts) <= n:
        return list(texts)
    if n == 1:
        return [texts[0]]
    return [texts[round(i * (len(texts) - 1) / (n - 1))] for i in range(n)]


def passages(texts: list[str], max_tokens: int = SAMPLE_TOKENS) -> str:
    """Sampled texts as numbered passages, within a token budget (each passage shares it equally)."""
    share = max(50, max_tokens // max(1, len(texts)))
    parts = []
    for index, text in enumerate(texts, start=1):
        words, kept = text.split(), []
        for word in words:
            kept.append(word)
            if len(kept) % 25 == 0 and count_tokens(" ".join(kept)) >= share:
                break
        parts.append(f"[{index}] " + " ".join(kept))
    return "\n\n".join(parts)


def parse_entity_types(answer: str, max_types: int = MAX_TYPES) -> list[str]:
    """The model's comma- or line-separated list, cleaned: lower case, no numbering, no duplicates."""
    types = []
    for raw in re.split(r"[,\n;]", answer):
        name = re.sub(r"^[\s\-*\d.)]+", "", raw).strip().strip("\"'`.").lower()
        name = re.sub(r"\s+", " ", name)
        if name and len(name) <= 40 and name not in types and not name.startswith("entity types"):
            types.append(name)
    return types[:max_types]


def one_line(answer: str) -> str:
    return re.sub(r"\s+", " ", answer).strip().strip("\"'")


def tuned_extraction_prompt(template: str, domain: str, persona: str, entity_types: list[str]) -> str:
    """The extraction prompt with persona and domain ahead of its goal and the proposed types written in."""
    text = template.replace("{entity_types}", ", ".join(entity_types))
    return text.replace("-Goal-\n", f"-Goal-\n{persona} The texts come from this domain: {domain}.\n", 1)


def tuned_report_prompt(template: str, persona: str) -> str:
    return template.replace("-Goal-\n", f"-Goal-\n{persona}\n", 1)


def example_block(number: int, entity_types: list[str], text: str, records: str) -> str:
    return (f"Example {number}\nEntity types: {', '.join(entity_types)}\nText:\n{text.strip()}\n-End of text-\n"
            f"Output:\n{records.strip()}\n")


def _sample_units(spark: SparkSession, cfg: Config) -> list[str]:
    store = T.TableStore(spark, cfg.storage)
    if store.exists(T.TEXT_UNITS):
        units = store.read(T.TEXT_UNITS)
    else:
        from graphrag_spark.index.chunks import build_text_units
        from graphrag_spark.index.documents import build_documents

        units = build_text_units(build_documents(spark, cfg.input).documents, cfg.chunking)
    rows = units.select("document_id", "chunk_index", "text").orderBy("document_id", "chunk_index").collect()
    texts = [r.text for r in rows if r.text and r.text.strip()]
    if not texts:
        raise UserError(f"No text to tune prompts on: '{cfg.input.path}' has no readable documents.")
    return sample_evenly(texts, cfg.prompts.tune_chunks)


def _answers(outcome: DataFrame, stage: str) -> dict[str, str]:
    rows = outcome.select("item_id", "result", "error").collect()
    failed = [r.error for r in rows if r.result is None]
    if failed:
        raise StageFailed(f"Prompt tuning stage '{stage}' got no answer ({failed[0]}); rerun to retry only it.")
    return {r.item_id: json.loads(r.result) for r in rows}


def tune_prompts(spark: SparkSession, cfg: Config) -> TunedPrompts:
    if not cfg.prompts.dir:
        raise UserError("prompts.dir is not set: tuned prompts need a folder of their own "
                        "(graphrag-spark init sets prompts.dir: prompts; or pass --set prompts.dir=my-prompts).")
    target = Path(cfg.prompts.dir)
    store = T.TableStore(spark, cfg.storage)
    run_id = new_run_id()
    chat = cfg.llm.chat
    language = cfg.prompts.tune_language
    sample = _sample_units(spark, cfg)
    shown = passages(sample)
    prompts = {name: load_prompt(name) for name in ("tune_domain", "tune_persona", "tune_entity_types")}
    usage: list[StageUsage] = []
    params = {"temperature": chat.temperature, "language": language}

    def ask(item_id: str, stage: str, prompt_name: str, max_tokens: int):
        async def work(client, item: dict) -> LlmWork:
            values = json.loads(item["payload"])
            content = prompts[prompt_name].render(**values) + f"\nWrite in {language}."
            call = await client.chat([{"role": "user", "content": content}], max_tokens=max_tokens,
                                     item_id=item["item_id"], stage=stage, prompt_version=prompts[prompt_name].version)
            return LlmWork(None if call.error else call.text, [call], call.error)
        return work

    def run(stage: str, items: list[tuple[str, dict]], work, version: str) -> dict[str, str]:
        frame = T.local_frame(spark, [(i, json.dumps(p, sort_keys=True)) for i, p in items], "item_id string, payload string")
        outcome, stage_usage = run_llm_stage(spark, store, cfg.llm, chat, stage, frame, work, run_id, version, params)
        usage.append(stage_usage)
        return _answers(outcome, stage)

    domain = one_line(run("tune_domain", [("domain", {"sample_text": shown})],
                          ask("domain", "tune_domain", "tune_domain", 40), prompts["tune_domain"].version)["domain"])

    async def profile(client, item: dict) -> LlmWork:
        name = "tune_persona" if item["item_id"] == "persona" else "tune_entity_types"
        return await ask(item["item_id"], "tune_profile", name, 200)(client, item)

    answers = run("tune_profile", [("persona", {"domain": domain}),
                                   ("entity_types", {"domain": domain, "sample_text": shown, "max_types": MAX_TYPES})],
                  profile, prompts["tune_persona"].version + prompts["tune_entity_types"].version)
    persona = one_line(answers["persona"])
    entity_types = parse_entity_types(answers["entity_types"]) or list(cfg.extraction.entity_types)

    # Examples: the project's extraction prompt with the proposed types, on sampled units (not an
    # earlier tuned prompt, whose types are written in).
    extraction = ExtractionPrompts.load(DEFAULT_PROMPT_DIR)
    chosen = sample_evenly(sample, cfg.prompts.tune_examples)
    type_list = ", ".join(entity_types)

    async def example(client, item: dict) -> LlmWork:
        text = json.loads(item["payload"])["text"]
        content = extraction.extraction.render(entity_types=type_list, examples=extraction.examples.text.strip(),
                                               input_text=text)
        call = await client.chat([{"role": "user", "content": content}], max_tokens=chat.max_tokens,
                                 item_id=item["item_id"], stage="tune_examples", prompt_version=extraction.version)
        if call.error:
            return LlmWork(None, [call], call.error)
        parsed = parse_extraction(call.text)
        return LlmWork({"records": call.text, "entities": len(parsed.entities)}, [call])

    records = run("tune_examples", [(f"example{i}", {"text": t, "entity_types": type_list})
                                    for i, t in enumerate(chosen)], example, extraction.version)
    examples = [(chosen[int(key[len("example"):])], value["records"]) for key, value in sorted(records.items())
                if value["entities"] > 0]
    if not examples:
        raise StageFailed("Prompt tuning: no example answer parsed into entity records; see the 'llm_results' "
                          "table (stage tune_examples) for what the model wrote.")

    target.mkdir(parents=True, exist_ok=True)
    written = []
    files = {
        "entity_extraction.txt": tuned_extraction_prompt(_template("entity_extraction"), domain, persona, entity_types),
        "entity_extraction_examples.txt": "\n".join(example_block(n, entity_types, text, rec)
                                                    for n, (text, rec) in enumerate(examples, start=1)),
        "community_report.txt": tuned_report_prompt(_template("community_report"), persona),
    }
    for name, text in files.items():
        path = target / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return TunedPrompts(domain, persona, entity_types, len(examples), written, usage)


def _template(name: str) -> str:
    """The project's prompt (not an earlier tuned one in prompts.dir), so tuning twice never stacks personas."""
    return (DEFAULT_PROMPT_DIR / f"{name}.txt").read_text(encoding="utf-8")
