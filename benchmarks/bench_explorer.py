"""Page weight and load time of the static explorer of an existing index.

    python benchmarks/bench_explorer.py --index /path/to/index [--out /tmp/explorer] [--runs 5]

Writes the explorer of the Delta index at ``--index`` (timed), then prints its size: all files,
the page itself, what the first view loads (page + meta + first level page + the largest top-level
community) and the largest data file. Load time: headless Chromium (Debian's ``chromium``) opens
the largest top-level community over a localhost HTTP server on a free port; the page records
``performance.now()`` when the hierarchy is listed and the community is drawn (``data-ready-ms``).
The War and Peace figure in the README comes from the offline index of
``../shared/corpora/war_and_peace.txt`` built with ``conf/local.yaml``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from graphrag_spark.config import load_config  # noqa: E402
from graphrag_spark.explore import write_explorer  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def _payload(root: Path, key: str):
    text = (root / "data" / f"{key}.js").read_text(encoding="utf-8")
    return json.loads(text[len(f'GR.receive("{key}",'):-3].replace("<\\/", "</"))


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


def load_times(root: Path, fragment: str, runs: int) -> list[int]:
    chromium = shutil.which("chromium")
    if not chromium:
        raise SystemExit("chromium is not installed (apt-get install chromium)")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/index.html{fragment}"
    times = []
    try:
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as profile:
                dom = subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", "--timeout=15000", "--dump-dom",
                                      url], capture_output=True, text=True, timeout=120).stdout
            found = re.search(r'data-ready-ms="(\d+)"', dom)
            if not found:
                raise SystemExit("the page did not become ready within 15 s")
            times.append(int(found.group(1)))
    finally:
        server.shutdown()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", required=True, help="storage.root of a built index")
    parser.add_argument("--out", default=None, help="explorer folder (default: a temporary one)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    cfg = load_config(REPO / "conf" / "local.yaml", [f"storage.root={args.index}"])
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_explorer_"))
    spark = build_spark(cfg.spark)
    started = time.perf_counter()
    written = write_explorer(spark, cfg, out)
    write_s = time.perf_counter() - started
    spark.stop()

    meta = _payload(out, "meta")
    top = _payload(out, f"level-{meta['levels'][0]['level']}-0")["communities"][0]
    first_view = [out / "index.html", out / "data" / "meta.js", out / "data" / f"level-{meta['levels'][0]['level']}-0.js",
                  out / "data" / "community" / f"{top['id']}.js"]
    data_files = sorted((p for p in (out / "data").rglob("*.js")), key=lambda p: p.stat().st_size)
    kinds = {kind: [p.stat().st_size for p in (out / "data" / kind).glob("*.js")] for kind in ("community", "entity", "text", "search")}
    times = load_times(out, f"#community={top['id']}", args.runs)

    print(f"index                      {args.index}: {meta['entities']:,} entities, {meta['relationships']:,} "
          f"relationships, {meta['communities']:,} communities, {meta['text_units']:,} text units")
    print(f"explorer written in        {write_s:.1f} s ({written.files:,} files, {written.bytes / 1e6:.1f} MB; "
          f"GraphML {written.graphml.stat().st_size / 1e6:.1f} MB)")
    print(f"page (index.html)          {(out / 'index.html').stat().st_size / 1e3:.1f} KB")
    print(f"first view loads           {sum(p.stat().st_size for p in first_view) / 1e3:.1f} KB in {len(first_view)} files "
          f"(page, meta, level {meta['levels'][0]['level']} list, community {top['id']} of {top['size']} entities)")
    for kind, sizes in kinds.items():
        if sizes:
            print(f"{kind + ' files':<26} {len(sizes):>5}, mean {statistics.mean(sizes) / 1e3:.1f} KB, "
                  f"max {max(sizes) / 1e3:.1f} KB")
    print(f"largest data file          {data_files[-1].relative_to(out)} {data_files[-1].stat().st_size / 1e3:.1f} KB")
    print(f"load time to ready (ms)    median {statistics.median(times)} over {len(times)} runs {times} "
          f"(headless Chromium, localhost HTTP)")


if __name__ == "__main__":
    main()
