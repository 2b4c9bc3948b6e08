"""Shared argument handling for the thin job entry points."""

from __future__ import annotations

import argparse
import sys
import textwrap
from contextlib import contextmanager

from graphrag_spark.config import Config, config_keys, load_config
from graphrag_spark.errors import StageFailed, UserError


def config_help(sections: list[str]) -> str:
    """The epilog of a job's --help: every config key it reads, with default and description."""
    lines = ["config keys read (set them in the --config YAML or with --set section.key=value):"]
    for key, default, description in config_keys(sections):
        lines.append(f"  {key} = {default}")
        if description:
            lines += textwrap.wrap(description, width=96, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


def base_parser(description: str, sections: list[str]) -> argparse.ArgumentParser:
    """``sections``: the config sections the job reads, listed key by key in its --help."""
    parser = argparse.ArgumentParser(description=description, epilog=config_help(sections),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="conf/local.yaml", help="YAML config (default: conf/local.yaml)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value; repeatable, e.g. --set chunking.size=300")
    parser.add_argument("--master", default=None, help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument("--verbose", action="store_true", help="show Spark's INFO log instead of progress lines only")
    return parser


def job_config(args: argparse.Namespace) -> Config:
    """The config of a job run: the YAML, the --set overrides, and --verbose's log level."""
    overrides = list(args.set) + (["spark.log_level=INFO"] if args.verbose else [])
    return load_config(args.config, overrides)


@contextmanager
def user_errors():
    """A user mistake ends the job with one sentence and exit code 2, not a stack trace."""
    try:
        yield
    except (UserError, StageFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
