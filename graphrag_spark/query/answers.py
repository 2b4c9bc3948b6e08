"""The final answer of a single-context method (basic, local): one LLM call over the context, or offline
an extractive answer from the same context. A question with an empty context gets the no-answer
text without a call."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import pandas as pd
from pyspark.sql import SparkSession

from graphrag_spark.config import Config
from graphrag_spark.embeddings import Embedder, OpenAIEmbedder
from graphrag_spark.prompts import load_prompt
from graphrag_spark.query.context import NO_ANSWER, extractive_answer
from graphrag_spark.query.executors import chat_in_executors
from graphrag_spark.query.global_search import SearchResult


@dataclass
class Answer:
    text: str
    calls: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


def answer_all(spark: SparkSession, prompt_name: str, questions: list[str], contexts: list[str],
               passages: list[Sequence[tuple[str, object, str]]], cfg: Config, lead: str) -> list[Answer]:
    """``contexts[i]`` is the prompt data of ``questions[i]``; ``passages[i]`` the same rows as
    ``(table, id, text)`` for the offline answer. All LLM calls run as one Spark job."""
    q = cfg.query
    if not q.llm:
        return [Answer(extractive_answer(question, rows, q.max_answer_points, lead) if rows else NO_ANSWER)
                for question, rows in zip(questions, passages)]
    prompt = load_prompt(prompt_name)
    asked = [i for i, context in enumerate(contexts) if context]
    results = chat_in_executors(spark, [prompt.messages(question=questions[i], context_data=contexts[i], response_type=q.response_type)
                                        for i in asked], cfg.llm.chat, stage=prompt_name, max_tokens=q.answer_max_tokens,
                                prompt_version=prompt.version, max_in_flight=cfg.llm.max_in_flight)
    answers = [Answer(NO_ANSWER) for _ in questions]
    for i, result in zip(asked, results):
        answers[i] = Answer(result.text if result.ok else f"The answer could not be generated: {result.error}", calls=1,
                            failed=int(not result.ok), prompt_tokens=result.prompt_tokens,
                            completion_tokens=result.completion_tokens)
    return answers


def single_context_results(method: str, level: int | None, answers: list[Answer], contexts: list[tuple[str, pd.DataFrame, int]],
                           embedder: Embedder, started: float) -> list[SearchResult]:
    """SearchResults of a single-context method; ``contexts[i]`` = (text, context rows, tokens) of answer i.
    The questions were embedded in one call when the embedder is an endpoint."""
    latency = (time.perf_counter() - started) / max(1, len(answers))
    embedding_calls = 1 if isinstance(embedder, OpenAIEmbedder) else 0
    return [SearchResult(answer=answer.text, method=method, level=level, context=frame, points=pd.DataFrame(),
                         context_units=len(frame), context_tokens=tokens, llm_calls=answer.calls, latency_s=latency,
                         prompt_tokens=answer.prompt_tokens, completion_tokens=answer.completion_tokens,
                         failed_llm_calls=answer.failed, embedding_calls=embedding_calls, context_text=text)
            for (text, frame, tokens), answer in zip(contexts, answers)]
