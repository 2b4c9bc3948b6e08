"""The Databricks notebooks run outside Databricks: their cells, in order, against a local SparkSession."""

from __future__ import annotations

import os

import pytest

from graphrag_spark.llm.server import start_server

from conftest import REPO

pytestmark = pytest.mark.spark

# The offline embedder's BLAS must not start a thread per core in every Python worker; test modules are
# imported before the shared SparkSession starts, so its workers inherit this.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

NOTEBOOKS = REPO / "notebooks"
HEADER = "# Databricks notebook source"
SEPARATOR = "# COMMAND ----------"


def notebook_cells(path) -> list[str]:
    """The code of each cell of a Databricks source-format notebook; markdown (``# MAGIC``) cells come out empty."""
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == HEADER, f"{path.name} is not in Databricks source format"
    cells, current = [], []
    for line in lines[1:]:
        if line == SEPARATOR:
            cells.append("\n".join(current))
            current = []
        elif not line.startswith("# MAGIC"):
            current.append(line)
    cells.append("\n".join(current))
    return cells


def run_notebook(path, spark) -> dict:
    namespace = {"spark": spark, "__name__": "__notebook__"}
    for number, cell in enumerate(notebook_cells(path)):
        exec(compile(cell, f"{path.name}, cell {number}", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def index_root(sample_index):
    return sample_index[0].storage.root


def test_every_notebook_is_in_databricks_source_format():
    paths = sorted(NOTEBOOKS.glob("*.py"))
    assert {p.name for p in paths} >= {"explore_index.py", "ask_questions.py"}
    for path in paths:
        cells = notebook_cells(path)
        assert len(cells) > 3 and any(cell.strip() == "" for cell in cells), f"{path.name} needs markdown cells"


def test_explore_notebook_drills_down_from_a_root_report(spark, index_root, monkeypatch, capsys):
    monkeypatch.setenv("GRAPHRAG_INDEX_ROOT", str(index_root))
    monkeypatch.setenv("GRAPHRAG_SET", "spark.shuffle_partitions=2")
    ns = run_notebook(NOTEBOOKS / "explore_index.py", spark)
    community = ns["community"]
    assert community in {r.community for r in ns["root_reports"].collect()}
    children = set(ns["index"].table("communities").where(f"community = {community}").first().children)
    assert {r.community for r in ns["sub_communities"].collect()} == children and children
    assert ns["source_text"].count() > 0
    assert ns["report"].title in capsys.readouterr().out
    assert 'GR.receive("meta",' in ns["explorer_page"] and f'GR.receive("community/{community}",' in ns["explorer_page"]


def test_ask_notebook_answers_with_every_method_through_the_llm(spark, index_root, monkeypatch):
    with start_server() as server:
        monkeypatch.setenv("GRAPHRAG_INDEX_ROOT", str(index_root))
        monkeypatch.setenv("GRAPHRAG_SET", f"query.llm=true;llm.chat.api_base={server.base_url};spark.shuffle_partitions=2")
        monkeypatch.setenv("GRAPHRAG_QUESTION", "Who opposes the harbour dredging near the estuary?")
        ns = run_notebook(NOTEBOOKS / "ask_questions.py", spark)
        by_kind = server.stats()["by_kind"]
    comparison = ns["comparison"].set_index("condition")
    levels = ns["index"].levels()
    assert list(comparison.index) == [f"C{level}" for level in levels] + ["TS", "SS", "local"]
    assert (comparison["llm_calls"] > 0).all()
    assert by_kind["global_map"] >= len(levels) + 1 and by_kind["basic_search"] == by_kind["local_search"] == 1
    assert all("[Data: " in r.answer for r in ns["results"].values())
