"""Stage 1, documents: read a folder or table into one row per distinct document.

Files are read by Spark's ``binaryFile`` source and decoded in executors; a small folder of this
machine's files is read on the driver instead (``DRIVER_READ_BYTES``), to the same rows. Anything
unusable (empty, binary, non-UTF-8, oversized, a JSON line without text) becomes a
row of ``input_rejects`` with its reason: skipped and counted, never silently lost.
Identical content is stored once; the other sources are kept in ``duplicate_sources``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterator
from urllib.parse import unquote, urlparse

import pandas as pd
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from graphrag_spark import tables as T
from graphrag_spark.compat import analysis_condition, is_connect
from graphrag_spark.config import InputConfig
from graphrag_spark.errors import UserError
from graphrag_spark.ids import content_id, normalize_text

_FORMAT_BY_SUFFIX = {".txt": "text", ".text": "text", ".md": "markdown", ".markdown": "markdown",
                     ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}
_PARSED_COLUMNS = ["kind", "id", "title", "text", "source", "metadata", "reason", "n_bytes", "file"]
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


# A folder of local files holding at most this many bytes is read on the driver: Python reads the files
# Spark lists, where a Spark job (and a Python worker's start) took about 5 s of a small index's critical
# path on 2 cores, before its first LLM call. The rows are the Spark read's, to the spelling of a source.
DRIVER_READ_BYTES = 8 << 20


@dataclass(frozen=True)
class InputRead:
    """A read of the input: its documents (one row per distinct content), its rejects and their counts.
    ``rows``: the documents' (id, text) in a pandas frame where the read was on the driver, else None."""
    documents: DataFrame
    rejects: DataFrame
    counts: dict
    rows: pd.DataFrame | None = None


@dataclass(frozen=True)
class ReaderOptions:
    format: str
    text_column: str
    title_column: str
    max_document_bytes: int

    @classmethod
    def from_config(cls, cfg: InputConfig) -> "ReaderOptions":
        return cls(cfg.format, cfg.text_column, cfg.title_column, cfg.max_document_bytes)


def _reject(source: str, reason: str, n_bytes: int) -> dict:
    return {"kind": "reject", "source": source, "reason": reason, "n_bytes": n_bytes}


def _document(source: str, text: str, title: str | None, metadata: dict[str, str], opts: ReaderOptions) -> dict:
    n_bytes = len(text.encode("utf-8"))
    if n_bytes > opts.max_document_bytes:
        return _reject(source, f"document is {n_bytes} bytes, above input.max_document_bytes={opts.max_document_bytes}", n_bytes)
    normalized = normalize_text(text)
    if not normalized:
        return _reject(source, "empty document (no text after trimming whitespace)", n_bytes)
    return {"kind": "document", "id": content_id(normalized), "title": title or PurePosixPath(source).stem,
            "text": normalized, "source": source, "metadata": metadata, "n_bytes": n_bytes}


def _decode(content: bytes) -> str | None:
    """UTF-8 (with or without BOM) or None: guessing another codec would silently garble text."""
    try:
        return content.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None


def file_format(path: str, configured: str) -> str | None:
    if configured != "auto":
        return configured
    return _FORMAT_BY_SUFFIX.get(PurePosixPath(path).suffix.lower())


def parse_file(path: str, content: bytes, opts: ReaderOptions) -> list[dict]:
    """Turn one input file into document rows and/or reject rows (pure; runs in executors)."""
    fmt = file_format(path, opts.format)
    if fmt is None:
        return [_reject(path, f"unsupported file type '{PurePosixPath(path).suffix}' (use .txt, .md, .jsonl or .csv)", len(content))]
    if not content.strip():
        return [_reject(path, "empty file", len(content))]
    if b"\x00" in content[:8192]:
        return [_reject(path, "binary file (contains NUL bytes)", len(content))]
    text = _decode(content)
    if text is None:
        return [_reject(path, "not valid UTF-8; re-encode the file as UTF-8", len(content))]
    if fmt in ("text", "markdown"):
        heading = _HEADING.search(text) if fmt == "markdown" else None
        return [_document(path, text, heading.group(1) if heading else None, {"format": fmt}, opts)]
    if fmt == "jsonl":
        return list(_parse_jsonl(path, text, opts))
    return list(_parse_csv(path, text, opts))


