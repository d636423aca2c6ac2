"""The planner's fast kernels against their plain definitions: the pruned, windowed innermost level
against pricing every split; the state graph's packed-bit matrices, grouped sums, undominated pairs,
computed table and blocked row solve against straightforward versions (pipedream/planner/states.py,
prune.py, recurrence.py, banded.py). The whole planner against brute force is in test_planner.py."""

from __future__ import annotations

import random

import pytest

from pipedream.planner.states import build_states
from pipedream.topology import get_cluster
from tests.test_planner import CLUSTERS, random_dag, read_profile


def test_pruned_windowed_kernel_equals_the_plain_one() -> None:
    """The innermost level's fast kernel (dominated splits dropped, windows) against pricing every split."""
    import numpy as np

    from pipedream.planner.banded import solve_rows_banded
    from pipedream.planner.hierarchy import level_rules
    from pipedream.planner.prune import all_pairs, by_end, undominated_pairs
    from pipedream.planner.recurrence import LevelInput, solve_rows

    for name in ("gnmt", "resnet50"):
        s = build_states(read_profile(name))
        c_prev = np.concatenate(([0.0], s.compute_s))
        for compat, memory_limit, ratio in [(True, False, None), (True, True, 2.0), (False, True, None)]:
            allowed = np.arange(s.n)[None, :] >= np.arange(s.n + 1)[:, None]
            if not compat:
                allowed[1:] &= s.nested
            table = np.where(allowed, s.compute_s[None, :] - c_prev[:, None], np.inf)
            rules = level_rules(get_cluster("B_2x8" if name == "gnmt" else "A_4x4", CLUSTERS), compat=compat,
                                memory_limit=memory_limit, straight=False, ratio=ratio)[0]
            boundary = s.boundary_bytes if compat else s.cut_bytes
            inp = LevelInput(table, s.param_bytes, s.activation_bytes, boundary, s.ancestors)
            keys = [s.compute_s, s.param_bytes, s.activation_bytes, boundary]
            fast = solve_rows_banded(inp, rules, by_end(undominated_pairs(s, keys), s.n), s.compute_s)
            assert np.array_equal(fast, solve_rows(inp, rules, by_end(all_pairs(s), s.n))), (name, compat, memory_limit)


def _small_state_graphs() -> list:
    """State graphs of the GNMT profile and of random DAGs (branches, joins, zero-cost layers)."""
    rng = random.Random(21)
    return [build_states(read_profile("gnmt"))] + [build_states(random_dag(rng, rng.randint(2, 12))) for _ in range(60)]


def test_state_graph_matrices_match_their_definitions() -> None:
    """Descendants, nested ideals and edges (computed on packed bits) against the plain definitions."""
    import numpy as np

    for s in _small_state_graphs():
        n = s.n
        succ = [[] for _ in range(n)]
        for k, j in s.edges.tolist():
            assert k < j and s.ideals[k] & ~s.ideals[j] == 0 and s.ideals[k] != s.ideals[j]  # an edge adds nodes
            succ[k].append(j)
        reach = [set() for _ in range(n)]
        for k in range(n - 1, -1, -1):
            for j in succ[k]:
                reach[k] |= {j} | reach[j]
        assert s.ancestors.tolist() == [[j in reach[k] for j in range(n)] for k in range(n)]
        proper = [[k != j and s.ideals[k] & ~s.ideals[j] == 0 for j in range(n)] for k in range(n)]
        assert s.nested.tolist() == proper
        assert np.array_equal(s.nested, s.nested & ~np.eye(n, dtype=bool))


def test_grouped_row_sums_equal_each_sum_alone() -> None:
    """The boundary bytes are summed by groups of equal length; the floats must be numpy's per-list sums."""
    import numpy as np

    from pipedream.planner.states import _row_sums

    rng = np.random.default_rng(3)
    values = rng.standard_normal(300) * 10.0 ** rng.integers(-3, 12, size=300)
    lists = [list(rng.choice(300, size=int(rng.integers(1, 40)), replace=False)) for _ in range(400)]
    assert _row_sums(values, lists).tolist() == [values[idx].sum() for idx in lists]


