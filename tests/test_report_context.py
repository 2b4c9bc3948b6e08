"""Community report contexts: the paper's priority order, the token budget, linear cost, and
real sub-community report substitution at higher levels."""

from __future__ import annotations

import csv
import io
import time

import pandas as pd
import pytest

from graphrag_spark.index.report_context import (
    CommunityElements,
    SubCommunity,
    build_higher_context,
    build_leaf_context,
)


def words(text: str) -> int:
    return len(text.split())


class CountingWords:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, text: str) -> int:
        self.calls += 1
        return words(text)


def entities_frame(titles: list[str], degrees: dict[str, int] | None = None, description_words: int = 3):
    return pd.DataFrame(
        {
            "id": [f"e-{t}" for t in titles],
            "human_readable_id": range(len(titles)),
            "title": titles,
            "description": [" ".join([f"about-{t}"] * description_words) for t in titles],
            "degree": [(degrees or {}).get(t, 1) for t in titles],
        }
    )


def relationships_frame(edges: list[tuple[str, str, int]], first_hrid: int = 0, id_prefix: str = "r"):
    return pd.DataFrame(
        {
            "id": [f"{id_prefix}-{s}-{t}" for s, t, _ in edges],
            "human_readable_id": range(first_hrid, first_hrid + len(edges)),
            "source": [s for s, _, _ in edges],
            "target": [t for _, t, _ in edges],
            "description": [f"{s} relates to {t}" for s, t, _ in edges],
            "combined_degree": [d for _, _, d in edges],
        }
    )


def claims_frame(rows: list[tuple[str, str]]):
    return pd.DataFrame(
        {
            "id": [cid for cid, _ in rows],
            "human_readable_id": range(len(rows)),
            "subject": [subject for _, subject in rows],
            "type": "FACT",
            "status": "TRUE",
            "description": [f"claim {cid}" for cid, _ in rows],
        }
    )


def section(text: str, name: str) -> list[list[str]]:
    """Rows (without the column header) of one section of a rendered context."""
    marker = f"-----{name}-----\n"
    if marker not in text:
        return []
    body = text.split(marker, 1)[1].split("\n-----", 1)[0]
    return list(csv.reader(io.StringIO(body)))[1:]


def test_edges_in_decreasing_combined_degree_ties_by_id():
    entities = entities_frame(["A", "B", "C", "D"])
    relationships = relationships_frame([("A", "B", 3), ("C", "D", 9), ("B", "C", 5), ("A", "D", 5)])
    context = build_leaf_context(entities, relationships, None, 10_000, words)
    assert context.relationship_ids == ["r-C-D", "r-A-D", "r-B-C", "r-A-B"]
    assert [row[0] for row in section(context.text, "Relationships")] == ["1", "3", "2", "0"]
    # entities enter with the first edge that names them: C, D (edge C-D), then A (edge A-D), then B
    assert context.entity_ids == ["e-C", "e-D", "e-A", "e-B"]
    assert not context.truncated


def test_every_edge_of_a_hub_is_a_candidate_not_one_per_entity():
    leaves = [f"L{i}" for i in range(6)]
    entities = entities_frame(["HUB", *leaves])
    relationships = relationships_frame([("HUB", leaf, 10 - i) for i, leaf in enumerate(leaves)])
    context = build_leaf_context(entities, relationships, None, 10_000, words)
    assert len(context.relationship_ids) == 6
    assert len(section(context.text, "Relationships")) == 6


def test_claims_follow_their_edge_once_and_section_only_when_present():
    entities = entities_frame(["A", "B", "C"])
    relationships = relationships_frame([("A", "B", 5), ("B", "C", 4)])
    claims = claims_frame([("c1", "B"), ("c2", "A"), ("c3", "B"), ("c4", "OUTSIDER")])
    context = build_leaf_context(entities, relationships, claims, 10_000, words)
    assert context.claim_ids == ["c2", "c1", "c3"]  # source A's claims, then target B's; B's not repeated
    assert [row[1] for row in section(context.text, "Claims")] == ["A", "B", "B"]
    assert "-----Claims-----" not in build_leaf_context(entities, relationships, None, 10_000, words).text


