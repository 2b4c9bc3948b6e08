from graphrag_spark.index.extract_nlp import extract_phrases, extract_unit, split_sentences

TEXT = ("Mayor Elena Voss met the Bank of England in Port Alder. Then the counting house closed. "
        "Mr. Scrooge said nothing to Elena Voss. The old clerk smiled at the counting house door.")


def test_honorifics_do_not_end_sentences():
    assert "Mr Scrooge said nothing to Elena Voss." in split_sentences(TEXT)


def test_proper_noun_sequences_with_connectors_and_noun_phrases():
    phrases = {(p, kind) for p, kind, _ in extract_phrases(TEXT)}
    assert ("Mayor Elena Voss", "PROPER_NOUN") in phrases
    assert ("Bank of England", "PROPER_NOUN") in phrases
    assert ("Port Alder", "PROPER_NOUN") in phrases
    assert ("Mr Scrooge", "PROPER_NOUN") in phrases
    assert ("counting house", "NOUN_PHRASE") in phrases
    # Sentence-initial function words are not names.
    assert not any(p in ("Then", "The") for p, _ in phrases)


def test_cooccurrence_edges_keep_provenance_and_cover_all_pairs():
    entities, relationships = extract_unit("unit-1", TEXT, max_phrases=30)
    names = {e["name"] for e in entities}
    assert {"ELENA VOSS", "PORT ALDER"} <= names
    assert all(e["text_unit_id"] == "unit-1" for e in entities + relationships)
    assert len(relationships) == len(names) * (len(names) - 1) // 2
    shared = next(r for r in relationships if {r["source"], r["target"]} == {"BANK OF ENGLAND", "PORT ALDER"})
    assert "Bank of England" in shared["description"]


def test_max_phrases_bounds_the_pairs():
    _, relationships = extract_unit("u", TEXT, max_phrases=3)
    assert len(relationships) == 3


def test_extraction_is_deterministic():
    assert extract_unit("u", TEXT, 30) == extract_unit("u", TEXT, 30)
