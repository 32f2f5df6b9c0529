"""stats.py against independent computations: the sign test against every sign pattern counted out, Holm
against its textbook steps, the bootstrap interval against what it must hold."""

from itertools import product

import pytest

from stats import bootstrap_interval, holm, sign_test


@pytest.mark.parametrize(("improved", "regressed"), [(0, 0), (1, 0), (3, 1), (6, 2), (5, 5), (9, 3), (2, 11)])
def test_the_sign_test_is_the_share_of_sign_patterns_at_least_as_uneven(
    improved: int, regressed: int
) -> None:
    n = improved + regressed
    uneven = abs(improved - regressed)
    patterns = list(product((1, -1), repeat=n))
    as_uneven = sum(abs(sum(signs)) >= uneven for signs in patterns)
    assert sign_test(improved, regressed) == pytest.approx(as_uneven / len(patterns))


def test_the_sign_test_is_symmetric_and_known_values_hold() -> None:
    assert sign_test(30, 11) == sign_test(11, 30) == pytest.approx(0.004324, abs=1e-6)
    assert sign_test(21, 3) == pytest.approx(0.000277, abs=1e-6)
    assert sign_test(20, 20) == 1.0


def test_holm_multiplies_by_the_tests_left_and_never_lets_a_later_p_fall() -> None:
    adjusted = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.5})
    assert adjusted == pytest.approx({"a": 0.04, "c": 0.09, "b": 0.09, "d": 0.5})
    assert holm({"only": 0.02}) == {"only": 0.02}
    assert holm({"a": 0.6, "b": 0.7}) == {"a": 1.0, "b": 1.0}


def test_the_bootstrap_interval_holds_the_mean_and_narrows_with_more_problems() -> None:
    few = [1.0, 0.0, 0.0, 0.25]
    many = few * 25
    low, high = bootstrap_interval(few)
    assert low <= sum(few) / len(few) <= high and 0.0 <= low < high <= 1.0
    many_low, many_high = bootstrap_interval(many)
    assert many_high - many_low < (high - low) / 3  # 25x the problems: about a fifth of the width
    assert bootstrap_interval([0.5] * 10) == (0.5, 0.5)
    assert bootstrap_interval(few, seed=1) == bootstrap_interval(few, seed=1)
