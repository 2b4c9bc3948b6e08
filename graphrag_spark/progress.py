"""One progress line per stage on the console: live in place on a terminal, periodic lines in a log.

The line shows the stage, its elapsed time, Spark's tasks done/total (from the status tracker) and,
for an LLM stage, items done/total, calls, 429s, tokens, cost so far and an ETA. LLM figures come
from a ``LlmMeter`` on the driver: each item's row as the stage's coordinator takes it from a task
(so they move as items return, not when a task that may last the whole stage ends). On Spark
Connect (no status tracker, no coordinator) the line shows elapsed time and the LLM figures wave by
wave, as each wave's rows come back to the client.

Jobs open a ``console_progress(spark)``; library code reports through ``stage()`` and
``llm_meter()``, which do nothing when no progress is open (tests, notebooks, the query API).

``GRAPHRAG_SPARK_PROGRESS``: ``tty`` (redraw in place), ``log`` (a line every
``GRAPHRAG_SPARK_PROGRESS_EVERY_S`` seconds, default 30) or ``off``; unset = ``tty`` when stderr
is a terminal, else ``log``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Iterator

from graphrag_spark.compat import is_connect


@dataclass
class LlmCounts:
    items_done: int = 0
    items_total: int = 0
    calls: int = 0
    n_429: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def eta_seconds(done: int, total: int, elapsed_s: float) -> float | None:
    """Time left at the rate so far; None until there is a rate."""
    if done <= 0 or elapsed_s <= 0 or total <= done:
        return None if total > done else 0.0
    return (total - done) * elapsed_s / done


def format_line(stage: str, elapsed_s: float, tasks: tuple[int, int] | None = None,
                llm: LlmCounts | None = None, llm_elapsed_s: float | None = None) -> str:
    """The progress line: pure, so its content is tested without Spark."""
    parts = [f"[{stage}]", format_duration(elapsed_s)]
    if llm is not None:
        parts.append(f"items {llm.items_done:,}/{llm.items_total:,}")
        parts.append(f"calls {llm.calls:,}")
        parts.append(f"429s {llm.n_429:,}")
        parts.append(f"tokens {llm.prompt_tokens + llm.completion_tokens:,}")
        parts.append(f"${llm.cost_usd:.4f}")
        eta = eta_seconds(llm.items_done, llm.items_total, llm_elapsed_s if llm_elapsed_s is not None else elapsed_s)
        parts.append(f"ETA {format_duration(eta) if eta is not None else '?'}")
    if tasks is not None and tasks[1]:
        parts.append(f"spark tasks {tasks[0]:,}/{tasks[1]:,}")
    return "  ".join(parts)


class LlmMeter:
    """An LLM stage's figures for its progress line, fed on the driver (``result``, ``returned``)."""

    def __init__(self, stage: str, total: int, price_per_1k_prompt: float, price_per_1k_completion: float):
        self.stage = stage
        self.total = total
        self.started = time.perf_counter()
        self._prices = (price_per_1k_prompt, price_per_1k_completion)
        self._lock = threading.Lock()  # rows come from the coordinator's request threads
        self._seen = LlmCounts()

    def result(self, row: dict) -> None:
        """An item's ``llm_results`` row, as the coordinator took it from a task."""
        self._add(1, row["n_calls"], row["n_429"], row["prompt_tokens"], row["completion_tokens"])

    def returned(self, figures, items: int) -> None:
        """A wave of ``items`` came back to the driver with its usage ``figures`` (Spark Connect)."""
        self._add(items, figures.calls, figures.n_429, figures.prompt_tokens, figures.completion_tokens)

    def _add(self, items: int, calls: int, n_429: int, prompt_tokens: int, completion_tokens: int) -> None:
        with self._lock:
            seen = self._seen
            seen.items_done += items
            seen.calls += calls
            seen.n_429 += n_429
            seen.prompt_tokens += prompt_tokens
            seen.completion_tokens += completion_tokens

    def counts(self) -> LlmCounts:
        with self._lock:
            seen = self._seen
            cost = seen.prompt_tokens / 1000 * self._prices[0] + seen.completion_tokens / 1000 * self._prices[1]
            return LlmCounts(items_done=min(self.total, seen.items_done), items_total=self.total,
                             calls=seen.calls, n_429=seen.n_429, prompt_tokens=seen.prompt_tokens,
                             completion_tokens=seen.completion_tokens, cost_usd=cost)


