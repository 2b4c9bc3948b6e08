"""A local OpenAI-compatible server that answers every prompt of the project, deterministically.

No generative model can be downloaded offline, so tests, the benchmark and the offline
demo talk to this server through the real ``openai`` client over real HTTP. It serves
``POST /v1/chat/completions`` and ``POST /v1/embeddings`` (also under Azure's
``/openai/deployments/<name>/...`` paths), ``GET /stats`` and ``POST /reset``.

**How a prompt is recognised.** Each prompt file in ``prompts/`` contains one sentence
that no other prompt contains (``MARKERS`` below; ``tests/test_llm_server.py`` checks
the files against it). The kind is the first marker found in the last message, else in
the earlier messages from last to first, so a gleaning turn is recognised by its own
message while still seeing the chunk text earlier in the conversation. A prompt sent as a
system message (instructions) and a user message (data) is read as one text, and document
text is taken out of its ``<document>`` fence.

**How it answers** (all derived from the input text, so an index built through it is
meaningful): extraction returns capitalised phrases as entities (type picked by a hash
among the prompt's entity types, the first sentence mentioning them as description) and
relationships between entities of the same sentence. About a quarter of the entities
are held back from the first answer: the gleaning check answers Y while they are
missing and the continuation returns them, so gleanings measurably add recall. Claims:
one per related pair. Community reports: JSON built from the context tables with
``[Data: ...]`` references to their ids. Global map: one point per context row whose
words overlap the question, scored by that overlap (0 points = "cannot answer"),
citing the row ids. Reduce: markdown keeping the citations. Evaluation prompts (questions,
pairwise judge, claims): see their section below. Other prompts: extractive summaries. Embeddings: unit vectors of signed hashed character trigrams, so similar
texts get similar vectors.

With ``echo_auth`` every completion and embeddings request is answered 401 with its ``Authorization`` header quoted in
the error message, so tests can check that no log, table or error repeats the key.

**Faults and limits** are decided per request from a hash of (seed, request body, how
many times that body was seen), so runs are reproducible whatever the thread
scheduling, and a retried request gets a fresh draw.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import hashlib
import io
import json
import logging
import math
import os
import re
import socket
import struct
import threading
import time
import zlib
from collections import Counter, deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

from graphrag_spark.tokens import count_tokens, get_encoding

log = logging.getLogger(__name__)

MARKERS: dict[str, str] = {
    "gleaning_loop_check": "Answer with the single letter Y or N",
    "gleaning_continue": "MANY entities were missed in the last extraction",
    "entity_extraction": "turn it into knowledge-graph records",
    "claims_extraction": "list the claims it makes about the entities of interest",
    "summarize_descriptions": "Merge the descriptions below",
    "community_report": "write a report about the community",
    "global_map": "You are one of several analysts answering a question",
    "global_reduce": "Several analysts each answered the user's question",
    "basic_search": "using only the text passages in the data tables below",
    "local_search": "Answer the question about specific entities",
    "raptor_summary": "Write a summary of the following, including as many key details as possible",
    "tune_domain": "Name the domain these documents come from",
    "tune_persona": "Describe the expert best placed to analyse",
    "tune_entity_types": "List the kinds of entities worth extracting",
    "eval_corpus_summary": "Describe the dataset these excerpts come from",
    "eval_personas": "describe the potential users of this dataset",
    "eval_tasks": "list the tasks this user would use the dataset for",
    "eval_questions": "write high-level questions that need an understanding of the entire dataset",
    "eval_judge": "decide which of the two answers is better by the measure below",
    "eval_claim_selection": "Pick the sentences that state at least one verifiable fact",
    "eval_claim_decomposition": "Rewrite the sentences below as simple, standalone factual claims",
}

# The same kinds as microsoft/graphrag words them (its default prompts), so that its indexer can run
# against this server in the side-by-side benchmark (benchmarks/bench_vs_graphrag.py). Checked
# after MARKERS; its answers use the same tuple format and delimiters as ours.
GRAPHRAG_MARKERS: dict[str, str] = {
    "gleaning_loop_check": "Please answer with a single letter Y or N",
    "gleaning_continue": "MANY entities and relationships were missed in the last extraction",
    "entity_extraction": "identify all entities of those types from the text and all relationships",
    "summarize_descriptions": "generating a comprehensive summary of the data provided below",
    "community_report": "Write a comprehensive report of a community",
}

EMBEDDING_DIM = 384
_SUMMARY_WORDS = 120
_MAX_PAIRS_PER_SENTENCE = 6
_STOPWORDS = set(
    """a an and are as at be but by for from had has have he her his how i if in into is it its of on or our she
    so than that the their them then there these they this those to was we were what when where which while who
    why will with would you your not no yes do does did can could should may might about after before over under
    also all any each many more most other some such only own same too very just here however""".split()
)
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'-]*")
_PHRASE = re.compile(r"[A-Z][A-Za-z0-9&'-]*(?:[ ]+[A-Z][A-Za-z0-9&'-]*)*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_TABLE_HEADER = re.compile(r"^-{3,}\s*([A-Za-z][A-Za-z ]*?)\s*-{3,}\s*$", re.MULTILINE)
_YEAR = re.compile(r"\b(1[89]\d\d|20\d\d)\b")


# ---------------------------------------------------------------- text helpers


def classify(messages: list[dict]) -> str:
    """The prompt kind of a conversation, by the markers of ``prompts/`` (see module docstring)."""
    for message in reversed(messages):
        content = _content(message)
        for markers in (MARKERS, GRAPHRAG_MARKERS):
            for kind, marker in markers.items():
                if marker in content:
                    return kind
    return "unknown"


def _content(message: dict) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # multi-part content: keep the text parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content


def _between(text: str, start: str, end: str) -> str:
    """The text after the last ``start`` up to the next ``end``: the real data follows any few-shot examples."""
    at = text.rfind(start)
    if at < 0:
        return ""
    at += len(start)
    stop = text.find(end, at)
    return text[at : stop if stop >= 0 else len(text)].strip()


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text) if len(w) > 2 and w.lower() not in _STOPWORDS}


def _flat(text: str) -> str:
    """One line without the record delimiters, safe inside a tuple field."""
    return " ".join(text.replace("<|>", " ").replace("##", " ").replace("(", "[").replace(")", "]").split())


def _hash_int(*parts: object) -> int:
    return zlib.crc32("\x1f".join(map(str, parts)).encode("utf-8"))


def _summary(text: str, max_words: int = _SUMMARY_WORDS) -> str:
    """Extractive summary: the leading sentences, up to ``max_words`` words."""
    kept: list[str] = []
    used = 0
    for sentence in _sentences(text):
        n = len(sentence.split())
        if kept and used + n > max_words:
            break
        kept.append(sentence)
        used += n
    return " ".join(kept)


def _refs(**tables: list[str]) -> str:
    """``[Data: Entities (1, 2), Relationships (3, 4, 5, 6, 7, +more)]``: at most five ids per table."""
    parts = []
    for name, ids in tables.items():
        ids = list(dict.fromkeys(i for i in ids if i != ""))
        if ids:
            shown = ", ".join(ids[:5]) + (", +more" if len(ids) > 5 else "")
            parts.append(f"{name} ({shown})")
    return f"[Data: {', '.join(parts)}]" if parts else ""


def parse_tables(text: str) -> dict[str, list[dict[str, str]]]:
    """The ``-----Name-----`` + CSV tables of a context; a context without tables is one table of its paragraphs."""
    pieces = _TABLE_HEADER.split(text)
    if len(pieces) == 1:
        paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]
        return {"Sources": [{"id": str(i), "text": p} for i, p in enumerate(paragraphs)]} if paragraphs else {}
    tables = {}
    for name, body in zip(pieces[1::2], pieces[2::2]):
        rows = list(csv.DictReader(io.StringIO(body.strip()), skipinitialspace=True))
        tables[name.strip()] = [{k.strip(): (v or "").strip() for k, v in row.items() if k} for row in rows]
    return tables


def _row_id(row: dict[str, str], index: int) -> str:
    return row.get("id") or row.get("short_id") or row.get("human_readable_id") or str(index)


def _row_text(row: dict[str, str]) -> str:
    """A row's text columns as sentences (a title becomes its own sentence)."""
    values = [v for k, v in row.items() if k not in ("id", "short_id", "human_readable_id", "combined_degree", "rank") and v]
    return " ".join(v if v[-1] in ".!?" else f"{v}." for v in values)


