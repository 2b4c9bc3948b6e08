"""Import a microsoft/graphrag index (the parquet files of its output folder, graphrag 1.0+
layout) into this project's table schemas, so its users move over without re-paying for
extraction and reports.

Ids are kept verbatim (theirs: random UUIDs for entities, relationships, communities and
claims; content hashes for documents, text units and reports), and so are the
human_readable_ids their reports cite. Their community levels already match ours (level 0 =
C0, the root; parent -1 becomes null). Their hierarchy lists a community only at the levels
where it exists, so the import projects every unsplit community down to the deepest level,
as our own index does (see ``_project_down``): each level is then a partition of the
clustered entities and global search at any level sees the whole graph. Their report
``rank`` is our ``rating``. Relationship endpoints without an entity row become stub
entities (see ``_with_endpoint_stubs``).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

import pandas as pd
from pyspark.sql.types import ArrayType, DataType, DoubleType, IntegerType, LongType, MapType, StructType

from graphrag_spark.errors import UserError
from graphrag_spark.ids import content_id
from graphrag_spark.tables import (
    CLAIMS,
    COMMUNITIES,
    COMMUNITY_REPORTS,
    DOCUMENTS,
    ENTITIES,
    RELATIONSHIPS,
    SCHEMAS,
    TEXT_UNITS,
)

log = logging.getLogger(__name__)

IMPORTED_METHOD = "imported"
# Columns read from each of their files; covariates.parquet is optional (claims were off).
_REQUIRED_COLUMNS = {
    "documents": ("id", "title", "text"),
    "text_units": ("id", "human_readable_id", "document_id", "text", "n_tokens"),
    "entities": ("id", "human_readable_id", "title", "type", "description", "text_unit_ids", "frequency", "degree"),
    "relationships": (
        "id", "human_readable_id", "source", "target", "description", "weight", "text_unit_ids", "combined_degree",
    ),
    "communities": ("id", "community", "level", "parent", "children", "title", "entity_ids", "relationship_ids"),
    "community_reports": (
        "id", "community", "level", "title", "summary", "rank", "rating_explanation", "findings", "full_content",
    ),
    "covariates": ("id", "human_readable_id", "subject_id", "type", "description", "text_unit_id"),
}
_OPTIONAL = {"covariates"}
_UNKNOWN = "NONE"  # what their claim prompt writes for an unknown object or date


def load_msgraphrag(folder: str | Path) -> dict[str, pd.DataFrame]:
    """Our tables (name -> DataFrame with exactly the SCHEMAS columns) from their output folder."""
    raw = _read_folder(Path(folder))
    communities, reports = _project_down(
        raw["communities"].assign(parent=raw["communities"]["parent"].where(lambda p: p >= 0)),
        raw["community_reports"].rename(columns={"rank": "rating"}).assign(method=IMPORTED_METHOD))
    tables = {
        DOCUMENTS: _documents(raw["documents"]),
        TEXT_UNITS: _text_units(raw["text_units"]),
        ENTITIES: _with_endpoint_stubs(raw["entities"], raw["relationships"]),
        RELATIONSHIPS: raw["relationships"],
        COMMUNITIES: communities,
        COMMUNITY_REPORTS: reports,
        CLAIMS: _claims(raw.get("covariates")),
    }
    return {name: _conform(df, SCHEMAS[name]) for name, df in tables.items()}


def _project_down(communities: pd.DataFrame, reports: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each community without sub-communities above the deepest level gets a copy at every finer
    level (same members, a new community number and a content-hash id, the coarser copy as its
    parent) and so does its report, as our hierarchy projects unsplit clusters down."""
    if communities.empty:
        return communities, reports
    deepest = int(communities["level"].max())
    children = {int(c): [int(x) for x in _as_list(kids)] for c, kids in zip(communities["community"], communities["children"])}
    report_of = {int(r["community"]): r for r in reports.to_dict("records")}
    next_number = int(communities["community"].max()) + 1
    new_communities, new_reports = [], []
    for row in communities.sort_values(["level", "community"]).to_dict("records"):
        if children[int(row["community"])] or row["level"] >= deepest:
            continue
        parent = row
        for level in range(int(row["level"]) + 1, deepest + 1):
            copy = {**row, "id": content_id("msgraphrag-projected", row["id"], level), "community": next_number,
                    "level": level, "parent": int(parent["community"])}
            children[int(parent["community"])] = [next_number]
            children[next_number] = []
            new_communities.append(copy)
            report = report_of.get(int(row["community"]))
            if report is not None:
                new_reports.append({**report, "id": content_id("msgraphrag-projected", report["id"], level),
                                    "community": next_number, "level": level})
            parent = copy
            next_number += 1
    if not new_communities:
        return communities, reports
    log.info("Projected %d unsplit communities of the imported index down to level %d.", len(new_communities), deepest)
    merged = pd.concat([communities, pd.DataFrame(new_communities)], ignore_index=True)
    merged["children"] = [children[int(c)] for c in merged["community"]]
    return merged, pd.concat([reports, pd.DataFrame(new_reports)], ignore_index=True)


