"""Bridges from other GraphRAG implementations' outputs into this project's tables."""