def test_undominated_pairs_match_the_definition() -> None:
    """Split k is dropped for end state j iff a state of k's class lies strictly between them; keys that
    grow along edges (the same-class edge path) and keys that can shrink (boundary bytes: every
    same-class descendant)."""
    import numpy as np

    from pipedream.planner.prune import all_pairs, undominated_pairs

    for s in _small_state_graphs():
        anc = s.ancestors
        for keys in ([s.compute_s, s.param_bytes], [s.compute_s, s.param_bytes, s.activation_bytes],
                     [s.compute_s, s.param_bytes, s.boundary_bytes], [s.compute_s, s.param_bytes, s.cut_bytes]):
            cls = [tuple(float(key[i]) for key in keys) for i in range(s.n)]
            want = [(k, j) for j in range(s.n) for k in range(s.n) if anc[k, j]
                    and not any(cls[d] == cls[k] and anc[k, d] and anc[d, j] for d in range(s.n))]
            k, j = undominated_pairs(s, keys)
            assert list(zip(k.tolist(), j.tolist(), strict=True)) == want
        k, j = all_pairs(s)
        assert np.array_equal(anc[k, j], np.ones(len(k), dtype=bool)) and len(k) == anc.sum()


def test_compute_table_equals_the_stored_table() -> None:
    import numpy as np

    from pipedream.planner.recurrence import ComputeTable

    for s in _small_state_graphs()[:20]:
        c_prev = np.concatenate(([0.0], s.compute_s))
        for nested in (None, s.nested):
            allowed = np.arange(s.n)[None, :] >= np.arange(s.n + 1)[:, None]
            if nested is not None:
                allowed[1:] &= nested
            stored = np.where(allowed, s.compute_s[None, :] - c_prev[:, None], np.inf)
            table = ComputeTable(s.compute_s, nested)
            rows = np.arange(s.n + 1)
            assert np.array_equal(table[rows], stored)
            r, j = np.meshgrid(rows, np.arange(s.n), indexing="ij")
            assert np.array_equal(table[r, j], stored)
            assert np.array_equal(table[rows[::-1][:3]], stored[rows[::-1][:3]])


def test_row_solve_pruned_blocked_equals_every_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    """solve_row over the pruned candidates, in blocks of one end state, against every ancestor in one
    block, every row, and the plans behind the values (the tie rule, over every ancestor) alike."""
    import numpy as np

    import pipedream.planner.recurrence as recurrence
    from pipedream.planner.hierarchy import level_rules
    from pipedream.planner.prune import all_pairs, undominated_pairs
    from pipedream.planner.recurrence import ComputeTable, LevelInput, solve_row

    for s in _small_state_graphs()[:12]:
        for compat, memory_limit, ratio, straight in [(True, False, None, False), (True, True, 2.0, False),
                                                      (False, True, None, False), (True, False, None, True)]:
            cluster = get_cluster("4:1e9", CLUSTERS)
            cluster.device_memory_bytes = float(s.param_bytes[-1] + s.activation_bytes[-1]) / 2
            rules = level_rules(cluster, compat=compat, memory_limit=memory_limit, straight=straight, ratio=ratio)[0]
            boundary = s.boundary_bytes if compat else s.cut_bytes
            inp = LevelInput(ComputeTable(s.compute_s, None if compat else s.nested), s.param_bytes,
                             s.activation_bytes, boundary, s.ancestors)
            pruned = undominated_pairs(s, [s.compute_s, s.param_bytes, s.activation_bytes, boundary])
            every = all_pairs(s)
            for r in range(s.n + 1) if s.n < 40 else (0, 1, s.n // 2):  # GNMT: 99 states
                monkeypatch.setattr(recurrence, "_BLOCK_BYTES", 1)
                fast = solve_row(inp, rules, r, pruned)
                monkeypatch.setattr(recurrence, "_BLOCK_BYTES", 2**40)
                plain = solve_row(inp, rules, r, every)
                assert np.array_equal(fast.time, plain.time), (r, compat, memory_limit)
                m = rules.workers - 1
                assert [fast.choice(j, m) for j in range(s.n)] == [plain.choice(j, m) for j in range(s.n)]
