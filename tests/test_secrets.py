"""API keys resolved on the driver, checked once, and carried to tasks without any dump showing them."""

from __future__ import annotations

import time

import cloudpickle
import pytest

from graphrag_spark.config import LlmModelConfig, load_config
from graphrag_spark.errors import UserError
from graphrag_spark.llm import ChatRequest, run_batch
from graphrag_spark.llm import secrets
from graphrag_spark.llm.server import start_server

KEY = "sk-test-0123456789abcdef"


@pytest.fixture
def server():
    with start_server(api_key=KEY) as handle:
        yield handle


@pytest.fixture(autouse=True)
def fresh_checks(monkeypatch):
    monkeypatch.setattr(secrets, "_CHECKED", set())
    monkeypatch.delenv("GRS_TEST_KEY", raising=False)


def model(server, **fields) -> LlmModelConfig:
    return LlmModelConfig(api_base=server.base_url, api_key_env="GRS_TEST_KEY", max_retries=0, **fields)


def test_key_from_a_file_wins_over_the_environment(tmp_path, monkeypatch):
    (tmp_path / "key").write_text(f"{KEY}\n")
    monkeypatch.setenv("GRS_TEST_KEY", "sk-from-env")
    cfg = LlmModelConfig(api_key_env="GRS_TEST_KEY", api_key_file=str(tmp_path / "key"))
    assert secrets.resolve_api_key(cfg) == KEY
    assert secrets.resolve_api_key(LlmModelConfig(api_key_env="GRS_TEST_KEY")) == "sk-from-env"
    with pytest.raises(UserError, match="cannot be read"):
        secrets.resolve_api_key(LlmModelConfig(api_key_file=str(tmp_path / "missing")))
    with pytest.raises(UserError, match="needs a Databricks runtime"):
        secrets.resolve_api_key(LlmModelConfig(api_key_secret="scope/openai"))


def test_driver_key_reaches_a_task_that_has_no_environment(server, monkeypatch):
    monkeypatch.setenv("GRS_TEST_KEY", KEY)
    cfg = model(server)
    secrets.ensure_api_key(cfg)
    task_cfg = cloudpickle.loads(cloudpickle.dumps(lambda: cfg))()  # what a task closure carries
    monkeypatch.delenv("GRS_TEST_KEY")  # an executor's environment: no key
    [result] = run_batch([ChatRequest(messages=[{"role": "user", "content": "Say hi."}])], task_cfg)
    assert result.ok, result.error
    dumped = repr(cfg) + cfg.model_dump_json() + str(load_config(None).model_dump())
    assert KEY not in dumped


def test_a_wrong_or_missing_key_fails_once_on_the_driver(server, monkeypatch):
    monkeypatch.setenv("GRS_TEST_KEY", "sk-wrong")
    with pytest.raises(UserError) as rejected:
        secrets.ensure_api_key(model(server))
    message = str(rejected.value)
    assert "rejected" in message and "GRS_TEST_KEY" in message and "sk-wrong" not in message
    assert server.stats()["unauthorized"] == 1 and server.stats()["requests"]["chat"] == 0
    monkeypatch.delenv("GRS_TEST_KEY")
    with pytest.raises(UserError, match="No API key for model"):
        secrets.ensure_api_key(LlmModelConfig(api_base="https://llm.example.com/v1", api_key_env="GRS_TEST_KEY"))


def test_the_check_runs_once_per_key(server, monkeypatch):
    monkeypatch.setenv("GRS_TEST_KEY", KEY)
    for _ in range(3):
        secrets.ensure_api_key(model(server))
    assert server.stats()["unauthorized"] == 0
    assert len(secrets._CHECKED) == 1


def test_an_unreachable_endpoint_is_one_sentence(monkeypatch):
    monkeypatch.setenv("GRS_TEST_KEY", KEY)
    with start_server() as handle:
        base = handle.base_url  # a port that is free once this server stops
    with pytest.raises(UserError, match="Cannot reach the model endpoint"):
        secrets.ensure_api_key(LlmModelConfig(api_base=base, api_key_env="GRS_TEST_KEY"))


def test_a_check_made_ahead_is_waited_for_and_a_failed_one_is_left_to_the_stage(server, monkeypatch):
    """The index checks its keys beside its start: a stage's own check waits for that request rather than making
    it again, and a key it finds rejected fails nothing there: the stage's check raises the one sentence."""
    made, real = [], secrets._preflight
    monkeypatch.setattr(secrets, "_preflight", lambda cfg, key: (made.append(key), time.sleep(0.3), real(cfg, key)))
    monkeypatch.setenv("GRS_TEST_KEY", KEY)
    cfg = model(server)
    ahead = secrets.check_ahead([cfg])
    secrets.ensure_api_key(cfg)
    ahead.join()
    assert made == [KEY]
    monkeypatch.setenv("GRS_TEST_KEY", "sk-wrong")
    wrong = model(server)
    secrets.check_ahead([wrong]).join()
    assert server.stats()["unauthorized"] == 1
    with pytest.raises(UserError, match="rejected"):
        secrets.ensure_api_key(wrong)
    assert secrets.check_ahead([]) is None
