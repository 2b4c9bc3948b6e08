"""API keys: resolved once on the driver, carried to the Python workers inside the task closure.

Sources, the first one configured wins: a Databricks secret scope (``llm.*.api_key_secret:
scope/key``, read through ``dbutils`` on the driver), a file (``llm.*.api_key_file``), the
environment variable ``llm.*.api_key_env``.

Delivery: the resolved key is a private attribute of the model's config object, and that object
is pickled into the closure Spark ships with every task. A closure appears nowhere a person or a
log can read it: not in the UI's environment tab or the event log (where ``spark.executorEnv.*``
would show it), not in driver or executor logs. It works the same on Spark Connect, where there is
no broadcast. The config's dumps and repr never include private attributes.

Before the first call of a stage, :func:`ensure_api_key` makes one cheap request (``GET /models``)
on the driver, so a missing or rejected key fails the job once, with one sentence, instead of
failing every task.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import openai

from graphrag_spark.config import LlmModelConfig
from graphrag_spark.errors import UserError

_CHECKED: set[tuple[str, str, str]] = set()
_CHECKING = threading.Lock()  # a check in flight (one made ahead) is waited for, not made twice
_PREFLIGHT_TIMEOUT_S = 20.0


def key_source(cfg: LlmModelConfig) -> str:
    """Where the key comes from, in words that are safe to print."""
    if cfg.api_key_secret:
        return f"Databricks secret '{cfg.api_key_secret}'"
    if cfg.api_key_file:
        return f"file '{cfg.api_key_file}'"
    return f"environment variable {cfg.api_key_env}"


def resolve_api_key(cfg: LlmModelConfig) -> str | None:
    """The key from the configured source (None where it names nothing); fails with one sentence when the
    configured file or secret cannot be read."""
    if cfg.api_key_secret:
        return _databricks_secret(cfg.api_key_secret)
    if cfg.api_key_file:
        path = Path(cfg.api_key_file).expanduser()
        try:
            key = path.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise UserError(f"llm.*.api_key_file '{path}' cannot be read ({exc.strerror}); fix the path or its permissions.") from None
        if not key:
            raise UserError(f"llm.*.api_key_file '{path}' is empty; write the API key into it.")
        return key
    import os

    return os.environ.get(cfg.api_key_env) or None


def _databricks_secret(spec: str) -> str:
    scope, _, name = spec.partition("/")
    if not scope or not name:
        raise UserError(f"llm.*.api_key_secret '{spec}' must be 'scope/key'.")
    try:
        from pyspark.dbutils import DBUtils  # present on Databricks runtimes only
        from pyspark.sql import SparkSession
    except ImportError:
        raise UserError("llm.*.api_key_secret needs a Databricks runtime (dbutils); elsewhere use api_key_env or api_key_file.") from None
    try:
        return DBUtils(SparkSession.getActiveSession()).secrets.get(scope=scope, key=name)
    except Exception as exc:  # noqa: BLE001 - dbutils raises py4j/IllegalArgument errors; the name is enough
        raise UserError(f"Databricks secret '{spec}' cannot be read ({type(exc).__name__}); check the scope, the key and your ACL.") from None


def ensure_api_key(cfg: LlmModelConfig) -> None:
    """On the driver, before a stage's first task: resolve the key into ``cfg`` (so every task closure
    carries it) and check it with one cheap request. Checked once per process, model and key."""
    from graphrag_spark.llm.client import LOCAL_PLACEHOLDER_KEY, _is_local

    key = resolve_api_key(cfg)
    if key is None:
        if not _is_local(cfg.api_base):
            raise UserError(f"No API key for model '{cfg.model}': the {key_source(cfg)} is not set; export it "
                            "(or set llm.*.api_key_env / api_key_file / api_key_secret to where the key is).")
        key = LOCAL_PLACEHOLDER_KEY
    cfg.attach_api_key(key)
    marker = (cfg.api_base or "", cfg.api_type, hashlib.sha256(key.encode()).hexdigest())
    with _CHECKING:
        if marker in _CHECKED:
            return
        _preflight(cfg, key)
        _CHECKED.add(marker)


def check_ahead(models: list[LlmModelConfig]) -> threading.Thread | None:
    """:func:`ensure_api_key` for ``models``, in a thread of its own (returned): the request overlaps the job's
    start rather than the first stage's. A failure is the stage's to raise: its own check makes the request again."""
    def check() -> None:
        for model in models:
            try:
                ensure_api_key(model)
            except Exception:  # noqa: BLE001 - see above
                pass

    if not models:
        return None
    thread = threading.Thread(target=check, name="api-key-check", daemon=True)
    thread.start()
    return thread


def _preflight(cfg: LlmModelConfig, key: str) -> None:
    from graphrag_spark.llm.client import build_sync_client

    where = cfg.api_base or "api.openai.com"
    try:
        with build_sync_client(cfg, key, timeout_s=_PREFLIGHT_TIMEOUT_S) as client:
            client.models.list()
    except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
        raise UserError(f"The API key from the {key_source(cfg)} was rejected by {where} "
                        f"(HTTP {exc.status_code}); set a valid key there.") from None
    except openai.APIConnectionError:
        raise UserError(f"Cannot reach the model endpoint {where}; check llm.*.api_base and the network.") from None
    except openai.APIStatusError:
        pass  # an endpoint without GET /models (or one that is briefly unwell) did not reject the key
