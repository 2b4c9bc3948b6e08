"""A static HTML explorer of an index, and its graph as GraphML.

``write_explorer`` turns the Delta tables into a folder that any browser opens without a server
or network: ``index.html`` (page, styles and script inline) and ``data/`` with one small file per
community, per bucket of entities, per bucket of text units and per search prefix. The page loads
a file only when it shows it, so a 100k-entity index is thousands of small files, never one
giant page. Data files are JavaScript (``GR.receive(key, {...})``) loaded through script tags,
which works from ``file://`` as well as from any static web server (fetch would need http).

The payload builders are pure functions over pandas frames; ``write_explorer`` is the Spark shell.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

ASSETS = Path(__file__).resolve().parent / "explorer"
LEVEL_PAGE = 200           # communities per page of a level list
ENTITIES_PER_COMMUNITY = 300
RELATIONSHIPS_PER_COMMUNITY = 150
GRAPH_NODES = 40           # entities drawn in a community's graph
NEIGHBOURS = 12            # neighbouring communities drawn around them
RELATIONSHIPS_PER_ENTITY = 40
TEXT_UNITS_PER_ENTITY = 20
BUCKET_TARGET = 50         # entities (or text units) per bucket file: ~100-300 KB each
DESCRIPTION_CHARS = 300    # a relationship's description as listed (the entity's own is kept whole)
TEXT_CHARS = 6000


@dataclass(frozen=True)
class ExplorerFiles:
    root: Path
    files: int
    bytes: int
    graphml: Path | None


def bucket_of(item_id: str, n_buckets: int) -> int:
    return int(hashlib.sha1(item_id.encode("utf-8")).hexdigest()[:8], 16) % n_buckets


def n_buckets_for(n_items: int) -> int:
    return max(1, -(-n_items // BUCKET_TARGET))


def search_key(title: str) -> str:
    """The search file of a name: its first two letters or digits, lower-cased (``_`` pads)."""
    folded = re.sub(r"[^a-z0-9]", "", str(title).lower())
    return (folded + "__")[:2]


def _clip(text, limit: int = DESCRIPTION_CHARS) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _as_list(value) -> list:
    return [] if value is None else list(value)


def build_payloads(communities: pd.DataFrame, reports: pd.DataFrame, entities: pd.DataFrame,
                   relationships: pd.DataFrame, text_units: pd.DataFrame, title: str) -> dict[str, dict | list]:
    """Every data file of the explorer: ``{relative path without .js: payload}``.

    Inputs: communities(community, level, parent, children, title, entity_ids, size);
    reports(community, title, summary, rating, rating_explanation, findings);
    entities(id, title, type, description, degree, text_unit_ids);
    relationships(source, target, description, weight) by entity title;
    text_units(id, document_id, document_title, text).
    """
    entity_buckets = n_buckets_for(len(entities))
    text_buckets = n_buckets_for(len(text_units))
    entities = entities.copy()
    entities["b"] = [bucket_of(i, entity_buckets) for i in entities["id"]]
    title_to_id = dict(zip(entities["title"], entities["id"]))
    report_of = {int(r["community"]): r for r in reports.to_dict("records")}
    community_rows = {int(r["community"]): r for r in communities.to_dict("records")}

    # Each entity's communities, one per level; its leaf community is the deepest.
    memberships: dict[str, list[tuple[int, int]]] = {}
    for row in communities.itertuples():
        for entity_id in _as_list(row.entity_ids):
            memberships.setdefault(entity_id, []).append((int(row.level), int(row.community)))
    leaf_of = {e: max(levels)[1] for e, levels in memberships.items()}

    relationships = relationships[relationships["source"].isin(title_to_id) & relationships["target"].isin(title_to_id)]
    # Adjacency by entity id: (weight, other title, other id, description), strongest first.
    adjacency: dict[str, list] = {}
    for s, t, d, w in zip(relationships["source"], relationships["target"], relationships["description"],
                          relationships["weight"]):
        sid, tid, w = title_to_id[s], title_to_id[t], float(w)
        adjacency.setdefault(sid, []).append((w, t, tid, d))
        adjacency.setdefault(tid, []).append((w, s, sid, d))
    for related in adjacency.values():
        related.sort(key=lambda r: (-r[0], r[1]))
    entity_records = {e["id"]: e for e in entities.to_dict("records")}
    rank = {e: i for i, e in enumerate(entities.sort_values(["degree", "title"], ascending=[False, True])["id"])}

    def entity_brief(entity_id: str) -> dict:
        e = entity_records[entity_id]
        return {"id": entity_id, "title": e["title"], "type": e["type"], "degree": int(e["degree"] or 0), "b": e["b"]}

    payloads: dict[str, dict | list] = {}

    def short(community: int) -> dict:
        row, report = community_rows[community], report_of.get(community)
        return {"id": community, "level": int(row["level"]), "size": int(row["size"] or 0),
                "title": (report["title"] if report is not None and report["title"] else row["title"]),
                "rating": None if report is None or pd.isna(report["rating"]) else float(report["rating"]),
                "children": len(_as_list(row["children"]))}

    levels = []
    for level, group in communities.groupby("level"):
        ordered = group.sort_values(["size", "community"], ascending=[False, True])["community"].astype(int).tolist()
        pages = [ordered[i:i + LEVEL_PAGE] for i in range(0, len(ordered), LEVEL_PAGE)] or [[]]
        for number, page in enumerate(pages):
            payloads[f"level-{int(level)}-{number}"] = {"level": int(level), "page": number, "pages": len(pages),
                                                        "communities": [short(c) for c in page]}
        levels.append({"level": int(level), "communities": len(ordered), "pages": len(pages),
                       "entities": int(group["size"].fillna(0).sum())})
    payloads["meta"] = {"title": title, "levels": levels, "entities": len(entities),
                        "relationships": len(relationships), "text_units": len(text_units),
                        "communities": len(communities), "entity_buckets": entity_buckets,
                        "text_buckets": text_buckets}

    community_at = {(e, level): c for e, pairs in memberships.items() for level, c in pairs}
    for community, row in community_rows.items():
        level = int(row["level"])
        members = [e for e in _as_list(row["entity_ids"]) if e in entity_records]
        member_set = set(members)
        shown = sorted(members, key=rank.__getitem__)[:ENTITIES_PER_COMMUNITY]
        shown_set, drawn = set(shown), set(shown[:GRAPH_NODES])
        inside, links = [], {}
        for entity_id in members:
            for w, other_title, other, d in adjacency.get(entity_id, []):
                if other in member_set:
                    if entity_id in shown_set and other in shown_set and entity_id < other:
                        inside.append((w, entity_records[entity_id]["title"], other_title, d, entity_id, other))
                else:
                    neighbour = community_at.get((other, level))
                    if neighbour is not None:
                        links[neighbour] = links.get(neighbour, 0) + 1
        inside.sort(key=lambda r: (-r[0], r[1], r[2]))
        inside = inside[:RELATIONSHIPS_PER_COMMUNITY]
        neighbours = sorted(links.items(), key=lambda kv: (-kv[1], kv[0]))[:NEIGHBOURS]
        report = report_of.get(community)
        parent = int(row["parent"]) if row["parent"] is not None and int(row["parent"]) >= 0 else None
        payloads[f"community/{community}"] = {
            **short(community),
            "parent": short(parent) if parent in community_rows else None,
            "sub_communities": [short(int(c)) for c in _as_list(row["children"]) if int(c) in community_rows],
            "report": None if report is None else {
                "title": report["title"], "summary": report["summary"],
                "rating": None if pd.isna(report["rating"]) else float(report["rating"]),
                "rating_explanation": report["rating_explanation"],
                "findings": [{"summary": f["summary"], "explanation": f["explanation"]}
                             for f in _as_list(report["findings"])]},
            "n_entities": len(members),
            "entities": [entity_brief(e) for e in shown],
            "relationships": [{"source": s, "target": t, "description": _clip(d), "weight": w}
                              for w, s, t, d, _, _ in inside],
            "graph": {"nodes": [entity_brief(e) for e in shown[:GRAPH_NODES]],
                      "edges": [[a, b, w] for w, _, _, _, a, b in inside if a in drawn and b in drawn],
                      "neighbours": [{**short(n), "links": k} for n, k in neighbours]},
        }

    # Entity details, bucketed.
    text_bucket = {i: bucket_of(i, text_buckets) for i in text_units["id"]}
    buckets: dict[int, dict] = {}
    for entity_id, entity in entity_records.items():
        related = adjacency.get(entity_id, [])[:RELATIONSHIPS_PER_ENTITY]
        units = [u for u in _as_list(entity["text_unit_ids"]) if u in text_bucket][:TEXT_UNITS_PER_ENTITY]
        buckets.setdefault(entity["b"], {})[entity_id] = {
            "title": entity["title"], "type": entity["type"], "description": entity["description"],
            "degree": int(entity["degree"] or 0),
            "communities": [{"level": level, "id": c} for level, c in sorted(memberships.get(entity_id, []))],
            "relationships": [{"title": t, "id": i, "b": entity_records[i]["b"], "description": _clip(d), "weight": w}
                              for w, t, i, d in related],
            "text_units": [{"id": u, "b": text_bucket[u]} for u in units],
        }
    for number, payload in buckets.items():
        payloads[f"entity/{number}"] = payload

    texts: dict[int, dict] = {}
    for unit in text_units.to_dict("records"):
        text = unit["text"] or ""
        texts.setdefault(text_bucket[unit["id"]], {})[unit["id"]] = {
            "document": unit.get("document_title") or unit.get("document_id"),
            "text": text[:TEXT_CHARS] + ("…" if len(text) > TEXT_CHARS else "")}
    for number, payload in texts.items():
        payloads[f"text/{number}"] = payload

    search: dict[str, list] = {}
    for entity in entities.sort_values(["degree", "title"], ascending=[False, True]).to_dict("records"):
        search.setdefault(search_key(entity["title"]), []).append(
            [entity["title"], entity["id"], entity["type"], int(entity["degree"] or 0), entity["b"],
             leaf_of.get(entity["id"])])
    for key, rows in search.items():
        payloads[f"search/{key}"] = rows
    return payloads


def _data_script(key: str, payload: dict | list) -> str:
    # "</" is escaped so a text unit quoting HTML can never close the script element.
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    return f"GR.receive({json.dumps(key)},{body});\n"


def render_page(preload: str = "") -> str:
    """index.html with its styles and script inline: one file, nothing fetched from a network."""
    page = (ASSETS / "index.html").read_text(encoding="utf-8")
    script = (ASSETS / "explorer.js").read_text(encoding="utf-8").replace("/*PRELOAD*/", preload)
    return page.replace("/*STYLE*/", (ASSETS / "explorer.css").read_text(encoding="utf-8")).replace("/*SCRIPT*/", script)


def render_inline(payloads: dict[str, dict | list], max_bytes: int = 20_000_000) -> str:
    """One HTML string with the data inside, for a notebook's ``displayHTML`` (which cannot load files):
    the hierarchy, levels and communities always; entity details, text units and search while they
    fit in ``max_bytes`` (a larger index is browsed through the written folder instead)."""
    order = sorted(payloads, key=lambda k: (0 if k == "meta" or k.startswith(("level-", "community/")) else 1, k))
    parts, size = [], 0
    for key in order:
        script = _data_script(key, payloads[key])
        essential = key == "meta" or key.startswith(("level-", "community/"))
        if not essential and size + len(script) > max_bytes:
            continue
        parts.append(script)
        size += len(script)
    return render_page("".join(parts))


def write_files(payloads: dict[str, dict | list], root: Path) -> ExplorerFiles:
    """Write the page and the data files into ``root`` (replacing an earlier explorer there)."""
    data = root / "data"
    if data.exists():
        shutil.rmtree(data)
    root.mkdir(parents=True, exist_ok=True)
    total, count = 0, 0
    for key, payload in payloads.items():
        path = data / f"{key}.js"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = _data_script(key, payload)
        path.write_text(text, encoding="utf-8")
        total += len(text.encode("utf-8"))
        count += 1
    page = render_page()
    (root / "index.html").write_text(page, encoding="utf-8")
    return ExplorerFiles(root, count + 1, total + len(page.encode("utf-8")), None)


def write_graphml(entities: pd.DataFrame, relationships: pd.DataFrame, communities: pd.DataFrame, path: Path) -> Path:
    """The entity graph for Gephi / yEd: nodes with title, type, degree and their community per level."""
    import networkx as nx

    graph = nx.Graph()
    levels: dict[str, dict[str, int]] = {}
    for row in communities.itertuples():
        for entity_id in _as_list(row.entity_ids):
            levels.setdefault(entity_id, {})[f"community_level_{int(row.level)}"] = int(row.community)
    for entity in entities.to_dict("records"):
        graph.add_node(entity["title"], label=entity["title"], type=entity["type"] or "",
                       degree=int(entity["degree"] or 0), description=entity["description"] or "",
                       **levels.get(entity["id"], {}))
    for s, t, w, d in zip(relationships["source"], relationships["target"], relationships["weight"],
                          relationships["description"]):
        if s in graph and t in graph:
            graph.add_edge(s, t, weight=float(w), description=d or "")
    path.parent.mkdir(parents=True, exist_ok=True)
    nx.write_graphml(graph, path)
    return path


def read_index_frames(spark, storage) -> dict[str, pd.DataFrame]:
    """The columns the explorer shows, from the index's Delta tables, as pandas frames."""
    from pyspark.sql import functions as F

    from graphrag_spark import tables as T
    from graphrag_spark.errors import UserError

    store = T.TableStore(spark, storage)
    for name in (T.ENTITIES, T.RELATIONSHIPS, T.COMMUNITIES, T.COMMUNITY_REPORTS, T.TEXT_UNITS):
        if not store.exists(name):
            raise UserError(f"No '{name}' table at {store.location(name)}; build the index first (graphrag-spark index).")
    documents = store.read(T.DOCUMENTS).select(F.col("id").alias("document_id"), F.col("title").alias("document_title")) \
        if store.exists(T.DOCUMENTS) else None
    units = store.read(T.TEXT_UNITS).select("id", "document_id", "text")
    if documents is not None:
        units = units.join(documents, "document_id", "left")
    else:
        units = units.withColumn("document_title", F.lit(None).cast("string"))
    return {
        "communities": store.read(T.COMMUNITIES).select("community", "level", "parent", "children", "title",
                                                        "entity_ids", "size").toPandas(),
        "reports": store.read(T.COMMUNITY_REPORTS).select("community", "title", "summary", "rating",
                                                          "rating_explanation", "findings").toPandas(),
        "entities": store.read(T.ENTITIES).select("id", "title", "type", "description", "degree",
                                                  "text_unit_ids").toPandas(),
        "relationships": store.read(T.RELATIONSHIPS).select("source", "target", "description", "weight").toPandas(),
        "text_units": units.toPandas(),
    }


