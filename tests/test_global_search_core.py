from graphrag_spark.query.global_search import (
    NO_ANSWER, MapPoint, extractive_reduce, lexical_map, pack_by_tokens, select_points)


def _reports(n):
    return [{"community": i, "title": f"R{i}", "summary": "s", "rating": i % 10, "text": f"Report {i} about harbour seals. " * 20}
            for i in range(n)]


def test_packing_respects_the_budget_and_keeps_every_report_once():
    batches = pack_by_tokens(_reports(40), max_tokens=500, seed=7)
    ids = [r["community"] for b in batches for r in b]
    assert sorted(ids) == list(range(40))
    assert all(sum(len(r["text"]) for r in b) < 4 * 500 for b in batches if len(b) > 1)
    assert ids != list(range(40)), "reports are shuffled"
    assert ids == [r["community"] for b in pack_by_tokens(_reports(40), 500, seed=7) for r in b], "seeded shuffle"


def test_oversized_item_gets_its_own_batch():
    items = [{"text": "x " * 2000, "community": 0}, {"text": "y", "community": 1}]
    assert [len(b) for b in pack_by_tokens(items, 100, seed=None)] == [1, 1]


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
    assert len(select_points(points, max_tokens=8)) == 1
    answer = extractive_reduce("q", chosen, 5, fallback=False)
    assert answer.index("Reports (3)") < answer.index("Reports (1)")
    assert extractive_reduce("q", [], 5, fallback=False) == NO_ANSWER
