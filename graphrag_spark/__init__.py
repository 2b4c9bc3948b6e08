"""GraphRAG and RAPTOR as distributed Spark jobs over Delta tables."""

__version__ = "0.1.0"
