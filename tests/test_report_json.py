"""Report JSON from the LLM: real reports parse, common breakage is repaired, data references
keep at most 5 ids then +more."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from conftest import SHARED, shared_path

from graphrag_spark.index.report_json import format_data_refs, limit_data_refs, parse_report, render_full_content

FIXTURE = SHARED / "fixtures" / "graphrag-operation-dulce"

GOOD = {
    "title": "Operation Dulce",
    "summary": "The squad's mission [Data: Entities (1, 2)].",
    "rating": 8.5,
    "rating_explanation": "High stakes.",
    "findings": [
        {"summary": "Leadership", "explanation": "Cruz leads [Data: Relationships (7, 8)]."},
        {"summary": "Technology", "explanation": "Rivera decodes signals."},
    ],
}


@pytest.fixture(scope="module")
def fixture_reports() -> pd.DataFrame:
    shared_path("fixtures/graphrag-operation-dulce")
    return pd.read_parquet(FIXTURE / "community_reports.parquet")


def test_real_reports_parse_and_render_like_the_reference(fixture_reports):
    for row in fixture_reports.itertuples():
        report, error = parse_report(row.full_content_json)
        assert error is None
        assert report["title"] == row.title
        assert report["rating"] == row.rank
        assert [f["summary"] for f in report["findings"]] == [f["summary"] for f in json.loads(row.full_content_json)["findings"]]
        assert render_full_content(report) == row.full_content


def test_valid_json_is_returned_as_is():
    assert parse_report(json.dumps(GOOD)) == (GOOD, None)


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(f"```json\n{json.dumps(GOOD, indent=2)}\n```", id="code fence"),
        pytest.param(f"Here is the report:\n{json.dumps(GOOD)}\nLet me know if you need more.", id="prose around"),
        pytest.param(json.dumps(GOOD, indent=2).replace('"\n    }', '",\n    }').replace("]\n}", "],\n}"), id="trailing commas"),
        pytest.param(repr(GOOD), id="python dict with single quotes"),
    ],
)
def test_common_breakage_is_repaired(broken):
    assert parse_report(broken) == (GOOD, None)


def test_unescaped_inner_quotes_and_apostrophes_survive():
    text = """{'title': 'The squad's base', 'summary': 'Cruz said "protocol", twice', 'rating': 7, 'findings': []}"""
    report, error = parse_report(text)
    assert error is None
    assert report["title"] == "The squad's base"
    assert report["summary"] == 'Cruz said "protocol", twice'


def test_truncated_answer_keeps_what_was_complete():
    text = json.dumps(GOOD)
    cut_in_second_finding = text[: text.index("Rivera decodes") + 6]
    report, error = parse_report(cut_in_second_finding)
    assert error is None
    assert report["findings"][0] == GOOD["findings"][0]
    assert report["findings"][1] == {"summary": "Technology", "explanation": "Rivera"}

    cut_after_a_key = text[: text.index('"explanation": "Rivera') + len('"explanation"')]
    report, error = parse_report(cut_after_a_key)
    assert error is None
    assert report["findings"][-1] == {"summary": "Technology", "explanation": ""}


@pytest.mark.parametrize(
    ("rating", "expected"),
    [("8.5", 8.5), ("7/10", 7.0), (15, 10.0), (-3, 0.0), ("high", None), (None, None), (True, None)],
)
def test_rating_is_a_float_clamped_to_0_10(rating, expected):
    report, error = parse_report(json.dumps({**GOOD, "rating": rating}))
    assert error is None
    assert report["rating"] == expected


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "empty response"),
        ("I cannot write this report.", "no JSON object found in the response"),
        ('{"summary": "no title here"}', "report JSON has no title"),
        ('{"title": "T", "findings": []}', "report JSON has no summary"),
        ('{"title": "T", "summary": "S", "findings": "none"}', "report JSON findings is not a list"),
    ],
)
def test_unusable_answers_say_why(text, error):
    assert parse_report(text) == (None, error)


def test_data_references_in_the_answer_are_limited():
    explanation = "Proof [Data: Entities (1, 2, 3, 4, 5, 6, 7); Relationships (9)]."
    report, _ = parse_report(json.dumps({**GOOD, "findings": [{"summary": "s", "explanation": explanation}]}))
    assert report["findings"][0]["explanation"] == "Proof [Data: Entities (1, 2, 3, 4, 5, +more); Relationships (9)]."


def test_format_data_refs():
    refs = {"Entities": [1, 2, 3, 4, 5, 6], "Relationships": [7], "Claims": []}
    assert format_data_refs(refs) == "[Data: Entities (1, 2, 3, 4, 5, +more); Relationships (7)]"
    assert format_data_refs({"Entities": [1, 2, 3, 4, 5]}) == "[Data: Entities (1, 2, 3, 4, 5)]"
    assert format_data_refs({"Reports": [1, 2, 3]}, max_ids=2) == "[Data: Reports (1, 2, +more)]"
    assert format_data_refs({"Entities": []}) == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "See [Data: Entities (5), Relationships (37, 38, 39, 40, 41, 42, 43)].",
            "See [Data: Entities (5); Relationships (37, 38, 39, 40, 41, +more)].",
        ),
        ("[Data: Reports (1, 2, +more)]", "[Data: Reports (1, 2, +more)]"),
        ("[Data: Claims (3, 3, 4)]", "[Data: Claims (3, 4)]"),
        ("No references here [Data: none].", "No references here [Data: none]."),
        ("Two [Data: Entities (1,2,3,4,5,6)] and [Data: Entities (9)]", "Two [Data: Entities (1, 2, 3, 4, 5, +more)] and [Data: Entities (9)]"),
    ],
)
def test_limit_data_refs(text, expected):
    assert limit_data_refs(text) == expected
