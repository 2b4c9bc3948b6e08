import networkx as nx
import numpy as np
import pandas as pd

from graphrag_spark.config import CommunitiesConfig
from graphrag_spark.index.communities import build_hierarchy, largest_component_mask, project_levels, run_leiden


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
