"""The wheel is self-sufficient: prompts, default configs and job scripts inside, and no Spark pinned
onto a cluster that brings its own."""

from __future__ import annotations

import email
import os
import subprocess
import sys
import zipfile

from conftest import REPO


def test_wheel_carries_its_resources_and_leaves_spark_to_the_cluster(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(REPO)],
                   check=True, capture_output=True, timeout=300)
    wheel = next((tmp_path / "dist").glob("graphrag_spark-*.whl"))
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
        metadata = email.message_from_bytes(archive.read(next(n for n in archive.namelist() if n.endswith("METADATA"))))
    requires = metadata.get_all("Requires-Dist")
    unconditional = [r for r in requires if "extra ==" not in r]
    assert not [r for r in unconditional if r.startswith(("pyspark", "delta-spark"))], unconditional
    assert any(r.startswith("pyspark==") and "extra == \"local\"" in r for r in requires)
    # Outside the checkout, with only the unpacked wheel importable: prompts and configs come from it.
    script = ("import graphrag_spark, graphrag_spark.prompts as p, graphrag_spark.config as c, graphrag_spark.cli as cli\n"
              "print(graphrag_spark.__file__)\n"
              "print(p.load_prompt('community_report').text[:40].replace(chr(10), ' '))\n"
              "print(c.load_config('conf/local.yaml').extraction.method)\n"
              "print(sorted(cli.available_jobs()))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    package_file, prompt_head, method, jobs = proc.stdout.splitlines()
    assert package_file.startswith(str(site))
    assert prompt_head == (REPO / "prompts" / "community_report.txt").read_text()[:40].replace("\n", " ")
    assert method == "nlp"
    assert "'index'" in jobs and "'query'" in jobs
