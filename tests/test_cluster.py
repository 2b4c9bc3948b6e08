"""Chunking and extraction on a real local-cluster: two executor JVMs, so closures, config and
the tokenizer really cross process boundaries."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, SAMPLE_CORPUS

pytestmark = [pytest.mark.spark, pytest.mark.cluster]


def test_chunk_and_extract_on_two_executors(tmp_path):
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "cluster_job.py"), str(SAMPLE_CORPUS), str(tmp_path / "idx")],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("VERDICT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    verdict = json.loads(lines[0].removeprefix("VERDICT "))
    assert verdict["master"] == "local-cluster[2,1,1024]"
    assert verdict["executors"] == 2
    assert verdict["worker_pids"] >= 2, "partitions ran in more than one Python worker"
    assert verdict["text_units"] > 9 and verdict["entity_instances"] > 0 and verdict["relationship_instances"] > 0
    assert verdict["entity_units_known"]
