import networkx as nx
import numpy as np
import pandas as pd

from graphrag_spark.config import CommunitiesConfig
from graphrag_spark.index.communities import (build_hierarchy, hierarchy_from_levels, keep_untouched, largest_component_mask,
                                              project_levels, run_leiden)


def _graph_edges(seed=1, n=300):
    g = nx.barabasi_albert_graph(n, 2, seed=seed)
    e = np.array(sorted(g.edges()))
    return e[:, 0], e[:, 1], np.ones(len(e))


def test_every_level_partitions_all_clustered_nodes():
    s, t, w = _graph_edges()
    h = build_hierarchy(run_leiden(s, t, w, CommunitiesConfig(max_cluster_size=10)), max_levels=4)
    nodes = set(np.concatenate([s, t]).tolist())
    levels = sorted(h.communities["level"].unique())
    assert len(levels) >= 2, "max_cluster_size=10 on 300 nodes must split into sub-communities"
    for level in levels:
        members = h.membership[h.membership["level"] == level]
        assert set(members["node"]) == nodes
        assert members["node"].is_unique


def test_parent_children_links_are_consistent():
    s, t, w = _graph_edges()
    c = build_hierarchy(run_leiden(s, t, w, CommunitiesConfig(max_cluster_size=10)), 4).communities
    by_id = c.set_index("community")
    for row in c.itertuples():
        if row.level == 0:
            assert row.parent == -1
        else:
            assert by_id.loc[row.parent, "level"] == row.level - 1
            assert row.community in by_id.loc[row.parent, "children"]
        assert sum(by_id.loc[child, "size"] for child in row.children) in (0, row.size)


def test_ids_are_deterministic_for_the_same_graph_regardless_of_edge_order():
    s, t, w = _graph_edges()
    first = build_hierarchy(run_leiden(s, t, w, CommunitiesConfig()), 4).communities
    perm = np.random.default_rng(0).permutation(len(s))
    second = build_hierarchy(run_leiden(s[perm], t[perm], w[perm], CommunitiesConfig()), 4).communities
    pd.testing.assert_frame_equal(first, second)


def test_final_clusters_are_projected_down():
    raw = pd.DataFrame({"node": [1, 2, 3, 1, 2], "cluster": [0, 0, 1, 5, 6], "level": [0, 0, 0, 1, 1],
                        "parent_cluster": [None, None, None, 0, 0], "is_final_cluster": [False, False, True, True, True]})
    projected = project_levels(raw, 4)
    assert projected[(projected.node == 3)].sort_values("level")["cluster"].tolist() == [1, 1]
    h = build_hierarchy(raw, 4)
    level1 = h.communities[h.communities.level == 1]
    assert len(level1) == 3  # {1}, {2} and node 3's community carried down
    carried = level1[level1["size"] == 1]
    assert all(h.communities.set_index("community").loc[p, "level"] == 0 for p in carried["parent"])


def test_largest_component_mask():
    s, t = np.array([1, 2, 3, 10]), np.array([2, 3, 1, 11])
    assert largest_component_mask(s, t).tolist() == [True, True, True, False]


def _partition(h, level):
    members = h.membership[h.membership["level"] == level]
    return {n: c for n, c in zip(members["node"], members["community"])}


def test_a_refresh_keeps_untouched_communities_with_their_numbers_and_reclusters_the_rest():
    s, t, w = _graph_edges(n=300)
    keys = {n: f"entity-{n}" for n in range(400)}
    cfg = CommunitiesConfig(max_cluster_size=10)
    first = build_hierarchy(run_leiden(s, t, w, cfg), 4, node_keys=keys)
    # A new document: five new nodes attached to node 7.
    s2, t2 = np.concatenate([s, np.arange(300, 305)]), np.concatenate([t, np.full(5, 7)])
    w2 = np.ones(len(s2))
    touched = {7, *range(300, 305)}
    numbers = dict(zip(first.communities["id"], first.communities["community"]))
    projected = keep_untouched(project_levels(run_leiden(s2, t2, w2, cfg, _partition(first, 0)), 4),
                               first.membership, touched)
    second = hierarchy_from_levels(projected, node_keys=keys, numbers=numbers)
    for level in sorted(second.communities["level"].unique()):
        members = second.membership[second.membership["level"] == level]
        assert set(members["node"]) == set(range(305)) and members["node"].is_unique
    touched_top = set(first.membership[(first.membership["level"] == 0) & first.membership["node"].isin(touched)]["community"])
    untouched = first.communities[(first.communities["level"] == 0) & ~first.communities["community"].isin(touched_top)]
    kept = second.communities.merge(first.communities, on="id", suffixes=("", "_before"))
    assert set(untouched["id"]) <= set(kept["id"]), "every untouched top community is found again"
    reached = set(first.membership[first.membership["community"].isin(touched_top)]["node"])
    outside = set(first.membership[~first.membership["node"].isin(reached)]["community"])
    assert set(first.communities[first.communities["community"].isin(outside)]["id"]) <= set(kept["id"]), \
        "and so is every community below them"
    assert (kept["community"] == kept["community_before"]).all(), "a community found again keeps its number"
    new = second.communities[~second.communities["id"].isin(first.communities["id"])]
    assert len(new) > 0 and (new["community"] > first.communities["community"].max()).all()
    assert second.communities["community"].is_unique


