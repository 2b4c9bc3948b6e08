"""Context size per query condition, as in the paper's Table 2: units and tokens at each level C0..Cn and for TS.

A global search at level ``Ci`` reads every report of that level; TS reads every text unit.
``map calls`` is how many map batches (of ``query.batch_tokens``) one question costs there.

    python -m graphrag_spark.query.context_report --config conf/local.yaml
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd
from pyspark.sql import SparkSession

from graphrag_spark import tables as T
from graphrag_spark.config import Config, load_config
from graphrag_spark.errors import UserError
from graphrag_spark.query.global_search import Units, load_level_reports, pack_by_tokens, report_units
from graphrag_spark.query.text_summary import load_text_units, source_units

COLUMNS = ["condition", "units", "tokens", "pct_of_max", "map_calls"]


def size_table(conditions: list[tuple[str, Units]], batch_tokens: int, seed: int) -> pd.DataFrame:
    """Pure: one row per (condition, its context units)."""
    rows = [[name, len(units.items), sum(i["n_tokens"] for i in units.items), 0.0,
             len(pack_by_tokens(units, batch_tokens, seed))] for name, units in conditions]
    frame = pd.DataFrame(rows, columns=COLUMNS)
    peak = frame["tokens"].max() if len(frame) else 0
    frame["pct_of_max"] = (100 * frame["tokens"] / peak).round(1) if peak else 0.0
    return frame


def context_sizes(spark: SparkSession, store: T.TableStore, cfg: Config) -> pd.DataFrame:
    reports = store.read(T.COMMUNITY_REPORTS)
    levels = sorted(r[0] for r in reports.select("level").distinct().collect())
    conditions = [(f"C{level}", report_units(load_level_reports(spark, reports, level))) for level in levels]
    conditions.append(("TS", source_units(load_text_units(store.read(T.TEXT_UNITS)))))
    return size_table(conditions, cfg.query.batch_tokens, cfg.query.seed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Context units and tokens per query condition (the paper's Table 2).")
    parser.add_argument("--config", default="conf/local.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--master", default=None)
    args = parser.parse_args(argv)
    try:
        from graphrag_spark.query.api import GraphRagIndex  # the API checks that the index exists
        from graphrag_spark.session import build_spark

        cfg = load_config(args.config, args.set)
        print(GraphRagIndex(build_spark(cfg.spark, master=args.master), cfg).context_sizes().to_string(index=False))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
