"""Stage 6, community reports: built bottom-up, deepest level first.

Each community arrives at the report function as one row holding its entities, its internal
relationships and the finished reports of its sub-communities (so higher levels can build
on finer ones). The offline method writes *extractive* reports (no LLM): title from the most
connected entities, summary from their descriptions (the most central text), findings from
the heaviest relationships with ``[Data: Entities (...); Relationships (...)]`` references,
and a rating from internal connection strength. Columns match the LLM reports exactly.

LLM reports (``build_llm_reports``) are scheduled so the rate budget is not idle between levels:

- A community with a single sub-community of its own size has the same members (Leiden's levels
  ran deeper than its subtree, so it was carried down unchanged): it reuses that sub-community's
  report, with no context built and no call (``reused_reports``).
- Every other community whose elements fit the context budget, or that has no sub-communities,
  does not depend on any finer report (the paper's context is then its elements alone): all of
  them, at every level, are called in one LLM stage at once.
- Only the communities that overflow and have sub-communities wait for the finer level: each is
  built with its finished sub-reports substituted. On the driver (below) it is built and called in
  that same stage as soon as its sub-communities' reports are answered (the stage's follow-ups; those
  sub-communities are called first), so it costs no stage, and no latency, of its own. Otherwise, and
  where a sub-community's call failed, they are called level by level after it, deepest first. The
  extractive stand-ins of failed calls with sub-communities are written level by level too (they name
  their sub-communities; no call).
- Every level is written in one commit: the levels with nothing waiting cost no Spark job of their
  own (only a waiting level's reports are materialised, as the next level's sub-reports).
- A small graph (``DRIVER_REPORT_MEMBERS``) follows the same schedule on the driver: its elements are
  collected once, so the stage runs its LLM stages and one write, not a dozen Spark jobs per level.
  There, in a full build, the stage runs beside the description summaries: a context is built and
  called as soon as the summaries of its elements are answered (the stage's feed), so the rate budget
  is not idle while the summaries' last calls are out and their tables are rewritten.
"""

from __future__ import annotations

import json
import math
from functools import reduce
from typing import Callable, Iterator

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.compat import in_parallel, is_connect
from graphrag_spark.ids import content_id
from graphrag_spark.index.report_context import CommunityElements, SubCommunity, build_higher_context, build_leaf_context
from graphrag_spark.index.report_json import format_data_refs, parse_report, render_full_content
from graphrag_spark.llm.stage import DRIVER_STAGE_ITEMS, Feed
from graphrag_spark.tokens import count_tokens

REPORT_COLUMNS = [f.name for f in T.SCHEMAS[T.COMMUNITY_REPORTS].fields]
OFFLINE_METHOD = "extractive"