def test_community_ids_depend_on_member_keys_not_node_numbers():
    raw = pd.DataFrame({"node": [1, 2, 3], "cluster": [0, 0, 1], "level": [0, 0, 0],
                        "parent_cluster": [None] * 3, "is_final_cluster": [True] * 3})
    renumbered = raw.assign(node=raw["node"] + 10)
    a = build_hierarchy(raw, 4, node_keys={1: "x", 2: "y", 3: "z"}).communities
    b = build_hierarchy(renumbered, 4, node_keys={11: "x", 12: "y", 13: "z"}).communities
    assert sorted(a["id"]) == sorted(b["id"])


def _clusters(levels: dict[int, list[set[int]]]) -> pd.DataFrame:
    """(node, level, cluster) from the communities of each level."""
    rows = [(n, level, c) for level, groups in levels.items() for c, group in enumerate(groups) for n in sorted(group)]
    return pd.DataFrame(rows, columns=["node", "level", "cluster"]).astype({"node": "int64", "level": "int32"})


def _groups(projected: pd.DataFrame, level: int) -> list[set[int]]:
    at = projected[projected["level"] == level]
    return sorted((set(g) for g in at.groupby("cluster")["node"].apply(list)), key=min)


def test_a_touched_community_keeps_its_untouched_sub_communities_where_they_still_nest():
    # Last run: {1..6} split into {1,2,3} and {4,5,6}; {10..15} split into {10,11,12} and {13,14,15}.
    previous = _clusters({0: [{1, 2, 3, 4, 5, 6}, {10, 11, 12, 13, 14, 15}],
                          1: [{1, 2, 3}, {4, 5, 6}, {10, 11, 12}, {13, 14, 15}]}).rename(columns={"cluster": "community"})
    # A new edge at 6 and at 15: both top communities are touched. Leiden now cuts {1..6} as
    # {1,2} {3,4,5,6}, and splits {10..15} at the top so that {10,11,12} no longer lies in one community.
    now = _clusters({0: [{1, 2, 3, 4, 5, 6}, {10, 11}, {12, 13, 14, 15}],
                     1: [{1, 2}, {3, 4, 5, 6}, {10, 11}, {12, 13}, {14, 15}]})
    kept = keep_untouched(now, previous, touched={6, 15})
    assert _groups(kept, 0) == _groups(now, 0), "touched top communities are this run's"
    # {1,2,3} had no touched member and still lies in one top community: kept as it was, carved out
    # of this run's clusters; {10,11,12} cannot nest any more, so this run's clusters stand there.
    assert _groups(kept, 1) == [{1, 2, 3}, {4, 5, 6}, {10, 11}, {12, 13}, {14, 15}]
    keys = {n: f"entity-{n}" for n in range(20)}
    before = hierarchy_from_levels(previous.rename(columns={"community": "cluster"}), node_keys=keys)
    after = hierarchy_from_levels(kept, node_keys=keys)

    def id_of(hierarchy, level, members):
        at = hierarchy.membership[hierarchy.membership["level"] == level].groupby("community")["node"].apply(set)
        number = next(c for c, nodes in at.items() if nodes == members)
        return hierarchy.communities.set_index("community").loc[number, "id"]

    ids_after = set(after.communities["id"])
    assert id_of(before, 1, {1, 2, 3}) in ids_after, "the untouched sub-community keeps its id"
    assert id_of(before, 1, {10, 11, 12}) not in ids_after