# ---------------------------------------------------------------- deterministic answers


@dataclass(frozen=True)
class _Graph:
    entities: dict[str, tuple[str, str]]  # name -> (type, description)
    pairs: dict[tuple[str, str], tuple[str, int]]  # (a, b) -> (first shared sentence, count)
    held_back: frozenset[str]  # entities only the gleaning returns


def _extract_graph(text: str, types: list[str]) -> _Graph:
    sentences = _sentences(text)
    occurrences: dict[str, list[tuple[int, bool]]] = {}
    per_sentence: list[list[str]] = []
    for index, sentence in enumerate(sentences):
        names = []
        for match in _PHRASE.finditer(sentence):
            words = match.group().replace("'s", "").split()
            while words and words[0].lower() in _STOPWORDS:
                words = words[1:]
            if not words or all(w.lower() in _STOPWORDS for w in words):
                continue
            name = " ".join(words).upper()
            initial = match.start() == 0 and len(words) == 1 and not any(c.isupper() for c in words[0][1:])
            occurrences.setdefault(name, []).append((index, initial))
            names.append(name)
        per_sentence.append(list(dict.fromkeys(names)))
    # A lone capitalised word seen once, at a sentence start, is an ordinary word ("Smaller"), unless
    # its inner capitals mark a name ("NeoChip").
    kept = {name for name, occ in occurrences.items() if not (len(occ) == 1 and occ[0][1])}
    types = [t.strip().upper() for t in types if t.strip()] or ["ENTITY"]
    entities = {
        name: (types[_hash_int("type", name) % len(types)], _flat(sentences[occurrences[name][0][0]]))
        for name in occurrences
        if name in kept
    }
    pairs: dict[tuple[str, str], tuple[str, int]] = {}
    for index, names in enumerate(per_sentence):
        names = [n for n in names if n in kept][:_MAX_PAIRS_PER_SENTENCE]
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                sentence, count = pairs.get((a, b), (_flat(sentences[index]), 0))
                pairs[(a, b)] = (sentence, count + 1)
    held_back = frozenset(n for n in entities if _hash_int("held", n) % 4 == 3) if len(entities) > 1 else frozenset()
    return _Graph(entities, pairs, held_back)


def _extraction_records(graph: _Graph, gleaning: bool) -> str:
    wanted = graph.held_back if gleaning else set(graph.entities) - graph.held_back
    records = [
        f'("entity"<|>{name}<|>{etype}<|>{description})'
        for name, (etype, description) in graph.entities.items()
        if name in wanted
    ]
    for (a, b), (sentence, count) in graph.pairs.items():
        touches_held = a in graph.held_back or b in graph.held_back
        if touches_held == gleaning:
            records.append(f'("relationship"<|>{a}<|>{b}<|>{sentence}<|>{min(10, count + 4)})')
    return "\n##\n".join(records) + ("\n" if records else "") + "<|COMPLETE|>"


def _document(prompt: str) -> str:
    """The text between ``Text:`` and ``-End of text-``, out of its ``<document>`` fence."""
    text = _between(prompt, "Text:\n", "\n-End of text-")
    return re.sub(r"^<document>\n?|\n?</document>$", "", text.strip())


def _with_system(messages: list[dict], index: int) -> str:
    """Message ``index`` with the system messages before it: the whole prompt of a system + user turn."""
    return "\n".join([_content(m) for m in messages[:index] if m.get("role") == "system"] + [_content(messages[index])])


