"""The Databricks Asset Bundle is well formed: it parses, defines the index job, a scheduled refresh
and the query notebooks, and every file it names exists in the repository."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from conftest import REPO

RESOURCES = REPO / "resources"


def _bundle() -> tuple[dict, dict[Path, dict]]:
    root = yaml.safe_load((REPO / "databricks.yml").read_text(encoding="utf-8"))
    files = [path for pattern in root["include"] for path in sorted(REPO.glob(pattern))]
    return root, {path: yaml.safe_load(path.read_text(encoding="utf-8")) for path in files}


def _jobs(resources: dict[Path, dict]) -> dict[str, tuple[Path, dict]]:
    return {name: (path, job) for path, doc in resources.items() for name, job in doc["resources"]["jobs"].items()}


def test_bundle_parses_and_declares_its_variables_and_targets():
    root, resources = _bundle()
    assert root["bundle"]["name"] and resources, "databricks.yml must include resources/*.yml"
    assert {"dev", "prod"} <= set(root["targets"]) and root["targets"]["dev"].get("default") is True
    declared = set(root["variables"])
    used = set()
    for text in [(REPO / "databricks.yml").read_text()] + [p.read_text() for p in resources]:
        used |= set(re.findall(r"\$\{var\.([A-Za-z_]+)\}", text))
    assert used and used <= declared, f"undeclared variables: {used - declared}"
    wheel = root["artifacts"]["graphrag_spark_wheel"]
    assert wheel["type"] == "whl" and (REPO / wheel["path"] / "pyproject.toml").is_file()


def test_index_refresh_and_notebook_jobs_name_files_that_exist():
    _, resources = _bundle()
    jobs = _jobs(resources)
    assert {"graphrag_index", "graphrag_refresh", "graphrag_explore", "graphrag_ask"} <= set(jobs)
    for name, (path, job) in jobs.items():
        assert job["name"] and job["tasks"], name
        for task in job["tasks"]:
            if "spark_python_task" in task:
                target = task["spark_python_task"]["python_file"]
                assert [lib["whl"] for lib in task["libraries"]] == ["../dist/*.whl"], name
                assert any(c["job_cluster_key"] == task["job_cluster_key"] for c in job["job_clusters"]), name
            else:
                target = task["notebook_task"]["notebook_path"]
                envs = {e["environment_key"]: e for e in job["environments"]}
                spec = envs[task["environment_key"]]["spec"]
                # Serverless environment 4 is the first with a Spark 4 client (Databricks Connect 17).
                assert "../dist/*.whl" in spec["dependencies"] and int(spec["client"]) >= 4, name
                assert (path.parent / target).read_text().startswith("# Databricks notebook source"), target
            assert (path.parent / target).resolve().is_file(), f"{name} names {target}, which does not exist"
            params = task.get("spark_python_task", {}).get("parameters", [])
            for value in params + list(task.get("notebook_task", {}).get("base_parameters", {}).values()):
                named = re.fullmatch(r"\$\{workspace\.file_path\}/(.+)", str(value))
                assert named is None or (REPO / named.group(1)).is_file(), value
    assert jobs["graphrag_index"][1]["tasks"][0]["spark_python_task"]["python_file"] == "../jobs/index.py"


def test_refresh_job_is_scheduled_and_never_overlaps_itself():
    _, resources = _bundle()
    path, refresh = _jobs(resources)["graphrag_refresh"]
    cron = refresh["schedule"]["quartz_cron_expression"]
    root, _ = _bundle()
    cron = root["variables"]["refresh_cron"]["default"] if cron == "${var.refresh_cron}" else cron
    assert len(cron.split()) in (6, 7) and refresh["schedule"]["timezone_id"]
    assert refresh["max_concurrent_runs"] == 1
    index = _jobs(resources)["graphrag_index"][1]
    assert refresh["tasks"][0]["spark_python_task"] == index["tasks"][0]["spark_python_task"]


def test_bundle_config_is_a_valid_project_config():
    from graphrag_spark.config import load_config

    cfg = load_config(REPO / "conf" / "databricks.yaml")
    assert cfg.storage.catalog and cfg.storage.database and cfg.input.path.startswith("/Volumes/")