def _first_sentence(text: str | None, limit: int = 300) -> str:
    text = " ".join((text or "").split("\n")[0].split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _names(titles: list[str]) -> str:
    titles = [t.title() for t in titles]
    return titles[0] if len(titles) == 1 else ", ".join(titles[:-1]) + " and " + titles[-1]


def as_list(value) -> list:
    """Arrow hands array columns to pandas as numpy arrays (or None for a missing join)."""
    return [] if value is None else list(value)


def extractive_report(community: dict, max_findings: int) -> dict:
    """Pure: an offline report from one community context row (see ``community_contexts``)."""
    entities = sorted(as_list(community["entities"]), key=lambda e: (-e["degree"], e["title"]))
    relationships = sorted(as_list(community["relationships"]), key=lambda r: (-r["weight"], -r["combined_degree"], r["id"]))
    sub_reports = sorted(as_list(community["sub_reports"]), key=lambda r: r["community"])
    top = [e["title"] for e in entities[:3]]
    by_title = {e["title"]: e for e in entities}
    central = [f"{e['title'].title()}: {_first_sentence(e['description'])}" for e in entities[:3] if e["description"]]
    summary = f"This community of {len(entities)} entities centres on {_names(top)}. " + " ".join(central)
    if sub_reports:
        summary += " It groups the sub-communities " + "; ".join(f"{r['title']} [Data: Reports ({r['community']})]" for r in sub_reports[:5]) + "."
    findings = []
    for rel in relationships[:max_findings]:
        refs = format_data_refs({"Entities": [by_title[t]["human_readable_id"] for t in (rel["source"], rel["target"]) if t in by_title],
                                 "Relationships": [rel["human_readable_id"]]})
        findings.append({"summary": f"{rel['source'].title()} and {rel['target'].title()}",
                         "explanation": f"{_first_sentence(rel['description'], 600)} (seen {int(rel['weight'])} times) {refs}"})
    internal_weight = sum(r["weight"] for r in relationships)
    rating = round(10 * (1 - math.exp(-internal_weight / (10 * max(1, len(entities))))), 1)
    report = {"title": _names(top), "summary": summary, "rating": rating,
              "rating_explanation": f"Offline estimate from internal connection strength: {internal_weight:g} weighted links among {len(entities)} entities.",
              "findings": findings}
    return {"id": content_id("report", community["id"], OFFLINE_METHOD), "community": community["community"],
            "level": community["level"], **report, "full_content": render_full_content(report), "method": OFFLINE_METHOD}


def community_contexts(level_communities: DataFrame, entities: DataFrame, relationships: DataFrame,
                       finer_reports: DataFrame | None, claims: DataFrame | None = None,
                       finer_communities: DataFrame | None = None) -> DataFrame:
    """One row per community: its entities, internal relationships, claims about its entities and
    sub-community reports (with their member ids, for substitution) as arrays of structs."""
    entity_rows = (level_communities.select("community", F.explode("entity_ids").alias("id"))
                   .join(entities.select("id", "human_readable_id", "title", "type", "description", "degree"), "id")
                   .groupBy("community").agg(F.collect_list(F.struct("id", "human_readable_id", "title", "type",
                                                                     "description", "degree")).alias("entities")))
    relationship_rows = (level_communities.select("community", F.explode("relationship_ids").alias("id"))
                         .join(relationships.select("id", "human_readable_id", "source", "target", "description",
                                                    "weight", "combined_degree"), "id")
                         .groupBy("community").agg(F.collect_list(F.struct(
                             "id", "human_readable_id", "source", "target", "description", "weight",
                             "combined_degree")).alias("relationships")))
    contexts = (level_communities.select("id", "community", "level", "size", "children")
                .join(entity_rows, "community").join(relationship_rows, "community", "left"))
    if claims is not None:
        claim_rows = (level_communities.select("community", F.explode("entity_ids").alias("entity_id"))
                      .join(entities.select(F.col("id").alias("entity_id"), F.col("title").alias("subject")), "entity_id")
                      .join(claims.select("id", "human_readable_id", "subject", "type", "status", "description"), "subject")
                      .groupBy("community").agg(F.collect_list(F.struct(
                          "id", "human_readable_id", "subject", "type", "status", "description")).alias("claims")))
        contexts = contexts.join(claim_rows, "community", "left")
    return with_sub_reports(contexts, finer_reports, finer_communities)


def with_sub_reports(contexts: DataFrame, finer_reports: DataFrame | None,
                     finer_communities: DataFrame | None = None) -> DataFrame:
    """``contexts`` (``community_contexts`` rows, any ``sub_reports`` column replaced) with the finished
    reports of their sub-communities in ``sub_reports`` (null without ``finer_reports``)."""
    contexts = contexts.drop("sub_reports")
    if finer_reports is None:
        return contexts.withColumn("sub_reports", F.lit(None).cast(
            "array<struct<community:int,title:string,summary:string,full_content:string,method:string,"
            "entity_ids:array<string>,relationship_ids:array<string>>>"))
    finer = finer_reports.select(F.col("community").alias("child"), "title", "summary", "full_content", "method")
    if finer_communities is not None:
        finer = finer.join(finer_communities.select(F.col("community").alias("child"), "entity_ids", "relationship_ids"), "child")
    else:
        finer = (finer.withColumn("entity_ids", F.array().cast("array<string>"))
                 .withColumn("relationship_ids", F.array().cast("array<string>")))
    subs = (contexts.select("community", F.explode("children").alias("child")).join(finer, "child")
            .groupBy("community").agg(F.collect_list(F.struct(
                F.col("child").alias("community"), "title", "summary", "full_content", "method", "entity_ids",
                "relationship_ids")).alias("sub_reports")))
    return contexts.join(subs, "community", "left")


def generate_level_reports(contexts: DataFrame, report_fn: Callable[[dict], dict]) -> DataFrame:
    """Apply a per-community report function in executors (mapInPandas over context rows)."""
    schema = T.SCHEMAS[T.COMMUNITY_REPORTS]

    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            rows = [report_fn(row) for row in batch.to_dict("records")]
            yield pd.DataFrame(rows, columns=REPORT_COLUMNS, dtype=object)

    return contexts.mapInPandas(run, schema)


REPORT_STAGE = "community_reports"
LLM_METHOD = "llm"
FALLBACK_METHOD = "extractive (llm failed)"
_CONTEXT_SCHEMA = ("id string, community int, level int, context string, n_tokens int, "
                   "substituted array<int>, truncated boolean")


def build_context(community: dict, max_tokens: int) -> dict:
    """Pure: the paper's report context for one community context row (leaf, or higher with substitution)."""
    entities = pd.DataFrame(as_list(community["entities"]),
                            columns=["id", "human_readable_id", "title", "type", "description", "degree"])
    relationships = pd.DataFrame(as_list(community["relationships"]), columns=[
        "id", "human_readable_id", "source", "target", "description", "weight", "combined_degree"])
    claims = pd.DataFrame(as_list(community.get("claims")),
                          columns=["id", "human_readable_id", "subject", "type", "status", "description"])
    # A sub-community whose LLM report failed has an extractive stand-in: it is never substituted
    # (its elements stay, so the parent's report is written from the elements, not a stand-in).
    subs = [SubCommunity(int(s["community"]), s["title"], None if s.get("method") == FALLBACK_METHOD else s["full_content"],
                         as_list(s["entity_ids"]), as_list(s["relationship_ids"])) for s in as_list(community["sub_reports"])]
    if subs:
        context = build_higher_context(CommunityElements(entities, relationships, claims), subs, max_tokens, count_tokens)
    else:
        context = build_leaf_context(entities, relationships, claims, max_tokens, count_tokens)
    return {"id": community["id"], "community": community["community"], "level": community["level"],
            "context": context.text, "n_tokens": context.n_tokens, "substituted": context.substituted_communities,
            "truncated": context.truncated}


def report_contexts(contexts: DataFrame, max_tokens: int) -> DataFrame:
    def run(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            yield pd.DataFrame([build_context(row, max_tokens) for row in batch.to_dict("records")], dtype=object,
                               columns=[c.split()[0] for c in _CONTEXT_SCHEMA.split(", ")])
    return contexts.mapInPandas(run, _CONTEXT_SCHEMA)


async def write_report(client, context: str, prompt, max_tokens: int, item_id: str):
    """One report call; invalid JSON that the parser cannot repair gets one corrective retry."""
    from graphrag_spark.llm.stage import LlmWork

    messages = prompt.messages(input_text=context)
    calls = []
    for attempt in range(2):
        call = await client.chat(messages, max_tokens=max_tokens, json_mode=True, item_id=item_id,
                                 stage=REPORT_STAGE, prompt_version=prompt.version)
        calls.append(call)
        if call.error:
            return LlmWork(None, calls, call.error)
        report, problem = parse_report(call.text)
        if report is not None:
            return LlmWork(report, calls)
        messages = messages + [{"role": "assistant", "content": call.text},
                               {"role": "user", "content": f"That was not a valid report ({problem}). "
                                                           "Answer again with only the JSON object."}]
    return LlmWork(None, calls, f"invalid report JSON after {len(calls)} answers: {problem}")


def reused_reports(communities: pd.DataFrame) -> dict[int, int]:
    """Pure: community -> the sub-community whose report it reuses. ``communities``: community, size,
    children. A community with one sub-community of its own size has the same members (the levels
    partition the clustered entities and nest), hence the same context and the same report."""
    size_of = dict(zip(communities["community"].astype(int), communities["size"].astype(int)))
    return {int(community): int(children[0])
            for community, size, children in zip(communities["community"], communities["size"], communities["children"])
            if len(as_list(children)) == 1 and size_of.get(int(children[0])) == int(size)}


def report_origins(reused: dict[int, int]) -> dict[int, int]:
    """Pure: community -> the community whose report it carries: a chain of copies (a community carried
    down over several levels) ends at the one community that was reported."""
    origins = {}
    for community, origin in reused.items():
        while origin in reused:
            origin = reused[origin]
        origins[community] = origin
    return origins


def reused_report(row: dict) -> dict:
    """Pure: the report of ``row["child"]`` (columns of a report row, prefixed ``child_``) as the report
    of the community ``row`` names; its id follows from both, so it is distinct and deterministic."""
    report = {name: row[f"child_{name}"] for name in ("title", "summary", "rating", "rating_explanation", "full_content",
                                                      "method")}
    return {"id": content_id("report", row["id"], row["child_id"]), "community": row["community"],
            "level": row["level"], **report, "findings": [dict(f) for f in as_list(row["child_findings"])]}


def _report_stage(spark, store, cfg, built: DataFrame, run_id: str, follow_up=None, feed=None, feed_items=None):
    """One LLM stage over report contexts (``report_contexts`` rows): (id, result, error) and its usage.
    ``follow_up``, ``feed`` and ``feed_items``: ``run_llm_stage``'s (contexts made ready by answers of the
    stage, and by the summaries' answers)."""
    from graphrag_spark.llm.stage import run_llm_stage
    from graphrag_spark.prompts import load_prompt

    prompt = load_prompt("community_report")
    max_tokens = cfg.reports.max_output_tokens
    items = built.select(F.col("id").alias("item_id"), F.col("context").alias("payload"))

    async def work(client, item: dict):
        return await write_report(client, item["payload"], prompt, max_tokens, item["item_id"])

    outcome, usage = run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, REPORT_STAGE, items, work, run_id,
                                   prompt.version, {"max_tokens": max_tokens, "temperature": cfg.llm.chat.temperature},
                                   follow_up, feed, feed_items)
    return outcome.select(F.col("item_id").alias("id"), "result", "error"), usage


def final_report(row: dict, max_findings: int) -> dict:
    """Pure: a community's report from its context row and its answer (``result``: the report JSON, or
    None where the call failed: the extractive stand-in)."""
    if row["result"] is None:
        return {**extractive_report(row, max_findings), "method": FALLBACK_METHOD}
    report = json.loads(row["result"])
    return {"id": content_id("report", row["id"], LLM_METHOD), "community": row["community"], "level": row["level"],
            **report, "full_content": render_full_content(report), "method": LLM_METHOD}


# Up to this many community memberships (the sum of the communities' sizes over every level), the
# report contexts are built on the driver: the elements are collected once and the stage runs a few
# Spark jobs (its LLM stages and one write) instead of a dozen per level. The work is linear in it.
DRIVER_REPORT_MEMBERS = 20_000


def build_llm_reports(spark, store, cfg, run_id: str, claims: DataFrame | None,
                      read: Callable[[str], DataFrame] | None = None, summaries: Feed | None = None,
                      awaited: set[str] | None = None) -> tuple[dict, list]:
    """The paper's LLM reports for every community (scheduled as the module docstring says), written to
    ``community_reports`` in one commit; a failed one falls back to extractive. Returns the run
    summary's counts and the stages' usage. ``read``: a table's rows by name (the index job's are held
    cached as written: ``Run.table``); by default the store's table.

    ``summaries``: the description summaries' answers (element id, summary), where that stage runs beside
    this one; ``awaited``: the ids it publishes one by one as they are answered (None: it publishes none).
    A driver-side stage builds and calls each context as soon as the summaries of its elements have come;
    otherwise the reports wait for the summaries to end before they read the tables."""
    read = read or store.read
    all_communities = read(T.COMMUNITIES)
    shape = all_communities.select("community", "level", "size", "children").toPandas()
    origins = report_origins(reused_reports(shape))
    on_driver = int(shape["size"].sum()) <= DRIVER_REPORT_MEMBERS
    streams = (awaited is not None and on_driver and not is_connect(spark)
               and len(shape) - len(origins) <= DRIVER_STAGE_ITEMS)
    if summaries is not None and not streams:
        summaries.all()  # the tables as the summaries leave them
    if shape.empty:
        store.write(T.local_frame(spark, [], T.SCHEMAS[T.COMMUNITY_REPORTS]), T.COMMUNITY_REPORTS)
        return {"reports per level": {}}, []
    if streams:
        built = _reports_on_driver(spark, store, cfg, run_id, claims, read, shape, origins, summaries, awaited)
    else:
        built = (_reports_on_driver if on_driver else _reports_in_spark)(spark, store, cfg, run_id, claims, read,
                                                                          shape, origins)
    substituted, trimmed, usages, awaited_contexts = built
    counts = {"reports per level": {int(level): int(n) for level, n in shape.groupby("level").size().sort_index().items()},
              "reports reused (same members as a sub-community)": len(origins),
              "contexts with substituted sub-reports": dict(sorted(substituted.items())),
              "report contexts trimmed to reports.max_input_tokens": trimmed,
              "reports failed (extractive stand-in, retried next run)": sum(u.failures for u in usages)}
    if streams:
        counts["report contexts built as their summaries came"] = awaited_contexts
    return counts, usages


def _reports_on_driver(spark, store, cfg, run_id: str, claims: DataFrame | None, read: Callable[[str], DataFrame],
                       shape: pd.DataFrame, origins: dict[int, int], summaries: Feed | None = None,
                       awaited: set[str] | None = None):
    """``build_llm_reports`` for a small graph: the same schedule over rows collected to the driver. Writes
    the reports; returns the substituted contexts per level, the trimmed contexts, the stages' usage and the
    contexts that waited for summaries. ``summaries`` and ``awaited``: ``build_llm_reports``'s, where they
    stream (the rows read may predate them)."""
    max_input, max_findings = cfg.reports.max_input_tokens, cfg.reports.max_findings
    entity_columns = ("id", "human_readable_id", "title", "type", "description", "degree")
    relationship_columns = ("id", "human_readable_id", "source", "target", "description", "weight", "combined_degree")
    claim_columns = ("id", "human_readable_id", "subject", "type", "status", "description")
    community_columns = ("id", "community", "level", "size", "children", "entity_ids", "relationship_ids")
    # Four independent reads: at once, their jobs' fixed latencies overlap.
    entity_rows, relationship_rows, claim_rows, community_rows = in_parallel(
        spark, lambda: _records(read(T.ENTITIES).select(*entity_columns)),
        lambda: _records(read(T.RELATIONSHIPS).select(*relationship_columns)),
        lambda: [] if claims is None else _records(claims.select(*claim_columns)),
        lambda: _records(read(T.COMMUNITIES).select(*community_columns)))
    entity_of = {r["id"]: r for r in entity_rows}
    relationship_of = {r["id"]: r for r in relationship_rows}
    claims_of: dict[str, list[dict]] = {}
    for claim in claim_rows:
        claims_of.setdefault(claim["subject"], []).append(claim)
    # Per community, its context row as ``community_contexts`` builds it (no sub-reports yet).
    rows: dict[int, dict] = {}
    for community in community_rows:
        members = [entity_of[i] for i in community["entity_ids"] or () if i in entity_of]
        rows[community["community"]] = {
            **community, "children": community["children"] or [], "entities": members,
            "relationships": [relationship_of[i] for i in community["relationship_ids"] or () if i in relationship_of],
            "claims": [claim for entity in members for claim in claims_of.get(entity["title"], ())] if claims is not None else None,
            "sub_reports": None}
    originals = [c for c in rows if c not in origins]
    schedule = _ContextSchedule(rows, origins, originals, max_input, max_findings, awaited or set())
    answers, usage = _driver_answers(spark, store, cfg, run_id, schedule.start(), schedule.answered,
                                     summaries if awaited else None, schedule.summarized)
    schedule.check_complete()
    first, waits = schedule.first, schedule.waits
    trimmed = sum(first[c]["truncated"] for c in originals if c not in waits)
    usages = [usage]
    # A failed call with sub-communities: its stand-in names them, so it is written at its level's turn.
    restated = {c for c in originals if c not in waits and answers[rows[c]["id"]] is None and rows[c]["children"]}
    later = waits | restated  # written level by level, deepest first, once their sub-reports are finished
    reports = {c: final_report({**rows[c], "result": answers[rows[c]["id"]]}, max_findings)
               for c in originals if c not in later}

    def report_of(community: int) -> dict:
        """A finished report; a copy's is its origin's (finished before the copy's parent level starts)."""
        if community not in reports:
            reports[community] = _carried_report(rows[community], reports[origins[community]])
        return reports[community]

    substituted = {}
    for level in sorted({rows[c]["level"] for c in later}, reverse=True):
        level_rows = {c: {**rows[c], "sub_reports": _sub_reports(rows, rows[c]["children"], report_of)}
                      for c in later if rows[c]["level"] == level}
        # Built and answered in the first stage already where every sub-report was written by then.
        built = {c: schedule.built.get(c) or build_context(row, max_input) for c, row in level_rows.items() if c in waits}
        if built:
            unanswered = [context for context in built.values() if context["id"] not in answers]
            if unanswered:
                late, usage = _driver_answers(spark, store, cfg, run_id, unanswered)
                usages.append(usage)
                answers.update(late)
            substituted[level] = sum(bool(context["substituted"]) for context in built.values())
            trimmed += sum(context["truncated"] for context in built.values())
        for c, row in level_rows.items():
            reports[c] = final_report({**row, "result": answers[row["id"]]}, max_findings)
    for community in origins:
        report_of(community)
    rows_out = [tuple(report[name] for name in REPORT_COLUMNS) for report in reports.values()]
    _write_reports(store, T.local_frame(spark, rows_out, T.SCHEMAS[T.COMMUNITY_REPORTS]), len(shape))
    return substituted, trimmed, usages, schedule.awaited_contexts


def _carried_report(row: dict, origin: dict) -> dict:
    """The report of the community ``row`` (a context row) that carries ``origin``'s report (same members)."""
    return reused_report({"id": row["id"], "community": row["community"], "level": row["level"],
                          **{f"child_{name}": value for name, value in origin.items()}})


def _sub_reports(rows: dict[int, dict], children: list[int], report_of: Callable[[int], dict]) -> list[dict]:
    """A context row's ``sub_reports``: each sub-community's finished report with its members."""
    return [{**{name: report_of(child)[name] for name in ("community", "title", "summary", "full_content", "method")},
             "entity_ids": rows[child]["entity_ids"], "relationship_ids": rows[child]["relationship_ids"]}
            for child in children]


class _ContextSchedule:
    """When each original community's context is called in the driver's first report stage (its items,
    follow-ups and feed). A community's own context is built once every summary its elements await has
    come (the summaries' feed, where they run beside the reports; each patches its element's description,
    so the context is the one the summarized tables give). One that overflows and has sub-communities
    (``waits``) is built again with their reports substituted, and called, once the report of every
    sub-community (a copy's: its origin's) is answered; one whose sub-community failed is left to the level
    loop (the failed one's extractive stand-in is written there). ``first``: community -> its own context;
    ``built``: community -> its context with sub-reports."""

    def __init__(self, rows: dict[int, dict], origins: dict[int, int], originals: list[int], max_input: int,
                 max_findings: int, awaited: set[str]):
        self._rows, self._origins, self._max_input, self._max_findings = rows, origins, max_input, max_findings
        self._originals = originals
        self._community_of = {row["id"]: c for c, row in rows.items()}
        # The element dicts are shared by every context row that holds them: one patch serves them all.
        self._element_of = {element["id"]: element for row in rows.values()
                            for element in row["entities"] + row["relationships"]}
        self._awaiting: dict[str, list[int]] = {}  # element id -> the communities whose context waits for its summary
        self._missing: dict[int, int] = {}
        for community in originals:
            for element in rows[community]["entities"] + rows[community]["relationships"]:
                if element["id"] in awaited:
                    self._awaiting.setdefault(element["id"], []).append(community)
                    self._missing[community] = self._missing.get(community, 0) + 1
        self.awaited_contexts = len(self._missing)
        self.first: dict[int, dict] = {}
        self.waits: set[int] = set()
        self._needs: dict[int, set[int]] = {}
        self._needed_by: dict[int, list[int]] = {}
        self._answered: dict[int, str] = {}  # community -> its report JSON (answered, not failed)
        self.built: dict[int, dict] = {}

    def start(self) -> list[dict]:
        """The contexts ready now; the reports that contexts waiting for sub-reports need go first (their
        answers return early in the stage)."""
        ready = [context for c in self._originals if not self._missing.get(c) for context in self._own(c)]
        needed = set(self._needed_by) - self.waits
        return sorted(ready, key=lambda context: self._community_of[context["id"]] not in needed)

    def summarized(self, events: list[tuple[str, str | None]]) -> list[tuple[str, str]]:
        """The feed's ``events`` (element id, its summary; None: the call failed, the description stays):
        the contexts they make ready."""
        made = []
        for element_id, summary in events:
            communities = self._awaiting.pop(element_id, ())  # none: published twice, or in no community
            if communities and summary is not None:
                self._element_of[element_id]["description"] = summary
            for community in communities:
                self._missing[community] -= 1
                if not self._missing[community]:
                    made += self._own(community)
        return _items(made)

    def check_complete(self) -> None:
        if self._awaiting:
            raise RuntimeError(f"internal error: {len(self._awaiting)} summaries awaited by report contexts never came")

    def _own(self, community: int) -> list[dict]:
        """The community's own context, to call; none where it waits for its sub-reports (built once they are)."""
        self.first[community] = context = build_context(self._rows[community], self._max_input)
        if not (context["truncated"] and self._rows[community]["children"]):
            return [context]
        self.waits.add(community)
        self._needs[community] = {self._origins.get(child, child) for child in self._rows[community]["children"]}
        for need in self._needs[community]:
            self._needed_by.setdefault(need, []).append(community)
        return self._with_sub_reports(community)

    def _with_sub_reports(self, community: int) -> list[dict]:
        if community in self.built or not self._needs[community] <= self._answered.keys():
            return []
        row = {**self._rows[community],
               "sub_reports": _sub_reports(self._rows, self._rows[community]["children"], self._report_of)}
        self.built[community] = context = build_context(row, self._max_input)
        return [context]

    def _report_of(self, community: int) -> dict:
        origin = self._origins.get(community, community)
        report = final_report({**self._rows[origin], "result": self._answered[origin]}, self._max_findings)
        return report if origin == community else _carried_report(self._rows[community], report)

    def answered(self, item_id: str, result: str | None, error: str | None) -> list[tuple[str, str]]:
        """The stage's follow-ups: the waiting contexts a report's answer completes."""
        if result is None:
            return []
        answered = self._community_of[item_id]
        self._answered[answered] = result
        return _items([context for community in self._needed_by.get(answered, ())
                       for context in self._with_sub_reports(community)])


def _items(contexts: list[dict]) -> list[tuple[str, str]]:
    """Built contexts as a report stage's items: (community id, context text)."""
    return [(context["id"], context["context"]) for context in contexts]


def _records(df: DataFrame) -> list[dict]:
    return [row.asDict(recursive=True) for row in df.collect()]


def _driver_answers(spark, store, cfg, run_id: str, contexts: list[dict], follow_up=None, feed: Feed | None = None,
                    feed_items=None) -> tuple[dict, object]:
    """One LLM stage over contexts built on the driver: their answers by community id (None: failed), the
    follow-ups' and the feed's (``_report_stage``) too."""
    built = T.local_frame(spark, _items(contexts), "id string, context string")
    outcome, usage = _report_stage(spark, store, cfg, built, run_id, follow_up, feed, feed_items)
    return {row["id"]: row["result"] for row in outcome.collect()}, usage


def _reports_in_spark(spark, store, cfg, run_id: str, claims: DataFrame | None, read: Callable[[str], DataFrame],
                      shape: pd.DataFrame, origins: dict[int, int]):
    """``build_llm_reports`` in Spark jobs, level by level (any graph size); writes and returns as ``_reports_on_driver``
    (no context waits for summaries here: 0)."""
    entities, relationships, all_communities = read(T.ENTITIES), read(T.RELATIONSHIPS), read(T.COMMUNITIES)
    copies = spark.createDataFrame(pd.DataFrame({"community": list(origins), "origin": list(origins.values())},
                                                dtype="int64"), "community long, origin long")
    originals = all_communities.join(copies.select("community"), "community", "left_anti")
    max_input, max_findings = cfg.reports.max_input_tokens, cfg.reports.max_findings

    # Every original's elements, built once: its report context and, should its call fail, its
    # extractive stand-in are written from them. Contexts without sub-reports, all levels in one job;
    # those that fit (or have nothing to substitute) are final, and all of them are called in one stage.
    n_originals = len(shape) - len(origins)
    elements = community_contexts(originals, entities, relationships, None, claims).persist()
    first = store.checkpoint(report_contexts(elements, max_input), "report_contexts", expected_rows=n_originals)
    waits = F.col("truncated") & (F.size("children") > 0)
    first = first.join(originals.select("id", "children"), "id")
    usages = []
    answers, usage = _report_stage(spark, store, cfg, first.where(~waits), run_id)
    usages.append(usage)
    answers = store.checkpoint(answers, "report_answers", expected_rows=n_originals)
    # Per community: whether it waits for its sub-reports, or needs them for its stand-in (a failed
    # call with sub-communities: the stand-in names them). Only those are built level by level.
    status = (first.join(answers.select("id", F.col("result").isNull().alias("failed")), "id", "left")
              .select("id", "level", waits.alias("waits"), (~waits & F.col("truncated")).alias("trimmed"),
                      (F.coalesce("failed", F.lit(False)) & (F.size("children") > 0)).alias("restated"))
              .toPandas())
    trimmed = int(status["trimmed"].sum())
    later = status[status["waits"] | status["restated"]]

    def reports_of(answered: DataFrame) -> DataFrame:
        return generate_level_reports(answered.select("id", "community", "level", "entities", "relationships",
                                                      "sub_reports", "result"), lambda row: final_report(row, max_findings))

    final = elements.join(answers, "id")
    if not later.empty:
        final = final.join(spark.createDataFrame(later[["id"]], "id string"), "id", "left_anti")
    written = [reports_of(final).persist()]
    child_columns = [F.col(name).alias(f"child_{name}") for name in REPORT_COLUMNS if name not in ("community", "level")]

    def carried(level_filter) -> DataFrame:
        """The copies' reports (at the levels ``level_filter`` keeps): their origins' reports, finished by then."""
        targets = copies.join(all_communities.where(level_filter).select("community", "id", "level"), "community")
        origin_reports = reduce(DataFrame.unionByName, written).select(F.col("community").alias("origin"), *child_columns)
        return generate_level_reports(targets.join(origin_reports, "origin"), reused_report)

    substituted = {}
    for level in sorted({int(v) for v in later["level"]}, reverse=True):
        finer_filter = F.col("level") == level + 1
        finer = reduce(DataFrame.unionByName, written).where(finer_filter).unionByName(carried(finer_filter))
        level_ids = spark.createDataFrame(later[later["level"] == level][["id", "waits"]], "id string, waits boolean")
        contexts = with_sub_reports(elements.join(level_ids.select("id"), "id", "left_semi"), finer,
                                    all_communities.where(finer_filter))
        # The stand-ins of failed calls: no new call, their sub-communities' reports are finished now.
        level_answers = answers.join(level_ids.where(~F.col("waits")).select("id"), "id", "left_semi")
        if later[later["level"] == level]["waits"].any():
            # Overflowing communities with sub-communities: the finer reports are finished now.
            built = store.checkpoint(report_contexts(contexts.join(level_ids.where("waits").select("id"), "id",
                                                                   "left_semi"), max_input),
                                     f"report_contexts_{level}")
            late, usage = _report_stage(spark, store, cfg, built, run_id)
            usages.append(usage)
            level_counts = built.agg(F.count(F.when(F.size("substituted") > 0, 1)).alias("substituted"),
                                     F.count(F.when(F.col("truncated"), 1)).alias("trimmed")).first()
            substituted[level] = level_counts["substituted"]
            trimmed += level_counts["trimmed"]
            level_answers = level_answers.unionByName(late)
        written.append(store.checkpoint(reports_of(contexts.join(level_answers, "id")), f"reports_{level}"))
    _write_reports(store, reduce(DataFrame.unionByName, written).unionByName(carried(F.lit(True))), len(shape))
    for frame in (elements, written[0]):
        frame.unpersist()
    return substituted, trimmed, usages, 0


def _write_reports(store, reports: DataFrame, n_communities: int) -> None:
    written_rows = store.write(reports, T.COMMUNITY_REPORTS)
    if written_rows != n_communities:  # one report per community: what the run summary's per-level counts assume
        raise RuntimeError(f"internal error: {written_rows} community reports written for {n_communities} communities")
