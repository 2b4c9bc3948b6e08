"""Pure query functions: map-answer parsing, budgets of every context, Table 2 sizes, question files."""

import json

import pandas as pd
import pytest

from graphrag_spark.config import QueryConfig
from graphrag_spark.errors import UserError
from graphrag_spark.query.basic_search import basic_context
from graphrag_spark.query.batch import parse_question_file
from graphrag_spark.query.context import NO_ANSWER, extractive_answer, fill_table
from graphrag_spark.query.context_report import size_table
from graphrag_spark.query.global_search import MapPoint, cited_ids, parse_map_answer, reduce_context, report_units, select_points
from graphrag_spark.query.local_search import LocalData, build_local_context, unit_candidates
from graphrag_spark.query.text_summary import source_units
from graphrag_spark.tokens import count_tokens


def test_map_answer_json_is_parsed_with_citations():
    text = json.dumps({"points": [{"description": "Seals declined [Data: Reports (3, 7, +more)]", "score": 80},
                                  {"description": "Nothing relevant", "score": 0}]})
    points, malformed = parse_map_answer("```json\n" + text + "\n```", "Reports")
    assert not malformed
    assert [(p.score, p.report_ids) for p in points] == [(80, [3, 7]), (0, [])]


def test_truncated_map_answer_is_malformed_but_keeps_its_complete_points():
    text = '{"points": [{"description": "A [Data: Sources (2)]", "score": 55}, {"description": "B is cut o'
    points, malformed = parse_map_answer(text, "Sources")
    assert malformed
    assert [(p.description, p.score, p.report_ids) for p in points] == [("A [Data: Sources (2)]", 55, [2])]


def test_prose_map_answer_is_malformed_with_no_points():
    assert parse_map_answer("I'm sorry, but I can't produce that format right now.", "Reports") == ([], True)


def test_point_without_score_marks_the_answer_malformed_and_scores_are_clipped():
    points, malformed = parse_map_answer('{"points": [{"description": "x"}, {"description": "y", "score": 250}]}', "Reports")
    assert malformed and [p.score for p in points] == [100]


def test_cited_ids_only_of_the_kind_asked():
    text = "a [Data: Entities (1, 2); Reports (5, 6, +more)] b [Data: Reports (9)]"
    assert cited_ids(text, "Reports") == [5, 6, 9]
    assert cited_ids(text, "Sources") == []


def test_reduce_context_orders_analysts_and_drops_zero_scores():
    chosen = select_points([MapPoint("low", 10, [1]), MapPoint("zero", 0, [2]), MapPoint("high", 90, [3])], 1000)
    text = reduce_context(chosen)
    assert text.index("high") < text.index("low") and "zero" not in text
    assert "Importance Score: 90" in text


def test_fill_table_stops_at_the_budget():
    rows = [[i, "word " * 40] for i in range(20)]
    text, kept, tokens = fill_table("Sources", ["id", "text"], rows, 200)
    assert 0 < kept < 20 and tokens <= 200 and count_tokens(text) <= 200
    assert text.startswith("-----Sources-----\nid,text\n")
    assert fill_table("Sources", ["id", "text"], rows, 3) == ("", 0, 0)


def test_basic_context_keeps_similarity_order_within_budget():
    texts = {f"u{i}": f"passage {i} " + "filler " * 30 for i in range(10)}
    ranked = [(f"u{i}", 1 - i / 10) for i in (4, 2, 9, 0, 1, 3, 5, 6, 7, 8)] + [("missing", 0.0)]
    text, frame, tokens = basic_context(ranked, texts, 120)
    assert list(frame["id"]) == ["u4", "u2", "u9"][: len(frame)] and len(frame) >= 2
    assert list(frame["short_id"]) == list(range(1, len(frame) + 1))
    assert tokens <= 120 and count_tokens(text) <= 120


def _local_data():
    entities = pd.DataFrame({
        "id": ["e1", "e2", "e3"], "human_readable_id": [1, 2, 3], "title": ["SCROOGE", "MARLEY", "FEZZIWIG"],
        "description": ["A miser. " * 5, "His late partner. " * 5, "A kind employer. " * 5], "degree": [5, 3, 1],
        "text_unit_ids": [["t1", "t2"], ["t2", "t3"], ["t4"]]})
    relationships = pd.DataFrame({
        "human_readable_id": [10, 11, 12], "source": ["FEZZIWIG", "MARLEY", "BELLE"], "target": ["SCROOGE", "SCROOGE", "FEZZIWIG"],
        "description": ["employed", "partner of", "danced with"], "weight": [1.0, 4.0, 2.0]})
    claims = pd.DataFrame({"human_readable_id": [7], "subject": ["MARLEY"], "object": ["SCROOGE"], "type": ["WARNING"],
                           "status": ["TRUE"], "description": ["Marley warns Scrooge."]})
    memberships = pd.DataFrame({"community": [0, 0, 1], "entity_id": ["e1", "e2", "e3"]})
    reports = pd.DataFrame({"community": [0, 1], "title": ["Counting house", "Warehouse"], "rating": [5.0, 2.0],
                            "summary": ["Scrooge and Marley. " * 10, "Fezziwig's ball. " * 10]})
    text_units = pd.DataFrame({"id": ["t1", "t2", "t3", "t4"], "text": [f"unit {i} " + "text " * 100 for i in range(4)]})
    return LocalData(entities, relationships, claims, memberships, reports, text_units)


