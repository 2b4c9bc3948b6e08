"""Drive every LLM path in local mode against a server that echoes the Authorization header in its
errors, then print a JSON verdict. Started in its own process by test_secret_leak.py, so the test sees
everything that process writes: driver and JVM output, the Python workers' output (their stderr
goes through the JVM's), the Spark event log and the Delta tables."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pyspark

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("SPARK_HOME", str(Path(pyspark.__file__).parent))

from pyspark.sql import functions as F  # noqa: E402

from graphrag_spark import tables as T  # noqa: E402
from graphrag_spark.config import load_config  # noqa: E402
from graphrag_spark.index.embed import embed_texts  # noqa: E402
from graphrag_spark.index.pipeline import run_index  # noqa: E402
from graphrag_spark.llm.server import start_server  # noqa: E402
from graphrag_spark.query.executors import chat_in_executors  # noqa: E402
from graphrag_spark.session import build_spark  # noqa: E402
from tiny_data import TINY_DATA_CONF  # noqa: E402


def step(name: str) -> None:
    print(f"secret_leak_job: {name}", file=sys.stderr, flush=True)  # where a slow or stuck run was


def main(corpus: str, root: str, event_log: str, key_env: str) -> None:
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)  # the driver logs everything it can
    verdict: dict = {"errors": []}
    with start_server(echo_auth=True) as server:
        cfg = load_config(REPO / "conf" / "local.yaml", [
            f"input.path={corpus}", f"storage.root={root}", f"spark.ivy_cache={REPO / '.cache' / 'ivy'}",
            "extraction.method=llm", f"llm.chat.api_base={server.base_url}", f"llm.chat.api_key_env={key_env}",
            f"llm.embedding.api_base={server.base_url}", f"llm.embedding.api_key_env={key_env}",
            "embeddings.provider=openai", "llm.chat.max_retries=1", "llm.embedding.max_retries=1",
            "spark.driver_memory=1g"])
        spark = build_spark(cfg.spark, master="local[2]", extra_conf={**TINY_DATA_CONF,
            "spark.eventLog.enabled": "true", "spark.eventLog.dir": event_log, "spark.ui.enabled": "false",
            "spark.eventLog.compress": "false"})  # Spark 4 compresses event logs (zstd) by default: the test greps plain text
        store = T.TableStore(spark, cfg.storage)
        step("index")
        try:  # index: every extraction call fails, the stage fails with a summary of the errors
            run_index(spark, cfg)
        except Exception as exc:  # noqa: BLE001 - the message itself is under test
            verdict["errors"].append(f"{type(exc).__name__}: {exc}")
        step("query")  # a call made in an executor
        verdict["errors"] += [r.error or "" for r in chat_in_executors(spark, ["Who sells chips?"], cfg.llm.chat,
                                                                        stage="global_reduce", max_tokens=10,
                                                                        max_in_flight=cfg.llm.max_in_flight)]
        step("embeddings")  # in executors: failed batches become null vectors
        store.write(embed_texts(store.read(T.TEXT_UNITS).select("id", "text"), cfg, 2), T.TEXT_UNIT_EMBEDDINGS)
        verdict["null_vectors"] = store.read(T.TEXT_UNIT_EMBEDDINGS).where(F.col("vector").isNull()).count()
        step("tables")
        verdict["config_dump"] = cfg.model_dump_json()
        secret = os.environ[key_env]
        verdict["tables"] = {}
        for path in sorted(Path(root).iterdir()):
            if (path / "_delta_log").is_dir():
                table = spark.read.format("delta").load(str(path))
                rows = table.select(F.to_json(F.struct(*table.columns)).alias("j"))
                # Searched here, not in SQL: a filter on the key would itself put it in the event log's plans.
                texts = [r.j for r in rows.collect()]
                verdict["tables"][path.name] = [len(texts), sum(secret in text for text in texts)]
        verdict["llm_result_errors"] = [r.error for r in store.read(T.LLM_RESULTS).where("error is not null")
                                        .select("error").limit(3).collect()]
        verdict["injected_401"] = server.stats()["injected"]["401"]
        spark.stop()  # flushes the event log
    print("VERDICT " + json.dumps(verdict))


if __name__ == "__main__":
    main(*sys.argv[1:])
