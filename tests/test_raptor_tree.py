"""Building the RAPTOR tree: soft clusters per layer, summaries, layers up to a root.

A cheap deterministic embedder (hashed bag of words) and the extractive summarizer stand in
for the embedding model and the LLM. The first UMAP call compiles numba code (~15 s, once).
"""

import hashlib
import random
import re
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from conftest import shared_path

from graphrag_spark.raptor.chunking import sentence_chunks, split_sentences
from graphrag_spark.raptor.clustering import cluster_layer, enforce_token_budget, soft_assign
from graphrag_spark.raptor.nodes import FAILED, OK
from graphrag_spark.raptor.params import RaptorParams
from graphrag_spark.raptor.summaries import extractive_summary
from graphrag_spark.raptor.tree import build_tree, make_leaves, next_frontier, summarize_clusters



@pytest.fixture
def carol() -> Path:
    return shared_path("corpora/a_christmas_carol.txt")
TOPICS = {
    "sea": "ship sail harbour captain wave anchor tide crew deck storm".split(),
    "farm": "cow barn harvest wheat tractor field farmer hay plough orchard".split(),
    "space": "rocket orbit planet astronaut moon launch star galaxy comet telescope".split(),
    "kitchen": "oven bread butter recipe flour sugar knife soup kettle baker".split(),
}


def words(text: str) -> int:
    return len(text.split())


def hashed_bow(texts: list[str], dim: int = 256) -> np.ndarray:
    """Bag of words hashed into ``dim`` buckets, L2-normalised: texts sharing words are close."""
    vectors = np.zeros((len(texts), dim))
    for row, text in enumerate(texts):
        for word in re.findall(r"[a-z]+", text.lower()):
            vectors[row, int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "big") % dim] += 1
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def summarize(texts: list[str]) -> str:
    return extractive_summary(texts, 30, words)


def topic_chunks(per_topic: int = 10) -> tuple[list[str], list[str]]:
    """12-word chunks drawn from four vocabularies, topics interleaved."""
    rng = random.Random(0)
    chunks, topics = [], []
    for _ in range(per_topic):
        for topic, vocabulary in TOPICS.items():
            chunks.append(" ".join(rng.choices(vocabulary, k=12)).capitalize() + ".")
            topics.append(topic)
    return chunks, topics


@pytest.fixture(scope="module")
def topic_tree():
    chunks, topics = topic_chunks()
    return build_tree(chunks, hashed_bow, summarize, words), topics


def children_of(tree) -> dict[str, list[str]]:
    children = defaultdict(list)
    for edge in tree.edges:
        children[edge.parent].append(edge.child)
    return children


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_tiny_inputs_give_trivial_trees(n):
    chunks = [f"Chunk number {i} about the sea." for i in range(n)]
    assert cluster_layer(hashed_bow(chunks), [6] * n, RaptorParams()) == ([[(i, 1.0) for i in range(n)]] if n else [])
    tree = build_tree(chunks, hashed_bow, summarize, words)
    layers = Counter(node.layer for node in tree.nodes)
    if n < 3:  # one node is a root; two are short enough to read whole
        assert layers == Counter({0: n} if n else {}) and tree.edges == []
    else:
        assert layers == Counter({0: 3, 1: 1})
        assert sorted((e.child, e.probability) for e in tree.edges) == sorted((leaf.id, 1.0) for leaf in tree.nodes[:3])


def test_leaves_cluster_by_topic_up_to_a_single_root(topic_tree):
    tree, topics = topic_tree
    topic_of = {node.id: topic for node, topic in zip(tree.nodes, topics)}
    text_of = {node.id: node.text for node in tree.nodes}
    children = children_of(tree)
    layer1 = [node for node in tree.nodes if node.layer == 1]
    assert 4 <= len(layer1) <= 8
    for summary in layer1:
        assert len({topic_of[child] for child in children[summary.id]}) == 1
        assert set(split_sentences(summary.text)) <= {text_of[child] for child in children[summary.id]}
    assert [node.layer for node in tree.nodes].count(max(node.layer for node in tree.nodes)) == 1
    assert {edge.child for edge in tree.edges} >= {node.id for node in tree.nodes if node.layer == 0}
    assert all(node.status == OK and node.embedding is not None for node in tree.nodes)


def test_same_input_and_seed_give_the_same_tree(topic_tree):
    tree, _ = topic_tree
    again = build_tree(topic_chunks()[0], hashed_bow, summarize, words)
    assert [(n.id, n.layer, n.text) for n in again.nodes] == [(n.id, n.layer, n.text) for n in tree.nodes]
    assert again.edges == tree.edges
    assert len({node.id for node in tree.nodes}) == len(tree.nodes)


def test_a_node_joins_every_cluster_above_the_threshold():
    posteriors = np.array([[0.55, 0.45, 0.0], [0.95, 0.05, 0.0], [0.08, 0.07, 0.85]])
    assert soft_assign(posteriors, 0.1) == [[(0, 0.55), (1, 0.95)], [(0, 0.45)], [(2, 0.85)]]
    # Below the threshold everywhere, a node still joins its most likely cluster.
    assert soft_assign(posteriors, 0.99) == [[(0, 0.55), (1, 0.95)], [(2, 0.85)]]