def _record_document(source: str, record: dict, opts: ReaderOptions) -> dict:
    value = record.get(opts.text_column)
    if not isinstance(value, str):
        return _reject(source, f"no string field '{opts.text_column}' (set input.text_column)", 0)
    title = record.get(opts.title_column)
    metadata = {k: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                for k, v in record.items() if k not in (opts.text_column, opts.title_column) and v is not None}
    return _document(source, value, str(title) if title not in (None, "") else None, metadata, opts)


def _parse_jsonl(path: str, text: str, opts: ReaderOptions) -> Iterator[dict]:
    for line_number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        source = f"{path}#L{line_number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            yield _reject(source, f"invalid JSON: {exc.msg}", len(line))
            continue
        if not isinstance(record, dict):
            yield _reject(source, "JSON line is not an object", len(line))
            continue
        yield _record_document(source, record, opts)


def _parse_csv(path: str, text: str, opts: ReaderOptions) -> Iterator[dict]:
    reader = csv.DictReader(io.StringIO(text))
    if opts.text_column not in (reader.fieldnames or []):
        yield _reject(path, f"CSV has no column '{opts.text_column}' (columns: {reader.fieldnames}); set input.text_column", len(text))
        return
    row_number = 0
    for row_number, row in enumerate(reader, start=1):
        yield _record_document(f"{path}#row{row_number}", row, opts)
    if not row_number:
        yield _reject(path, "CSV has a header but no rows", len(text))


def _parsed_frame(rows: list[dict]) -> pd.DataFrame:
    """Object columns (None, not NaN, for missing values: Arrow cannot cast an all-NaN float column to string);
    metadata travels as JSON text and is parsed in Spark."""
    frame = pd.DataFrame(rows, columns=_PARSED_COLUMNS, dtype=object)
    frame["n_bytes"] = frame["n_bytes"].astype("int64")
    frame["metadata"] = frame["metadata"].map(lambda m: json.dumps(m) if isinstance(m, dict) else None)
    return frame


# ``file``: the input file a row came from (null for a table's rows).
_PARSED_SCHEMA = ("kind string, id string, title string, text string, source string, "
                  "metadata string, reason string, n_bytes long, file string")


def _too_big(opts: ReaderOptions) -> str:
    """The reject reason of a file above ``max_document_bytes``, its size a ``%d`` (Spark's ``format_string`` too)."""
    return f"file is %d bytes, above input.max_document_bytes={opts.max_document_bytes}"


