import pytest

from graphrag_spark.config import Config, load_config
from graphrag_spark.errors import UserError
from graphrag_spark.ids import content_id, normalize_name, normalize_text
from graphrag_spark.raptor.params import RaptorParams

from conftest import REPO


def test_content_ids_are_stable_and_separator_safe():
    assert content_id("a", "b") == content_id("a", "b")
    assert content_id("ab", "c") != content_id("a", "bc")


def test_normalized_text_ignores_line_endings_and_trailing_space():
    assert normalize_text("Hello  \r\nworld\r\n\n") == normalize_text("Hello\nworld")


def test_name_matching_modes():
    assert normalize_name("  elena   Voss ") == "ELENA VOSS"
    assert normalize_name("Dr. Jekyll") != normalize_name("DR JEKYLL")
    assert normalize_name("Dr. Jekyll", "folded") == normalize_name("DR JEKYLL", "folded")
    assert normalize_name("Café", "folded") == "CAFE"


def test_local_config_loads_with_documented_defaults():
    cfg = load_config("conf/local.yaml")
    assert cfg.extraction.method == "nlp"
    assert (cfg.chunking.size, cfg.chunking.overlap) == (600, 100)
    assert cfg.reports.max_input_tokens == 8000


def test_code_defaults_are_the_papers_parameters():
    """``Config()`` itself (no YAML, which sets values of its own) carries the papers' parameters."""
    cfg = Config()
    assert (cfg.chunking.size, cfg.chunking.overlap, cfg.chunking.encoding) == (600, 100, "cl100k_base")
    assert cfg.extraction.max_gleanings == 1
    assert cfg.extraction.entity_types == ["organization", "person", "geo", "event"]
    assert (cfg.graph.name_matching, cfg.graph.edge_weight) == ("exact", "count")
    assert cfg.communities.max_levels == 4
    assert cfg.reports.max_input_tokens == 8000
    assert (cfg.query.batch_tokens, cfg.query.reduce_tokens, cfg.query.context_tokens) == (8000, 8000, 8000)
    raptor = cfg.raptor
    assert (raptor.threshold, raptor.reduction_dim, raptor.local_neighbors) == (0.1, 10, 10)
    assert (raptor.retrieval, raptor.max_context_tokens, raptor.chunk_tokens) == ("collapsed_tree", 2000, 100)
    ev = cfg.evaluation
    assert (ev.personas, ev.tasks_per_persona, ev.questions_per_task, ev.repeats) == (5, 5, 5, 5)
    assert ev.criteria == ["comprehensiveness", "diversity", "empowerment", "directness"]
    assert ev.cluster_thresholds == [0.5, 0.6, 0.7, 0.8]
    params = RaptorParams()
    assert (params.threshold, params.reduction_dim, params.local_neighbors, params.chunk_tokens) == (0.1, 10, 10, 100)


def test_overrides_and_env_substitution(tmp_path, monkeypatch):
    monkeypatch.setenv("INDEX_ROOT", "/data/idx")
    path = tmp_path / "c.yaml"
    path.write_text("storage:\n  root: ${INDEX_ROOT}\nllm:\n  chat:\n    model: ${MODEL:-gpt-4o}\n")
    cfg = load_config(path, ["chunking.size=300", "communities.max_cluster_size=5"])
    assert cfg.storage.root == "/data/idx"
    assert cfg.llm.chat.model == "gpt-4o"
    assert cfg.chunking.size == 300 and cfg.communities.max_cluster_size == 5


@pytest.mark.parametrize("overrides, message", [
    (["chunking.overlap=700"], "must be smaller than chunking.size"),
    (["extraction.method=magic"], "extraction.method"),
    (["chunking.sise=3"], "chunking.sise"),
])
def test_invalid_config_fails_with_one_clear_sentence(overrides, message):
    with pytest.raises(UserError, match=message):
        load_config("conf/local.yaml", overrides)


def test_missing_config_file_and_unset_env_var(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    path = tmp_path / "c.yaml"
    path.write_text("llm:\n  chat:\n    api_base: ${SURELY_UNSET_VAR_123}\n")
    with pytest.raises(UserError, match="SURELY_UNSET_VAR_123"):
        load_config(path)


@pytest.mark.parametrize("name", ["local.yaml", "local-llm.yaml", "openai.yaml", "azure.yaml"])
def test_shipped_configs_validate(name, monkeypatch):
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", "https://example.openai.azure.com")
    cfg = load_config(f"conf/{name}")
    assert cfg.extraction.method == ("nlp" if name == "local.yaml" else "llm")
    assert cfg.llm.chat.api_key_env.isidentifier(), "configs name the key's environment variable, never the key"


def test_the_jar_cache_is_the_checkouts_whatever_folder_a_job_runs_from(tmp_path, monkeypatch):
    """A project folder made by `graphrag-spark init` uses the JARs setup resolved, not a cache of its own."""
    from graphrag_spark.config import SparkConfig

    monkeypatch.chdir(tmp_path)
    assert SparkConfig().ivy_cache == str(REPO / ".cache" / "ivy")
    assert load_config(REPO / "conf" / "local.yaml").spark.ivy_cache == str(REPO / ".cache" / "ivy")
