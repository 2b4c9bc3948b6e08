"""Shared argument handling for the thin job entry points."""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager

from graphrag_spark.errors import StageFailed, UserError


def base_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", default="conf/local.yaml", help="YAML config (default: conf/local.yaml)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value; repeatable, e.g. --set chunking.size=300")
    parser.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[*])")
    return parser


@contextmanager
def user_errors():
    """A user mistake ends the job with one sentence and exit code 2, not a stack trace."""
    try:
        yield
    except (UserError, StageFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
