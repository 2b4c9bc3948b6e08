"""The RAPTOR tree as Spark jobs over Delta: the Spark shell around this package's pure core.

One round per layer, for all trees of the run together (one tree per corpus, or one per document):

    documents ─mapInPandas─▶ sentence chunks (leaves) ─embed in executors─▶ layer 0
    frontier ─collect float32─▶ global clusters (driver, per tree)
             ─groupBy(tree, global cluster).applyInPandas─▶ local clusters (executors)
             ─▶ token budget enforced (driver)
             ─▶ summaries in executors (``run_llm_stage`` for ``llm``, mapInPandas for ``extractive``)
             ─embed in executors─▶ next layer
    every layer ─▶ raptor_nodes, raptor_edges (Delta)

Texts stay in executors: the driver holds ids, token counts and the current frontier's embeddings.
Ids are content hashes (a leaf: its chunk; a summary: its layer and children) and an LLM summary
is cached under a hash of its children's texts, so a rerun over the same input builds the same
tree and pays for no summary twice; summaries that failed are retried.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Iterator

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from graphrag_spark import tables as T
from graphrag_spark.compat import default_parallelism
from graphrag_spark.config import Config, RaptorConfig
from graphrag_spark.errors import UserError
from graphrag_spark.ids import content_id
from graphrag_spark.index.documents import build_documents
from graphrag_spark.index.embed import embed_texts
from graphrag_spark.llm.stage import LlmWork, StageUsage, new_run_id, run_llm_stage
from graphrag_spark.prompts import load_prompt
from graphrag_spark.raptor.chunking import sentence_chunks
from graphrag_spark.raptor.clustering import Cluster, enforce_token_budget, global_clusters, lift_clusters, local_clusters
from graphrag_spark.raptor.nodes import FAILED, OK, Edge, Node, leaf_id, summary_id
from graphrag_spark.raptor.params import RaptorParams
from graphrag_spark.raptor.summaries import extractive_summary
from graphrag_spark.raptor.tree import next_frontier
from graphrag_spark.tokens import count_tokens

SUMMARY_STAGE = "raptor_summary"
CORPUS_TREE = "corpus"
"""tree_id of the single tree of ``raptor.scope: corpus``; with ``document`` a tree's id is its document's."""

NODE_SCHEMA = T.SCHEMAS[T.RAPTOR_NODES]
# Node rows before embedding; ``position`` orders a tree's nodes within their layer (leaves: within their document).
_UNEMBEDDED = StructType([f for f in NODE_SCHEMA.fields if f.name not in ("embedding", "model_name")]
                         + [StructField("position", LongType())])
_LOCAL_CLUSTERS = "tree_id string, global_cluster int, local_cluster int, position int, probability double"


def raptor_params(cfg: RaptorConfig) -> RaptorParams:
    """The core's parameters from the config section that mirrors them."""
    return RaptorParams(**cfg.model_dump(include={f.name for f in dataclasses.fields(RaptorParams)}))


# ---------------------------------------------------------------- pure helpers


def leaf_rows(document_id: str, text: str, tree_id: str, max_tokens: int, count) -> list[dict]:
    """A document's sentence chunks as leaf rows (no embedding yet); ``position`` orders the leaves of a tree."""
    rows = []
    for index, chunk in enumerate(sentence_chunks(text, max_tokens, count_tokens=count)):
        chunk_id = content_id("raptor-chunk", document_id, index, chunk)
        rows.append({"tree_id": tree_id, "id": leaf_id(chunk_id), "layer": 0, "text": chunk, "n_tokens": count(chunk),
                     "chunk_id": chunk_id, "document_id": document_id, "status": OK, "error": None, "position": index})
    return rows


@dataclass
class TreeShape:
    """What a built tree looks like, for the run summary and the benchmark (paper: ~6.7 children per
    parent; summaries ~131 tokens from children of ~86)."""

    trees: int
    nodes_per_layer: dict[int, int]
    failed_summaries: int
    failed_leaves: int
    """Leaves whose embedding failed: kept in the table, left out of clustering and retrieval."""
    mean_children: float
    mean_summary_tokens: float
    mean_child_tokens: float

    @property
    def summary_child_token_ratio(self) -> float:
        return self.mean_summary_tokens / self.mean_child_tokens if self.mean_child_tokens else 0.0


