"""The offline cluster summary: extractive, so the tree can be built without any LLM.

The paper's summaries are abstractive ("as many key details as possible", by an LLM); this
stand-in keeps the cluster's most central sentences instead, which preserves the tree's shape
and retrieval behaviour but never says anything the children did not.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer

from graphrag_spark.raptor.chunking import CountTokens, sentence_chunks, split_sentences


def extractive_summary(texts: Sequence[str], max_tokens: int, count_tokens: CountTokens) -> str:
    """The most central sentences of ``texts`` that fit in ``max_tokens``, in reading order.

    Centrality is a sentence's summed TF-IDF cosine similarity to the others (LexRank's degree
    centrality): sentences that share the cluster's common vocabulary carry its gist. A sentence
    that would overflow is skipped for a shorter, less central one.
    """
    sentences = list(dict.fromkeys(s for text in texts for s in split_sentences(text)))
    if not sentences:
        return ""
    centrality = _centrality(sentences)
    ranked = sorted(range(len(sentences)), key=lambda i: (-centrality[i], i))
    chosen, used = [], 0
    for i in ranked:
        n = count_tokens(sentences[i])
        if used + n <= max_tokens:
            chosen.append(i)
            used += n
    if not chosen:  # every sentence is longer than the budget: keep the head of the most central one
        return sentence_chunks(sentences[ranked[0]], max_tokens, count_tokens=count_tokens)[0]
    return " ".join(sentences[i] for i in sorted(chosen))


def _centrality(sentences: list[str]) -> np.ndarray:
    try:
        vectors = TfidfVectorizer(stop_words="english").fit_transform(sentences)
    except ValueError:  # only stop words: no sentence stands out
        return np.zeros(len(sentences))
    similarity = vectors @ vectors.T
    return np.asarray(similarity.sum(axis=1)).ravel() - similarity.diagonal()
