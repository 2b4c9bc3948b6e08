"""Offline extraction method ``nlp``: noun phrases + co-occurrence, no LLM (the embedded default).

The heuristic, per text unit:
1. Split into sentences (honorifics such as "Mr." do not end a sentence).
2. **Proper-noun phrases**: maximal runs of capitalised words, which may be joined by
   "of", "the", "de", "von", "van", "la" or "and" only when a capitalised word follows
   ("Bank of England", "Ghost of Christmas Past"). Leading determiners are dropped. A
   run of one word that starts a sentence is kept only if it is not a stop word and it is
   not also seen in lower case in the same text unit (so "Then", "Yet" are not names).
3. **Multi-word noun phrases**: exactly two lower-case content words (no stop words, no
   -ly adverbs) right after a determiner, e.g. "the counting house", "an old clerk": the
   determiner is the cue that a noun phrase starts, which keeps verb phrases such as
   "people ran" out without a POS tagger.
4. **Co-occurrence**: the ``max_phrases_per_chunk`` most frequent phrases of the unit are
   linked pairwise (one relationship instance per unit). The description is the first
   sentence mentioning both, if any.
Corpus-wide pruning of rare phrases (``min_entity_mentions``) happens in the graph stage.
Phrases are typed PROPER_NOUN or NOUN_PHRASE; descriptions are the sentence of first mention.
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import combinations

from graphrag_spark.ids import content_id

METHOD = "nlp"

_HONORIFICS = re.compile(r"\b(Mr|Mrs|Ms|Dr|St|Prof|Sr|Jr|Capt|Col|Gen|Lt|Sgt|Rev)\.", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?;])[\"'”’)\]]*\s+|\n\s*\n")
_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*[A-Za-z]|[A-Za-z]")
_POSSESSIVE = re.compile(r"['’]s$")
_CONNECTORS = {"of", "the", "de", "von", "van", "la", "and", "del", "da"}
_DETERMINERS = {"the", "a", "an", "this", "that", "these", "those", "my", "his", "her", "our", "their", "its", "your"}
STOP_WORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below between
both but by can could did do does doing down during each few for from further had has have having he her here
hers herself him himself his how i if in into is it its itself just me more most my myself no nor not now of off
on once only or other our ours ourselves out over own same she should so some such than that the their theirs them
themselves then there these they this those through to too under until up upon very was we were what when where
which while who whom why will with would you your yours yourself yourselves yet oh ah ay o thou thee thy thine ye
said says say one two three four five six seven eight nine ten first last new old good great little much many
well even still ever never always again indeed perhaps quite rather shall may might must let like yes no not
chapter stave part book section page mr mrs ms dr st himself herself whose whatever however therefore thus
""".split())


def split_sentences(text: str) -> list[str]:
    protected = _HONORIFICS.sub(lambda m: m.group(1), text)
    return [s.strip() for s in _SENTENCE_END.split(protected) if s and s.strip()]


def _is_capitalised(word: str) -> bool:
    return word[0].isupper()


def _proper_noun_runs(words: list[str]) -> list[tuple[int, list[str]]]:
    """(start index, words) for each run of capitalised words with allowed inner connectors."""
    runs, i = [], 0
    while i < len(words):
        if not _is_capitalised(words[i]):
            i += 1
            continue
        start, run = i, [words[i]]
        i += 1
        while i < len(words):
            if _is_capitalised(words[i]):
                run.append(words[i])
                i += 1
            elif words[i].lower() in _CONNECTORS and i + 1 < len(words) and _is_capitalised(words[i + 1]):
                run.extend([words[i], words[i + 1]])
                i += 2
            else:
                break
        runs.append((start, run))
    return runs


def _clean_proper(start: int, run: list[str], lowercase_seen: set[str]) -> str | None:
    while run and run[0].lower() in _DETERMINERS:
        run, start = run[1:], start + 1
    while run and run[-1].lower() in _CONNECTORS:
        run = run[:-1]
    if not run:
        return None
    if len(run) == 1:
        word = run[0]
        if word.lower() in STOP_WORDS or len(word) < 2 or "'" in word or "’" in word:
            return None
        if start == 0 and word.lower() in lowercase_seen:
            return None
    if all(w.lower() in STOP_WORDS for w in run):
        return None
    return " ".join(run)


def _is_content(word: str) -> bool:
    return word.islower() and word not in STOP_WORDS and len(word) > 2 and not word.endswith("ly")


def _noun_phrases(words: list[str]) -> list[str]:
    phrases = []
    for i in range(len(words) - 2):
        if words[i].lower() in _DETERMINERS and _is_content(words[i + 1]) and _is_content(words[i + 2]):
            phrases.append(f"{words[i + 1]} {words[i + 2]}")
    return phrases


def extract_phrases(text: str) -> list[tuple[str, str, str]]:
    """(phrase, type, sentence) per mention, in order of appearance."""
    sentences = split_sentences(text)
    tokenized = [[_POSSESSIVE.sub("", w) for w in _WORD.findall(s)] for s in sentences]
    lowercase_seen = {w for words in tokenized for w in words if w.islower()}
    mentions = []
    for sentence, words in zip(sentences, tokenized):
        for start, run in _proper_noun_runs(words):
            phrase = _clean_proper(start, run, lowercase_seen)
            if phrase:
                mentions.append((phrase, "PROPER_NOUN", sentence))
        mentions.extend((phrase, "NOUN_PHRASE", sentence) for phrase in _noun_phrases(words))
    return mentions


def _trim(sentence: str, limit: int = 400) -> str:
    sentence = " ".join(sentence.split())
    return sentence if len(sentence) <= limit else sentence[: limit - 1].rstrip() + "…"


def extract_unit(text_unit_id: str, text: str, max_phrases: int) -> tuple[list[dict], list[dict]]:
    """Entity and relationship instances of one text unit (pure)."""
    mentions = extract_phrases(text)
    counts = Counter(phrase.upper() for phrase, _, _ in mentions)
    first: dict[str, tuple[str, str, str]] = {}
    for phrase, kind, sentence in mentions:
        first.setdefault(phrase.upper(), (phrase, kind, sentence))
    entities = [{"id": content_id(text_unit_id, "entity", key), "text_unit_id": text_unit_id, "name": key,
                 "type": first[key][1], "description": _trim(first[key][2]), "method": METHOD} for key in first]
    order = {key: i for i, key in enumerate(first)}
    top = sorted(counts, key=lambda k: (-counts[k], order[k]))[:max_phrases]
    top_sentences = {key: [s.upper() for p, _, s in mentions if p.upper() == key] for key in top}
    relationships = []
    for source, target in combinations(sorted(top), 2):
        shared = next((s for p, _, s in mentions if p.upper() == source and s.upper() in top_sentences[target]), None)
        description = _trim(shared) if shared else f"{source} and {target} are mentioned in the same passage."
        relationships.append({"id": content_id(text_unit_id, "relationship", source, target), "text_unit_id": text_unit_id,
                              "source": source, "target": target, "description": description,
                              "strength": 2.0 if shared else 1.0, "method": METHOD})
    return entities, relationships
