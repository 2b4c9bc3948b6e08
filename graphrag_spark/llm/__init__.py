"""LLM access for every stage: the throttled, retrying client and its synchronous façade for Spark UDFs."""

from graphrag_spark.llm.client import (
    CallResult,
    ChatRequest,
    EmbedResult,
    LlmClient,
    cache_key,
    run_batch,
    run_items,
)

__all__ = ["CallResult", "ChatRequest", "EmbedResult", "LlmClient", "cache_key", "run_batch", "run_items"]
