"""The README's first command, scripts/quickstart.sh, less the setup that scripts/test.sh has just run:
``graphrag-spark index`` and ``query`` with the shipped conf/local.yaml on the shipped sample, through
spark-submit, from a folder of their own, so that the config's relative root (output/index) is resolved
against it as a user's would be. Its index must be the shared session's sample index."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_process
from graphrag_spark import tables as T
from graphrag_spark.config import load_config
from graphrag_spark.query.api import GraphRagIndex

pytestmark = pytest.mark.spark


def EARLY_JOB(workdir):
    """Both commands, while other tests run (see conftest)."""
    for folder in ("conf", "data/sample"):
        shutil.copytree(REPO / folder, workdir / folder)
    command = [str(Path(sys.executable).parent / "graphrag-spark")]
    settings = ["--config", "conf/local.yaml"]
    index = run_process([*command, "index", *settings], timeout=1200, cwd=workdir)
    query = run_process([*command, "query", *settings, "--level", "1", "What are the main themes?"],
                        timeout=600, cwd=workdir)
    return index, query, workdir / "output" / "index"


def test_the_quickstart_indexes_the_sample_quietly_and_answers(early_result, spark, sample_index):
    index, query, root = early_result
    assert index.returncode == 0, index.stderr[-4000:]
    assert query.returncode == 0, query.stderr[-4000:]
    # Quietly: a progress line per stage, then the summary; nothing of Spark's, Ivy's or the JVM's own output.
    assert index.stderr == query.stderr == "", index.stderr[-4000:] + query.stderr[-4000:]
    progress, _, summary_text = index.stdout.partition("Index summary")
    assert all(line.startswith("[") for line in progress.splitlines()), progress
    assert {"[extraction] done", "[community_reports] done"} <= {line.split("  ")[0] for line in progress.splitlines()}
    assert "Wall time per stage" in summary_text
    assert "[global search, level 1:" in query.stdout and "[Data: Reports (" in query.stdout, query.stdout

    # The relative root is the job's folder's, and holds what the shared session built from the same config.
    cfg, summary = sample_index
    built = GraphRagIndex.load(spark, load_config(REPO / "conf" / "local.yaml", [f"storage.root={root}"]))
    assert not (root.parent.parent / ".cache").exists(), "the JARs setup resolved were used, not resolved again"
    shared = GraphRagIndex.load(spark, cfg)
    assert f"entities                     {summary.counts['entities']}\n" in index.stdout
    for name, columns in ((T.ENTITIES, ["title"]), (T.RELATIONSHIPS, ["source", "target"]),
                          (T.COMMUNITY_REPORTS, ["community", "title"])):
        assert sorted(built.table(name).select(*columns).collect()) == sorted(shared.table(name).select(*columns).collect()), name