def test_token_budget_is_respected_and_keeps_the_priority_prefix():
    titles = [f"E{i}" for i in range(30)]
    entities = entities_frame(titles, description_words=20)
    relationships = relationships_frame([(titles[i], titles[i + 1], 100 - i) for i in range(29)])
    full = build_leaf_context(entities, relationships, None, 100_000, words)
    for budget in (10, 60, 200, 500):
        context = build_leaf_context(entities, relationships, None, budget, words)
        assert context.n_tokens <= budget
        assert context.n_tokens == words(context.text)
        assert context.truncated
        assert context.relationship_ids == full.relationship_ids[: len(context.relationship_ids)]
    assert not full.truncated


def test_descriptions_with_commas_quotes_and_newlines_stay_one_field():
    entities = entities_frame(["A", "B"])
    entities.loc[0, "description"] = 'line one, with "quotes"\nline two'
    context = build_leaf_context(entities, relationships_frame([("A", "B", 2)]), None, 1000, words)
    assert section(context.text, "Entities")[0] == ["0", "A", 'line one, with "quotes"\nline two']


def test_a_community_without_edges_still_gets_its_entities():
    context = build_leaf_context(entities_frame(["ALONE"]), relationships_frame([]), None, 1000, words)
    assert context.entity_ids == ["e-ALONE"]
    assert "-----Relationships-----" not in context.text


def big_community(n_entities: int, n_edges: int):
    titles = [f"E{i}" for i in range(n_entities)]
    edges = [(titles[i % n_entities], titles[(i * 7 + 1) % n_entities], i % 97) for i in range(n_edges)]
    claims = claims_frame([(f"c{i}", titles[i % n_entities]) for i in range(n_entities)])
    return entities_frame(titles), relationships_frame(edges), claims


def test_context_building_is_linear_in_community_size():
    entities, relationships, claims = big_community(2_000, 20_000)
    count = CountingWords()
    started = time.process_time()
    context = build_leaf_context(entities, relationships, claims, 10**9, count)
    elapsed = time.process_time() - started  # CPU time: robust to other load
    assert len(context.relationship_ids) == 20_000
    n_rows = len(entities) + len(relationships) + len(claims)
    assert count.calls <= n_rows + 10  # each row counted once, plus headers and the final text
    assert elapsed < 1.0, f"20k-edge context took {elapsed:.2f}s"


def test_truncated_context_stops_counting_early():
    entities, relationships, claims = big_community(2_000, 20_000)
    count = CountingWords()
    context = build_leaf_context(entities, relationships, claims, 8_000, count)
    assert context.truncated and context.n_tokens <= 8_000
    assert count.calls < 5_000


# ---- higher levels -------------------------------------------------------------------------

def higher_community(sizes: dict[int, int]):
    """Sub-communities numbered by ``sizes`` (community -> number of entities, chained by edges),
    plus one edge between consecutive sub-communities (owned by none of them)."""
    entity_titles, edges, members = [], [], {}
    for community, size in sizes.items():
        titles = [f"S{community}N{i}" for i in range(size)]
        sub_edges = [(titles[i], titles[i + 1], 50) for i in range(size - 1)]
        entity_titles += titles
        edges += sub_edges
        members[community] = (titles, sub_edges)
    keys = list(sizes)
    bridges = [(members[a][0][0], members[b][0][0], 1) for a, b in zip(keys, keys[1:])]
    entities = entities_frame(entity_titles, description_words=10)
    relationships = relationships_frame(edges + bridges)
    subs = [
        SubCommunity(
            community=community,
            title=f"Report {community}",
            report=f'# Report {community}\n\nSub-community {community}, "finished", short.',
            entity_ids=[f"e-{t}" for t in titles],
            relationship_ids=[f"r-{s}-{t}" for s, t, _ in sub_edges],
        )
        for community, (titles, sub_edges) in members.items()
    ]
    return CommunityElements(entities, relationships), subs


