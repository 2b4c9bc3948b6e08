"""Community report context building: ``python benchmarks/bench_report_context.py --communities 1000``.

Times ``build_leaf_context`` and ``build_higher_context`` with the real tokenizer
(cl100k_base via ``graphrag_spark.tokens.count_tokens``) on seeded synthetic communities of
realistic sizes: 10-200 entities (log-uniform), one to three edges per entity (up to a few
hundred per community), LLM-like descriptions (entities 20-60 words, edges 10-30 words),
claims on a fifth of the entities. A higher community joins 2-6 such communities (its
sub-communities, each with a finished 250-450 word report) plus edges between them, so its
elements usually exceed the 8k budget and reports get substituted.

The frames are built before timing; the timed part is exactly what the report stage runs
per community.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pandas as pd

from graphrag_spark.index.report_context import CommunityElements, SubCommunity, build_higher_context, build_leaf_context
from graphrag_spark.tokens import count_tokens

_WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have an they you "
    "were her their one all we can has been more when will would there who so no if out up what about into than its "
    "only other time could new some these two may first then do any like my now over such our man me even most made "
    "after also did many before must through back years where much your way well down should because each just those "
    "people how too little state good very make world still own see men work long get here between both life being "
    "under never day same another know while last might us great old year off come since against go came right used "
    "take three company government council treaty merchant harbour captain village river alliance ministry festival "
    "research network report meeting agreement director foundation expedition archive museum railway trade union "
    "partnership conflict negotiation investment island province university hospital laboratory committee election"
).split()


class Corpus:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self._next = 0

    def text(self, low: int, high: int) -> str:
        words = self.rng.choice(_WORDS, self.rng.integers(low, high + 1))
        return " ".join(words).capitalize() + "."

    def uid(self, prefix: str) -> str:
        self._next += 1
        return f"{prefix}{self._next:08x}"


def community_elements(corpus: Corpus, n_entities: int, first_hrid: int = 0) -> CommunityElements:
    rng = corpus.rng
    ids = [corpus.uid("e") for _ in range(n_entities)]
    titles = [f"{corpus.text(1, 2)[:-1].upper()} {i + first_hrid}" for i in range(n_entities)]
    n_edges = int(min(n_entities * (n_entities - 1) // 2, rng.integers(n_entities, 3 * n_entities + 1)))
    pairs: set[tuple[int, int]] = set()
    while len(pairs) < n_edges:
        a, b = (int(x) for x in rng.integers(0, n_entities, 2))
        if a != b:
            pairs.add((min(a, b), max(a, b)))
    edges = sorted(pairs)
    degree = np.bincount(np.array(edges).ravel(), minlength=n_entities) if edges else np.zeros(n_entities, int)
    entities = pd.DataFrame({"id": ids, "human_readable_id": range(first_hrid, first_hrid + n_entities), "title": titles,
                             "description": [corpus.text(20, 60) for _ in ids], "degree": degree})
    relationships = pd.DataFrame({
        "id": [corpus.uid("r") for _ in edges], "human_readable_id": range(first_hrid, first_hrid + len(edges)),
        "source": [titles[a] for a, _ in edges], "target": [titles[b] for _, b in edges],
        "description": [corpus.text(10, 30) for _ in edges],
        "combined_degree": [int(degree[a] + degree[b]) for a, b in edges]})
    subjects = [t for t in titles if rng.random() < 0.2]
    claims = pd.DataFrame({"id": [corpus.uid("c") for _ in subjects], "human_readable_id": range(len(subjects)),
                           "subject": subjects, "type": "FACT", "status": "TRUE",
                           "description": [corpus.text(10, 25) for _ in subjects]})
    return CommunityElements(entities, relationships, claims)


def higher_community(corpus: Corpus, sizes: list[int]) -> tuple[CommunityElements, list[SubCommunity]]:
    parts, subs, hrid = [], [], 0
    for number, size in enumerate(sizes):
        part = community_elements(corpus, size, hrid)
        hrid += size
        parts.append(part)
        subs.append(SubCommunity(number, f"Community {number}", corpus.text(250, 450),
                                 part.entities["id"].tolist(), part.relationships["id"].tolist()))
    entities = pd.concat([p.entities for p in parts], ignore_index=True)
    between = []
    for _ in range(sum(sizes) // 4):
        a, b = corpus.rng.choice(len(parts), 2, replace=False)
        between.append((corpus.rng.choice(parts[a].entities["title"]), corpus.rng.choice(parts[b].entities["title"])))
    degree = entities.set_index("title")["degree"]
    cross = pd.DataFrame({"id": [corpus.uid("x") for _ in between], "human_readable_id": range(hrid, hrid + len(between)),
                          "source": [s for s, _ in between], "target": [t for _, t in between],
                          "description": [corpus.text(10, 30) for _ in between],
                          "combined_degree": [int(degree[s] + degree[t]) for s, t in between]})
    relationships = pd.concat([p.relationships for p in parts] + [cross], ignore_index=True)
    claims = pd.concat([p.claims for p in parts], ignore_index=True)
    return CommunityElements(entities, relationships, claims), subs


def community_sizes(rng: np.random.Generator, n: int) -> list[int]:
    return [int(s) for s in np.exp(rng.uniform(np.log(10), np.log(200), n)).astype(int)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--communities", type=int, default=1000, help="communities per timed run")
    parser.add_argument("--max-tokens", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    corpus = Corpus(args.seed)
    count_tokens("warm up the encoding")
    leaves = [community_elements(corpus, size) for size in community_sizes(corpus.rng, args.communities)]
    highers = [higher_community(corpus, community_sizes(corpus.rng, int(corpus.rng.integers(2, 7))))
               for _ in range(args.communities)]

    started = time.perf_counter()
    leaf_contexts = [build_leaf_context(c.entities, c.relationships, c.claims, args.max_tokens, count_tokens) for c in leaves]
    leaf_s = time.perf_counter() - started
    started = time.perf_counter()
    higher_contexts = [build_higher_context(e, subs, args.max_tokens, count_tokens) for e, subs in highers]
    higher_s = time.perf_counter() - started

    per_1000 = 1000 / args.communities
    n_entities = [len(c.entities) for c in leaves]
    n_edges = [len(c.relationships) for c in leaves]
    print(f"Leaf communities: {args.communities:,}, entities {min(n_entities)}-{max(n_entities)} "
          f"(median {statistics.median(n_entities):.0f}), edges {min(n_edges)}-{max(n_edges)} "
          f"(median {statistics.median(n_edges):.0f}), context tokens median "
          f"{statistics.median(c.n_tokens for c in leaf_contexts):.0f}, "
          f"truncated at {args.max_tokens} tokens: {sum(c.truncated for c in leaf_contexts)}")
    print(f"  build_leaf_context: {leaf_s * 1000 * per_1000:,.0f} ms per 1,000 communities "
          f"({leaf_s / args.communities * 1000:.1f} ms each)")
    h_entities = [len(e.entities) for e, _ in highers]
    h_edges = [len(e.relationships) for e, _ in highers]
    print(f"Higher communities: {args.communities:,}, entities {min(h_entities)}-{max(h_entities)} "
          f"(median {statistics.median(h_entities):.0f}), edges {min(h_edges)}-{max(h_edges)} "
          f"(median {statistics.median(h_edges):.0f}), with reports substituted: "
          f"{sum(bool(c.substituted_communities) for c in higher_contexts)}, "
          f"still truncated: {sum(c.truncated for c in higher_contexts)}")
    print(f"  build_higher_context: {higher_s * 1000 * per_1000:,.0f} ms per 1,000 communities "
          f"({higher_s / args.communities * 1000:.1f} ms each)")


if __name__ == "__main__":
    main()
