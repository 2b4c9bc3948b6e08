"""The graphrag-spark command: init, --help listing config keys, launcher noise hidden, prompts from the project folder."""

import io
import subprocess
import sys

import pytest

from graphrag_spark import cli
from graphrag_spark.config import config_keys, load_config
from graphrag_spark.errors import UserError
from graphrag_spark.prompts import DEFAULT_PROMPT_DIR, load_prompt, use_prompt_dir

IVY_AND_STARTUP = """\
WARNING: Using incubator modules: jdk.incubator.vector
:: loading settings :: url = jar:file:/x/ivy-2.5.3.jar!/org/apache/ivy/core/settings/ivysettings.xml
Ivy Default Cache set to: /x/.cache/ivy/cache
The jars for the packages stored in: /x/.cache/ivy/jars
io.delta#delta-spark_4.1_2.13 added as a dependency
:: resolving dependencies :: org.apache.spark#spark-submit-parent-4ab6;1.0
\tconfs: [default]
\tfound io.delta#delta-spark_4.1_2.13;4.4.0 in central
:: resolution report :: resolve 847ms :: artifacts dl 38ms
\t:: modules in use:
\tcom.fasterxml.jackson.core#jackson-core;2.13.5 from central in [default]
\torg.slf4j#slf4j-api;2.0.17 by [org.slf4j#slf4j-api;2.0.13] in [default]
\t---------------------------------------------------------------------
\t|                  |            modules            ||   artifacts   |
\t0 artifacts copied, 33 already retrieved (0kB/22ms)
You probably access the destination server through a proxy server that is not well configured.
26/12/01 09:09:28 WARN NativeCodeLoader: Unable to load native-hadoop library for your platform
Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties
26/12/01 09:09:30 INFO SparkContext: Running Spark version 4.1.1
Setting Spark log level to "WARN".
Setting default log level to "WARN".
To adjust logging level use sc.setLogLevel(newLevel). For SparkR, use setLogLevel(newLevel).
"""


def test_launcher_noise_is_hidden_and_errors_and_progress_pass():
    job_output = ("error: Config file 'nope.yaml' does not exist.\n"
                  "Traceback (most recent call last):\n"
                  "[extraction] tasks 3/8\r[extraction] tasks 8/8\n")
    sink = io.BytesIO()
    cli.filter_stream(io.BytesIO((IVY_AND_STARTUP + job_output).encode()), sink)
    assert sink.getvalue().decode() == job_output


def test_init_writes_settings_and_prompts_that_jobs_then_read(tmp_path):
    written = cli.init_project(tmp_path)
    assert (tmp_path / "settings.yaml") == written[0] and (tmp_path / "input").is_dir()
    assert {p.name for p in (tmp_path / "prompts").glob("*.txt")} == {p.name for p in DEFAULT_PROMPT_DIR.glob("*.txt")}
    with pytest.raises(UserError, match="already exists"):
        cli.init_project(tmp_path)
    edited = tmp_path / "prompts" / "community_report.txt"
    edited.write_text("My own report prompt: {input_text}", encoding="utf-8")
    (tmp_path / "prompts" / "raptor_summary.txt").unlink()  # a prompt missing from the folder comes from prompts/
    try:
        cfg = load_config(tmp_path / "settings.yaml", [f"prompts.dir={tmp_path / 'prompts'}"])
        assert cfg.extraction.method == "nlp" and cfg.input.path == "input"
        assert load_prompt("community_report").text.startswith("My own report prompt")
        assert load_prompt("raptor_summary").text == (DEFAULT_PROMPT_DIR / "raptor_summary.txt").read_text()
    finally:
        use_prompt_dir(None)
    assert not load_prompt("community_report").text.startswith("My own")


def test_every_command_help_lists_the_config_keys_it_reads():
    for name in ["index", "query", "raptor", "import-graphrag", "explore", "prompt-tune"]:
        text = cli.job_parser(name).format_help()
        assert text.startswith(f"usage: graphrag-spark {name}"), name
        assert "storage.root = output/index" in text, name
    index_help = cli.job_parser("index").format_help()
    for key, default, _ in config_keys(["extraction", "communities", "llm"]):
        assert f"{key} = {default}" in index_help
    assert "--dry-run" in index_help
    assert "raptor.retrieval" in cli.job_parser("query").format_help()
    assert "communities.seed" not in cli.job_parser("query").format_help()


def test_console_script_reports_mistakes_in_one_line_without_starting_spark(tmp_path):
    run = subprocess.run([sys.executable, "-m", "graphrag_spark.cli", "index", "--config", str(tmp_path / "nope.yaml")],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [f"error: Config file '{tmp_path / 'nope.yaml'}' does not exist; "
                                               "pass --config conf/local.yaml or another file in conf/."]
    assert subprocess.run([sys.executable, "-m", "graphrag_spark.cli", "nope"], capture_output=True,
                          timeout=60).returncode == 2
