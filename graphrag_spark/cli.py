"""The ``graphrag-spark`` command: one entry point over the Spark jobs in ``jobs/``.

    graphrag-spark init my-project            # starter settings.yaml + a copy of the prompts
    graphrag-spark index --config settings.yaml [--dry-run] [--full]
    graphrag-spark query "What are the main themes?"

Every job command validates its arguments and config here (a mistake costs no JVM start), then
runs ``spark-submit jobs/<job>.py`` with Delta's JARs by path (resolved once into the project's
cache) and the driver memory of the config. ``spark-submit jobs/<job>.py`` by hand keeps working the same way.
Without ``--verbose`` the launcher's dependency resolution and Spark's start-up log are hidden.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from graphrag_spark.config import load_config
from graphrag_spark.errors import UserError
from graphrag_spark.prompts import DEFAULT_PROMPT_DIR
from graphrag_spark.resources import JOBS_DIR

DEFAULT_SETTINGS = "settings.yaml"


@dataclass(frozen=True)
class Job:
    script: str
    summary: str


JOBS = {
    "index": Job("index.py", "build (or refresh) the GraphRAG index into Delta tables"),
    "query": Job("query.py", "ask questions: global, local, basic, ts or raptor search"),
    "raptor": Job("raptor.py", "build the RAPTOR tree index"),
    "import-graphrag": Job("import_msgraphrag.py", "import a microsoft/graphrag index (parquet output)"),
    "explore": Job("explore.py", "write the static HTML explorer (and GraphML) of an index"),
    "prompt-tune": Job("prompt_tune.py", "have the model adapt the extraction prompts to your corpus"),
    "evaluate": Job("evaluate.py", "evaluate query methods against each other"),
}


def available_jobs() -> dict[str, Job]:
    """Commands whose job script exists (``evaluate`` only once jobs/evaluate.py is there)."""
    return {name: job for name, job in JOBS.items() if (JOBS_DIR / job.script).is_file()}


def job_parser(name: str) -> argparse.ArgumentParser | None:
    """The job's own parser (its options and the config keys it reads), named as this command;
    None for a job script without ``build_parser()`` (it then parses its arguments itself)."""
    job = JOBS[name]
    spec = importlib.util.spec_from_file_location(f"graphrag_spark_job_{job.script[:-3]}", JOBS_DIR / job.script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "build_parser"):
        return None
    parser = module.build_parser()
    parser.prog = f"graphrag-spark {name}"
    return parser


def _launch_options() -> argparse.ArgumentParser:
    """What the launcher itself needs from a job's arguments, when the job has no parser to ask."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--config", default="conf/local.yaml")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--verbose", action="store_true")
    return parser


# ---------------------------------------------------------------- init

STARTER_SETTINGS = """\
# graphrag-spark project settings. Every key, its default and meaning: `graphrag-spark index --help`.
# Paths are relative to the folder you run graphrag-spark in (this one).
storage:
  root: output/index
input:
  path: input            # put .txt / .md / .jsonl / .csv documents here
prompts:
  dir: prompts           # edit these, or let `graphrag-spark prompt-tune` rewrite them for your corpus
chunking:
  size: 600
  overlap: 100
extraction:
  # `nlp` indexes offline (no LLM, no cost). Switch to `llm` for the paper's extraction and reports
  # with the model configured below.
  method: nlp
  entity_types: [organization, person, geo, event]
llm:
  chat:
    model: gpt-4o-mini
    api_base: ${OPENAI_API_BASE:-https://api.openai.com/v1}
    api_key_env: OPENAI_API_KEY   # the name of the variable holding the key, never the key
    price_per_1k_prompt: 0.00015
    price_per_1k_completion: 0.0006
  embedding:
    model: text-embedding-3-small
    api_base: ${OPENAI_API_BASE:-https://api.openai.com/v1}
    api_key_env: OPENAI_API_KEY
    price_per_1k_prompt: 0.00002
embeddings:
  provider: offline      # `openai` embeds with llm.embedding
query:
  llm: false             # true answers with llm.chat
spark:
  shuffle_partitions: 8
"""


