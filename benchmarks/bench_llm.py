"""LLM extraction throughput against a rate limit, through the local OpenAI-compatible server.

    python benchmarks/bench_llm.py --corpus ../shared/corpora/a_christmas_carol.txt --rpm 300 --latency 1.0

Prints requests/min sustained while calls were being served (first to last answer, measured by
the server) and over the whole stage (including Spark scheduling and Delta commits), each as a
share of the limit; wall time against the theoretical minimum (calls / limit); calls per chunk;
and the 429s received. The server enforces
the limit itself (sliding 60 s window, 429 + Retry-After), so overshooting shows up as 429s, and how near
it came as the fullest window the server saw (``busiest_window_share``). ``--tpm`` adds
a tokens/min limit (server and job); the shares are then of the limit the run used more of.
``--job-over F`` configures the job at F x the limits the server enforces (a key other callers share): the
shares stay of the server's limits, and the 429s show how soon the budget learnt them; with
``--limit-headers`` the server states its limits on every answer, as OpenAI does (``x-ratelimit-*``).
``--server-counts-max-tokens`` makes the server's tokens/min window count a call at its prompt and
``max_tokens`` when it arrives (OpenAI's and Azure OpenAI's accounting); ``--job-counts used`` runs the job as
if the provider counted what the calls used (what the job assumed of every provider before
``llm.chat.token_limit_counts``). The token shares are of what the server's window counted.

    python benchmarks/bench_llm.py --index --corpus ../shared/corpora/a_christmas_carol.txt \
        --chunk-size 1200 --rpm 120 --latency 10

``--connect`` runs the extraction through a local Spark Connect server (started here, as the tests
do): the path Databricks serverless and shared clusters take, with no coordinator, where each task
throttles to its share of the budget (``RateLimiter``), in waves; ``--connect-wave-s S`` (repeatable: each
value runs in turn) sets ``llm.connect_wave_s``, a tiny one keeping every wave at ``--items-per-commit``.

``--embed BATCH_SIZE`` measures endpoint embeddings of the corpus's chunks in executors instead (the
path of a table above ``DRIVER_EMBED_ROWS`` texts; classic, or waves on ``--connect``), requests limited
by the server at ``--rpm``:

    python benchmarks/bench_llm.py --embed 4 --connect --corpus ../shared/corpora/war_and_peace.txt --rpm 600

``--index`` runs the whole index instead (LLM extraction with gleanings, claims, summaries, LLM
reports, endpoint embeddings; each endpoint limited by the server at ``--rpm``, the job
configured to it) and prints the share of the limit sustained inside the chat LLM stages: while calling (a stage's
first call sent to its last answer), the best that measure can be at this latency (a stage of n
calls spans at least (n - 1) / limit + latency), while sending (first to last call sent: the rate
the budget let calls start at), and over the stages' wall time; end to end (all calls over the job's
wall time, Spark start-up included); the wall time of the non-LLM stages; and the dead time: the
seconds of the whole run in which no chat call was in flight (one run-wide timeline of the calls,
so a stage overlapped by another stage's calls is not dead), each counted once under the set of
stages running then; the seconds with no call of either model in flight; and the budget left unsent
(per 5 s of the run, the seconds of the limit no chat call was sent in, by the stages running then:
unlike dead time, it also counts a stage's last latency and its ramp, where calls are in flight but
fewer start than the limit allows).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from graphrag_spark import tables as T  # noqa: E402
from graphrag_spark.config import load_config  # noqa: E402
from graphrag_spark.index import embed  # noqa: E402
from graphrag_spark.index.chunks import build_text_units  # noqa: E402
from graphrag_spark.index.documents import build_documents  # noqa: E402
from graphrag_spark.index.extraction import extract_llm_instances  # noqa: E402
from graphrag_spark.index.pipeline import RunSummary, run_index  # noqa: E402
from graphrag_spark.llm.server import start_server  # noqa: E402
from graphrag_spark.llm.stage import new_run_id  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _session(stack: ExitStack, root: str, connect: bool, overrides: list[str]):
    """The benchmark's Spark session (through a local Spark Connect server with ``connect``) and config."""
    master = []
    if connect:
        from tests.connect_server import connect_server

        url = stack.enter_context(connect_server(REPO / ".cache" / "ivy", Path(root) / "connect_server.log"))
        master = [f"spark.master={url}"]
    cfg = load_config(REPO / "conf" / "local.yaml", [
        f"storage.root={root}", f"spark.ivy_cache={REPO / '.cache' / 'ivy'}", *overrides, *master])
    spark = build_spark(cfg.spark)
    stack.callback(spark.stop)  # before its Connect server stops: a client left open keeps the process alive
    return spark, cfg


