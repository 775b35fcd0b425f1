"""`pack_least_padding`: the micro-batches of least padded tokens plus per-call cost, against
every way of cutting the sorted rows (brute force) and against hand-worked cases."""

from __future__ import annotations

import itertools
import random

from llds.policy.forward import pack_by_length, pack_least_padding


def _cost(lengths, groups, per_call):
    return sum(max(lengths[i] for i in g) * len(g) + per_call for g in groups)


def _fits(lengths, groups, budget):
    return all(len(g) == 1 or max(lengths[i] for i in g) * len(g) <= budget for g in groups)


def _brute_force(lengths, budget, per_call):
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    best = None
    for cuts in itertools.product([False, True], repeat=len(order) - 1):
        groups, current = [], [order[0]]
        for cut, i in zip(cuts, order[1:], strict=True):
            if cut:
                groups.append(current)
                current = []
            current.append(i)
        groups.append(current)
        if _fits(lengths, groups, budget):
            cost = _cost(lengths, groups, per_call)
            best = cost if best is None else min(best, cost)
    return best


def test_hand_worked_cuts():
    # sorted 30, 29, 20, 10, 5: without a call cost every row alone pads nothing
    assert pack_least_padding([10, 30, 20, 29, 5], range(5), 60, per_call=0) == [
        [1],
        [3],
        [2],
        [0],
        [4],
    ]
    # a call costs 100 tokens: two calls, (30, 29) and (20, 10, 5), cost 60 + 60 + 200; any
    # three cost 300 in calls alone (and no two others fit the budget)
    assert pack_least_padding([10, 30, 20, 29, 5], range(5), 60, per_call=100) == [
        [1, 3],
        [2, 0, 4],
    ]
    assert pack_least_padding([100], [0], 60) == [[0]]  # longer than the budget: alone


def test_least_cost_of_all_cuts_and_never_worse_than_greedy():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 9)
        lengths = [rng.choice([rng.randint(1, 20), rng.randint(50, 120)]) for _ in range(n)]
        budget, per_call = rng.choice([60, 150, 400]), rng.choice([0, 8, 64])
        got = pack_least_padding(lengths, range(n), budget, per_call=per_call)
        assert sorted(i for g in got for i in g) == list(range(n))
        assert _fits(lengths, got, budget)
        assert _cost(lengths, got, per_call) == _brute_force(lengths, budget, per_call)
        greedy = pack_by_length(lengths, range(n), budget)
        assert _cost(lengths, got, per_call) <= _cost(lengths, greedy, per_call)