def init_project(root: Path, force: bool = False) -> list[Path]:
    """Write ``settings.yaml``, ``prompts/`` (a copy of the project's prompts) and ``input/`` under ``root``."""
    settings = root / DEFAULT_SETTINGS
    prompt_dir = root / "prompts"
    existing = [p for p in (settings, prompt_dir) if p.exists()]
    if existing and not force:
        raise UserError(f"'{existing[0]}' already exists; pass --force to overwrite it, or init another folder.")
    (root / "input").mkdir(parents=True, exist_ok=True)
    prompt_dir.mkdir(parents=True, exist_ok=True)
    settings.write_text(STARTER_SETTINGS, encoding="utf-8")
    written = [settings]
    for source in sorted(DEFAULT_PROMPT_DIR.glob("*.txt")):
        written.append(Path(shutil.copy2(source, prompt_dir / source.name)))
    return written


# ---------------------------------------------------------------- launching

_LAUNCHER_NOISE = re.compile(
    r"^(:: |\t(confs|found|downloading|\[SUCCESSFUL|\d+ artifacts copied|:: |[|-])"
    r"|Ivy Default Cache set to|The jars for the packages stored in|.* added as a dependency$"
    r"|.* from \w+ in \[default\]$|.* by \[.*\] in \[default\]$"
    r"|WARNING: Using incubator modules|Using Spark's default log4j profile|Setting Spark log level to"
    r"|Setting default log level to|To adjust logging level use sc.setLogLevel"
    r"|.*You probably access the destination server through a proxy server"
    r"|\d\d/\d\d/\d\d \d\d:\d\d:\d\d (INFO|WARN) )"
)


def is_launcher_noise(line: str) -> bool:
    """Lines spark-submit prints before the job runs: Ivy's dependency resolution, the JVM's module
    notice and Spark's start-up log. Hidden unless --verbose; anything else (errors) passes."""
    return bool(_LAUNCHER_NOISE.match(line))


def filter_stream(source: IO[bytes], sink: IO[bytes]) -> None:
    """Copy ``source`` to ``sink`` without noise lines. Progress lines that end in ``\\r`` are copied
    as soon as they arrive, so a line updated in place stays live."""
    buffer = b""
    while chunk := source.read1(65536) if hasattr(source, "read1") else source.read(65536):
        buffer += chunk
        while (cut := _first_break(buffer)) >= 0:
            segment, buffer = buffer[:cut + 1], buffer[cut + 1:]
            if not is_launcher_noise(segment.decode("utf-8", "replace").rstrip("\r\n")):
                sink.write(segment)
                sink.flush()
    if buffer and not is_launcher_noise(buffer.decode("utf-8", "replace")):
        sink.write(buffer)
        sink.flush()


def _first_break(buffer: bytes) -> int:
    breaks = [i for i in (buffer.find(b"\n"), buffer.find(b"\r")) if i >= 0]
    return min(breaks) if breaks else -1


def spark_submit_binary() -> str:
    local = Path(sys.executable).parent / "spark-submit"
    if local.is_file():
        return str(local)
    found = shutil.which("spark-submit")
    if not found:
        raise UserError("spark-submit was not found; run scripts/setup.sh (it installs pyspark into .venv).")
    return found


