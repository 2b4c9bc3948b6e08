"""GraphRAG and RAPTOR as distributed Spark jobs over Delta tables."""

__version__ = "0.1.0"

# PySpark is not a declared dependency (a cluster brings its own): say what is missing in one sentence.
try:
    import pyspark as _pyspark
except ModuleNotFoundError:
    raise ImportError("graphrag-spark runs on PySpark, which this environment lacks: on a machine without Spark "
                      "install `graphrag-spark[local]`; on a cluster use its own Spark (3.5 or 4.x).") from None
if tuple(int(part) for part in _pyspark.__version__.split(".")[:2]) < (3, 5):
    raise ImportError(f"graphrag-spark needs Spark 3.5 or later and this environment has pyspark {_pyspark.__version__} "
                      f"(Databricks Runtime 15.4 LTS and later ship Spark 3.5 or 4).")

# A runtime's own numpy, pandas or pyarrow that graphrag-spark does not support: one sentence, before pandas or pyarrow is imported.
from graphrag_spark.versions import conflict as _conflict, installed_versions as _installed_versions

if (_problem := _conflict(_installed_versions())) is not None:
    raise ImportError(_problem)