def _as_list(values: object) -> list:
    return [] if _missing(values) else list(values)


def _read_folder(root: Path) -> dict[str, pd.DataFrame]:
    if not root.is_dir():
        raise UserError(f"{root} is not a folder; pass the output folder of a microsoft/graphrag index.")
    raw = {}
    for name, columns in _REQUIRED_COLUMNS.items():
        path = root / f"{name}.parquet"
        if not path.is_file():
            if name in _OPTIONAL:
                continue
            raise UserError(
                f"{path.name} is missing in {root}; pass the output folder of a microsoft/graphrag 1.0+ index "
                "(the one holding entities.parquet, relationships.parquet, communities.parquet, ...)."
            )
        df = pd.read_parquet(path)
        missing = [c for c in columns if c not in df.columns]
        if missing:
            raise UserError(
                f"{path} lacks column(s) {', '.join(missing)}; "
                "only the microsoft/graphrag 1.0+ output layout can be imported."
            )
        raw[name] = df
    return raw


def _documents(documents: pd.DataFrame) -> pd.DataFrame:
    """Their title is the input file name, the closest thing to our source; creation_date and
    their metadata go to metadata."""
    metadata = [
        _metadata(meta, created)
        for meta, created in zip(_column(documents, "metadata"), _column(documents, "creation_date"))
    ]
    return pd.DataFrame(
        {
            "id": documents["id"],
            "title": documents["title"],
            "text": documents["text"],
            "source": documents["title"],
            "metadata": metadata,
            "n_chars": documents["text"].str.len(),
        }
    )


def _text_units(text_units: pd.DataFrame) -> pd.DataFrame:
    """chunk_index = position in the document by their human_readable_id (their documents'
    text_unit_ids cannot give the order: they do not match the text units' ids)."""
    ordered = text_units.sort_values("human_readable_id")
    return ordered.assign(chunk_index=ordered.groupby("document_id").cumcount())


def _with_endpoint_stubs(entities: pd.DataFrame, relationships: pd.DataFrame) -> pd.DataFrame:
    """Their relationships can name endpoints that have no entity row. Every endpoint of ours is
    an entity, and their reports cite those relationships, so each such endpoint becomes a stub
    entity (no type or description; degree = distinct neighbours, their degree's meaning)
    instead of its edges being dropped. Logged, never silent."""
    known = set(entities["title"])
    neighbours: dict[str, set[str]] = defaultdict(set)
    text_units: dict[str, set[str]] = defaultdict(set)
    endpoints = zip(relationships["source"], relationships["target"], relationships["text_unit_ids"])
    for source, target, unit_ids in endpoints:
        for title, other in ((source, target), (target, source)):
            if title not in known:
                neighbours[title].add(other)
                text_units[title].update(() if unit_ids is None else unit_ids)
    if not neighbours:
        return entities
    titles = sorted(neighbours)
    log.warning(
        "%d relationship endpoint(s) of the imported index have no entity row; added as stub entities: %s",
        len(titles), ", ".join(titles),
    )
    first_hrid = int(entities["human_readable_id"].max()) + 1 if len(entities) else 0
    stubs = pd.DataFrame(
        {
            "id": [content_id("msgraphrag-endpoint", title) for title in titles],
            "human_readable_id": range(first_hrid, first_hrid + len(titles)),
            "title": titles,
            "text_unit_ids": [sorted(text_units[title]) for title in titles],
            "degree": [len(neighbours[title] - {title}) for title in titles],
        }
    )
    return pd.concat([entities, stubs], ignore_index=True)


