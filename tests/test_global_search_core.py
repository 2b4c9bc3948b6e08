from pathlib import Path

from graphrag_spark.prompts import load_prompt
from graphrag_spark.query.global_search import (
    NO_ANSWER, MapPoint, cited_ids, extractive_reduce, lexical_map, map_context, pack_by_tokens, parse_map_answer,
    map_messages, reduce_context, reduce_messages, report_units, select_points)
from graphrag_spark.query.text_summary import source_units
from graphrag_spark.tokens import count_tokens


def _reports(n):
    return [{"community": i, "title": f"R{i}", "summary": "s", "rating": i % 10, "text": f"Report {i} about harbour seals. " * 20}
            for i in range(n)]


def test_packing_respects_the_budget_and_keeps_every_report_once():
    batches = pack_by_tokens(report_units(_reports(40)), max_tokens=500, seed=7)
    ids = [r["community"] for b in batches for r in b]
    assert sorted(ids) == list(range(40))
    assert all(sum(len(r["text"]) for r in b) < 4 * 500 for b in batches if len(b) > 1)
    assert ids != list(range(40)), "reports are shuffled"
    assert ids == [r["community"] for b in pack_by_tokens(report_units(_reports(40)), 500, seed=7) for r in b], "seeded"


def test_oversized_item_gets_its_own_batch():
    items = [{"text": "x " * 2000, "community": 0, "title": "X"}, {"text": "y", "community": 1, "title": "Y"}]
    assert [len(b) for b in pack_by_tokens(report_units(items), 100, seed=None)] == [1, 1]


def test_map_batches_fit_as_rendered_with_ids_titles_and_header():
    """Long titles and short texts: counting only the texts would overfill every batch."""
    reports = [{"community": 1000 + i, "title": f"The harbour and estuary community number {i} of Port Alder",
                "text": f"Seals {i}.", "n_tokens": 3} for i in range(60)]
    units = report_units(reports)
    batches = pack_by_tokens(units, 300, seed=None)
    assert sorted(r["community"] for b in batches for r in b) == [r["community"] for r in reports]
    for batch, following in zip(batches, batches[1:]):
        assert count_tokens(map_context(batch, units)) <= 300
        assert count_tokens(map_context(batch + following[:1], units)) > 300, "filled until the limit"
    sources = [{"short_id": i, "text": "The grey seals returned to the estuary in spring, " * 4} for i in range(1, 30)]
    source_batches = pack_by_tokens(source_units(sources), 250, seed=3)
    assert all(count_tokens(map_context(b, source_units(b))) <= 250 for b in source_batches)


def test_lexical_map_scores_and_cites_reports():
    batch = [{"community": 3, "text": "The harbour expansion worried the estuary trust. Seals declined."},
             {"community": 4, "text": "A bakery opened."}]
    points = lexical_map("What happened to the seals near the harbour?", batch)
    assert len(points) == 1
    assert points[0].report_ids == [3] and "[Data: Reports (3)]" in points[0].description
    assert 0 < points[0].score <= 100


def test_reduce_drops_zero_scores_orders_by_score_and_respects_budget():
    points = [MapPoint("low [Data: Reports (1)]", 10, [1]), MapPoint("zero", 0, [2]), MapPoint("high [Data: Reports (3)]", 90, [3])]
    chosen = select_points(points, max_tokens=1000)
    assert [p.report_ids for p in chosen] == [[3], [1]]
    assert len(select_points(points, max_tokens=25)) == 1
    answer = extractive_reduce("q", chosen, 5, fallback=False)
    assert answer.index("Reports (3)") < answer.index("Reports (1)")
    assert extractive_reduce("q", [], 5, fallback=False) == NO_ANSWER


def test_reduce_context_is_counted_as_rendered_and_stops_at_the_limit():
    """Analyst headers and score lines count: 40 points of ~10 description tokens each."""
    points = [MapPoint(f"Seal numbers fell near pier {i} [Data: Reports ({i})]", 100 - i, [i]) for i in range(40)]
    chosen = select_points(points, max_tokens=300)
    assert count_tokens(reduce_context(chosen)) <= 300
    assert count_tokens(reduce_context(select_points(points, 10_000)[: len(chosen) + 1])) > 300, "filled until the limit"
    assert [p.report_ids[0] for p in chosen] == list(range(len(chosen))), "best scores first"
    long_then_short = [MapPoint("long " * 400, 90, [1]), MapPoint("short", 80, [2])]
    assert select_points(long_then_short, 100) == [], "the context ends where the next point does not fit"


FIXTURES = Path(__file__).parent / "fixtures"
PASSAGES = [
    "The Estuary Trust wrote to the Port Alder authority in 2018 asking for a pause in any works during the pupping season. The authority declined.",
    "Dredging for the harbour expansion started in spring 2019. Volunteers counted about 400 grey seals on the sandbank that year.",
    "A bakery on Quay Street opened a second shop in 2020.",
    "By the end of the 2020 season fewer than 150 seals used the haul-out. Researchers blamed noise from the dredgers working next to the sandbank, not a lack of fish.",
]


def test_ts_prompts_name_sources_and_a_recorded_answer_keeps_its_citations():
    """TS reads text passages: its prompts must ask for [Data: Sources (...)], the table it shows,
    and a real model's answer to them (recorded) must keep its citations through parse and reduce."""
    question = "Why did the grey seals of the Alder estuary decline?"
    units = source_units([{"short_id": i, "text": t} for i, t in enumerate(PASSAGES, 1)])
    system, user = map_messages(load_prompt("global_map"), question, units.items, units)
    assert "-----Sources-----" in user["content"] and "-----Sources-----" not in system["content"]
    map_prompt = system["content"] + user["content"]
    assert "-----Sources-----" in map_prompt and "[Data: Sources (2, 7, 34, 46, 64, +more)]" in map_prompt
    assert "Reports" not in map_prompt and "community report" not in map_prompt

    points, malformed = parse_map_answer((FIXTURES / "ts_global_map_answer.txt").read_text(), units.kind)
    assert not malformed
    assert [p.report_ids for p in points] == [[2, 4], [4], [1]]
    reduce_prompt = "".join(m["content"] for m in reduce_messages(
        load_prompt("global_reduce"), question, select_points(points, 8000), units, "multiple paragraphs"))
    assert "[Data: Sources (2, 4)]" in reduce_prompt and "Reports" not in reduce_prompt
    answer = (FIXTURES / "ts_global_reduce_answer.md").read_text()
    assert cited_ids(answer, units.kind) == [2, 4, 1]

    reports = report_units([{"community": 7, "title": "Seals", "text": "Seals declined."}])
    report_prompt = "".join(m["content"] for m in map_messages(load_prompt("global_map"), question, reports.items, reports))
    assert "community reports" in report_prompt and "[Data: Reports (2, 7, 64)]" in report_prompt
    assert "Sources" not in report_prompt
