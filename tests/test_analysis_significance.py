"""The exact tests against brute force over every relabelling and values worked by hand."""

from __future__ import annotations

import pytest

from brute_force import permutation_p as _brute_p
from llds.analysis.significance import (
    exact_permutation_p,
    sign_test,
    smallest_fisher_p,
    smallest_permutation_p,
)


def test_exact_permutation_p_counts_every_split() -> None:
    a, b = [0.70, 0.62, 0.81, 0.55], [0.41, 0.48, 0.66, 0.35, 0.50]
    assert exact_permutation_p(a, b) == pytest.approx(_brute_p(a, b))
    # complete separation of 3 against 3: 2 of the 20 splits are as extreme
    assert exact_permutation_p([1.0, 1.1, 1.2], [0.0, 0.1, 0.2]) == pytest.approx(0.1)
    assert exact_permutation_p([], [0.1]) is None


def test_exact_permutation_p_with_one_seed_in_a_group() -> None:
    """One complete seed per arm (where a confirmation stands after its first pair): 1 against
    1 has two splits, equally extreme (p = 1); 0.9 against 0.1, 0.2, 0.3 by hand: |0.9 - 0.2|
    = 0.7 is the largest of the four singletons' 0.7, 0.367, 0.233, 0.1, so p = 1 / 4."""
    assert exact_permutation_p([0.675], [0.045]) == pytest.approx(1.0)
    assert exact_permutation_p([0.9], [0.1, 0.2, 0.3]) == pytest.approx(0.25)
    assert exact_permutation_p([0.1, 0.2, 0.3], [0.9]) == pytest.approx(0.25)
    a, b = [0.41], [0.70, 0.62, 0.81, 0.55, 0.35]
    assert exact_permutation_p(a, b) == pytest.approx(_brute_p(a, b))
    assert exact_permutation_p(b, a) == pytest.approx(_brute_p(b, a))


def test_smallest_p_the_exact_tests_can_give() -> None:
    """By hand: with a + b seeds that do not overlap, one split of the C(a+b, a) is the observed
    one; two-sided doubles it (at equal sizes its mirror is as extreme). Fisher's extreme table
    [[n, 0], [0, m]] has probability 1 / C(n+m, n), and its mirror at equal sizes as much."""
    assert smallest_permutation_p(2, 2) == pytest.approx(2 / 6)
    assert smallest_permutation_p(2, 2) == pytest.approx(_brute_p([10.0, 11.0], [0.0, 1.0]))
    assert smallest_permutation_p(3, 3) == pytest.approx(2 / 20)
    assert smallest_permutation_p(4, 4) == pytest.approx(2 / 70)  # the first below 0.05
    assert smallest_permutation_p(3, 2) == pytest.approx(2 / 10)
    assert smallest_permutation_p(0, 2) is None
    assert smallest_fisher_p(2, 2) == pytest.approx(2 / 6)
    assert smallest_fisher_p(3, 2) == pytest.approx(1 / 10)  # the mirror table: 3/10
    assert smallest_fisher_p(6, 6) == pytest.approx(2 / 924)
    assert smallest_fisher_p(2, 0) is None


def test_sign_test_by_hand() -> None:
    assert sign_test(0, 5) == pytest.approx(2 / 32)  # 2 * C(5,0) / 2^5
    assert sign_test(5, 5) == pytest.approx(2 / 32)
    assert sign_test(1, 5) == pytest.approx(2 * (1 + 5) / 32)
    assert sign_test(2, 4) == 1.0  # 2 * (1 + 4 + 6) / 16 > 1 is capped
    assert sign_test(0, 10) == pytest.approx(2 / 1024)
    assert sign_test(0, 0) == 1.0
    with pytest.raises(ValueError, match="k=3, n=2"):
        sign_test(3, 2)