def test_higher_level_that_fits_is_the_leaf_context():
    elements, subs = higher_community({1: 3, 2: 5, 3: 4})
    context = build_higher_context(elements, subs, 100_000, words)
    leaf = build_leaf_context(elements.entities, elements.relationships, None, 100_000, words)
    assert context.substituted_communities == []
    assert context.text == leaf.text
    assert not context.truncated


def test_overflow_substitutes_finished_reports_largest_sub_community_first():
    elements, subs = higher_community({1: 3, 2: 12, 3: 6})
    full = build_higher_context(elements, subs, 100_000, words)
    reports = {sub.community: sub for sub in subs}

    just_over = build_higher_context(elements, subs, full.n_tokens - 1, words)
    assert just_over.substituted_communities == [2]
    assert not just_over.truncated and just_over.n_tokens <= full.n_tokens - 1
    rows = section(just_over.text, "Reports")
    assert rows == [["2", "Report 2", reports[2].report]]  # exactly the finished report, verbatim
    assert not set(reports[2].entity_ids) & set(just_over.entity_ids)
    assert set(reports[1].entity_ids) | set(reports[3].entity_ids) <= set(just_over.entity_ids)
    assert "r-S1N0-S2N0" in just_over.relationship_ids  # edges between sub-communities stay

    tight = build_higher_context(elements, subs, 90, words)
    assert tight.substituted_communities == [2, 3]
    assert [row[0] for row in section(tight.text, "Reports")] == ["2", "3"]
    assert tight.n_tokens <= 90


def test_reports_are_cut_in_rank_order_when_even_they_do_not_fit():
    elements, subs = higher_community({1: 8, 2: 12, 3: 6})
    context = build_higher_context(elements, subs, 25, words)  # room for two of the three reports
    assert context.truncated
    assert context.substituted_communities == [2, 1]  # rank order: 12, 8, then 6 entities
    assert context.entity_ids == [] and context.n_tokens <= 25


def test_a_report_that_does_not_fit_gives_its_elements_back():
    elements, subs = higher_community({1: 2, 2: 12})
    long_report = SubCommunity(2, "Report 2", "finding " * 60, subs[1].entity_ids, subs[1].relationship_ids)
    context = build_higher_context(elements, [subs[0], long_report], 40, words)
    assert context.substituted_communities == [1]  # report 2 is substituted but 60 words cannot fit
    assert context.entity_ids and set(context.entity_ids) <= set(long_report.entity_ids)
    assert context.truncated and context.n_tokens <= 40


def test_failed_or_longer_reports_are_never_substituted():
    elements, subs = higher_community({1: 3, 2: 12, 3: 6})
    failed = SubCommunity(2, "Report 2", None, subs[1].entity_ids, subs[1].relationship_ids)
    bloated = SubCommunity(3, "Report 3", "word " * 1000, subs[2].entity_ids, subs[2].relationship_ids)
    full = build_higher_context(elements, subs, 100_000, words)
    context = build_higher_context(elements, [subs[0], failed, bloated], full.n_tokens - 1, words)
    assert context.substituted_communities == [1]
    assert set(failed.entity_ids) | set(bloated.entity_ids) <= set(context.entity_ids)
    assert not context.truncated


@pytest.mark.parametrize("budget", [50, 120, 400])
def test_higher_context_never_exceeds_its_budget(budget):
    elements, subs = higher_community({1: 9, 2: 4, 3: 7, 4: 2})
    context = build_higher_context(elements, subs, budget, words)
    assert context.n_tokens <= budget


