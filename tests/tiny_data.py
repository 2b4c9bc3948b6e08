"""Spark settings for the few kilobytes of test data, shared by the test session and the jobs and servers
that tests start in other processes.

On such data a JVM's work is planning, not rows: a Java Flight Recorder profile of the sample index found
35% of its samples generating and compiling code (most of it a projection over Delta's wide action schema,
generated again in every task) and 7% listing a new table's files for its first checksum. Interpreted
expressions and no file list in the checksum give the same rows, and took tests/test_refresh.py from 448
to 367 CPU-s (252 to 207 s) in one process. The quickstart's jobs and Spark 3.5's keep Spark's and
Delta's defaults, so the defaults stay tested end to end.

Executor JVMs (a test's local-cluster or standalone cluster) live for one small job: they compile with C1
only, as a local job's driver does. On the standalone cluster's test, C2 took half of each executor's CPU.
"""

from graphrag_spark.session import C1_ONLY

TINY_DATA_CONF = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN",
                  "spark.databricks.delta.allFilesInCrc.enabled": "false",
                  "spark.executor.extraJavaOptions": " ".join(C1_ONLY)}