def _conversation_graph(messages: list[dict]) -> tuple[_Graph, int]:
    """The extraction graph of the chunk in this conversation, and how many gleanings were already asked for."""
    markers = (MARKERS["entity_extraction"], GRAPHRAG_MARKERS["entity_extraction"])
    at = next((i for i, m in enumerate(messages) if any(k in _content(m) for k in markers)), None)
    if at is not None and messages[at].get("role") == "system" and at + 1 < len(messages):
        at += 1  # the instructions are the system message; the chunk is in the user message after it
    first = _with_system(messages, at) if at is not None else ""
    if GRAPHRAG_MARKERS["entity_extraction"] in first:  # graphrag: "Entity_types: ..." then "Text: <chunk>" then "Output:"
        real = first[first.rfind("-Real Data-") :]
        types = _between(real, "Entity_types:", "\n").split(",")
        text = _between(real, "Text:", "\n######################\nOutput:")
    else:
        real = first[first.rfind("-Real data-") :]
        types = _between(real, "Entity types:", "\n").split(",")
        text = _document(real)
    graph = _extract_graph(text, types)
    continues = (MARKERS["gleaning_continue"], GRAPHRAG_MARKERS["gleaning_continue"])
    gleanings = sum(1 for m in messages if m.get("role") == "user" and any(k in _content(m) for k in continues))
    return graph, gleanings


def _claims(prompt: str) -> str:
    graph = _extract_graph(_document(prompt), ["ENTITY"])
    records = []
    for (a, b), (sentence, _) in graph.pairs.items():
        year = _YEAR.search(sentence)
        start, end = (f"{year.group()}-01-01", f"{year.group()}-12-31") if year else ("NONE", "NONE")
        records.append(
            f'("claim"<|>{a}<|>{b}<|>ASSOCIATION<|>TRUE<|>{start}<|>{end}<|>{a} is linked to {b}: {sentence}<|>{sentence})'
        )
    return "\n##\n".join(records) + ("\n" if records else "") + "<|COMPLETE|>"


def _summarize_descriptions(prompt: str) -> str:
    if GRAPHRAG_MARKERS["summarize_descriptions"] in prompt:  # graphrag: a JSON list of descriptions
        limit = re.search(r"length to (\d+) words", prompt)
        listed = _between(prompt, "Description List:", "\n#######")
        try:
            descriptions = [str(d) for d in json.loads(listed)]
        except json.JSONDecodeError:
            descriptions = [listed]
        sentences = dict.fromkeys(s for d in descriptions for s in _sentences(d))
        return _summary(" ".join(sentences), int(limit.group(1)) if limit else _SUMMARY_WORDS)
    max_words = int(re.search(r"at most (\d+) words", prompt).group(1)) if "at most" in prompt else _SUMMARY_WORDS
    lines = _between(prompt, "Descriptions:\n", "\n-End of data-").splitlines()
    sentences = dict.fromkeys(s for line in lines for s in _sentences(line.lstrip("- ")))
    return _summary(" ".join(sentences), max_words)


def _community_report(prompt: str) -> str:
    if GRAPHRAG_MARKERS["community_report"] in prompt:  # graphrag: its tables after the last "Text:"
        data = _between(prompt[prompt.rfind("# Real Data"):], "Text:\n", "\nThe report should include")
        tables = {name.capitalize(): rows for name, rows in parse_tables(data).items()}
        for row in tables.get("Entities", []):
            row.setdefault("entity", row.get("title", ""))
    else:
        tables = parse_tables(_between(prompt, "-Real data-\n", "\n-End of data-"))
    entities, relationships = tables.get("Entities", []), tables.get("Relationships", [])
    claims, reports = tables.get("Claims", []), tables.get("Reports", [])
    entity_ids = {row.get("entity", ""): _row_id(row, i) for i, row in enumerate(entities)}
    names = [row.get("entity", "") for row in entities[:3]] or [row.get("title", "") for row in reports[:2]]
    title = " and ".join(n for n in names if n) or "Empty community"
    findings = []
    if entities:
        findings.append(
            {
                "summary": f"{len(entities)} entities, led by {names[0]}",
                "explanation": f"{_summary(entities[0].get('description', ''), 60)} "
                + _refs(Entities=[_row_id(r, i) for i, r in enumerate(entities)]),
            }
        )
    for i, row in enumerate(relationships[:4]):
        source, target = row.get("source", ""), row.get("target", "")
        findings.append(
            {
                "summary": f"{source} and {target}",
                "explanation": f"{_summary(row.get('description', ''), 60)} "
                + _refs(
                    Entities=[entity_ids.get(source, ""), entity_ids.get(target, "")], Relationships=[_row_id(row, i)]
                ),
            }
        )
    for i, row in enumerate(claims[:2]):
        findings.append(
            {
                "summary": f"Claim about {row.get('entity') or row.get('subject', '')}: {row.get('type', '')}",
                "explanation": f"{_summary(row.get('description', ''), 60)} " + _refs(Claims=[_row_id(row, i)]),
            }
        )
    for i, row in enumerate(reports[:3]):
        findings.append(
            {
                "summary": row.get("title", "Sub-community"),
                "explanation": f"{_summary(_row_text(row), 60)} " + _refs(Reports=[_row_id(row, i)]),
            }
        )
    size = len(entities) + 2 * len(relationships) + len(claims) + 3 * len(reports)
    rating = round(min(10.0, size / 3), 1)
    report = {
        "title": title,
        "summary": f"The community of {title} has {len(entities)} entities, {len(relationships)} relationships, "
        f"{len(claims)} claims and {len(reports)} sub-community reports. "
        + _refs(
            Entities=[_row_id(r, i) for i, r in enumerate(entities)],
            Reports=[_row_id(r, i) for i, r in enumerate(reports)],
        ),
        "rating": rating,
        "rating_explanation": f"Rated {rating}: the rating grows with the community's size ({size} weighted elements).",
        "findings": findings or [{"summary": "No data", "explanation": "The community data is empty."}],
    }
    return json.dumps(report, indent=2)


