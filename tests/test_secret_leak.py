"""The API key never leaks in local mode, even when the provider echoes it in every error: not in
the driver's or the Python workers' output, the Spark event log, any Delta table (llm_usage and
llm_results included), an exception or a config dump."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from graphrag_spark.llm.server import start_server

from conftest import REPO

pytestmark = pytest.mark.spark

SECRET = "sk-test-ECHOED-KEY-MUST-NEVER-LEAK-5f0c2a9d7e1b4c3a"
KEY_ENV = "GRAPHRAG_SECRET_TEST_KEY"


def test_the_echo_mode_really_returns_the_key():
    """The control: without the client's scrubbing, the key would be in every error."""
    with start_server(echo_auth=True) as server:
        request = urllib.request.Request(f"{server.base_url}/chat/completions", data=b"{}", method="POST",
                                         headers={"Authorization": f"Bearer {SECRET}", "Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(request, timeout=10)
    assert answer.value.code == 401 and SECRET in answer.value.read().decode()


def test_an_echoed_key_leaks_into_no_output_event_log_table_or_error(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "note.txt").write_text("NeoChip sells low-power processors. Quantum Systems owned NeoChip until 2016.\n")
    event_log = tmp_path / "events"
    event_log.mkdir()
    env = {**os.environ, KEY_ENV: SECRET, "OPENAI_LOG": "debug"}  # the openai library logs in workers too
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "secret_leak_job.py"), str(corpus), str(tmp_path / "idx"),
                           str(event_log), KEY_ENV], capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    verdict = json.loads(proc.stdout.rsplit("VERDICT ", 1)[1])

    # The failure paths really ran, with the echoed key in the provider's answers.
    assert verdict["injected_401"] >= 3
    assert any("AuthenticationError" in e for e in verdict["llm_result_errors"])
    assert any("StageFailed" in e for e in verdict["errors"]) and verdict["null_vectors"] > 0
    # Only the Python workers call the model: their warnings in stderr show their output was captured.
    assert "LLM call extract:" in proc.stderr and "Incorrect API key provided" in proc.stderr

    assert SECRET not in output
    assert all(SECRET not in e for e in verdict["errors"] + verdict["llm_result_errors"])
    assert SECRET not in verdict["config_dump"]
    assert {"llm_usage", "llm_results"} <= set(verdict["tables"])
    assert all(leaking == 0 for _, leaking in verdict["tables"].values()), verdict["tables"]
    logs = [p for p in event_log.rglob("*") if p.is_file()]
    assert logs and all(SECRET.encode() not in p.read_bytes() for p in logs)
    delta_logs = [p for p in (tmp_path / "idx").rglob("*.json")]
    assert delta_logs and all(SECRET.encode() not in p.read_bytes() for p in delta_logs)


def test_without_the_clients_scrubbing_the_echoed_key_would_be_in_every_error(monkeypatch):
    """What the job test guards against: the same failure path with scrubbing switched off leaks."""
    from graphrag_spark.config import LlmModelConfig
    from graphrag_spark.llm.client import ChatRequest, LlmClient, run_batch

    monkeypatch.setenv(KEY_ENV, SECRET)
    monkeypatch.setattr(LlmClient, "_scrub", lambda self, text: text)
    with start_server(echo_auth=True) as server:
        cfg = LlmModelConfig(api_base=server.base_url, api_key_env=KEY_ENV, max_retries=0)
        [result] = run_batch([ChatRequest(messages=[{"role": "user", "content": "hi"}])], cfg)
    assert result.error and SECRET in result.error