def _claims(covariates: pd.DataFrame | None) -> pd.DataFrame:
    """Claims are their covariates of type "claim"; their "NONE" placeholders become nulls."""
    if covariates is None:
        return pd.DataFrame()
    if "covariate_type" in covariates.columns:
        covariates = covariates[covariates["covariate_type"] == "claim"]
    return pd.DataFrame(
        {
            "id": covariates["id"],
            "human_readable_id": covariates["human_readable_id"],
            "text_unit_id": covariates["text_unit_id"],
            "subject": covariates["subject_id"],
            "object": _known(_column(covariates, "object_id")),
            "type": covariates["type"],
            "status": _column(covariates, "status"),
            "start_date": _known(_column(covariates, "start_date")),
            "end_date": _known(_column(covariates, "end_date")),
            "description": covariates["description"],
            "source_text": _column(covariates, "source_text"),
        }
    )


def _conform(df: pd.DataFrame, schema: StructType) -> pd.DataFrame:
    """Exactly the schema's columns, in order, ready for createDataFrame(df, schema); absent
    columns are null."""
    return pd.DataFrame(
        {field.name: _convert(_column(df, field.name), field.dataType) for field in schema.fields},
        index=pd.RangeIndex(len(df)),
    )


def _convert(values: Iterable[object], dtype: DataType) -> pd.Series:
    """Plain Python values (int, float, str, list, dict, None) in object columns: the one form
    createDataFrame accepts with and without Arrow (nullable pandas ints become floats without it)."""
    return pd.Series([_value(v, dtype) for v in values], dtype=object)


def _value(value: object, dtype: DataType) -> object:
    if _missing(value):
        return None
    if isinstance(dtype, ArrayType):
        return [_value(item, dtype.elementType) for item in value]
    if isinstance(dtype, StructType):
        return {field.name: _value(value.get(field.name), field.dataType) for field in dtype.fields}
    if isinstance(dtype, MapType):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(dtype, (IntegerType, LongType)):
        return int(value)
    if isinstance(dtype, DoubleType):
        return float(value)
    return str(value)


def _metadata(meta: object, created: object) -> dict[str, str] | None:
    merged = {str(k): str(v) for k, v in meta.items() if v is not None} if isinstance(meta, Mapping) else {}
    if not _missing(created):
        merged["creation_date"] = str(created)
    return merged or None


def _column(df: pd.DataFrame, name: str) -> Iterable[object]:
    return df[name] if name in df.columns else [None] * len(df)


def _known(values: Iterable[object]) -> list[object]:
    return [None if v == _UNKNOWN else v for v in values]


def _missing(value: object) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def import_msgraphrag(spark, store, folder: str | Path, cfg) -> dict[str, int]:
    """Write their index into our Delta tables under ``store`` (overwriting them), then embed
    its text units and entities with our configured embedder; row counts per table."""
    from graphrag_spark.index.embed import build_embeddings

    counts = {}
    for name, frame in load_msgraphrag(folder).items():
        store.write(spark.createDataFrame(frame, SCHEMAS[name]), name)
        counts[name] = len(frame)
    counts.update(build_embeddings(spark, store, cfg)[0])
    return counts