def _scored_rows(question: str, context: str) -> list[tuple[int, str, str, str]]:
    """(score, table, id, best sentence) per context row sharing words with the question, best first."""
    wanted = _words(question)
    scored = []
    for table, rows in parse_tables(context).items():
        for i, row in enumerate(rows):
            text = _row_text(row)
            overlap = len(wanted & _words(text))
            if overlap and wanted:
                best = max(_sentences(text), key=lambda s: (len(wanted & _words(s)), -len(s)))
                scored.append((round(100 * overlap / len(wanted)), table, _row_id(row, i), best))
    return sorted(scored, key=lambda r: (-r[0], r[1], r[2]))


def _global_map(prompt: str) -> str:
    question = _between(prompt, "-Question-\n", "\n-End of question-")
    rows = _scored_rows(question, _between(prompt, "-Data tables-\n", "\n-End of data-"))[:10]
    points = [
        {"description": f"{sentence} {_refs(**{table: [rid]})}", "score": score} for score, table, rid, sentence in rows
    ]
    return json.dumps(
        {"points": points or [{"description": "The data tables do not help answer this question.", "score": 0}]}
    )


def _global_reduce(prompt: str) -> str:
    question = _between(prompt, "-Question-\n", "\n-End of question-")
    data = _between(prompt, "-Analyst points-\n", "\n-End of points-")
    points = [
        line.strip()
        for line in data.splitlines()
        if line.strip()
        and not line.strip().startswith("---")
        and not line.lower().startswith(("importance score", "analyst"))
    ]
    if not points:
        return "I do not know: the available data does not answer this question."
    return f"## {question}\n\n" + "\n".join(f"- {p}" for p in points[:10])


def _search_answer(prompt: str) -> str:
    question = _between(prompt, "-Question-\n", "\n-End of question-")
    rows = _scored_rows(question, _between(prompt, "-Data tables-\n", "\n-End of data-"))[:3]
    if not rows:
        return "I do not know: the data provided does not answer this question."
    return f"## {question}\n\n" + "\n".join(
        f"- {sentence} {_refs(**{table: [rid]})}" for _, table, rid, sentence in rows
    )


def _top_words(text: str, n: int) -> list[str]:
    counts = Counter(w.lower() for w in _WORD.findall(text) if w.lower() not in _STOPWORDS and len(w) > 3)
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def _tune_domain(prompt: str) -> str:
    words = _top_words(_between(prompt, "-Passages-", "-End of passages-"), 3) or ["general"]
    return f"documents about {', '.join(words)}"


def _tune_persona(prompt: str) -> str:
    domain = _between(prompt, "knowledge graph: ", "\n").strip() or "these documents"
    return (f"You are an expert analyst of {domain}, skilled at finding the people, organisations, places and "
            f"events they involve and how these are connected.")


def _tune_entity_types(prompt: str) -> str:
    """The usual kinds, plus the passages' most frequent word as a domain-specific one."""
    extra = _top_words(_between(prompt, "-Passages-", "-End of passages-"), 1)
    return ", ".join(["person", "organization", "location", "event", *extra])


_TUNE_ANSWERS = {"tune_domain": _tune_domain, "tune_persona": _tune_persona, "tune_entity_types": _tune_entity_types}
# ---------------------------------------------------------------- evaluation prompts
#
# Question generation draws personas, tasks and questions from templates filled with the names the
# corpus description mentions. The judge scores each answer on a criterion's proxy (distinct content
# words, distinct cited ids, data references, brevity for directness); on a tie of the proxy it says
# tie, except that for two identical answers it prefers Answer 1, the position bias real judges show,
# which the two presentation orders must cancel. Claims: sentences of five or more words are
# selected, and split at "; " and " and " into claims.

_ROLES = ("Journalist", "Policy analyst", "Researcher", "Educator", "Community organiser", "Investor", "Historian",
          "Regulator")
_TASKS = ("Track how {t} developed over time", "Compare the positions of the main actors on {t}",
          "Explain the causes and consequences of {t}", "Brief newcomers on the key themes around {t}",
          "Assess the risks and opportunities linked to {t}", "Map the groups involved with {t} and their interests")
_QUESTIONS = ("What are the main themes connecting {a} and {b}?",
              "How do different groups view {a}, and how do their views compare with those on {b}?",
              "What patterns emerge in how {a} affects {b} across the documents?",
              "Which developments around {a} matter most for {b}, and why?",
              "How has the debate about {a} evolved, and what role does {b} play in it?",
              "What common causes lie behind {a} and {b}?",
              "What would someone misunderstand about {a} without knowing about {b}?",
              "Where do the documents agree and disagree about {a} and {b}?",
              "What tensions between {a} and {b} run through the dataset?",
              "How are responsibilities divided between {a} and {b}, and where are the gaps?",
              "What long-term trends link {a} to {b}?",
              "Which risks does {a} pose for {b}, and how are they addressed?",
              "What lessons does the story of {a} hold for {b}?",
              "How does the public picture of {a} differ from that of {b}?")
_DATA_IDS = re.compile(r"\[Data:([^\[\]]*)\]")


def _topics(text: str) -> list[str]:
    """Names the text mentions, most frequent first (content words when it names nothing)."""
    names = Counter()
    for match in _PHRASE.finditer(text):
        words = [w for w in match.group().split() if w.lower() not in _STOPWORDS]
        if words and not (len(words) == 1 and len(words[0]) < 4):
            names[" ".join(words)] += 1
    return [name for name, _ in names.most_common()] or sorted(_words(text)) or ["the dataset"]


def _wanted(prompt: str) -> int:
    match = re.search(r"exactly (\d+)", prompt)
    return int(match.group(1)) if match else 5


def _eval_corpus_summary(prompt: str) -> str:
    excerpts = _between(prompt, "-Excerpts-\n", "\n-End of excerpts-")
    return f"A collection of documents about {', '.join(_topics(excerpts)[:8])}. {_summary(excerpts, 60)}"