def _text_units(spark, cfg, max_chunks: int | None) -> int:
    """The corpus chunked into the ``text_units`` table (its first ``max_chunks`` by id); their number."""
    store = T.TableStore(spark, cfg.storage)
    units = build_text_units(build_documents(spark, cfg.input).documents, cfg.chunking)
    if max_chunks:
        units = units.orderBy("id").limit(max_chunks)
    store.write(units, T.TEXT_UNITS)
    return store.read(T.TEXT_UNITS).count()


def _chunking(corpus: str, chunk_size: int) -> list[str]:
    return [f"input.path={corpus}", f"chunking.size={chunk_size}", f"chunking.overlap={min(100, chunk_size // 6)}"]


def _wave_time(connect_wave_s: float | None) -> list[str]:
    return [] if connect_wave_s is None else [f"llm.connect_wave_s={connect_wave_s:.10f}"]


def run(corpus: str, rpm: int, latency: float, chunk_size: int, gleanings: int, max_chunks: int | None,
        tpm: int | None = None, connect: bool = False, items_per_commit: int = 1000,
        connect_wave_s: float | None = None, job_over: float = 1.0, limit_headers: bool = False,
        server_counts_max_tokens: bool = False, job_counts: str = "auto", max_tokens: int | None = None,
        server_window_s: float = 60.0, job_interval_s: float | None = None) -> dict:
    root = tempfile.mkdtemp(prefix="bench_llm_")
    with ExitStack() as stack:
        server = stack.enter_context(start_server(latency_s=latency, requests_per_minute=rpm, tokens_per_minute=tpm,
                                                  limit_headers=limit_headers, count_max_tokens=server_counts_max_tokens,
                                                  window_s=server_window_s, seed=1))
        spark, cfg = _session(stack, root, connect, [
            *_chunking(corpus, chunk_size), "extraction.method=llm", f"extraction.max_gleanings={gleanings}",
            f"llm.chat.api_base={server.base_url}", f"llm.chat.requests_per_minute={round(rpm * job_over)}",
            *([f"llm.chat.limit_interval_s={job_interval_s}"] if job_interval_s else []),
            f"llm.chat.tokens_per_minute={round(tpm * job_over) if tpm else 100_000_000}", f"llm.items_per_commit={items_per_commit}",
            f"llm.chat.token_limit_counts={job_counts}", *([f"llm.chat.max_tokens={max_tokens}"] if max_tokens else []),
            *_wave_time(connect_wave_s)])
        store = T.TableStore(spark, cfg.storage)
        n_chunks = _text_units(spark, cfg, max_chunks)
        units = store.read(T.TEXT_UNITS)
        server.reset()
        started = time.perf_counter()
        usages = extract_llm_instances(spark, store, units, cfg.extraction, cfg.llm, new_run_id()).usages
        wall = time.perf_counter() - started
        stats = server.stats()
        commits = store.version(T.LLM_RESULTS) + 1  # on --connect, one a wave
    calls = stats["served"]["chat"]
    tokens = stats["counted_tokens"]  # what the server charged its tokens/min window (max_tokens where it counts them)
    span_s = stats["served_span_s"]
    # The limit that binds is the one the run used the larger share of: requests/min, or tokens/min with --tpm.
    binding = "tokens/min" if tpm and tokens / tpm >= calls / rpm else "requests/min"
    limit_per_minute, used = (tpm, tokens) if binding == "tokens/min" else (rpm, calls)
    sustained = used / span_s * 60 if span_s else 0.0
    return {"chunks": n_chunks, "calls": calls, "calls_per_chunk": round(calls / n_chunks, 2), "wall_s": round(wall, 1),
            "llm_results_commits": commits,
            "tokens": tokens, "tokens_per_call": round(tokens / max(1, calls)),
            "binding_limit": binding,
            "theoretical_min_s": round(used / limit_per_minute * 60, 1), "achieved_rpm": round(calls / wall * 60, 1),
            "limit_rpm": rpm, "achieved_tpm": round(tokens / wall * 60), "limit_tpm": tpm,
            "share_of_limit": round(used / wall * 60 / limit_per_minute, 3),
            "sustained_rpm_during_calls": round(calls / span_s * 60 if span_s else 0.0, 1),
            "sustained_tpm_during_calls": round(tokens / span_s * 60 if span_s else 0.0),
            "sustained_share": round(sustained / limit_per_minute, 3), "server_429s": stats["rate_limited"],
            # How near a 429 the run came: the fullest sliding window the server saw, as a share of the limit.
            "busiest_window_share": round(stats["busiest_window"].get(binding.split("/")[0], 0) / limit_per_minute, 3),
            "client_429s_seen": sum(u.n_429 for u in usages), "share_429": round(stats["rate_limited"] / max(1, calls), 4),
            "failures": sum(u.failures for u in usages),
            "service_latency_p50_s": usages[0].latency_p50_s, "service_latency_p95_s": usages[0].latency_p95_s,
            "queue_wait_p50_s": usages[0].queue_p50_s, "queue_wait_p95_s": usages[0].queue_p95_s,
            # Little's law: calls in flight on average while calls were being served.
            "mean_in_flight": round(calls * usages[0].latency_p50_s / stats["served_span_s"], 1) if stats["served_span_s"] else 0.0,
            "goal_95pct_inside_stage": sustained / limit_per_minute >= 0.95, "goal_429s_le_1pct": stats["rate_limited"] <= 0.01 * calls}


