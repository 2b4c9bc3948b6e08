"""This project and microsoft/graphrag 3.3.0 on the same work, one after the other, against the same server.

    python benchmarks/bench_vs_graphrag.py --corpus ../shared/corpora/a_christmas_carol.txt --latency 1.0

Both index the corpus (1200/100 cl100k chunks, 1 gleaning, LLM description summaries, LLM
community reports, endpoint embeddings, no claims: graphrag's default) through the project's
local OpenAI-compatible server (``llm/server.py``, which also recognises graphrag's prompts),
then index it again unchanged (the warm rerun). For each run the table shows the wall time (the
whole command, interpreter and Spark start-up included), the chat and embedding calls the
server answered, and the most calls it had in flight at once. ``--rpm`` limits the server (and
configures both systems to the limit).

graphrag is installed into its own virtual environment outside the repository
(``--graphrag-venv``, default ``/work/bench-graphrag/.venv``; created with
``pip install graphrag==3.3.0`` if it is missing). It is never a dependency of this project
and none of its code is used here: it runs as its own command.

The same work on both sides: 1 gleaning sent directly (this project's default
``extraction.gleaning_check: between`` is graphrag's order: 2 calls per chunk), and communities of
the largest connected component only (graphrag's ``cluster_graph.use_lcc`` default; this project's
``graph.largest_component_only`` is set to match, its own default clusters every component, so
the small components get reports too). Work that still differs: graphrag embeds every community
report (this project embeds text units and entities), and each system summarizes the descriptions
by its own rule (this project: only elements with two or more distinct descriptions).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from graphrag_spark.llm.server import start_server  # noqa: E402

GRAPHRAG_VERSION = "3.3.0"


def ensure_graphrag(venv: Path) -> Path:
    """The ``graphrag`` command of its benchmark venv, created if missing (outside the repository)."""
    if REPO in venv.resolve().parents:
        raise SystemExit(f"--graphrag-venv must be outside the repository ({REPO}); got {venv}")
    command = venv / "bin" / "graphrag"
    if not command.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"graphrag=={GRAPHRAG_VERSION}"], check=True)
    return command


def peak_in_flight(intervals: list[tuple[float, float]]) -> int:
    """The most (admitted, answered) intervals open at one instant."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def graphrag_settings(base_url: str, rpm: int | None) -> str:
    rate_limit = (f"""
    rate_limit:
      type: sliding_window
      period_in_seconds: 60
      requests_per_period: {rpm}""" if rpm else "")
    return textwrap.dedent(f"""\
        completion_models:
          default_completion_model:
            model_provider: openai
            model: gpt-4o-mini
            api_base: {base_url}
            api_key: local-bench-key
            retry:
              type: exponential_backoff{rate_limit}
        embedding_models:
          default_embedding_model:
            model_provider: openai
            model: text-embedding-3-small
            api_base: {base_url}
            api_key: local-bench-key
            retry:
              type: exponential_backoff{rate_limit}
        input:
          type: text
        chunking:
          type: tokens
          size: 1200
          overlap: 100
          encoding_model: cl100k_base
        input_storage:
          type: file
          base_dir: "input"
        output_storage:
          type: file
          base_dir: "output"
        reporting:
          type: file
          base_dir: "logs"
        cache:
          type: json
          storage:
            type: file
            base_dir: "cache"
        vector_store:
          type: lancedb
          db_uri: output/lancedb
        embed_text:
          embedding_model_id: default_embedding_model
        extract_graph:
          completion_model_id: default_completion_model
          prompt: "prompts/extract_graph.txt"
          entity_types: [organization,person,geo,event]
          max_gleanings: 1
        summarize_descriptions:
          completion_model_id: default_completion_model
          prompt: "prompts/summarize_descriptions.txt"
          max_length: 500
        cluster_graph:
          max_cluster_size: 10
        extract_claims:
          enabled: false
        community_reports:
          completion_model_id: default_completion_model
          graph_prompt: "prompts/community_report_graph.txt"
          text_prompt: "prompts/community_report_text.txt"
          max_length: 2000
          max_input_length: 8000
        """).replace("    rate_limit:", "    rate_limit:")


def timed(server, command: list[str], cwd: Path, env: dict, log: Path) -> dict:
    """Run one indexing command; its wall time and what the server saw meanwhile."""
    server.reset()
    started = time.perf_counter()
    with log.open("w") as out:
        result = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=3600)
    wall = time.perf_counter() - started
    stats = server.stats()
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} failed ({result.returncode}); see {log}:\n"
                         + log.read_text()[-3000:])
    return {"wall_s": round(wall, 1), "chat": stats["served"]["chat"], "embeddings": stats["served"]["embeddings"],
            "429s": stats["rate_limited"], "peak_in_flight": peak_in_flight(server.served_intervals())}