def _eval_personas(prompt: str) -> str:
    topics = _topics(_between(prompt, "-Dataset description-\n", "\n-End of description-"))
    personas = [{"name": f"{_ROLES[k % len(_ROLES)]} following {topics[k % len(topics)]}",
                 "description": f"Wants to understand the role of {topics[k % len(topics)]} across the dataset."}
                for k in range(_wanted(prompt))]
    return json.dumps({"personas": personas})


def _eval_tasks(prompt: str) -> str:
    persona = _between(prompt, "-User-\n", "\n-End of user-")
    topics = _topics(persona + "\n" + _between(prompt, "-Dataset description-\n", "\n-End of description-"))
    start = _hash_int("tasks", persona)
    return json.dumps({"tasks": [_TASKS[(start + n) % len(_TASKS)].format(t=topics[n % len(topics)])
                                 for n in range(_wanted(prompt))]})


def _eval_questions(prompt: str) -> str:
    task = _between(prompt, "-Task-\n", "\n-End of task-")
    topics = _topics(_between(prompt, "-Dataset description-\n", "\n-End of description-"))
    persona = _between(prompt, "-User-\n", "\n-End of user-")
    focus = max((t for t in topics if t in task), key=len, default=topics[0])  # the task's own subject
    others = [t for t in topics if t != focus] or topics
    start = _hash_int("questions", persona, task)
    return json.dumps({"questions": [
        _QUESTIONS[(start + m) % len(_QUESTIONS)].format(a=focus, b=others[_hash_int(start, m) % len(others)])
        for m in range(_wanted(prompt))]})


def _judge_proxy(criterion: str, text: str) -> tuple[int, ...]:
    cited = {i.strip() for block in _DATA_IDS.findall(text) for i in re.findall(r"\d+", block)}
    if criterion == "directness":
        return (-len(text.split()),)
    if criterion == "diversity":
        return len(cited), len(set(_sentences(text)))
    if criterion == "empowerment":
        return len(_DATA_IDS.findall(text)), len(cited)
    return (len(_words(text)),)


def _eval_judge(prompt: str) -> str:
    criterion = _between(prompt, "-Measure-\n", ":").lower()
    first = _between(prompt, "-Answer 1-\n", "\n-End of answer 1-")
    second = _between(prompt, "-Answer 2-\n", "\n-End of answer 2-")
    a, b = _judge_proxy(criterion, first), _judge_proxy(criterion, second)
    winner = 1 if first == second or a > b else 2 if b > a else 0
    reasoning = ("Both answers are the same; Answer 1 is preferred." if first == second else
                 f"On {criterion}, Answer 1 scores {a} and Answer 2 scores {b}.")
    return json.dumps({"reasoning": reasoning, "winner": winner})


def _numbered(block: str) -> list[tuple[int, str]]:
    lines = [re.match(r"\s*(\d+)[.)]\s*(.*)", line) for line in block.splitlines()]
    return [(int(m.group(1)), m.group(2).strip()) for m in lines if m]


def _eval_claim_selection(prompt: str) -> str:
    sentences = _numbered(_between(prompt, "-Sentences-\n", "\n-End of sentences-"))
    return json.dumps({"sentences": [n for n, s in sentences if len(s.split()) >= 5 and not s.endswith("?")]})


def _eval_claim_decomposition(prompt: str) -> str:
    claims = []
    for _, sentence in _numbered(_between(prompt, "-Sentences-\n", "\n-End of sentences-")):
        parts = [p.strip(" .;,") for p in re.split(r";\s+|\s+and\s+", sentence)]
        if any(len(p.split()) < 3 for p in parts):
            parts = [sentence.strip(" .")]
        claims.extend(f"{p[0].upper()}{p[1:]}." for p in parts if p)
    return json.dumps({"claims": claims})


_EVALUATION_ANSWERS = {
    "eval_corpus_summary": _eval_corpus_summary,
    "eval_personas": _eval_personas,
    "eval_tasks": _eval_tasks,
    "eval_questions": _eval_questions,
    "eval_judge": _eval_judge,
    "eval_claim_selection": _eval_claim_selection,
    "eval_claim_decomposition": _eval_claim_decomposition,
}


def answer(messages: list[dict]) -> tuple[str, str]:
    """(kind, completion text) for a chat conversation, before length limits and fault injection."""
    kind = classify(messages)
    last = _with_system(messages, len(messages) - 1) if messages else ""
    if kind == "entity_extraction":
        graph, _ = _conversation_graph(messages)
        return kind, _extraction_records(graph, gleaning=False)
    if kind == "gleaning_loop_check":
        graph, gleanings = _conversation_graph(messages)
        return kind, "Y" if graph.held_back and gleanings == 0 else "N"
    if kind == "gleaning_continue":
        graph, gleanings = _conversation_graph(messages)
        return kind, _extraction_records(graph, gleaning=True) if gleanings == 1 else "<|COMPLETE|>"
    if kind == "claims_extraction":
        return kind, _claims(last)
    if kind == "summarize_descriptions":
        return kind, _summarize_descriptions(last)
    if kind == "community_report":
        return kind, _community_report(last)
    if kind == "global_map":
        return kind, _global_map(last)
    if kind == "global_reduce":
        return kind, _global_reduce(last)
    if kind in ("basic_search", "local_search"):
        return kind, _search_answer(last)
    if kind in _TUNE_ANSWERS:
        return kind, _TUNE_ANSWERS[kind](last)
    if kind == "raptor_summary":
        return kind, _summary(last.split(MARKERS["raptor_summary"] + ":", 1)[-1].strip().rstrip(":"))
    if kind in _EVALUATION_ANSWERS:
        return kind, _EVALUATION_ANSWERS[kind](last)
    return kind, _summary(last)


def embed_text(text: str, dim: int = EMBEDDING_DIM) -> list[float]:
    """Unit vector of signed hashed character trigrams: texts sharing many trigrams point the same way."""
    vector = [0.0] * dim
    padded = f" {' '.join(text.lower().split())} "
    for i in range(len(padded) - 2):
        h = zlib.crc32(padded[i : i + 3].encode("utf-8"))
        vector[h % dim] += 1.0 if h & 0x80000000 else -1.0
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0:
        vector[0], norm = 1.0, 1.0
    return [v / norm for v in vector]


