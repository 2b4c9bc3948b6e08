"""Adapt the extraction prompts to your corpus with the configured model (graphrag's prompt-tune):

    spark-submit jobs/prompt_tune.py --config settings.yaml

Samples text units evenly over the corpus (the index's text_units table, else input.path), asks
llm.chat for the domain, a persona, the entity types and few-shot examples in the extraction
format, and writes entity_extraction.txt, entity_extraction_examples.txt and community_report.txt
into prompts.dir, which every later run of that config reads. Answers are cached in the index's
llm_results table: a rerun pays only for what is missing.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cli import base_parser, job_config, user_errors  # noqa: E402

SECTIONS = ["storage", "input", "chunking", "prompts", "extraction", "llm", "spark"]


def build_parser():
    return base_parser(__doc__, SECTIONS)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    # Imported after parsing, so --help and argument mistakes cost no Spark import.
    from graphrag_spark.progress import console_progress, stage
    from graphrag_spark.prompt_tune import tune_prompts
    from graphrag_spark.session import build_spark

    with user_errors():
        cfg = job_config(args)
        spark = build_spark(cfg.spark, master=args.master)
        with console_progress(spark), stage("prompt-tune"):
            tuned = tune_prompts(spark, cfg)
        print(tuned.render())


if __name__ == "__main__":
    main()