def tree_shape(nodes: pd.DataFrame, edges: pd.DataFrame) -> TreeShape:
    """From ``tree_id, id, layer, n_tokens, status`` nodes and ``parent, child`` edges; children
    statistics over successful summaries only (a failed summary has no text)."""
    ok_summaries = nodes[(nodes["layer"] > 0) & (nodes["status"] == OK)]
    ok_edges = edges[edges["parent"].isin(ok_summaries["id"])]
    child_tokens = ok_edges["child"].map(nodes.set_index("id")["n_tokens"])
    return TreeShape(
        trees=int(nodes["tree_id"].nunique()),
        nodes_per_layer={int(k): int(v) for k, v in nodes.groupby("layer").size().items()},
        failed_summaries=int(((nodes["layer"] > 0) & (nodes["status"] == FAILED)).sum()),
        failed_leaves=int(((nodes["layer"] == 0) & (nodes["status"] == FAILED)).sum()),
        mean_children=float(ok_edges.groupby("parent").size().mean()) if len(ok_edges) else 0.0,
        mean_summary_tokens=float(ok_summaries["n_tokens"].mean()) if len(ok_summaries) else 0.0,
        mean_child_tokens=float(child_tokens.mean()) if len(child_tokens) else 0.0,
    )


@dataclass
class RaptorBuild:
    shape: TreeShape
    seconds: float
    usage: list[StageUsage] = field(default_factory=list)

    @property
    def llm_calls(self) -> int:
        return sum(u.calls for u in self.usage)

    def render(self) -> str:
        s = self.shape
        lines = ["RAPTOR tree summary", "-------------------", f"{'trees':<32} {s.trees}"]
        lines += [f"{f'nodes in layer {layer}':<32} {n}" for layer, n in sorted(s.nodes_per_layer.items())]
        lines += [f"{'failed summaries / leaves':<32} {s.failed_summaries} / {s.failed_leaves}",
                  f"{'mean children per parent':<32} {s.mean_children:.2f}",
                  f"{'mean summary / child tokens':<32} {s.mean_summary_tokens:.1f} / {s.mean_child_tokens:.1f} "
                  f"(ratio {s.summary_child_token_ratio:.2f})",
                  f"{'build time (s)':<32} {self.seconds:.1f}",
                  f"{'LLM calls (this run)':<32} {self.llm_calls} ({sum(u.cache_hits for u in self.usage)} summaries from cache)"]
        if self.usage:
            lines += ["", "LLM usage (this run)"] + [u.render() for u in self.usage]
        return "\n".join(lines)


# ---------------------------------------------------------------- the Spark shell