# ---------------------------------------------------------------- serving


@dataclass(frozen=True)
class Knobs:
    latency_s: float = 0.0
    latency_jitter_s: float = 0.0
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    window_s: float = 60.0
    limit_per_endpoint: bool = False  # like a provider's per-model limits: chat and embeddings each get the limits
    limit_headers: bool = False  # state the limits and what is left of them on every answer, as OpenAI does
    count_max_tokens: bool = False  # the tokens/min window counts a chat call's max_tokens, as OpenAI and Azure do
    error_rate: float = 0.0
    timeout_rate: float = 0.0
    timeout_mode: str = "drop"
    timeout_sleep_s: float = 30.0
    rate_429: float = 0.0
    retry_after_s: float = 1.0
    malformed_rate: float = 0.0
    echo_auth: bool = False  # answer every request 401 with its Authorization header in the body (secret-leak tests)
    seed: int = 0
    api_key: str | None = None  # when set, every request must carry "Authorization: Bearer <api_key>"


class _State:
    """Counters, limit windows and seeded draws shared by all handler threads."""

    def __init__(self, knobs: Knobs) -> None:
        self.knobs = knobs
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.answering = threading.Event()  # cleared while answers are held back (a stalled provider)
        self.answering.set()
        self.held_kind: tuple[str, int, threading.Event] | None = None  # see ServerHandle.holding_calls_of
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.counters: Counter = Counter()
            self.by_kind: Counter = Counter()
            self.request_hashes: Counter = Counter()
            self.served_hashes: Counter = Counter()
            self.repaid: Counter = Counter()  # per endpoint: answers to a request already answered before
            self.in_progress: dict[int, str] = {}  # client port -> kind, of the requests admitted, not answered
            self.admitted_by_kind: Counter = Counter()
            self.windows: dict[str, deque[tuple[float, int]]] = {}
            self.busiest: Counter = Counter()  # the most requests and tokens one window held (how near a 429)
            self.served_times: list[float] = []
            self.served_intervals: list[tuple[str, float, float]] = []  # (endpoint, admitted, answered) per served call

    def draw(self, *parts: object) -> float:
        digest = hashlib.sha256("\x1f".join(map(str, (self.knobs.seed, *parts))).encode()).hexdigest()
        return int(digest[:13], 16) / 16**13

    def arrive(self, endpoint: str, request_hash: str) -> int:
        with self.lock:
            self.counters[f"requests.{endpoint}"] += 1
            self.request_hashes[request_hash] += 1
            return self.request_hashes[request_hash]

    def count(self, name: str) -> None:
        with self.lock:
            self.counters[name] += 1

    def admit(self, endpoint: str, tokens: int) -> float | None:
        """Charge a request to the sliding window (the endpoint's own with ``limit_per_endpoint``); None if it
        fits, else seconds until it would."""
        k = self.knobs
        max_requests = k.requests_per_minute * k.window_s / 60 if k.requests_per_minute else math.inf
        max_tokens = k.tokens_per_minute * k.window_s / 60 if k.tokens_per_minute else math.inf
        with self.lock:
            window = self.windows.setdefault(endpoint if k.limit_per_endpoint else "all", deque())
            now = time.monotonic()
            while window and window[0][0] <= now - k.window_s:
                window.popleft()
            used = sum(t for _, t in window)
            if window and (len(window) + 1 > max_requests or used + tokens > max_tokens):
                excess_requests = len(window) + 1 - max_requests
                excess_tokens = used + tokens - max_tokens
                for at, spent in window:
                    excess_requests -= 1
                    excess_tokens -= spent
                    if excess_requests <= 0 and excess_tokens <= 0:
                        return max(0.001, at + k.window_s - now)
                return k.window_s
            window.append((now, tokens))
            self.counters["counted_tokens"] += tokens
            self.busiest["requests"] = max(self.busiest["requests"], len(window))
            self.busiest["tokens"] = max(self.busiest["tokens"], used + tokens)
            return None

    def limit_headers(self, endpoint: str) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*`` headers of the endpoint's window: each configured limit (per minute), what
        is left of it in the window and when the window holds all of it again (``limit_headers`` knob)."""
        k = self.knobs
        if not k.limit_headers:
            return {}
        with self.lock:
            window = list(self.windows.get(endpoint if k.limit_per_endpoint else "all", ()))
        now = time.monotonic()
        window = [(at, spent) for at, spent in window if at > now - k.window_s]
        reset = _duration(window[-1][0] + k.window_s - now) if window else "0s"
        headers = {}
        for name, limit, used in (("requests", k.requests_per_minute, len(window)),
                                  ("tokens", k.tokens_per_minute, sum(spent for _, spent in window))):
            if limit:
                headers[f"x-ratelimit-limit-{name}"] = str(round(limit))
                headers[f"x-ratelimit-remaining-{name}"] = str(max(0, math.floor(limit * k.window_s / 60 - used)))
                headers[f"x-ratelimit-reset-{name}"] = reset
        return headers

    def served(self, endpoint: str, kind: str, request_hash: str, prompt_tokens: int, completion_tokens: int,
               admitted_at: float) -> None:
        with self.lock:
            self.served_intervals.append((endpoint, admitted_at, time.monotonic()))
            self.counters[f"served.{endpoint}"] += 1
            self.counters["prompt_tokens"] += prompt_tokens
            self.counters["completion_tokens"] += completion_tokens
            self.by_kind[kind] += 1
            self.served_hashes[request_hash] += 1
            self.repaid[endpoint] += self.served_hashes[request_hash] > 1
            self.served_times.append(time.monotonic())

    def stats(self) -> dict[str, Any]:
        with self.lock:
            c = self.counters
            return {
                "requests": {e: c[f"requests.{e}"] for e in ("chat", "embeddings")},
                "served": {e: c[f"served.{e}"] for e in ("chat", "embeddings")},
                "by_kind": dict(self.by_kind),
                "injected": {name: c[f"injected.{name}"] for name in ("401", "429", "500", "timeout", "malformed")},
                "rate_limited": c["rate_limited"],
                "busiest_window": dict(self.busiest),
                "unauthorized": c["unauthorized"],
                "prompt_tokens": c["prompt_tokens"],
                "completion_tokens": c["completion_tokens"],
                "counted_tokens": c["counted_tokens"],  # what the tokens/min window charged the admitted calls
                "request_hashes": dict(self.request_hashes),
                "served_hashes": dict(self.served_hashes),
                "repaid": {e: self.repaid[e] for e in ("chat", "embeddings")},
                # Sustained rate: served calls per minute between the first and the last answer.
                "served_span_s": (self.served_times[-1] - self.served_times[0]) if len(self.served_times) > 1 else 0.0,
            }


def _duration(seconds: float) -> str:
    """A duration as OpenAI writes its resets: ``850ms``, ``12.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.0f}s" if minutes else f"{rest:.3g}s"


