"""What a refresh changes: the document diff, kept numbers, and what may be reused from the last run.

A document is identified by its source (file path, ``path#L<line>``, ``table#<key>``) and its
content hash (the document id). Against the published ``documents`` table a source is new,
changed (same source, other content), deleted or unchanged. Work follows document *ids*: the
ids that appear are chunked, extracted and embedded; the ids that disappear have everything
derived from them retracted. A document that only moved to another source costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F


@dataclass
class DocumentDiff:
    counts: dict[str, int]
    added: DataFrame    # (id) documents whose content is not in the last run
    removed: DataFrame  # (id) documents of the last run whose content is gone
    n_added: int
    n_removed: int

    @property
    def empty(self) -> bool:
        return self.n_added == 0 and self.n_removed == 0


def sources(documents: DataFrame) -> DataFrame:
    """(source, id) for every source of every document, duplicates included."""
    return documents.select(F.explode(F.array_union(F.array("source"), F.coalesce(
        "duplicate_sources", F.array().cast("array<string>")))).alias("source"), "id")


def diff_documents(current: DataFrame, previous: DataFrame) -> DocumentDiff:
    joined = (sources(current).withColumnRenamed("id", "now")
              .join(sources(previous).withColumnRenamed("id", "before"), "source", "full_outer"))
    state = (F.when(F.col("before").isNull(), "new").when(F.col("now").isNull(), "deleted")
             .when(F.col("now") == F.col("before"), "unchanged").otherwise("changed"))
    found = {r["state"]: int(r["n"]) for r in joined.groupBy(state.alias("state")).agg(F.count("*").alias("n")).collect()}
    counts = {k: found.get(k, 0) for k in ("new", "changed", "deleted", "unchanged")}
    now, before = current.select("id").distinct(), previous.select("id").distinct()
    added, removed = now.join(before, "id", "left_anti"), before.join(now, "id", "left_anti")
    return DocumentDiff(counts, added, removed, added.count(), removed.count())


def same_rows(pairs: list[tuple[DataFrame, DataFrame, list[str]]]) -> bool:
    """Whether each (current, published, columns) pair holds the same rows (as multisets, over
    ``columns``), all pairs checked in one Spark job: a rerun on unchanged input then writes nothing."""
    def hashed(frame: DataFrame, columns: list[str], tag: int, sign: int) -> DataFrame:
        row = F.sha2(F.to_json(F.struct(F.lit(tag).alias("_table"), *columns)), 256)
        return frame.select(row.alias("row"), F.lit(sign).alias("side"))

    union = reduce(DataFrame.unionByName, [hashed(frame, columns, tag, sign)
                                            for tag, (current, published, columns) in enumerate(pairs)
                                            for frame, sign in ((current, 1), (published, -1))])
    return not union.groupBy("row").agg(F.sum("side").alias("n")).where(F.col("n") != 0).take(1)


def keep_numbers(frame: DataFrame, previous: DataFrame | None, order: list[str]) -> DataFrame:
    """``frame`` with ``human_readable_id``: an id of ``previous`` keeps its number; new ids are
    numbered after the largest previous number, ascending by the ``order`` columns (nothing is ever
    renumbered, so citations in reports stay valid across refreshes)."""
    frame = frame.drop("human_readable_id") if "human_readable_id" in frame.columns else frame
    if previous is None:
        return frame.withColumn("human_readable_id", F.row_number().over(Window.orderBy(*order)) - 1)
    known = previous.select("id", F.col("human_readable_id").alias("_kept"))
    start = previous.agg(F.max("human_readable_id")).collect()[0][0]
    start = -1 if start is None else int(start)
    joined = frame.join(known, "id", "left")
    # A window over the new rows only, on the narrow columns the order needs.
    new = (joined.where(F.col("_kept").isNull()).select("id", *[c for c in order if c != "id"])
           .withColumn("_new", F.lit(start) + F.row_number().over(Window.orderBy(*order))).select("id", "_new"))
    return (joined.join(new, "id", "left")
            .withColumn("human_readable_id", F.coalesce("_kept", "_new").cast("long")).drop("_kept", "_new"))

