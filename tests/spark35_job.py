"""The offline index of a corpus and one question of each kind, on whatever Spark this Python has, in its own
process; writes what a user would see as JSON. tests/test_spark35.py runs it in .venv-spark35 (pyspark 3.5)
and compares with the Spark 4 session's own index and answers.

    python tests/spark35_job.py --root DIR --input DIR --ivy-cache DIR --out FILE
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import metadata
from pathlib import Path

from graphrag_spark import tables as T
from graphrag_spark.config import load_config
from graphrag_spark.query.api import GraphRagIndex

REPO = Path(__file__).resolve().parent.parent
# The libraries the Databricks runtime brings and constraints-dbr-15.4.txt pins to its versions.
RUNTIME_LIBRARIES = ("numpy", "pandas", "pyarrow", "scipy", "scikit-learn", "graspologic-native")
QUESTION = "Who opposes the harbour dredging near the estuary?"
INDEX_TABLES = (T.DOCUMENTS, T.INPUT_REJECTS, T.TEXT_UNITS, T.ENTITIES, T.RELATIONSHIPS, T.COMMUNITIES,
                T.COMMUNITY_REPORTS, T.TEXT_UNIT_EMBEDDINGS, T.ENTITY_EMBEDDINGS)


def answers(index: GraphRagIndex) -> dict:
    """Row counts of the index tables and the offline local and global answers."""
    local, global_ = index.local_search(QUESTION), index.global_search(QUESTION, level=0)
    return {"rows": {name: index.table(name).count() for name in INDEX_TABLES},
            "local": {"answer": local.answer, "context_units": local.context_units},
            "global": {"answer": global_.answer, "context_units": global_.context_units}}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    for name in ("--root", "--input", "--ivy-cache", "--out"):
        parser.add_argument(name, required=True)
    args = parser.parse_args(argv)

    import pyspark

    from graphrag_spark.index.pipeline import run_index
    from graphrag_spark.session import build_spark

    cfg = load_config(REPO / "conf" / "local.yaml", [f"storage.root={args.root}", f"input.path={args.input}",
                                                     f"spark.ivy_cache={args.ivy_cache}", "spark.shuffle_partitions=2"])
    cfg.spark.conf["spark.ui.enabled"] = "false"  # as the test session: the UI only costs time here
    spark = build_spark(cfg.spark)
    summary = run_index(spark, cfg)
    verdict = {"pyspark": pyspark.__version__, "spark": spark.version,
               "libraries": {name: metadata.version(name) for name in RUNTIME_LIBRARIES},
               "summary_counts": {k: str(v) for k, v in summary.counts.items()},
               **answers(GraphRagIndex.load(spark, cfg))}
    Path(args.out).write_text(json.dumps(verdict, indent=1, default=str))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