def run_embed_bench(corpus: str, rpm: int, latency: float, chunk_size: int, max_chunks: int | None,
                    batch_size: int, connect: bool, connect_wave_s: float | None = None,
                    items_per_commit: int | None = None) -> dict:
    """Endpoint embeddings of the corpus's chunks in executors (the path of a stage above
    ``DRIVER_EMBED_ROWS`` texts), against a server that limits them to ``rpm`` requests/min."""
    root = tempfile.mkdtemp(prefix="bench_llm_embed_")
    os.environ.setdefault("OPENAI_API_KEY", "bench-local")
    with ExitStack() as stack:
        server = stack.enter_context(start_server(latency_s=latency, requests_per_minute=rpm, seed=1))
        spark, cfg = _session(stack, root, connect, [
            *_chunking(corpus, chunk_size), "embeddings.provider=openai", f"embeddings.batch_size={batch_size}",
            f"llm.embedding.api_base={server.base_url}", f"llm.embedding.requests_per_minute={rpm}",
            "llm.embedding.tokens_per_minute=100000000", *_wave_time(connect_wave_s),
            *([f"llm.items_per_commit={items_per_commit}"] if items_per_commit else [])])
        store = T.TableStore(spark, cfg.storage)
        n_chunks = _text_units(spark, cfg, max_chunks)
        embed.DRIVER_EMBED_ROWS = 0  # the executor path whatever the corpus's size (the client decides it)
        server.reset()
        started = time.monotonic()
        counts = embed.build_embeddings(spark, store, cfg, names=(T.TEXT_UNIT_EMBEDDINGS,))[0]
        wall = time.monotonic() - started
        served, stats = server.served_intervals("embeddings"), server.stats()
        commits = store.version(T.EMBEDDING_CACHE) + 1  # on --connect, one a wave
    calls = len(served)
    span = max(b for _, b in served) - min(a for a, _ in served) if served else 0.0
    return {"texts": n_chunks, "texts_embedded": counts[f"{T.TEXT_UNIT_EMBEDDINGS} texts embedded"],
            "failed": counts[f"{T.TEXT_UNIT_EMBEDDINGS} failed"], "requests": calls, "limit_rpm": rpm,
            "wall_s": round(wall, 1), "theoretical_min_s": round(calls / rpm * 60, 1), "cache_commits": commits,
            "share_while_calling": round(calls / span * 60 / rpm, 3) if span else 0.0,
            "share_over_stage": round(calls / wall * 60 / rpm, 3),
            "server_429s": stats["rate_limited"],
            "busiest_window_share": round(stats["busiest_window"].get("requests", 0) / rpm, 3)}