def _request_hash(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send_json(self, status: int, payload: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode("utf-8")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

    def _send_error(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
        self._send_json(status, {"error": {"message": message, "type": kind, "param": None, "code": kind}}, headers)

    def _send_429(self, seconds: float, message: str, endpoint: str) -> None:
        headers = {
            "Retry-After": str(max(1, math.ceil(seconds))),
            "retry-after-ms": str(max(1, math.ceil(seconds * 1000))),
            **self.server.state.limit_headers(endpoint),
        }
        self._send_error(429, "rate_limit_exceeded", message, headers)

    def _authorized(self) -> bool:
        """Like a real endpoint: a missing or wrong key is a 401 that never echoes what was sent."""
        required = self.server.state.knobs.api_key
        if required is None or self.headers.get("Authorization") == f"Bearer {required}":
            return True
        self.server.state.count("unauthorized")
        self._send_error(401, "invalid_api_key", "Incorrect API key provided.")
        return False

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path.endswith("/stats"):
            self._send_json(200, self.server.state.stats())
        elif path.endswith("/models"):
            if self._authorized():
                self._send_json(200, {"object": "list", "data": [{"id": "local", "object": "model", "owned_by": "local"}]})
        else:
            self._send_error(404, "not_found", f"No route {self.path}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0].rstrip("/")
        if path.endswith("/reset"):
            self.server.state.reset()
            self._send_json(200, {"ok": True})
            return
        endpoint = (
            "chat" if path.endswith("/chat/completions") else "embeddings" if path.endswith("/embeddings") else None
        )
        if endpoint is None:
            self._send_error(404, "not_found", f"No route {self.path}")
            return
        if not self._authorized():
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._send_error(400, "invalid_request_error", "Request body is not valid JSON.")
            return
        self._complete(endpoint, body)

    def _complete(self, endpoint: str, body: dict) -> None:
        state, knobs = self.server.state, self.server.state.knobs
        if knobs.echo_auth:  # the worst a provider can do: echo the whole key back in its error
            state.count("injected.401")
            self._send_error(401, "invalid_api_key",
                             f"Incorrect API key provided: {self.headers.get('Authorization', '')}. "
                             "You can find your API key at https://platform.openai.com/account/api-keys.")
            return
        request_hash = _request_hash(body)
        seen = state.arrive(endpoint, request_hash)
        fault = state.draw("fault", request_hash, seen)
        if fault < knobs.timeout_rate:
            state.count("injected.timeout")
            if knobs.timeout_mode == "drop":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            state.stopping.wait(knobs.timeout_sleep_s)
        elif fault < knobs.timeout_rate + knobs.error_rate:
            state.count("injected.500")
            self._send_error(500, "server_error", "Injected server error.")
            return
        elif fault < knobs.timeout_rate + knobs.error_rate + knobs.rate_429:
            state.count("injected.429")
            self._send_429(knobs.retry_after_s, "Injected rate limit.", endpoint)
            return

        if endpoint == "chat":
            kind, payload, prompt_tokens, completion_tokens = self._chat(body, request_hash, seen)
        else:
            kind, payload, prompt_tokens, completion_tokens = self._embeddings(body)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        counted = max_tokens if knobs.count_max_tokens and endpoint == "chat" and max_tokens else completion_tokens
        wait = state.admit(endpoint, prompt_tokens + counted)
        admitted_at = time.monotonic()
        if wait is not None:
            state.count("rate_limited")
            self._send_429(wait, "Rate limit reached for requests or tokens per minute.", endpoint)
            return
        latency = knobs.latency_s + knobs.latency_jitter_s * (2 * state.draw("latency", request_hash, seen) - 1)
        with state.lock:
            state.in_progress[self.client_address[1]] = kind
            held = state.held_kind if state.held_kind and state.held_kind[0] == kind and \
                state.admitted_by_kind[kind] >= state.held_kind[1] else None
            state.admitted_by_kind[kind] += 1
        try:
            if latency > 0:
                state.stopping.wait(latency)
            state.answering.wait()
            if held is not None:
                held[2].wait()
        finally:
            with state.lock:
                state.in_progress.pop(self.client_address[1], None)
        state.served(endpoint, kind, request_hash, prompt_tokens, completion_tokens, admitted_at)
        self._send_json(200, payload, state.limit_headers(endpoint))

    def _chat(self, body: dict, request_hash: str, seen: int) -> tuple[str, dict, int, int]:
        state = self.server.state
        messages = body.get("messages") or []
        kind, text = answer(messages)
        finish_reason = "stop"
        if state.draw("malformed", request_hash, seen) < state.knobs.malformed_rate:
            state.count("injected.malformed")
            if state.draw("malformed-mode", request_hash, seen) < 0.5:
                text, finish_reason = text[: len(text) // 2], "length"
            else:
                text = "I'm sorry, but I can't produce that format right now. " + text[::-1][:80]
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        tokens = get_encoding().encode(text, disallowed_special=())
        if max_tokens and len(tokens) > max_tokens:
            text, tokens, finish_reason = get_encoding().decode(tokens[:max_tokens]), tokens[:max_tokens], "length"
        prompt_tokens = sum(count_tokens(_content(m)) for m in messages)
        payload = {
            "id": f"chatcmpl-{request_hash}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "local"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": finish_reason,
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(tokens),
                "total_tokens": prompt_tokens + len(tokens),
            },
        }
        return kind, payload, prompt_tokens, len(tokens)

    def _embeddings(self, body: dict) -> tuple[str, dict, int, int]:
        inputs = body.get("input", [])
        texts = [inputs] if isinstance(inputs, str) else [str(t) for t in inputs]
        dim = int(body.get("dimensions") or EMBEDDING_DIM)
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(texts):
            vector = embed_text(text, dim)
            encoded = base64.b64encode(struct.pack(f"<{dim}f", *vector)).decode() if as_base64 else vector
            data.append({"object": "embedding", "index": index, "embedding": encoded})
        tokens = sum(count_tokens(t) for t in texts)
        payload = {
            "object": "list",
            "data": data,
            "model": body.get("model", "local"),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        return "embedding", payload, tokens, 0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default backlog of 5 refuses connections under a burst of concurrent clients

    def __init__(self, address: tuple[str, int], knobs: Knobs) -> None:
        super().__init__(address, _Handler)
        self.state = _State(knobs)


@dataclass
class ServerHandle:
    """A running server; ``base_url`` ends with ``/v1`` and goes straight into ``llm.*.api_base``."""

    server: _Server
    thread: threading.Thread

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def stats(self) -> dict[str, Any]:
        return self.server.state.stats()

    def reset(self) -> None:
        self.server.state.reset()

    def served_intervals(self, endpoint: str | None = None) -> list[tuple[float, float]]:
        """(admitted, answered) ``time.monotonic()`` of every served call (of ``endpoint``: chat or embeddings)
        since the last reset (in-process use)."""
        with self.server.state.lock:
            return [(a, b) for e, a, b in self.server.state.served_intervals if endpoint in (None, e)]

    @contextlib.contextmanager
    def holding_answers(self) -> Iterator[None]:
        """Within the block calls are taken but not answered, as by a stalled provider; they are answered
        when it ends."""
        self.server.state.answering.clear()
        try:
            yield
        finally:
            self.server.state.answering.set()

    @contextlib.contextmanager
    def holding_calls_of(self, kind: str, after: int) -> Iterator[None]:
        """Within the block the calls of ``kind`` admitted after its first ``after`` (since the last reset) are
        taken but not answered (in ``requests_in_progress`` meanwhile); they are answered when it ends."""
        release = threading.Event()
        with self.server.state.lock:
            self.server.state.held_kind = (kind, after, release)
        try:
            yield
        finally:
            with self.server.state.lock:
                self.server.state.held_kind = None
            release.set()

    def requests_in_progress(self) -> dict[int, str]:
        """The requests admitted and not answered yet (in their latency, or held): their client's port and their
        kind (what ``stats()["by_kind"]`` counts)."""
        with self.server.state.lock:
            return dict(self.server.state.in_progress)

    def stop(self) -> None:
        self.server.state.stopping.set()
        self.server.state.answering.set()
        held = self.server.state.held_kind
        if held is not None:
            held[2].set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_server(host: str = "127.0.0.1", port: int = 0, **knobs: Any) -> ServerHandle:
    """Start the server in a background thread (port 0 = a free ephemeral port)."""
    get_encoding()  # load the tokenizer before the first request, not inside its latency
    server = _Server((host, port), Knobs(**knobs))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="local-llm-server", daemon=True)
    thread.start()
    return ServerHandle(server, thread)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Local OpenAI-compatible server answering the project's prompts.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port (the URL is printed).")
    parser.add_argument("--latency", type=float, default=0.0, dest="latency_s", help="Mean seconds per answer.")
    parser.add_argument(
        "--latency-jitter", type=float, default=0.0, dest="latency_jitter_s", help="Uniform +- seconds."
    )
    parser.add_argument("--rpm", type=float, default=None, dest="requests_per_minute", help="Requests/min before 429.")
    parser.add_argument("--tpm", type=float, default=None, dest="tokens_per_minute", help="Tokens/min before 429.")
    parser.add_argument(
        "--window", type=float, default=60.0, dest="window_s", help="Sliding window of the limits, seconds."
    )
    parser.add_argument("--limit-headers", action="store_true",
                        help="State the limits on every answer (OpenAI's x-ratelimit-* headers).")
    parser.add_argument("--count-max-tokens", action="store_true",
                        help="The tokens/min window counts a chat call's max_tokens, not its completion (as OpenAI and Azure do).")
    parser.add_argument("--error-rate", type=float, default=0.0, help="Share of requests answered with HTTP 500.")
    parser.add_argument("--timeout-rate", type=float, default=0.0, help="Share of requests that time out.")
    parser.add_argument(
        "--timeout-mode", choices=["drop", "sleep"], default="drop", help="Drop the connection or stall."
    )
    parser.add_argument(
        "--timeout-sleep", type=float, default=30.0, dest="timeout_sleep_s", help="Stall seconds (sleep mode)."
    )
    parser.add_argument("--rate-429", type=float, default=0.0, help="Share of requests answered with an injected 429.")
    parser.add_argument(
        "--retry-after", type=float, default=1.0, dest="retry_after_s", help="Retry-After of injected 429s."
    )
    parser.add_argument("--malformed-rate", type=float, default=0.0, help="Share of answers truncated or garbled.")
    parser.add_argument("--echo-auth", action="store_true", help="Answer 401 echoing the Authorization header.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--api-key-env", default=None,
                        help="Require the key held in this environment variable (a key on the command line would show in ps).")
    args = vars(parser.parse_args(argv))
    key_env = args.pop("api_key_env")
    if key_env:
        args["api_key"] = os.environ[key_env]
    handle = start_server(**args)
    print(handle.base_url, flush=True)
    try:
        handle.thread.join()
    except KeyboardInterrupt:
        handle.stop()


if __name__ == "__main__":
    main()