def build_raptor(spark: SparkSession, cfg: Config) -> RaptorBuild:
    """Build every tree of the configured input and overwrite ``raptor_nodes`` and ``raptor_edges``."""
    started = time.perf_counter()
    store = T.TableStore(spark, cfg.storage)
    params = raptor_params(cfg.raptor)
    run_id = new_run_id()

    leaves = store.checkpoint(_leaves(_documents(spark, store, cfg), cfg), "raptor_leaves")
    layers = [_embedded(spark, store, leaves, cfg, "raptor_layer_0")]
    frontiers = _frontiers(layers[0])
    edges: list[tuple[str, Edge]] = []
    usage: list[StageUsage] = []
    for layer in range(1, params.max_layers + 1):
        growing = {t: f for t, f in frontiers.items() if len(f) >= params.min_nodes_to_cluster}
        clusters = _layer_clusters(spark, _union(layers), growing, params) if growing else {}
        clusters = {t: c for t, c in clusters.items() if len(c) < len(growing[t])}  # else nothing merges
        if not clusters:
            break
        layer_edges = {t: _cluster_edges(growing[t], c, layer) for t, c in clusters.items()}
        edges += [(t, e) for t, es in layer_edges.items() for e in es]
        summaries, stage_usage = _summarize(spark, store, cfg, params, _union(layers), layer_edges, layer, run_id)
        usage += stage_usage
        layers.append(_embedded(spark, store, summaries, cfg, f"raptor_layer_{layer}"))
        made = _frontiers(layers[-1], with_failed=True)
        frontiers = {}
        for t in clusters:
            following = next_frontier(growing[t], made.get(t, []), layer_edges[t])
            if len(following) < len(growing[t]):
                frontiers[t] = following

    nodes = _union(layers).drop("position")
    store.write(nodes, T.RAPTOR_NODES)
    edge_rows = pd.DataFrame([(t, e.parent, e.child, e.probability) for t, e in edges],
                             columns=T.SCHEMAS[T.RAPTOR_EDGES].fieldNames())
    store.write(spark.createDataFrame(edge_rows, T.SCHEMAS[T.RAPTOR_EDGES]), T.RAPTOR_EDGES)
    shape = tree_shape(store.read(T.RAPTOR_NODES).select("tree_id", "id", "layer", "n_tokens", "status").toPandas(), edge_rows)
    store.drop_scratch()
    return RaptorBuild(shape, round(time.perf_counter() - started, 2), usage)


def _documents(spark: SparkSession, store: T.TableStore, cfg: Config) -> DataFrame:
    """The index's documents table when the root has one (shared with the GraphRAG index), else read from input.path."""
    if not store.exists(T.DOCUMENTS):
        read = build_documents(spark, cfg.input)
        store.write(read.rejects, T.INPUT_REJECTS)
        store.write(read.documents, T.DOCUMENTS)
        if read.counts["documents"] == 0:
            raise UserError(f"No readable documents in '{cfg.input.path}': {read.counts['rejected']} inputs were skipped; "
                            f"see the '{T.INPUT_REJECTS}' table at {store.location(T.INPUT_REJECTS)} for the reasons.")
    return store.read(T.DOCUMENTS)