def _busy_spans(served: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of the calls' (sent, answered) intervals, as sorted disjoint spans."""
    spans: list[tuple[float, float]] = []
    for start, end in sorted(served):
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((start, end))
    return spans


def dead_time(calls: list[tuple[float, float]], begin: float, end: float, stages: list[tuple[str, float, float]],
              min_gap_s: float) -> tuple[float, dict[str, float]]:
    """Seconds in [begin, end] with no call of ``calls`` in flight (a run-wide timeline: a call of any
    stage keeps the budget busy, whichever stage sent it), total and by what was running meanwhile.
    Each idle second is counted once, under the set of stages running then (``a+b`` where stages
    overlap), ``start-up`` before the first stage and ``between stages`` when none ran. Gaps shorter
    than ``min_gap_s`` are in the total only. ``stages``' offsets are from ``begin``."""
    idle, by_running, cursor = 0.0, {}, 0.0
    for start, stop in _busy_spans([(a - begin, b - begin) for a, b in calls]) + [(end - begin, end - begin)]:
        gap_end = min(start, end - begin)
        if gap_end > cursor:
            idle += gap_end - cursor
            if gap_end - cursor >= min_gap_s:
                for label, seconds in _running_during(stages, cursor, gap_end).items():
                    by_running[label] = round(by_running.get(label, 0.0) + seconds, 1)
        cursor = max(cursor, stop)
    return idle, dict(sorted(by_running.items(), key=lambda item: -item[1]))


def unsent_budget(sent_at: list[float], begin: float, end: float, stages: list[tuple[str, float, float]],
                  rate: float, bucket_s: float = 5.0) -> dict[str, float]:
    """Where the budget went unused: per ``bucket_s`` of the run, the seconds of budget no call was sent
    in (calls short of ``rate`` x ``bucket_s``, over ``rate``), summed by the stages running then (the
    bucket's middle; ``start-up`` before the first stage, ``between stages`` when none ran). Unlike dead
    time, it counts the stretches where calls are in flight but fewer are sent than the limit allows
    (a stage's last latency, a ramp)."""
    buckets = [0] * max(1, math.ceil((end - begin) / bucket_s))
    for sent in sent_at:
        buckets[min(len(buckets) - 1, max(0, int((sent - begin) // bucket_s)))] += 1
    unsent: dict[str, float] = {}
    for i, count in enumerate(buckets):
        width = min(bucket_s, end - begin - i * bucket_s)
        label = _running_at(stages, i * bucket_s + width / 2)
        unsent[label] = unsent.get(label, 0.0) + max(0.0, width - count / rate)
    return {label: round(seconds, 1) for label, seconds in sorted(unsent.items(), key=lambda item: -item[1])}


def _running_at(stages: list[tuple[str, float, float]], t: float) -> str:
    """The stages running at offset ``t`` (``a+b`` where they overlap), ``start-up`` before the first one
    and ``between stages`` when none ran."""
    running = [name for name, t0, t1 in stages if t0 <= t < t1]
    if running:
        return "+".join(running)
    return "start-up" if t < min((a for _, a, _ in stages), default=float("inf")) else "between stages"


def _running_during(stages: list[tuple[str, float, float]], s0: float, s1: float) -> dict[str, float]:
    """The span [s0, s1] cut where a stage starts or ends: seconds per set of running stages."""
    cuts = sorted({s0, s1, *(t for _, a, b in stages for t in (a, b) if s0 < t < s1)})
    seconds: dict[str, float] = {}
    for a, b in zip(cuts, cuts[1:]):
        label = _running_at(stages, (a + b) / 2)
        seconds[label] = seconds.get(label, 0.0) + (b - a)
    return seconds


def _run_recording_stages(spark, cfg, stages: list, begin: float):
    """``run_index``, appending (stage, start, end) offsets from ``begin`` of every top-level stage to ``stages``."""
    original = RunSummary.stage

    @contextmanager
    def recorded(self, name):
        started = time.monotonic()
        with original(self, name):
            yield
        stages.append((name, started - begin, time.monotonic() - begin))

    RunSummary.stage = recorded
    try:
        return run_index(spark, cfg)
    finally:
        RunSummary.stage = original


def run_index_bench(corpus: str, rpm: int, latency: float, chunk_size: int, gleanings: int) -> dict:
    """The whole index against a rate-limited server; shares of the limit inside LLM stages and end to end."""
    root = tempfile.mkdtemp(prefix="bench_llm_index_")
    with start_server(latency_s=latency, requests_per_minute=rpm, limit_per_endpoint=True, seed=1) as server:
        overrides = [
            *_chunking(corpus, chunk_size), f"storage.root={root}", "extraction.method=llm",
            f"extraction.max_gleanings={gleanings}", "reports.method=llm", "embeddings.provider=openai",
            f"llm.chat.api_base={server.base_url}", f"llm.chat.requests_per_minute={rpm}",
            f"llm.embedding.api_base={server.base_url}", f"llm.embedding.requests_per_minute={rpm}",
            "llm.chat.tokens_per_minute=100000000", "llm.embedding.tokens_per_minute=100000000",
            f"spark.ivy_cache={REPO / '.cache' / 'ivy'}"]
        os.environ.setdefault("OPENAI_API_KEY", "bench-local")
        cfg = load_config(REPO / "conf" / "local.yaml", overrides)
        begin = time.monotonic()
        spark = build_spark(cfg.spark)
        session_s = time.monotonic() - begin
        stages: list[tuple[str, float, float]] = []
        summary = _run_recording_stages(spark, cfg, stages, begin)
        end = time.monotonic()
        calls, chat_calls = server.served_intervals(), server.served_intervals("chat")
        stats = server.stats()
        warm_begin = time.monotonic()
        warm = run_index(spark, cfg)
        warm_s = time.monotonic() - warm_begin
        warm_calls = server.stats()["served"]
    # The chat model's budget is the one the shares measure: idle while no chat call is in flight.
    idle, idle_by_stage = dead_time(chat_calls, begin, end, stages, min_gap_s=max(1.0, latency / 2))
    idle_any, _ = dead_time(calls, begin, end, stages, min_gap_s=max(1.0, latency / 2))
    chat, embeddings = stats["served"]["chat"], stats["served"]["embeddings"]
    llm_stages = {"extraction", "summarize_descriptions", "community_reports", "text_unit_embeddings", "entity_embeddings"}
    chat_stages = llm_stages - {"text_unit_embeddings", "entity_embeddings"}  # the chat model's limit is the one to fill
    non_llm_s = sum(s for name, s in summary.seconds.items() if name not in llm_stages)
    # Inside the LLM stages: from each stage's first call sent to its last answer (what the rate limit
    # can see), and over the stages' whole wall time (their Spark work before and after the calls too).
    # Sending: from a stage's first call sent to its last call sent (the budget's view: the rate at which
    # calls start). From first sent to last answered also counts the last calls' service time, so a stage
    # of n calls can reach at most n / (n - 1 + rate x latency) of the limit that way.
    calling_s, sending_s, bound_s, stage_wall_s, stage_calls, sent_gaps = 0.0, 0.0, 0.0, 0.0, 0, 0
    per_stage = {}
    rate = rpm / 60.0
    for name, s0, s1 in stages:
        inside = [(a, b) for a, b in chat_calls if s0 <= a - begin < s1]
        if name in chat_stages and inside:
            span = max(b for _, b in inside) - min(a for a, _ in inside)
            sent = max(a for a, _ in inside) - min(a for a, _ in inside)
            calling_s += span
            sending_s += sent
            bound_s += (len(inside) - 1) / rate + latency
            stage_wall_s += s1 - s0
            stage_calls += len(inside)
            sent_gaps += len(inside) - 1
            per_stage[name] = (f"{len(inside)} calls, calling {span:.1f}s (share {len(inside) / span / rate:.3f}), "
                               f"sending {sent:.1f}s (share {(len(inside) - 1) / sent / rate if sent else 0:.3f}), "
                               f"stage {s1 - s0:.1f}s")
    wall = end - begin
    return {
        "latency_s": latency, "limit_rpm": rpm, "chat_calls": chat, "embedding_calls": embeddings,
        "wall_s": round(wall, 1), "session_start_s": round(session_s, 1),
        "theoretical_min_s": round(chat / rpm * 60, 1),
        "share_while_calling": round(stage_calls / calling_s * 60 / rpm, 3) if calling_s else 0.0,
        "share_while_calling_at_best": round(stage_calls / bound_s / rate, 3) if bound_s else 0.0,
        "share_while_sending": round(sent_gaps / sending_s / rate, 3) if sending_s else 0.0,
        "chat_stages": per_stage,
        "share_over_llm_stage_wall": round(stage_calls / stage_wall_s * 60 / rpm, 3) if stage_wall_s else 0.0,
        "share_end_to_end": round(chat / wall * 60 / rpm, 3),
        "server_429s": stats["rate_limited"],
        "busiest_window_share": round(stats["busiest_window"].get("requests", 0) / rpm, 3),
        "dead_time_s": round(idle, 1), "dead_time_by_running_stages": idle_by_stage,
        "dead_time_no_call_of_any_model_s": round(idle_any, 1),
        "unsent_budget_s_by_running_stages": unsent_budget([a for a, _ in chat_calls], begin, end, stages, rate),
        "non_llm_stages_s": round(non_llm_s, 1),
        "stage_s": summary.seconds,
        "llm_stages": [f"{u.stage}: {u.items} items {u.calls} calls {u.wall_s}s" for u in summary.usage],
        "report_counts": {key: value for key, value in summary.counts.items() if "report" in key},
        "warm_rerun_s": round(warm_s, 1),
        "warm_rerun_paid_calls": warm_calls["chat"] + warm_calls["embeddings"] - chat - embeddings,
        "warm_rerun_mode": warm.mode,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", action="append", required=True, help="file or folder; repeat for several sizes")
    parser.add_argument("--rpm", type=int, default=300)
    parser.add_argument("--job-over", type=float, default=1.0,
                        help="the job configured to this many times the limits the server enforces (extraction only):"
                             " above 1, a key the job shares with other callers, or limits set too high")
    parser.add_argument("--limit-headers", action="store_true",
                        help="the server states its limits on every answer (x-ratelimit-*, as OpenAI does; extraction only)")
    parser.add_argument("--tpm", type=int, default=None,
                        help="a tokens/min limit too, on the server and in the job (extraction only): with a high --rpm it binds")
    parser.add_argument("--server-counts-max-tokens", action="store_true",
                        help="the server's tokens/min window counts a chat call's prompt and max_tokens when it arrives, as"
                             " OpenAI and Azure OpenAI do (extraction only)")
    parser.add_argument("--job-counts", choices=["auto", "used", "max_tokens"], default="auto",
                        help="llm.chat.token_limit_counts: what the job takes the provider's tokens/min to count")
    parser.add_argument("--max-tokens", type=int, default=None, help="llm.chat.max_tokens (the config's default unset)")
    parser.add_argument("--server-window", type=float, default=60.0, metavar="S",
                        help="the server enforces the limits over S s (at S/60 of them), as Azure OpenAI enforces "
                             "its requests/min over 1 s or 10 s")
    parser.add_argument("--job-interval", type=float, default=None, metavar="S",
                        help="llm.chat.limit_interval_s: the interval the job takes the limits to be enforced over")
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--chunk-size", type=int, default=600)
    parser.add_argument("--gleanings", type=int, default=1)
    parser.add_argument("--max-chunks", type=int, default=None)
    parser.add_argument("--items-per-commit", type=int, default=None,
                        help="llm.items_per_commit (on --connect, the first wave's items and the fewest of any; "
                             "extraction: 1000 unset, embeddings: the config's)")
    parser.add_argument("--connect-wave-s", type=float, action="append", default=None,
                        help="on --connect: llm.connect_wave_s (the budget's seconds a later wave holds; the config's "
                             "default unset); repeat to run each in turn, e.g. 0.00000001 (every wave at its fewest) "
                             "against the default 300"),
    parser.add_argument("--connect", action="store_true", help="through a local Spark Connect server")
    parser.add_argument("--index", action="store_true", help="run the whole index (see the module's docstring)")
    parser.add_argument("--embed", type=int, default=None, metavar="BATCH_SIZE",
                        help="endpoint embeddings of the chunks in executors instead, this many texts a request")
    args = parser.parse_args()
    for corpus, connect_wave_s in ((c, w) for c in args.corpus for w in args.connect_wave_s or [None]):
        waves = f" (llm.connect_wave_s={connect_wave_s})" if connect_wave_s is not None else ""
        if args.index:
            result = run_index_bench(corpus, args.rpm, args.latency, args.chunk_size, args.gleanings)
            print(f"{corpus} (whole index): " + ", ".join(f"{k}={v}" for k, v in result.items()), flush=True)
            continue
        if args.embed:
            result = run_embed_bench(corpus, args.rpm, args.latency, args.chunk_size, args.max_chunks, args.embed,
                                     args.connect, connect_wave_s, args.items_per_commit)
            print(f"{corpus}{waves} (endpoint embeddings in executors): " + ", ".join(f"{k}={v}" for k, v in result.items()),
                  flush=True)
            continue
        result = run(corpus, args.rpm, args.latency, args.chunk_size, args.gleanings, args.max_chunks, args.tpm, args.connect,
                     args.items_per_commit or 1000, connect_wave_s, args.job_over, args.limit_headers,
                     args.server_counts_max_tokens, args.job_counts, args.max_tokens, args.server_window,
                     args.job_interval)
        print(f"{corpus}{waves}: " + ", ".join(f"{k}={v}" for k, v in result.items()), flush=True)


if __name__ == "__main__":
    main()