def run_graphrag(server, graphrag: Path, corpus: Path, work: Path, rpm: int | None) -> tuple[dict, dict]:
    root = work / "graphrag"
    if root.exists():
        shutil.rmtree(root)
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "GRAPHRAG_API_KEY": "local-bench-key"}
    subprocess.run([str(graphrag), "init", "--root", str(root), "--force", "-m", "gpt-4o-mini",
                    "-e", "text-embedding-3-small"], check=True, env=env, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL)
    (root / "settings.yaml").write_text(graphrag_settings(server.base_url, rpm))
    (root / "input").mkdir(exist_ok=True)
    shutil.copy(corpus, root / "input" / corpus.name)
    command = [str(graphrag), "index", "--root", str(root)]
    cold = timed(server, command, root, env, work / "graphrag_cold.log")
    warm = timed(server, command, root, env, work / "graphrag_warm.log")
    return cold, warm


def run_ours(server, corpus: Path, work: Path, rpm: int | None) -> tuple[dict, dict]:
    root = work / "ours"
    if root.exists():
        shutil.rmtree(root)
    limits = [f"llm.chat.requests_per_minute={rpm}", f"llm.embedding.requests_per_minute={rpm}"] if rpm else [
        "llm.chat.requests_per_minute=100000", "llm.embedding.requests_per_minute=100000"]
    settings = [f"input.path={corpus}", f"storage.root={root}", "extraction.method=llm", "chunking.size=1200",
                "chunking.overlap=100", "extraction.max_gleanings=1", "extraction.gleaning_check=between",
                "graph.largest_component_only=true", "extraction.claims=false",
                "reports.method=llm", "embeddings.provider=openai",
                f"llm.chat.api_base={server.base_url}", f"llm.embedding.api_base={server.base_url}",
                "llm.chat.tokens_per_minute=1000000000", "llm.embedding.tokens_per_minute=1000000000", *limits]
    command = [sys.executable, str(REPO / "jobs" / "index.py"), "--config", str(REPO / "conf" / "local.yaml")]
    for setting in settings:
        command += ["--set", setting]
    env = {**os.environ, "OPENAI_API_KEY": "local-bench-key", "GRAPHRAG_SPARK_PROGRESS": "off",
           "SPARK_LOCAL_IP": "127.0.0.1"}
    cold = timed(server, command, REPO, env, work / "ours_cold.log")
    warm = timed(server, command, REPO, env, work / "ours_warm.log")
    return cold, warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "corpora" / "a_christmas_carol.txt")
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--rpm", type=int, default=None, help="server limit and both systems' configured limit")
    parser.add_argument("--graphrag-venv", type=Path, default=Path("/work/bench-graphrag/.venv"))
    parser.add_argument("--only", choices=["both", "ours", "graphrag"], default="both")
    args = parser.parse_args()
    graphrag = ensure_graphrag(args.graphrag_venv) if args.only != "ours" else None
    work = Path(tempfile.mkdtemp(prefix="bench_vs_graphrag_"))
    rows = {}
    with start_server(latency_s=args.latency, requests_per_minute=args.rpm, limit_per_endpoint=True,
                      seed=1) as server:
        if args.only != "ours":
            rows["graphrag 3.3.0"] = run_graphrag(server, graphrag, args.corpus.resolve(), work, args.rpm)
        if args.only != "graphrag":
            rows["graphrag-spark"] = run_ours(server, args.corpus.resolve(), work, args.rpm)
    limit = f"server and both limited to {args.rpm} RPM" if args.rpm else "no rate limit"
    print(f"{args.corpus.name}, latency {args.latency} s, {limit} (logs in {work})")
    print(f"{'system':<16} {'run':<5} {'wall s':>8} {'chat':>6} {'embed':>6} {'429s':>5} {'peak in flight':>15}")
    for system, runs in rows.items():
        for name, row in zip(("cold", "warm"), runs):
            print(f"{system:<16} {name:<5} {row['wall_s']:>8} {row['chat']:>6} {row['embeddings']:>6} "
                  f"{row['429s']:>5} {row['peak_in_flight']:>15}")
    if len(rows) == 2:
        (ours_cold, ours_warm), (theirs_cold, theirs_warm) = rows["graphrag-spark"], rows["graphrag 3.3.0"]
        print(f"cold wall ratio (ours / graphrag) {ours_cold['wall_s'] / theirs_cold['wall_s']:.2f}  (goal <= 0.5)")
        print(f"cold calls ratio {(ours_cold['chat'] + ours_cold['embeddings']) / max(1, theirs_cold['chat'] + theirs_cold['embeddings']):.2f}"
              "  (goal <= 1 for equivalent work)")
        print(f"warm wall ratio {ours_warm['wall_s'] / theirs_warm['wall_s']:.2f}  (goal <= 0.5); "
              f"warm paid calls ours {ours_warm['chat'] + ours_warm['embeddings']}, "
              f"graphrag {theirs_warm['chat'] + theirs_warm['embeddings']}  (goal: ours 0)")


if __name__ == "__main__":
    main()