def findings_as_dicts(reports: pd.DataFrame) -> pd.DataFrame:
    """Spark Rows of the findings array become plain dicts."""
    reports = reports.copy()
    reports["findings"] = [[f.asDict() if hasattr(f, "asDict") else dict(f) for f in _as_list(v)]
                           for v in reports["findings"]]
    return reports


def _index_payloads(spark, cfg) -> tuple[dict, dict[str, pd.DataFrame]]:
    frames = read_index_frames(spark, cfg.storage)
    frames["reports"] = findings_as_dicts(frames["reports"])
    payloads = build_payloads(frames["communities"], frames["reports"], frames["entities"], frames["relationships"],
                              frames["text_units"], cfg.storage.database or cfg.storage.root)
    return payloads, frames


def explorer_html(spark, cfg, max_bytes: int = 20_000_000) -> str:
    """The explorer as one HTML string, for a notebook: ``displayHTML(explorer_html(spark, cfg))``."""
    return render_inline(_index_payloads(spark, cfg)[0], max_bytes)


def write_explorer(spark, cfg, out_dir: str | Path, graphml: bool = True) -> ExplorerFiles:
    """The explorer of the index at ``cfg.storage`` in ``out_dir`` (plus ``graph.graphml``)."""
    payloads, frames = _index_payloads(spark, cfg)
    root = Path(out_dir)
    written = write_files(payloads, root)
    graphml_path = None
    if graphml:
        graphml_path = write_graphml(frames["entities"], frames["relationships"], frames["communities"],
                                     root / "graph.graphml")
    return ExplorerFiles(written.root, written.files, written.bytes, graphml_path)
