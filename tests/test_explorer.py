"""The static HTML explorer: its data files (pure), and the page in a real headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from conftest import in_ci
from graphrag_spark import explore


def _toy_index(n_leaf: int = 3):
    """Two levels: root community 0 over everything, leaves 1..n_leaf of three entities each."""
    entities, relationships, leaves = [], [], []
    for leaf in range(1, n_leaf + 1):
        ids = [f"e{leaf}{k}" for k in range(3)]
        for k, entity_id in enumerate(ids):
            entities.append({"id": entity_id, "title": f"NAME {leaf}{k}", "type": "PERSON", "description": f"d{leaf}{k}",
                             "degree": 3 - k, "text_unit_ids": [f"t{leaf}"]})
        relationships += [{"source": f"NAME {leaf}0", "target": f"NAME {leaf}{k}", "description": "knows", "weight": 2.0}
                          for k in (1, 2)]
        leaves.append({"community": leaf, "level": 1, "parent": 0, "children": [], "title": f"Leaf {leaf}",
                       "entity_ids": ids, "size": 3})
    relationships.append({"source": "NAME 10", "target": "NAME 20", "description": "bridges", "weight": 1.0})
    communities = pd.DataFrame([{"community": 0, "level": 0, "parent": -1, "children": list(range(1, n_leaf + 1)),
                                 "title": "Root", "entity_ids": [e["id"] for e in entities], "size": len(entities)}]
                               + leaves)
    reports = pd.DataFrame([{"community": c, "title": f"Report {c}", "summary": f"Summary {c} </script><b>",
                             "rating": float(c), "rating_explanation": "why",
                             "findings": [{"summary": f"Finding {c}", "explanation": "because"}]}
                            for c in range(n_leaf + 1)])
    units = pd.DataFrame([{"id": f"t{leaf}", "document_id": "d", "document_title": "Doc", "text": f"Text {leaf}"}
                          for leaf in range(1, n_leaf + 1)])
    return communities, reports, pd.DataFrame(entities), pd.DataFrame(relationships), units


def test_payloads_hold_levels_reports_drill_down_neighbours_and_search():
    payloads = explore.build_payloads(*_toy_index(), title="toy")
    meta = payloads["meta"]
    assert [(l["level"], l["communities"]) for l in meta["levels"]] == [(0, 1), (1, 3)]
    root = payloads["community/0"]
    assert [c["id"] for c in root["sub_communities"]] == [1, 2, 3] and root["parent"] is None
    leaf = payloads["community/1"]
    assert leaf["parent"]["id"] == 0 and leaf["report"]["findings"] == [{"summary": "Finding 1", "explanation": "because"}]
    assert [e["title"] for e in leaf["entities"]] == ["NAME 10", "NAME 11", "NAME 12"]  # by degree
    assert [(n["id"], n["links"]) for n in leaf["graph"]["neighbours"]] == [(2, 1)]  # the bridge
    assert len(leaf["graph"]["edges"]) == 2
    entity = payloads[f"entity/{leaf['entities'][0]['b']}"]["e10"]
    assert [c["id"] for c in entity["communities"]] == [0, 1]
    assert {r["title"] for r in entity["relationships"]} == {"NAME 11", "NAME 12", "NAME 20"}
    assert payloads[f"text/{entity['text_units'][0]['b']}"]["t1"]["text"] == "Text 1"
    assert [row[0] for row in payloads["search/na"]][:3] == ["NAME 10", "NAME 20", "NAME 30"]  # highest degree first


def test_a_level_with_many_communities_is_paginated_and_buckets_stay_small(monkeypatch):
    monkeypatch.setattr(explore, "LEVEL_PAGE", 2)
    monkeypatch.setattr(explore, "BUCKET_TARGET", 4)
    payloads = explore.build_payloads(*_toy_index(n_leaf=5), title="toy")
    assert [payloads[f"level-1-{p}"]["pages"] for p in range(3)] == [3, 3, 3]
    assert sum(len(payloads[f"level-1-{p}"]["communities"]) for p in range(3)) == 5
    entity_files = [k for k in payloads if k.startswith("entity/")]
    assert len(entity_files) == 4 and sum(len(payloads[k]) for k in entity_files) == 15


def test_written_data_cannot_close_the_script_element(tmp_path):
    written = explore.write_files(explore.build_payloads(*_toy_index(), title="toy"), tmp_path)
    text = (tmp_path / "data" / "community" / "1.js").read_text()
    assert "</script>" not in text and text.startswith('GR.receive("community/1",')
    body = text[len('GR.receive("community/1",'):-3]
    assert json.loads(body.replace("<\\/", "</"))["report"]["summary"] == "Summary 1 </script><b>"
    assert written.files == len(list(tmp_path.rglob("*.js"))) + 1


# ---------------------------------------------------------------- the page in Chromium

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, installed once per machine when missing (as root, as in CI)."""
    found = shutil.which("chromium")
    if not found and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env, timeout=900,
                       stdout=subprocess.DEVNULL)
        found = shutil.which("chromium")
    if not found:
        if in_ci():
            pytest.fail("chromium is not installed and cannot be installed (not root)")
        pytest.skip("chromium is not installed (apt-get install chromium, as root)")
    return found