def submit_command(job: Job, job_args: list[str], config_path: str, overrides: list[str], verbose: bool) -> list[str]:
    """spark-submit with what the JVM needs before the job starts: Delta's JARs by path, log level, driver memory."""
    from graphrag_spark.session import _preset_conf, local_driver_options, local_jars

    cfg = load_config(config_path, overrides)
    command = [spark_submit_binary(), "--jars", ",".join(local_jars(cfg.spark)),
               "--conf", f"spark.log.level={'INFO' if verbose else cfg.spark.log_level}"]
    local = not cfg.spark.master or cfg.spark.master.startswith("local")
    # The small-machine driver heap only for a local master, unless the config names one.
    if local or "driver_memory" in cfg.spark.model_fields_set:
        command += ["--driver-memory", cfg.spark.driver_memory]
    # As build_spark: never over driver options spark-defaults.conf already sets.
    ours = local and "spark.driver.extraJavaOptions" not in _preset_conf(under_submit=False)
    options = local_driver_options(cfg.spark, cfg.spark.conf.get("spark.driver.extraJavaOptions")) if ours else []
    if options:
        command += ["--driver-java-options", " ".join(options)]
    if cfg.spark.master:
        command += ["--master", cfg.spark.master]
    return command + [str(JOBS_DIR / job.script), *job_args]


def run_job(name: str, job_args: list[str]) -> int:
    parser = job_parser(name)
    if parser is not None:
        args = parser.parse_args(job_args)  # --help and argument mistakes end here, before any JVM
    else:
        args = _launch_options().parse_known_args(job_args)[0]
    if "--config" not in job_args and not any(a.startswith("--config=") for a in job_args) \
            and Path(DEFAULT_SETTINGS).is_file():
        job_args = ["--config", DEFAULT_SETTINGS, *job_args]
        args.config = DEFAULT_SETTINGS
    command = submit_command(JOBS[name], job_args, args.config, args.set, args.verbose)
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if args.verbose:
        return subprocess.call(command, env=env)
    if sys.stderr.isatty():
        env["GRAPHRAG_SPARK_PROGRESS"] = "tty"  # the job's stderr is our pipe, but a person is watching
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
    copier = threading.Thread(target=filter_stream, args=(process.stderr, sys.stderr.buffer), daemon=True)
    copier.start()
    try:
        code = process.wait()
    except KeyboardInterrupt:
        process.terminate()
        code = process.wait()
    copier.join(timeout=5)
    return code


def build_parser() -> argparse.ArgumentParser:
    jobs = available_jobs()
    parser = argparse.ArgumentParser(
        prog="graphrag-spark", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="GraphRAG and RAPTOR as Spark jobs over Delta tables.",
        epilog="commands:\n  init                 write a starter settings.yaml and a copy of the prompts\n"
               + "".join(f"  {name:<20} {job.summary}\n" for name, job in jobs.items())
               + "\n`graphrag-spark COMMAND --help` shows a command's options and the config keys it reads.\n"
                 "Without --config, a settings.yaml in the current folder is used, else conf/local.yaml.")
    parser.add_argument("command", choices=["init", *jobs], metavar="COMMAND")
    return parser


def init_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="graphrag-spark init",
                                     description="Write a starter settings.yaml, prompts/ (a copy of the project's "
                                                 "prompts, read by every job through prompts.dir) and input/.")
    parser.add_argument("root", nargs="?", default=".", help="project folder (default: the current one)")
    parser.add_argument("--force", action="store_true", help="overwrite an existing settings.yaml and prompts/")
    args = parser.parse_args(argv)
    root = Path(args.root)
    written = init_project(root, args.force)
    print(f"Wrote {written[0]} and {len(written) - 1} prompts in {root / 'prompts'}; put documents in {root / 'input'}.")
    print(f"Next: cd {root} && graphrag-spark index   (offline; set extraction.method: llm for the paper's method)")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--verbose"]:  # `graphrag-spark --verbose index` = `graphrag-spark index --verbose`
        argv = argv[1:2] + ["--verbose"] + argv[2:]
    if not argv or argv[0].startswith("-"):
        build_parser().parse_args(argv or ["--help"])
        return 2
    command, rest = argv[0], argv[1:]
    build_parser().parse_args([command])
    try:
        return init_main(rest) if command == "init" else run_job(command, rest)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