def _sections(text):
    parts = text.split("-----")
    return {parts[i]: count_tokens(f"-----{parts[i]}-----{parts[i + 1]}") for i in range(1, len(parts) - 1, 2)}


def test_local_context_respects_each_share_of_the_budget():
    q = QueryConfig(context_tokens=600, local_text_unit_prop=0.5, local_community_prop=0.15)
    context = build_local_context([("e2", 0.9), ("e1", 0.8), ("e3", 0.1)], _local_data(), q)
    sizes = _sections(context.text)
    assert set(sizes) == {"Entities", "Relationships", "Claims", "Reports", "Sources"}
    assert sizes["Sources"] <= 300 and sizes["Reports"] <= 90
    assert sizes["Entities"] + sizes["Relationships"] + sizes["Claims"] <= 210
    assert len(context.frame[context.frame.table == "Sources"]) < 4, "the text-unit share is full before every unit fits"
    assert context.tokens <= 600 and count_tokens(context.text) <= 600
    assert list(context.frame[context.frame.table == "Entities"]["name"])[:1] == ["MARLEY"]


def test_local_context_ranks_in_network_relationships_and_best_entities_first():
    q = QueryConfig(context_tokens=8000)
    context = build_local_context([("e2", 0.9), ("e1", 0.8)], _local_data(), q)
    rels = context.frame[context.frame.table == "Relationships"]
    assert list(rels["id"]) == [11, 10]  # MARLEY-SCROOGE (both matched) first; BELLE-FEZZIWIG not linked
    sources = context.frame[context.frame.table == "Sources"]
    assert list(sources["text_unit_id"]) == ["t2", "t3", "t1"]  # MARLEY's units first, t2 shared by both
    assert list(context.frame[context.frame.table == "Claims"]["id"]) == [7]
    assert list(context.frame[context.frame.table == "Reports"]["id"]) == [0]


def test_an_isolated_entity_matched_by_local_search_gets_its_context():
    """An entity with no relationship is in no community and no report, but local search (which
    matches every entity's embedding) still gives it its description and source text."""
    data = _local_data()
    data.entities.loc[len(data.entities)] = ["e4", 4, "OLD JOE", "A rag-and-bone dealer. ", 0, ["t4"]]
    context = build_local_context([("e4", 0.9)], data, QueryConfig(context_tokens=2000))
    assert list(context.frame[context.frame.table == "Entities"]["name"]) == ["OLD JOE"]
    assert list(context.frame[context.frame.table == "Sources"]["text_unit_id"]) == ["t4"]
    assert set(context.frame["table"]) == {"Entities", "Sources"}


def test_unknown_entities_give_an_empty_context():
    context = build_local_context([("nope", 0.5)], _local_data(), QueryConfig())
    assert context.text == "" and context.passages == []


def test_unit_candidates_are_capped_and_ordered():
    assert unit_candidates([("e2", 0.9), ("e1", 0.8)], _local_data().entities, limit=3) == ["t2", "t3", "t1"]


def test_extractive_answer_cites_rows_and_says_when_nothing_matches():
    rows = [("Sources", 1, "The grey seals declined. Bakeries opened."), ("Sources", 2, "Seals returned in spring.")]
    answer = extractive_answer("Why did the seals decline?", rows, 5, "Lead:")
    assert answer.startswith("Lead:") and "[Data: Sources (1)]" in answer and "Bakeries" not in answer
    assert extractive_answer("Quantum xylophones?", rows, 5, "Lead:") == NO_ANSWER


def test_size_table_counts_units_tokens_and_map_calls():
    report = {"community": 1, "title": "Seals", "text": "word " * 100, "n_tokens": 100}
    source = {"short_id": 1, "text": "word " * 300, "n_tokens": 300}
    frame = size_table([("C0", report_units([report] * 2)), ("TS", source_units([source] * 4))], batch_tokens=620, seed=1)
    assert frame.to_dict("records") == [
        {"condition": "C0", "units": 2, "tokens": 200, "pct_of_max": 16.7, "map_calls": 1},
        {"condition": "TS", "units": 4, "tokens": 1200, "pct_of_max": 100.0, "map_calls": 2}]


def test_question_files(tmp_path):
    (tmp_path / "q.txt").write_text("# header\nFirst?\n\n  Second?  \n")
    (tmp_path / "q.jsonl").write_text('{"question": "A?"}\n{"question": ""}\n')
    (tmp_path / "q.csv").write_text("question,topic\nB?,x\n")
    (tmp_path / "bad.csv").write_text("text\nC?\n")
    assert parse_question_file(tmp_path / "q.txt") == ["First?", "Second?"]
    assert parse_question_file(tmp_path / "q.jsonl") == ["A?"]
    assert parse_question_file(tmp_path / "q.csv") == ["B?"]
    with pytest.raises(UserError, match="question"):
        parse_question_file(tmp_path / "bad.csv")
