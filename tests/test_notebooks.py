"""The Databricks notebooks run both ways, their cells in order against the test SparkSession: outside
Databricks (settings from the environment, printed output) and as on Databricks (widgets, a secret
scope, display/displayHTML), with a recording stand-in for ``dbutils``."""

from __future__ import annotations

import os

import pytest

from graphrag_spark.llm.server import start_server

from conftest import REPO
from databricks_stub import StubDbutils, databricks_globals

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


def run_notebook(path, spark, namespace: dict | None = None) -> dict:
    """The cells in order in one namespace: a plain one (off Databricks), or ``databricks_globals``."""
    namespace = namespace if namespace is not None else {"spark": spark, "__name__": "__notebook__"}
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


SETTINGS_ENV = ("GRAPHRAG_INDEX_ROOT", "GRAPHRAG_DATABASE", "GRAPHRAG_CATALOG", "GRAPHRAG_CONFIG", "GRAPHRAG_SET",
                "GRAPHRAG_QUESTION", "GRAPHRAG_SECRET_SCOPE")


@pytest.fixture
def databricks_env(monkeypatch):
    """No settings in the environment: on Databricks they come from the widgets."""
    for name in SETTINGS_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "restored-after-the-test")
    monkeypatch.delenv("OPENAI_API_KEY")


def test_explore_notebook_on_databricks_reads_widgets_and_renders_through_display(spark, index_root, databricks_env, capsys):
    dbutils = StubDbutils({"index_root": str(index_root), "overrides": "spark.shuffle_partitions=2"})
    ns = run_notebook(NOTEBOOKS / "explore_index.py", spark, databricks_globals(spark, dbutils))
    assert ("widgets.get", "index_root") in dbutils.calls and ("widgets.text", "index_root", "") in dbutils.calls
    assert ns["index"].cfg.storage.root == str(index_root)
    assert len(ns["displayed"]) == 6 and ns["displayed"][-1].count() == ns["source_text"].count() > 0
    assert len(ns["html"]) == 2 and ns["report"].title.replace("&", "&amp;") in ns["html"][0]
    assert ns["html"][1] is ns["explorer_page"]
    assert capsys.readouterr().out == ""  # everything went to the platform's rendering


def test_ask_notebook_on_databricks_takes_its_key_from_the_secret_scope(spark, index_root, databricks_env, capsys):
    secret = "sk-from-the-scope-0123456789"
    with start_server() as server:
        dbutils = StubDbutils({"index_root": str(index_root), "secret_scope": "graphrag",
                               "overrides": f"query.llm=true;llm.chat.api_base={server.base_url};spark.shuffle_partitions=2",
                               "question": "Who opposes the harbour dredging near the estuary?"},
                              secrets={("graphrag", "OPENAI_API_KEY"): secret})
        ns = run_notebook(NOTEBOOKS / "ask_questions.py", spark, databricks_globals(spark, dbutils))
    assert ("secrets.get", "graphrag", "OPENAI_API_KEY") in dbutils.calls and os.environ["OPENAI_API_KEY"] == secret
    assert ("widgets.get", "question") in dbutils.calls
    answers = [h for h in ns["html"] if "LLM calls" in h]
    assert len(answers) == len(ns["index"].levels()) + 3 and all("[Data: " in a for a in answers)
    out = capsys.readouterr()
    assert secret not in out.out + out.err and "[Data: " not in out.out


@pytest.mark.parametrize("overrides, jit", [("", "full"), ("spark.driver_jit=quick", "quick")])
def test_a_notebook_without_a_session_starts_one_with_the_full_jit_unless_configured(monkeypatch, overrides, jit):
    import graphrag_spark.session
    from graphrag_spark.query import notebook

    built = []
    monkeypatch.setenv("GRAPHRAG_SET", overrides)
    monkeypatch.setattr(graphrag_spark.session, "build_spark", lambda cfg: built.append(cfg.driver_jit) or "session")
    monkeypatch.setattr(notebook.GraphRagIndex, "load", classmethod(lambda cls, spark, cfg: (spark, cfg)))
    assert notebook.open_index({})[0] == "session" and built == [jit]
