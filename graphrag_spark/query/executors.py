"""Query work as Spark jobs: a list of payloads in, one result per payload out, computed in executors.

Every query-time LLM call (map, reduce, answers) runs in an executor: one row per call, at most
``defaultParallelism`` partitions, each partition's calls sent concurrently by the project
client with its share of the request/token budget. Results come back in payload order; a call
that finally fails comes back as a ``CallResult`` with ``error`` set.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable, Iterator

import pandas as pd
from pyspark.sql import SparkSession

from graphrag_spark.compat import llm_tasks
from graphrag_spark.config import LlmModelConfig
from graphrag_spark.llm.client import CallResult, ChatRequest, run_batch, task_concurrency
from graphrag_spark.llm.secrets import ensure_api_key


def run_in_executors(spark: SparkSession, payloads: list[str], fn: Callable[[list[str]], list[str]]) -> list[str]:
    """``fn`` maps a partition's payloads to as many result strings; runs as one Spark job."""
    if not payloads:
        return []
    frame = spark.createDataFrame(pd.DataFrame({"position": range(len(payloads)), "payload": payloads}))

    def run(parts: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for part in parts:
            yield pd.DataFrame({"position": part["position"], "result": fn(part["payload"].tolist())})

    rows = frame.repartition(llm_tasks(spark, len(payloads))).mapInPandas(run, "position long, result string").collect()
    return [row.result for row in sorted(rows, key=lambda row: row.position)]


Prompt = str | list[dict[str, str]]  # one user message, or the messages (system + user) of ``Prompt.messages``


def chat_calls(prompts: list[Prompt], cfg: LlmModelConfig, share: float, *, stage: str, max_tokens: int,
               json_mode: bool = False, prompt_version: str = "", max_in_flight: int) -> list[str]:
    """In an executor: one chat call per prompt, concurrently (the task's ``share`` of the job's
    ``max_in_flight`` at most); encoded results."""
    requests = [ChatRequest(messages=prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}],
                            stage=stage, max_tokens=max_tokens, json_mode=json_mode, prompt_version=prompt_version)
                for prompt in prompts]
    return [json.dumps(dataclasses.asdict(result)) for result in run_batch(requests, cfg, share,
                                                                             task_concurrency(cfg, max_in_flight, share))]


def decode_call(encoded: str) -> CallResult:
    return CallResult(**json.loads(encoded))


def chat_in_executors(spark: SparkSession, prompts: list[Prompt], cfg: LlmModelConfig, *, stage: str, max_tokens: int,
                      json_mode: bool = False, prompt_version: str = "", max_in_flight: int) -> list[CallResult]:
    """Prompts rendered on the driver, called in executors (``max_in_flight``: ``llm.max_in_flight``)."""
    ensure_api_key(cfg)
    share = 1.0 / llm_tasks(spark, len(prompts))
    encoded = run_in_executors(spark, [json.dumps(p) for p in prompts], lambda batch: chat_calls(
        [json.loads(p) for p in batch], cfg, share, stage=stage, max_tokens=max_tokens, json_mode=json_mode,
        prompt_version=prompt_version, max_in_flight=max_in_flight))
    return [decode_call(text) for text in encoded]