def _leaves(documents: DataFrame, cfg: Config) -> DataFrame:
    """Sentence chunks, cut in executors."""
    max_tokens, encoding, per_document = cfg.raptor.chunk_tokens, cfg.chunking.encoding, cfg.raptor.scope == "document"

    def run(parts: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        count = partial(count_tokens, encoding=encoding)
        for part in parts:
            rows = [row for doc_id, text in zip(part["id"], part["text"])
                    for row in leaf_rows(doc_id, text or "", doc_id if per_document else CORPUS_TREE, max_tokens, count)]
            yield pd.DataFrame(rows, columns=_UNEMBEDDED.fieldNames())

    return documents.select("id", "text").mapInPandas(run, _UNEMBEDDED)


def _embedded(spark: SparkSession, store: T.TableStore, nodes: DataFrame, cfg: Config, name: str) -> DataFrame:
    """Nodes with the embeddings of their texts, computed in executors by the configured provider
    (index.embed); a node whose embedding failed becomes a failed node. Materialized, so no
    embedding is computed (or paid) twice."""
    texts = nodes.where(F.col("status") == OK).select("id", "text")
    rows = texts.count()
    partitions = max(1, min(rows, max(default_parallelism(spark), math.ceil(rows / cfg.llm.items_per_commit))))
    vectors = embed_texts(texts, cfg, partitions).withColumnRenamed("vector", "embedding")
    no_vector = (F.col("status") == OK) & F.col("embedding").isNull()
    return store.checkpoint(nodes.join(vectors, "id", "left")
                            .withColumn("error", F.when(no_vector, F.lit("embedding failed")).otherwise(F.col("error")))
                            .withColumn("status", F.when(no_vector, F.lit(FAILED)).otherwise(F.col("status")))
                            .select(*[f.name for f in NODE_SCHEMA.fields], "position"), name)


def _union(layers: list[DataFrame]) -> DataFrame:
    union = layers[0]
    for layer in layers[1:]:
        union = union.unionByName(layer)
    return union


def _frontiers(layer: DataFrame, with_failed: bool = False) -> dict[str, list[Node]]:
    """A layer's nodes per tree on the driver, in ``position`` order, without their texts.

    Only successful nodes can be clustered; ``with_failed`` keeps failed summaries too, so
    ``next_frontier`` sees which clusters failed (their children stay in the frontier)."""
    rows = layer.select("tree_id", "id", "layer", "n_tokens", "embedding", "status", "document_id", "position")
    if not with_failed:
        rows = rows.where(F.col("status") == OK)
    frame = rows.toPandas()
    frame = frame.sort_values(["tree_id", "document_id", "position"], na_position="first", kind="stable")
    frontiers: dict[str, list[Node]] = {}
    for r in frame.itertuples(index=False):
        vector = None if r.status != OK else np.asarray(r.embedding, dtype=np.float32)
        frontiers.setdefault(r.tree_id, []).append(Node(r.id, int(r.layer), "", int(r.n_tokens), vector, status=r.status))
    return frontiers


def _layer_clusters(spark: SparkSession, nodes: DataFrame, frontiers: dict[str, list[Node]],
                    params: RaptorParams) -> dict[str, list[Cluster]]:
    """Final clusters of every tree's frontier (indices into it): the same as ``clustering.cluster_layer``,
    with the local passes distributed."""
    embeddings = {t: np.stack([n.embedding for n in f]).astype(np.float64) for t, f in frontiers.items()}
    outer = {t: global_clusters(e, params) for t, e in embeddings.items()}
    assignments = T.local_frame(
        spark, [(t, g, position, frontiers[t][index].id) for t, clusters in outer.items()
         for g, cluster in enumerate(clusters) for position, (index, _) in enumerate(cluster)],
        "tree_id string, global_cluster int, position int, id string")
    members = assignments.join(nodes.select("tree_id", "id", "embedding"), ["tree_id", "id"])

    def local_pass(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame.sort_values("position")
        clusters = local_clusters(np.stack(frame["embedding"].to_numpy()).astype(np.float64), params)
        tree, g, positions = frame["tree_id"].iloc[0], int(frame["global_cluster"].iloc[0]), frame["position"].to_numpy()
        return pd.DataFrame([(tree, g, k, int(positions[i]), prob) for k, cluster in enumerate(clusters) for i, prob in cluster],
                            columns=["tree_id", "global_cluster", "local_cluster", "position", "probability"])

    inner: dict[tuple[str, int], list[Cluster]] = {}
    local = members.groupBy("tree_id", "global_cluster").applyInPandas(local_pass, _LOCAL_CLUSTERS).toPandas()
    for (t, g), frame in local.sort_values(["local_cluster", "position"]).groupby(["tree_id", "global_cluster"]):
        inner[(t, int(g))] = [list(zip(c["position"].astype(int), c["probability"].astype(float)))
                              for _, c in frame.groupby("local_cluster", sort=True)]
    return {t: enforce_token_budget([c for g, cluster in enumerate(outer[t]) for c in lift_clusters(cluster, inner[(t, g)])],
                                    embeddings[t], [n.n_tokens for n in frontiers[t]], params)
            for t in frontiers}


def _cluster_edges(frontier: list[Node], clusters: list[Cluster], layer: int) -> list[Edge]:
    edges = []
    for cluster in clusters:
        members = [frontier[i] for i, _ in cluster]
        parent = summary_id(layer, [m.id for m in members])
        edges += [Edge(parent, m.id, float(p)) for m, (_, p) in zip(members, cluster)]
    return edges


def _summarize(spark: SparkSession, store: T.TableStore, cfg: Config, params: RaptorParams, nodes: DataFrame,
               edges: dict[str, list[Edge]], layer: int, run_id: str) -> tuple[DataFrame, list[StageUsage]]:
    """The layer's summary nodes (not yet embedded), written in executors; failures are failed nodes."""
    children = T.local_frame(
        spark, [(t, e.parent, position, e.child) for t, es in edges.items() for position, e in enumerate(es)],
        "tree_id string, parent string, edge int, child string")
    parent_order = {parent: i for es in edges.values() for i, parent in enumerate(dict.fromkeys(e.parent for e in es))}
    texts = (children.join(nodes.select(F.col("id").alias("child"), "text"), "child")
             .groupBy("tree_id", "parent").agg(F.sort_array(F.collect_list(F.struct("edge", "text"))).alias("members"))
             .select("tree_id", F.col("parent").alias("item_id"),
                     F.to_json(F.struct(F.col("members.text").alias("texts"))).alias("payload")))
    texts = store.checkpoint(texts, f"raptor_texts_{layer}")
    if cfg.raptor.method == "llm":
        outcome, usage = _llm_summaries(spark, store, cfg, texts, run_id)
        written = outcome.select("item_id", F.get_json_object("result", "$.text").alias("text"), "error")
        usages = [usage]
    else:
        written, usages = _extractive_summaries(texts, params, cfg.chunking.encoding), []
    order = T.local_frame(spark, parent_order.items(), "item_id string, position long")
    nodes = _summary_nodes(texts.select("tree_id", "item_id").join(written, "item_id").join(order, "item_id"), layer,
                           cfg.chunking.encoding)
    return store.checkpoint(nodes, f"raptor_summaries_{layer}"), usages


def _llm_summaries(spark: SparkSession, store: T.TableStore, cfg: Config, items: DataFrame,
                   run_id: str) -> tuple[DataFrame, StageUsage]:
    prompt = load_prompt("raptor_summary")
    max_tokens = cfg.raptor.summary_max_tokens

    async def work(client, item: dict) -> LlmWork:
        context = "\n\n".join(json.loads(item["payload"])["texts"])
        call = await client.chat([{"role": "user", "content": prompt.render(context=context)}], max_tokens=max_tokens,
                                 item_id=item["item_id"], stage=SUMMARY_STAGE, prompt_version=prompt.version)
        text = call.text.strip()
        return LlmWork({"text": text}, [call], call.error or (None if text else "the model returned an empty summary"))

    return run_llm_stage(spark, store, cfg.llm, cfg.llm.chat, SUMMARY_STAGE, items.select("item_id", "payload"), work,
                         run_id, prompt.version, {"max_tokens": max_tokens, "temperature": cfg.llm.chat.temperature})


def _extractive_summaries(items: DataFrame, params: RaptorParams, encoding: str) -> DataFrame:
    summary_tokens = params.summary_tokens

    def run(parts: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        count = partial(count_tokens, encoding=encoding)
        for part in parts:
            rows = []
            for item_id, payload in zip(part["item_id"], part["payload"]):
                try:
                    text = extractive_summary(json.loads(payload)["texts"], summary_tokens, count).strip()
                    rows.append((item_id, text, None if text else "the summarizer returned no text"))
                except Exception as exc:  # one bad cluster must not abort the layer; the failure is recorded
                    rows.append((item_id, None, f"{type(exc).__name__}: {exc}"))
            yield pd.DataFrame(rows, columns=["item_id", "text", "error"])

    return items.mapInPandas(run, "item_id string, text string, error string")


def _summary_nodes(written: DataFrame, layer: int, encoding: str) -> DataFrame:
    """``tree_id, item_id, text, error, position`` -> node rows; a summary with an error has no text."""

    def run(parts: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        count = partial(count_tokens, encoding=encoding)
        for part in parts:
            ok = part["error"].isna() & part["text"].notna()
            yield pd.DataFrame({
                "tree_id": part["tree_id"], "id": part["item_id"], "layer": layer,
                "text": part["text"].where(ok, ""),
                "n_tokens": [count(t) if good else 0 for t, good in zip(part["text"], ok)],
                "chunk_id": None, "document_id": None,
                "status": np.where(ok, OK, FAILED),
                "error": part["error"].fillna("no summary").where(~ok, None),
                "position": part["position"],
            })

    return written.mapInPandas(run, _UNEMBEDDED)
