"""Index stages, in pipeline order: documents, chunks, extraction, graph, communities, reports."""