class ConsoleProgress:
    def __init__(self, spark, stream: IO[str], mode: str, every_s: float):
        self._spark = spark
        self._stream = stream
        self._tty = mode == "tty"
        self._every_s = 0.5 if self._tty else every_s
        self._tracker = None if is_connect(spark) else spark.sparkContext.statusTracker()
        self._lock = threading.Lock()
        # The stages running now (the index runs independent stages at once), each with its start
        # and LLM meter; a meter belongs to the stage of the thread that opened it.
        self._stages: dict[str, list] = {}
        self._thread_stage = threading.local()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="graphrag-progress", daemon=True)
        self._width = 0

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _tasks(self) -> tuple[int, int] | None:
        if self._tracker is None:
            return None
        done = total = 0
        for stage_id in self._tracker.getActiveStageIds():
            info = self._tracker.getStageInfo(stage_id)
            if info is not None:
                done += info.numCompletedTasks
                total += info.numTasks
        return done, total

    def _stage_line(self, name: str, tasks: tuple[int, int] | None) -> str:
        started, meter = self._stages[name]
        now = time.perf_counter()
        label = name if meter is None or meter.stage == name else f"{name}: {meter.stage}"
        return format_line(label, now - started, tasks, meter.counts() if meter else None,
                           now - meter.started if meter else None)

    def _line(self, only: str | None = None) -> str | None:
        """One stage's final line (``only``), or the running stages' lines side by side (Spark's tasks on the
        first: the tracker cannot tell which stage a task is of, and a stage that ends shows none of the tasks
        the stages still running have)."""
        with self._lock:
            names = [only] if only is not None else list(self._stages)
            if not names or names[0] not in self._stages:
                return None
            tasks = self._tasks() if only is None else None
            return "  |  ".join(self._stage_line(name, tasks if i == 0 else None) for i, name in enumerate(names))

    def _write(self, line: str, final: bool) -> None:
        if self._tty:
            padding = " " * max(0, self._width - len(line))
            self._width = 0 if final else len(line)
            self._stream.write("\r" + line + padding + ("\n" if final else ""))
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self._every_s):
            line = self._line()
            if line is not None:
                self._write(line, final=False)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        with self._lock:
            self._stages[name] = [time.perf_counter(), None]
        self._thread_stage.name = name
        succeeded = False
        try:
            yield
            succeeded = True
        finally:
            line = self._line(name)
            with self._lock:
                del self._stages[name]
            self._thread_stage.name = None
            if line is not None and succeeded:
                self._write(line.replace("]", "] done", 1), final=True)
            elif self._tty and self._width:
                # A failing stage leaves the console to its error sentence: erase the live line.
                self._stream.write("\r" + " " * self._width + "\r")
                self._stream.flush()
                self._width = 0

    def track(self, meter: LlmMeter) -> None:
        with self._lock:
            name = getattr(self._thread_stage, "name", None) or next(reversed(self._stages), None)
            if name in self._stages:
                self._stages[name][1] = meter


_active: ConsoleProgress | None = None


def progress_mode(stream: IO[str]) -> str:
    mode = os.environ.get("GRAPHRAG_SPARK_PROGRESS", "").lower()
    if mode in ("tty", "log", "off"):
        return mode
    return "tty" if stream.isatty() else "log"


@contextmanager
def console_progress(spark, stream: IO[str] | None = None) -> Iterator[None]:
    """Show progress lines on ``stream`` (stderr) while the block runs."""
    global _active
    stream = stream or sys.stderr
    mode = progress_mode(stream)
    if mode == "off":
        yield
        return
    progress = ConsoleProgress(spark, stream, mode, float(os.environ.get("GRAPHRAG_SPARK_PROGRESS_EVERY_S", "30")))
    _active = progress
    progress.start()
    try:
        yield
    finally:
        progress.close()
        _active = None


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Mark a stage of the running job (no-op without an open console_progress)."""
    if _active is None:
        yield
        return
    with _active.stage(name):
        yield


def llm_meter(stage_name: str, total: int, price_per_1k_prompt: float = 0.0,
              price_per_1k_completion: float = 0.0) -> LlmMeter:
    """A meter for an LLM stage's ``total`` pending items; shown on the open progress line, if any."""
    meter = LlmMeter(stage_name, total, price_per_1k_prompt, price_per_1k_completion)
    if _active is not None:
        _active.track(meter)
    return meter
