"""The paper's evaluation (section 4): generated questions, pairwise LLM judging with statistics,
claim-based metrics, one report. Pure core in the modules here; the Spark steps in ``run``.

    from graphrag_spark.evaluation.run import run_evaluation
    result = run_evaluation(index)          # a GraphRagIndex; settings in cfg.evaluation
    print(result.markdown)
"""