def test_a_failed_sub_report_is_never_substituted_for_its_elements():
    """Sub-community 1's LLM report failed (extractive stand-in), 2's succeeded: only 2's is substituted."""
    from graphrag_spark.index.reports import FALLBACK_METHOD, LLM_METHOD, build_context

    entities, relationships, subs = [], [], []
    for sub, method in ((1, FALLBACK_METHOD), (2, LLM_METHOD)):
        ids = [f"e{sub}{i}" for i in range(4)]
        entities += [{"id": e, "human_readable_id": 10 * sub + i, "title": f"NODE {e}", "type": "GEO",
                      "description": f"Node {e} is a place on the estuary shore with a long history. " * 6, "degree": 3}
                     for i, e in enumerate(ids)]
        edges = [(ids[i], ids[i + 1]) for i in range(3)]
        relationships += [{"id": f"r{a}{b}", "human_readable_id": 100 * sub + i, "source": f"NODE {a}",
                           "target": f"NODE {b}", "description": f"{a} and {b} share a harbour. " * 6, "weight": 1.0,
                           "combined_degree": 6} for i, (a, b) in enumerate(edges)]
        subs.append({"community": sub, "title": f"Sub {sub}", "summary": "short", "full_content": f"Sub {sub}: short.",
                     "method": method, "entity_ids": ids, "relationship_ids": [f"r{a}{b}" for a, b in edges]})
    community = {"id": "c0", "community": 0, "level": 0, "entities": entities, "relationships": relationships,
                 "claims": None, "sub_reports": subs}
    context = build_context(community, max_tokens=700)
    assert context["substituted"] == [2]
    assert "Sub 1: short." not in context["context"] and "NODE e10" in context["context"]


def test_a_community_carried_down_unchanged_reuses_its_sub_communitys_report():
    from graphrag_spark.index.reports import reused_report, reused_reports

    # 0 splits into 1 and 2; 2 is final, so Leiden's deeper level carries it down as 3 (same members),
    # and 1 splits into 4 and 5. Only 2 -> 3 is the same community twice.
    shape = pd.DataFrame({"community": [0, 1, 2, 3, 4, 5], "level": [0, 1, 1, 2, 2, 2], "size": [9, 5, 4, 4, 3, 2],
                          "children": [[1, 2], [4, 5], [3], [], [], []]})
    assert reused_reports(shape) == {2: 3}
    child = {"child_id": "r3", "child_title": "T", "child_summary": "S", "child_rating": 7.0,
             "child_rating_explanation": "E", "child_findings": [{"summary": "f", "explanation": "x"}],
             "child_full_content": "# T", "child_method": "llm"}
    report = reused_report({"id": "c2", "community": 2, "level": 1, **child})
    assert (report["community"], report["level"], report["full_content"], report["findings"]) == (2, 1, "# T", child["child_findings"])
    assert report["id"] != reused_report({"id": "c9", "community": 9, "level": 1, **child})["id"]



def test_a_community_carried_down_over_several_levels_carries_the_one_reported_communitys_report():
    from graphrag_spark.index.reports import report_origins

    # 0 is carried down as 1, then as 2 (three levels, the same members); 4 is carried down as 5.
    assert report_origins({0: 1, 1: 2, 4: 5}) == {0: 2, 1: 2, 4: 5}

def test_a_context_that_fits_does_not_depend_on_the_sub_reports():
    """What lets every fitting community be reported at once, before the finer level is done."""
    from graphrag_spark.index.reports import build_context

    entities = [{"id": f"e{i}", "human_readable_id": i, "title": f"E{i}", "type": "person", "description": f"d{i}",
                 "degree": 1} for i in range(3)]
    relationships = [{"id": "r0", "human_readable_id": 0, "source": "E0", "target": "E1", "description": "knows",
                      "weight": 1.0, "combined_degree": 2}]
    sub = {"community": 7, "title": "Sub", "summary": "s", "full_content": "a sub report", "method": "llm",
           "entity_ids": ["e0", "e1"], "relationship_ids": ["r0"]}
    row = {"id": "c", "community": 1, "level": 0, "entities": entities, "relationships": relationships, "claims": None}
    alone, with_subs = build_context({**row, "sub_reports": None}, 1000), build_context({**row, "sub_reports": [sub]}, 1000)
    assert not alone["truncated"] and alone["context"] == with_subs["context"] and with_subs["substituted"] == []
    assert build_context({**row, "sub_reports": None}, 12)["truncated"], "too small a budget: it must wait for its subs"
