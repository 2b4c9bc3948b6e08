"""What a refresh costs against a full index: LLM calls per stage and wall time, through the local server.

    python benchmarks/bench_refresh.py                       # A Christmas Carol + data/sample
    python benchmarks/bench_refresh.py --corpus ../shared/corpora/a_christmas_carol.txt \\
        --corpus ../shared/corpora/operation_dulce.md --corpus data/sample

Steps, each a run of the index job on the same root: a full index; add one new document of ~1% of
the corpus tokens; add ~10% more (new documents); change one document; delete one; change nothing.
New text is cut from War and Peace (not in the corpus). Prints chat calls per LLM stage and
embedding requests per step side by side, each total as a share of the full index's, and checks
the issue's targets: 1% <= 5% of the calls, 10% <= 20%, nothing changed = 0 calls and <= 30% wall.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from graphrag_spark.config import load_config  # noqa: E402
from graphrag_spark.index.pipeline import run_index  # noqa: E402
from graphrag_spark.llm.server import start_server  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402
from graphrag_spark.tokens import count_tokens  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "corpora"
STAGES = ["extract", "extract_claims", "summarize_entities", "summarize_relationships", "community_reports"]


def _copy_corpus(paths: list[Path], folder: Path) -> int:
    tokens = 0
    for path in paths:
        for file in ([path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())):
            shutil.copy(file, folder / file.name)
            tokens += count_tokens(file.read_text(encoding="utf-8"))
    return tokens


def _slice(text: str, start_word: int, tokens: int) -> tuple[str, int]:
    """Words of ``text`` from ``start_word`` until about ``tokens`` tokens (~0.75 words a token)."""
    words = text.split()
    piece = " ".join(words[start_word:start_word + int(tokens * 0.75)])
    return piece, start_word + int(tokens * 0.75)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", action="append", type=Path,
                        help="file or folder (repeatable); default: A Christmas Carol + data/sample")
    parser.add_argument("--chunk-size", type=int, default=1200)
    parser.add_argument("--overlap", type=int, default=100)
    parser.add_argument("--latency", type=float, default=0.0, help="local server seconds per answer")
    args = parser.parse_args()
    corpus = args.corpus or [SHARED / "a_christmas_carol.txt", REPO / "data" / "sample"]
    work = Path(tempfile.mkdtemp(prefix="bench_refresh_"))
    folder, root = work / "docs", work / "index"
    folder.mkdir()
    corpus_tokens = _copy_corpus(corpus, folder)
    donor = (SHARED / "war_and_peace.txt").read_text(encoding="utf-8")
    print(f"corpus: {', '.join(str(p) for p in corpus)} = {corpus_tokens} tokens; chunks {args.chunk_size}/{args.overlap}")

    with start_server(seed=7, latency_s=args.latency) as server:
        cfg = load_config(REPO / "conf" / "local.yaml", [
            f"storage.root={root}", f"input.path={folder}", f"spark.ivy_cache={REPO / '.cache' / 'ivy'}",
            "extraction.method=llm", "extraction.claims=true", f"chunking.size={args.chunk_size}",
            f"chunking.overlap={args.overlap}", f"llm.chat.api_base={server.base_url}", "llm.chat.model=local-model",
            "llm.chat.api_key_env=BENCH_KEY", "embeddings.provider=openai",
            f"llm.embedding.api_base={server.base_url}", "llm.embedding.api_key_env=BENCH_KEY",
            "llm.items_per_commit=64", "refresh.vacuum_retain_hours=null"])
        os.environ.setdefault("BENCH_KEY", "sk-bench")
        spark = build_spark(cfg.spark)
        position = 0

        def add(name: str, tokens: int) -> None:
            nonlocal position
            text, position = _slice(donor, position, tokens)
            (folder / name).write_text(text, encoding="utf-8")

        def change_one() -> None:
            target = folder / "seals_report.md"
            target.write_text(target.read_text(encoding="utf-8") + "\n\nThe seal count was revised in the spring survey.\n",
                              encoding="utf-8")

        steps = [("full", lambda: None), ("+1% doc", lambda: add("new_1pct.txt", corpus_tokens // 100)),
                 ("+10% docs", lambda: [add(f"new_10pct_{i}.txt", corpus_tokens // 40) for i in range(4)]),
                 ("change 1", change_one), ("delete 1", lambda: (folder / "lumen_cells_factory.txt").unlink()),
                 ("no change", lambda: None)]
        results = []
        for label, prepare in steps:
            prepare()
            before = server.stats()
            started = time.perf_counter()
            summary = run_index(spark, cfg)
            wall = time.perf_counter() - started
            after = server.stats()
            calls = {}
            for usage in summary.usage:  # community_reports has one usage per level
                calls[usage.stage] = calls.get(usage.stage, 0) + usage.calls
            chat = after["served"]["chat"] - before["served"]["chat"]
            embeddings = after["served"]["embeddings"] - before["served"]["embeddings"]
            diff = {k: summary.counts.get(f"documents {k}", "-") for k in ("new", "changed", "deleted", "unchanged")}
            results.append((label, calls, chat, embeddings, wall, diff))
            print(f"{label}: {chat} chat calls, {embeddings} embedding requests, {wall:.1f}s, documents {diff}", flush=True)

    full_calls = results[0][2] + results[0][3]
    full_wall = results[0][4]
    width = 11
    print(f"\n{'calls per stage':<24}" + "".join(f"{label:>{width}}" for label, *_ in results))
    for stage in STAGES:
        print(f"{stage:<24}" + "".join(f"{r[1].get(stage, 0):>{width}}" for r in results))
    print(f"{'embeddings':<24}" + "".join(f"{r[3]:>{width}}" for r in results))
    print(f"{'total':<24}" + "".join(f"{r[2] + r[3]:>{width}}" for r in results))
    print(f"{'% of full':<24}" + "".join(f"{100 * (r[2] + r[3]) / full_calls:>{width - 1}.1f}%" for r in results))
    print(f"{'wall s':<24}" + "".join(f"{r[4]:>{width}.1f}" for r in results))
    print(f"{'% of full wall':<24}" + "".join(f"{100 * r[4] / full_wall:>{width - 1}.1f}%" for r in results))
    share = {label: (chat + emb) / full_calls for label, _, chat, emb, _, _ in results}
    checks = [("+1% doc <= 5% of calls", share["+1% doc"] <= 0.05),
              ("+10% docs <= 20% of calls", share["+10% docs"] <= 0.20),
              ("no change = 0 calls", share["no change"] == 0),
              ("no change wall <= 30%", results[-1][4] <= 0.3 * full_wall)]
    print("\n" + "\n".join(f"{'PASS' if ok else 'FAIL'}  {name}" for name, ok in checks))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
