"""RAPTOR (Sarthi et al. 2024): a tree of recursive cluster summaries over ~100-token chunks.

Pure core, in pipeline order: ``chunking`` (sentence-aware leaves) → ``clustering`` (UMAP + GMM
soft clusters of one layer) → ``summaries`` (the offline extractive summarizer) → ``tree``
(layers of summaries until clustering is infeasible) → ``retrieval`` (collapsed tree and tree
traversal). ``nodes`` is the tree's data model, ``params`` its settings. Nothing here needs
Spark; the Spark shell distributes the per-layer steps.
"""
