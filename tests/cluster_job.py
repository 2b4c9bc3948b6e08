"""Run chunking and extraction on a real multi-process cluster (two executor JVMs, their own
Python workers), then print a JSON verdict. Started in its own process by test_cluster.py,
because one Python process can hold only one SparkContext."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pandas as pd
import pyspark

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("SPARK_HOME", str(Path(pyspark.__file__).parent))

from graphrag_spark.config import load_config  # noqa: E402
from graphrag_spark.index import documents, extraction  # noqa: E402
from graphrag_spark.index.chunks import build_text_units  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402
from tiny_data import TINY_DATA_CONF  # noqa: E402


def main(corpus: str, root: str) -> None:
    cfg = load_config(REPO / "conf" / "local.yaml", [f"input.path={corpus}", f"storage.root={root}",
                                                     f"spark.ivy_cache={REPO / '.cache' / 'ivy'}", "chunking.size=200",
                                                     "chunking.overlap=20"])
    spark = build_spark(cfg.spark, master="local-cluster[2,1,1024]", extra_conf=TINY_DATA_CONF)
    units = build_text_units(documents.build_documents(spark, cfg.input).documents, cfg.chunking).repartition(4).persist()
    # Persisted, as the index job does: the counts below read one extraction pass, not one pass each.
    entities, relationships = extraction.split_instances(extraction.nlp_instances(units, cfg.extraction).persist())

    def worker(batches):
        for batch in batches:
            yield pd.DataFrame({"pid": [os.getpid()], "rows": [len(batch)]})

    pids = {r.pid for r in units.mapInPandas(worker, "pid long, rows long").collect()}
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver
    verdict = {"master": spark.sparkContext.master, "executors": executors, "worker_pids": len(pids),
               "driver_pid": os.getpid(), "text_units": units.count(), "entity_instances": entities.count(),
               "relationship_instances": relationships.count(),
               "entity_units_known": entities.join(units.select("id").withColumnRenamed("id", "text_unit_id"),
                                                   "text_unit_id", "left_anti").count() == 0}
    print("VERDICT " + json.dumps(verdict))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