def _browse(chromium: str, page: Path, fragment: str, tmp_path: Path, screenshot: Path | None = None) -> str:
    """The DOM after the page's scripts ran (virtual time lets the on-demand data files load)."""
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    profile.mkdir()
    url = page.as_uri() + fragment
    flags = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--window-size=1400,1000",
             "--virtual-time-budget=8000"]
    if screenshot is not None:
        subprocess.run([*flags, f"--screenshot={screenshot}", url], check=True, capture_output=True, timeout=120)
    run = subprocess.run([*flags, "--dump-dom", url], check=True, capture_output=True, text=True, timeout=120)
    return run.stdout


def _data(root: Path, key: str):
    text = (root / "data" / f"{key}.js").read_text()
    return json.loads(text[len(f'GR.receive("{key}",'):-3].replace("<\\/", "</"))


def test_explorer_renders_levels_a_report_drill_down_entities_and_search(chromium, tmp_path):
    root = tmp_path / "explorer"
    explore.write_files(explore.build_payloads(*_toy_index(), title="toy index"), root)
    page = root / "index.html"

    shot = tmp_path / "community.png"
    dom = _browse(chromium, page, "#community=0", tmp_path, screenshot=shot)
    assert shot.stat().st_size > 10_000
    assert re.findall(r'data-level="(\d+)"[^>]*>Level \d+ \((\d+)\)', dom) == [("0", "1"), ("1", "3")]
    assert '<h2 id="community-title">Report 0 ' in dom
    assert '<p class="summary" id="report-summary">Summary 0 &lt;/script&gt;&lt;b&gt;</p>' in dom
    assert "<li><b>Finding 0</b>because</li>" in dom
    subs = re.findall(r'<div class="community-link" data-community="(\d+)">',
                      dom.split('id="sub-communities"')[1].split("<h3>")[0])
    assert subs == ["1", "2", "3"]
    graph = dom.split('<svg id="graph"')[1].split("</svg>")[0]
    assert graph.count('<circle class="node"') == 9 and graph.count("<line ") == 7  # 3 leaves' entities, edges

    # Drill down: the sub-community names its parent, lists its entities and draws its neighbour.
    sub_dom = _browse(chromium, page, "#community=1", tmp_path)
    assert 'data-community="0">↑ Report 0' in sub_dom
    assert re.findall(r'class="entity-link" data-entity="(\w+)"', sub_dom.split('id="entities"')[1].split("</table>")[0]) \
        == ["e10", "e11", "e12"]
    graph = sub_dom.split('<svg id="graph"')[1].split("</svg>")[0]
    assert '<circle class="neighbour"' in graph and 'data-community="2"' in graph

    # An entity: description, its communities, relationships and the source text unit, loaded on demand.
    bucket = _data(root, "community/1")["entities"][0]["b"]
    entity_dom = _browse(chromium, page, f"#entity=e10:{bucket}", tmp_path)
    assert '<h2 id="entity-title">NAME 10</h2>' in entity_dom and "<p>d10</p>" in entity_dom
    assert '<div class="muted">Doc</div>Text 1</div>' in entity_dom
    assert '<h2 id="community-title">Report 1 ' in entity_dom  # its deepest community opens beside it

    # Search by name: the first letters list the matching entities, highest degree first.
    search_dom = _browse(chromium, page, "#search=name 2", tmp_path)
    results = search_dom.split('<ul id="search-results"')[1].split("</ul>")[0]
    assert not results.startswith(" hidden")
    assert re.findall(r">(NAME \d+) <span", results) == ["NAME 20", "NAME 21", "NAME 22"]


@pytest.mark.spark
def test_explorer_and_graphml_from_the_delta_tables(spark, sample_index, tmp_path):
    cfg, summary = sample_index
    written = explore.write_explorer(spark, cfg, tmp_path / "explorer")
    meta = _data(written.root, "meta")
    assert meta["entities"] == summary.counts["entities"]
    assert {l["level"]: l["communities"] for l in meta["levels"]} == summary.counts["communities per level"]
    assert len(list((written.root / "data" / "community").glob("*.js"))) == sum(summary.counts["communities per level"].values())
    some = _data(written.root, "community/0")
    assert some["report"]["findings"] and some["entities"]
    graphml = written.graphml.read_text()
    assert graphml.count("<node ") == summary.counts["entities"]
    assert graphml.count("<edge ") == summary.counts["relationships"]