def _read_files(spark: SparkSession, path: str, opts: ReaderOptions) -> DataFrame:
    files = (spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(path)
             .select("path", "length", "content"))

    def parse_partition(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            rows = []
            for file_path, content in zip(batch["path"], batch["content"]):
                rows.extend({**row, "file": file_path} for row in parse_file(file_path, bytes(content), opts))
            yield _parsed_frame(rows)

    # Oversized files are rejected from their length alone: their bytes never leave storage.
    too_big = files.where(F.col("length") > opts.max_document_bytes).select(
        F.lit("reject").alias("kind"), F.lit(None).cast("string").alias("id"), F.lit(None).cast("string").alias("title"),
        F.lit(None).cast("string").alias("text"), F.col("path").alias("source"),
        F.lit(None).cast("string").alias("metadata"),
        F.format_string(_too_big(opts), F.col("length")).alias("reason"),
        F.col("length").alias("n_bytes"), F.col("path").alias("file"))
    parsed = files.where(F.col("length") <= opts.max_document_bytes).mapInPandas(parse_partition, _PARSED_SCHEMA)
    return parsed.unionByName(too_big)


def _read_table(spark: SparkSession, cfg: InputConfig, opts: ReaderOptions, source: DataFrame | None = None) -> DataFrame:
    if source is None:
        source = spark.read.format("delta").load(cfg.path) if cfg.format == "delta" else spark.table(cfg.path)
    if cfg.text_column not in source.columns:
        raise UserError(f"Input table '{cfg.path}' has no column '{cfg.text_column}' (columns: {source.columns}); set input.text_column.")
    record = F.to_json(F.struct(*[F.col(c) for c in source.columns]))

    if cfg.id_column is not None and cfg.id_column not in source.columns:
        raise UserError(f"Input table '{cfg.path}' has no column '{cfg.id_column}' (columns: {source.columns}); set input.id_column.")
    id_column, path = cfg.id_column, cfg.path

    def parse_partition(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            rows = []
            for i, raw in zip(batch["row"], batch["record"]):
                record = json.loads(raw)
                key = record.get(id_column) if id_column else None
                row = _record_document(f"{path}#{i if key is None else key}", record, opts)
                if row["kind"] == "document" and key is None:
                    # No id column: the content names the row (a row order would renumber on every write).
                    row["source"] = f"{path}#{row['id']}"
                rows.append(row)
            yield _parsed_frame(rows)

    indexed = source.select(record.alias("record")).withColumn("row", F.monotonically_increasing_id())
    return indexed.mapInPandas(parse_partition, _PARSED_SCHEMA)


def _missing_input(path: str) -> str:
    return f"Input path '{path}' does not exist; set input.path to a folder of .txt/.md/.jsonl/.csv files."


def check_local_input(cfg: InputConfig, plain_paths_local: bool) -> None:
    """A missing input caught before Spark starts (a JVM takes from seconds to a minute to start), where
    the path surely names this machine's files: a ``file:`` URI, or a plain path where
    ``plain_paths_local`` (see ``session.plain_paths_are_local``). Tables and glob patterns are left to Spark."""
    if cfg.format in ("delta", "table"):
        return
    uri = urlparse(cfg.path)
    if uri.scheme == "file":
        local = unquote(uri.path)
    elif not uri.scheme and plain_paths_local:
        local = cfg.path
    else:
        return
    if not any(c in local for c in "*?[{") and not Path(local).expanduser().exists():
        raise UserError(_missing_input(cfg.path))


def _list_files(spark: SparkSession, cfg: InputConfig) -> list[str]:
    """Every file of the input folder, zero-byte ones included: Spark's file scans skip those without a
    trace, so they are found by comparing this listing (``inputFiles``) with the files the scan read, to
    be counted as rejects. Fails fast on a missing or empty folder; works on Spark Connect (no Hadoop API)."""
    try:
        listed = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(cfg.path).inputFiles()
    except Exception as exc:  # noqa: BLE001 - only a missing path is the user's mistake
        if analysis_condition(exc) == "PATH_NOT_FOUND":
            raise UserError(_missing_input(cfg.path)) from None
        raise
    if not listed:
        raise UserError(f"Input folder '{cfg.path}' contains no files; add documents or point input.path elsewhere.")
    return list(listed)


def _scan_spelling(listed: str) -> str:
    """The spelling the scan's ``path`` gives a file the listing spells as a URI: ``file:///x%20y`` is ``file:/x y``
    (the scan's own spelling is already decoded: ``file:/x%41`` is a file named that)."""
    return re.sub(r"^file:/+", "file:/", unquote(listed))


def build_documents(spark: SparkSession, cfg: InputConfig) -> InputRead:
    """The input's documents; duplicates keep the smallest source path as canonical."""
    opts = ReaderOptions.from_config(cfg)
    if cfg.format in ("delta", "table"):
        return _group(_read_table(spark, cfg, opts))
    listed = _list_files(spark, cfg)  # first: a missing or empty folder gets its sentence
    local = None if is_connect(spark) else _local_files(listed, opts)  # a Connect server's files are its own
    if local is not None:
        return _read_on_driver(spark, local, opts)
    return _group(_read_files(spark, cfg.path, opts), listed)


def _local_files(listed: list[str], opts: ReaderOptions) -> dict[str, tuple[str, int]] | None:
    """Per listed file, its path on this machine and its size: where every one is a ``file:`` URI of a file
    here and those the read would take (not above ``max_document_bytes``) hold at most ``DRIVER_READ_BYTES``;
    else None."""
    local, total = {}, 0
    for uri in listed:
        parts = urlparse(uri)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
            return None
        path = unquote(parts.path)
        try:
            size = os.path.getsize(path)
        except OSError:  # not a file of this machine after all (or gone since the listing): Spark reads it
            return None
        local[uri] = (path, size)
        total += size if size <= opts.max_document_bytes else 0
        if total > DRIVER_READ_BYTES:
            return None
    return local


def _read_on_driver(spark: SparkSession, local: dict[str, tuple[str, int]], opts: ReaderOptions) -> InputRead:
    """``_group(_read_files(...))``'s rows, read and grouped in Python: the same ``parse_file`` of each file
    under the path Spark's scan gives it, the same grouping by content id (Python orders strings by code
    point, Spark by UTF-8 bytes: the same order)."""
    rows = []
    for uri, (path, size) in local.items():
        source = _scan_spelling(uri)
        if size == 0:  # whatever its type, as the Spark read (whose scan skips it) finds it in the listing
            rows.append(_reject(source, "empty file", 0))
        elif size > opts.max_document_bytes:  # rejected from its size, never read (as Spark does)
            rows.append(_reject(source, _too_big(opts) % size, size))
        else:
            with open(path, "rb") as file:
                rows.extend(parse_file(source, file.read(), opts))
    read = [row for row in rows if row["kind"] == "document"]
    rejects = [(row["source"], row["reason"], row["n_bytes"]) for row in rows if row["kind"] == "reject"]
    by_id: dict[str, list[dict]] = {}
    for row in read:
        by_id.setdefault(row["id"], []).append(row)
    documents = []
    for document_id, copies in by_id.items():
        first = min(copies, key=lambda row: row["source"])
        others = sorted(row["source"] for row in copies if row["source"] != first["source"])
        documents.append((document_id, first["title"], first["text"], first["source"], others, first["metadata"],
                          len(first["text"])))
    counts = {"documents": len(documents), "duplicates": len(read) - len(documents), "rejected": len(rejects),
              "chars": sum(len(row["text"]) for row in read)}
    return InputRead(T.local_frame(spark, documents, T.SCHEMAS[T.DOCUMENTS]),
                     T.local_frame(spark, rejects, T.SCHEMAS[T.INPUT_REJECTS]), counts, pd.DataFrame([(d[0], d[2]) for d in documents], columns=["id", "text"]))


def _group(parsed: DataFrame, listed: list[str] | None = None) -> InputRead:
    """Documents grouped by content, rejects and counts from parsed rows; ``listed``: the input files, of
    which those the scan did not read (zero bytes: every file read gives a row) are rejects too."""
    # Persisted under a plan of its own: an identical plan persisted by an earlier run in this session
    # (a refresh of the same path) would otherwise be served from that run's cache, not from the files.
    parsed = (parsed.withColumn("metadata", F.from_json("metadata", "map<string,string>"))
              .withColumn("_read", F.lit(time.time_ns())).persist().drop("_read"))
    rejects = parsed.where("kind = 'reject'").select("source", "reason", "n_bytes")
    docs = parsed.where("kind = 'document'")
    documents = (docs.groupBy("id").agg(
        F.min_by(F.struct("source", "title", "text", "metadata"), F.col("source")).alias("first"),
        F.array_sort(F.collect_list("source")).alias("all_sources"))
        .select("id", "first.title", "first.text", "first.source",
                # filter, not array_remove: a column as the element to remove is Spark 4 only.
                F.filter("all_sources", lambda source: source != F.col("first.source")).alias("duplicate_sources"),
                "first.metadata", F.length("first.text").cast("long").alias("n_chars")))
    # One job for the counts (each Spark job is a fixed cost that dominates small inputs).
    is_document = F.col("kind") == "document"
    totals = parsed.agg(F.count(F.when(is_document, 1)).alias("read"), F.count(F.when(F.col("kind") == "reject", 1)).alias("rejected"),
                        F.countDistinct(F.when(is_document, F.col("id"))).alias("documents"),
                        F.countDistinct("file").alias("files"),
                        F.sum(F.when(is_document, F.length("text"))).alias("chars")).collect()[0]
    # ``chars``: of every document read, duplicates included (what a driver-side step would hold at most).
    counts = {"documents": totals["documents"], "duplicates": totals["read"] - totals["documents"],
              "rejected": totals["rejected"], "chars": totals["chars"] or 0}
    if listed is not None and totals["files"] < len(listed):
        scanned = {row.file for row in parsed.select("file").distinct().collect()}
        empty = sorted(path for path in map(_scan_spelling, listed) if path not in scanned)
        rejects = rejects.unionByName(T.local_frame(
            parsed.sparkSession, [(path, "empty file", 0) for path in empty], T.SCHEMAS[T.INPUT_REJECTS]))
        counts["rejected"] += len(empty)
    return InputRead(documents, rejects, counts)


def _table_name(spark: SparkSession, cfg: InputConfig) -> str:
    return f"delta.`{T.absolute_path(spark, cfg.path)}`" if cfg.format == "delta" else cfg.path


def source_table_version(spark: SparkSession, cfg: InputConfig) -> int:
    """The latest Delta version of a table input (recorded as the version a run processed)."""
    return int(spark.sql(f"DESCRIBE HISTORY {_table_name(spark, cfg)} LIMIT 1").collect()[0]["version"])


def build_documents_from_changes(spark: SparkSession, cfg: InputConfig, published: DataFrame,
                                 processed_version: int) -> InputRead:
    """The published documents with the table's changes after ``processed_version`` applied, read
    through Delta Change Data Feed: only changed rows are read and parsed. Per row key the last
    change wins (a delete or an update's pre-image removes the row's source, an insert or post-image
    adds it)."""
    if cfg.id_column is None:
        raise UserError("input.change_data_feed needs input.id_column: the column that names a row across versions.")
    opts = ReaderOptions.from_config(cfg)
    prefix = f"{cfg.path}#"
    kept = (published.select(F.explode(F.array_union(F.array("source"), F.coalesce(
        "duplicate_sources", F.array().cast("array<string>")))).alias("source"), "id", "title", "text", "metadata")
        .select(F.lit("document").alias("kind"), "id", "title", "text", "source", F.to_json("metadata").alias("metadata"),
                F.lit(None).cast("string").alias("reason"), F.lit(0).cast("long").alias("n_bytes"),
                F.lit(None).cast("string").alias("file")))
    latest_version = source_table_version(spark, cfg)
    if latest_version > processed_version:
        reader = (spark.read.format("delta").option("readChangeFeed", "true")
                  .option("startingVersion", processed_version + 1).option("endingVersion", latest_version))
        changes = reader.load(cfg.path) if cfg.format == "delta" else reader.table(cfg.path)
        image = F.when(F.col("_change_type") == "update_preimage", 0).otherwise(1)
        latest = Window.partitionBy(cfg.id_column).orderBy(F.desc("_commit_version"), F.desc(image))
        final = changes.withColumn("_n", F.row_number().over(latest)).where(F.col("_n") == 1)
        touched = final.select(F.concat(F.lit(prefix), F.col(cfg.id_column).cast("string")).alias("source"))
        present = (final.where(F.col("_change_type").isin("insert", "update_postimage"))
                   .drop("_change_type", "_commit_version", "_commit_timestamp", "_n"))
        changed = _read_table(spark, cfg, opts, present)
        kept = kept.join(touched, "source", "left_anti").unionByName(changed)
    return _group(kept)