def test_a_node_in_two_clusters_gets_two_parents():
    leaves = make_leaves(["Sea ship.", "Ship farm.", "Farm cow."], hashed_bow(["a", "b", "c"]), words)
    summaries, edges = summarize_clusters(leaves, [[(0, 1.0), (1, 0.6)], [(1, 0.4), (2, 1.0)]], 1, summarize, words)
    parents = [e.parent for e in edges if e.child == leaves[1].id]
    assert sorted(parents) == sorted(s.id for s in summaries)
    assert sorted(e.probability for e in edges if e.child == leaves[1].id) == [0.4, 0.6]
    assert next_frontier(leaves, summaries, edges) == summaries


def test_over_budget_clusters_are_clustered_again_until_they_fit():
    chunks, topics = topic_chunks()
    embeddings, tokens = hashed_bow(chunks), [words(c) for c in chunks]
    roomy = cluster_layer(embeddings, tokens, RaptorParams())
    tight = cluster_layer(embeddings, tokens, RaptorParams(max_cluster_tokens=40))
    assert max(sum(tokens[i] for i, _ in c) for c in roomy) > 40
    assert all(sum(tokens[i] for i, _ in c) <= 40 for c in tight)
    assert len(tight) > len(roomy)
    assert all(len({topics[i] for i, _ in c}) == 1 for c in tight)  # split within topics, not across
    assert {i for c in tight for i, _ in c} == set(range(len(chunks)))


def test_a_cluster_that_cannot_be_split_is_cut_in_order_to_fit():
    cluster = [(i, 1.0) for i in range(6)]
    clusters = enforce_token_budget([cluster], hashed_bow([str(i) for i in range(6)]), [100] * 6, RaptorParams(max_cluster_tokens=250))
    assert clusters == [[(0, 1.0), (1, 1.0)], [(2, 1.0), (3, 1.0)], [(4, 1.0), (5, 1.0)]]


def test_a_failed_summary_is_recorded_and_its_children_are_summarized_next_layer():
    calls = []

    def flaky(texts):
        calls.append(texts)
        if len(calls) == 1:
            raise TimeoutError("LLM timed out")
        return None if len(calls) == 2 else summarize(texts)

    tree = build_tree(topic_chunks()[0], hashed_bow, flaky, words)
    failed = [node for node in tree.nodes if node.status == FAILED]
    assert [(n.layer, n.error, n.text, n.embedding) for n in failed] == [
        (1, "TimeoutError: LLM timed out", "", None),
        (1, "summarizer returned no text", "", None),
    ]
    ok_ids = {node.id for node in tree.nodes if node.status == OK}
    children = children_of(tree)
    layer_of = {node.id: node.layer for node in tree.nodes}
    for node in failed:
        assert children[node.id]  # edges kept
        for child in children[node.id]:
            assert any(child in kids and parent in ok_ids and layer_of[parent] > 1 for parent, kids in children.items())


def test_max_layers_bounds_the_tree(topic_tree):
    tree = build_tree(topic_chunks()[0], hashed_bow, summarize, words, RaptorParams(max_layers=1))
    assert max(node.layer for node in tree.nodes) == 1
    assert len(tree.nodes) == len([n for n in topic_tree[0].nodes if n.layer <= 1])


def test_leaf_ids_come_from_chunk_ids():
    embeddings = hashed_bow(["a", "b"])
    first = make_leaves(["A.", "B."], embeddings, words, chunk_ids=["c1", "c2"])
    second = make_leaves(["A changed.", "B."], embeddings, words, chunk_ids=["c1", "c2"])
    assert [n.id for n in first] == [n.id for n in second]
    assert [n.chunk_id for n in first] == ["c1", "c2"]
    assert make_leaves(["A.", "A."], embeddings, words)[0].id != make_leaves(["A.", "A."], embeddings, words)[1].id


def test_christmas_carol_tree(carol):
    text = " ".join(carol.read_text().split()[3000:7000])
    chunks = sentence_chunks(text, 100, count_tokens=words)
    tree = build_tree(chunks, hashed_bow, lambda texts: extractive_summary(texts, 100, words), words)
    per_layer = Counter(node.layer for node in tree.nodes)
    assert per_layer[0] == len(chunks) > 40
    assert all(per_layer[layer] < per_layer[layer - 1] for layer in range(1, max(per_layer) + 1))
    assert max(per_layer) >= 2
    summaries = [node for node in tree.nodes if node.layer > 0]
    assert all(node.n_tokens <= 100 for node in summaries)
    assert len(tree.edges) / len(summaries) > 2  # clusters merge several nodes
    assert len({node.id for node in tree.nodes}) == len(tree.nodes)
    leaf_sentences = {s for chunk in chunks for s in split_sentences(chunk)}
    assert all(set(split_sentences(node.text)) <= leaf_sentences for node in summaries)
