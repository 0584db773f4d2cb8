"""The report statistics against scipy, closed forms and known values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_budgetbench.reports.stats import (
    BOOTSTRAP,
    SCORE,
    bootstrap_ci,
    cell_rng,
    is_binary,
    mcnemar_p,
    minimal_detectable_drop,
    no_flip_items_to_exclude,
    paired_changes,
    pareto_front,
    percentile_interval,
    resample_means,
    score_interval,
    wilson_interval,
)

scipy_stats = pytest.importorskip("scipy.stats")

Z95 = 1.959963984540054


@pytest.mark.parametrize(
    "values",
    [
        np.random.default_rng(1).normal(0.5, 0.2, size=60),
        np.random.default_rng(2).integers(0, 2, size=80).astype(float),
        np.random.default_rng(3).exponential(1.0, size=25),
    ],
    ids=["normal", "binary", "skewed"],
)
def test_percentile_bootstrap_agrees_with_scipy(values: np.ndarray) -> None:
    resamples = 20_000
    ours = bootstrap_ci(values, resamples=resamples, rng=np.random.default_rng(10))
    theirs = scipy_stats.bootstrap(
        (values,), np.mean, n_resamples=resamples, method="percentile",
        confidence_level=0.95, rng=np.random.default_rng(11),
    ).confidence_interval
    # Monte-Carlo tolerance: with 20,000 draws the 2.5% quantile of the resample means has
    # a Monte-Carlo sd of about 0.02 standard errors, so two independent runs differ by
    # ~0.03 SE; 0.25 SE is ~9 sigma yet still covers one grid step of the 0/1 sample.
    tolerance = 0.25 * values.std(ddof=1) / math.sqrt(values.size)
    assert ours[0] == pytest.approx(theirs.low, abs=tolerance)
    assert ours[1] == pytest.approx(theirs.high, abs=tolerance)


def test_bootstrap_is_seeded_and_vectorised_shape() -> None:
    values = np.arange(10.0)
    first = resample_means(values, 2000, cell_rng(0, "a", 1))
    again = resample_means(values, 2000, cell_rng(0, "a", 1))
    other = resample_means(values, 2000, cell_rng(0, "b", 1))
    assert first.shape == (2000,)
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)


def test_chunked_resampling_equals_one_index_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_budgetbench.reports import stats

    values = np.random.default_rng(0).random(50)
    whole = resample_means(values, 300, np.random.default_rng(5))
    monkeypatch.setattr(stats, "_CHUNK_ENTRIES", 50 * 7)  # 7 resamples per chunk
    chunked = resample_means(values, 300, np.random.default_rng(5))
    assert np.allclose(whole, chunked)


def test_bootstrap_of_empty_or_constant_sample() -> None:
    assert all(math.isnan(v) for v in bootstrap_ci([], rng=np.random.default_rng(0)))
    assert bootstrap_ci([0.7] * 5, rng=np.random.default_rng(0)) == pytest.approx((0.7, 0.7))


def wilson_closed_form(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    p = k / n
    centre = (2 * k + z * z) / (2 * (n + z * z))
    half = z * math.sqrt(n * p * (1 - p) + z * z / 4) / (n + z * z)
    return centre - half, centre + half


@pytest.mark.parametrize(("k", "n"), [(0, 10), (3, 10), (8, 10), (10, 10), (50, 100), (1, 3)])
def test_wilson_matches_closed_form(k: int, n: int) -> None:
    lo, hi = wilson_interval(k, n)
    ref_lo, ref_hi = wilson_closed_form(k, n)
    assert lo == pytest.approx(max(0.0, ref_lo), abs=1e-12)
    assert hi == pytest.approx(min(1.0, ref_hi), abs=1e-12)


@pytest.mark.parametrize(
    ("k", "n", "expected"),
    [
        # Published values (Newcombe 1998, Table I; Agresti & Coull 1998).
        (81, 263, (0.2553, 0.3662)),
        (15, 148, (0.0624, 0.1605)),
        (0, 20, (0.0, 0.1611)),
        (8, 10, (0.4902, 0.9433)),
    ],
)
def test_wilson_known_values(k: int, n: int, expected: tuple[float, float]) -> None:
    lo, hi = wilson_interval(k, n)
    assert (lo, hi) == pytest.approx(expected, abs=6e-5)


def test_wilson_of_nothing_is_nan() -> None:
    assert all(math.isnan(v) for v in wilson_interval(0, 0))


def test_is_binary() -> None:
    assert is_binary([0.0, 1.0, 1.0])
    assert not is_binary([0.0, 0.5])
    assert not is_binary([])


def test_pareto_front_known_points() -> None:
    cost = [100, 200, 150, 300, 120, float("nan")]
    quality = [0.5, 0.8, 0.4, 0.8, 0.5, 0.99]
    # (150, 0.4) is beaten by (100, 0.5); (300, 0.8) by (200, 0.8); (120, 0.5) by (100, 0.5).
    assert pareto_front(cost, quality).tolist() == [True, True, False, False, False, False]


samples = st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(samples, st.integers(0, 2**32 - 1))
def test_interval_brackets_the_resample_median(values: list[float], seed: int) -> None:
    means = resample_means(values, 500, np.random.default_rng(seed))
    lo, hi = percentile_interval(means)
    assert lo <= float(np.median(means)) <= hi
    assert min(values) - 1e-12 <= lo <= hi <= max(values) + 1e-12


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 500).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_contains_the_proportion(case: tuple[int, int]) -> None:
    k, n = case
    lo, hi = wilson_interval(k, n)
    assert 0.0 <= lo <= k / n <= hi <= 1.0


points = st.lists(
    st.tuples(st.integers(0, 20).map(float), st.integers(0, 10).map(lambda q: q / 10)),
    min_size=1, max_size=25,
)


@settings(max_examples=80, deadline=None)
@given(points)
def test_pareto_front_is_exactly_the_undominated_points(pts: list[tuple[float, float]]) -> None:
    x = [p[0] for p in pts]
    y = [p[1] for p in pts]
    front = pareto_front(x, y)

    def dominated(i: int) -> bool:
        return any(
            x[j] <= x[i] and y[j] >= y[i] and (x[j] < x[i] or y[j] > y[i])
            for j in range(len(pts))
        )

    assert front.tolist() == [not dominated(i) for i in range(len(pts))]
    assert front.any()


# -- paired changes: McNemar, the score interval, the minimal detectable drop ---------------
flips = st.integers(min_value=0, max_value=400)


@given(flips, flips)
@settings(max_examples=200, deadline=None)
def test_mcnemar_p_is_scipys_exact_binomial_test_and_symmetric(down: int, up: int) -> None:
    p = mcnemar_p(down, up)
    assert 0.0 <= p <= 1.0
    assert mcnemar_p(up, down) == p
    expected = scipy_stats.binomtest(min(down, up), down + up, 0.5).pvalue if down + up else 1
    assert p == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_mcnemar_p_known_values_and_a_million_flips() -> None:
    assert mcnemar_p(0, 0) == mcnemar_p(5, 5) == 1.0
    assert mcnemar_p(6, 0) == pytest.approx(2 / 64)  # 2 x (1/2)^6
    assert mcnemar_p(5, 0) == pytest.approx(2 / 32)  # not below 0.05: 5 flips show nothing
    assert mcnemar_p(500_000, 501_000) == pytest.approx(
        scipy_stats.binomtest(500_000, 1_001_000, 0.5).pvalue, rel=1e-6)


@given(st.integers(min_value=1, max_value=300).flatmap(
    lambda n: st.tuples(st.just(n), st.integers(0, n)).flatmap(
        lambda t: st.tuples(st.just(t[0]), st.just(t[1]), st.integers(0, t[0] - t[1])))))
@settings(max_examples=200, deadline=None)
def test_score_interval_holds_the_change_and_mirrors_when_the_flips_swap(
    case: tuple[int, int, int],
) -> None:
    n, down, up = case
    lo, hi = score_interval(down, up, n)
    observed = (up - down) / n
    assert -1.0 <= lo <= observed <= hi <= 1.0
    assert score_interval(up, down, n) == pytest.approx((-hi, -lo), abs=1e-9)


def test_score_interval_of_an_unchanged_run_shrinks_with_its_size() -> None:
    # No flip: the bound solves n d / (1 - d) = z^2, so it is -+z^2 / (n + z^2).
    for n in (10, 20, 200, 5000):
        bound = Z95**2 / (n + Z95**2)
        assert score_interval(0, 0, n) == pytest.approx((-bound, bound), rel=1e-9)
    assert score_interval(0, 0, 10)[0] == pytest.approx(-0.2775, abs=1e-4)
    assert score_interval(0, 0, 200)[0] == pytest.approx(-0.0188, abs=1e-4)
    assert all(math.isnan(bound) for bound in score_interval(0, 0, 0))


def test_score_interval_is_where_the_score_test_stops_rejecting() -> None:
    """Tango's interval by brute force: the change values whose score statistic, with the
    right-to-wrong rate at its constrained maximum likelihood found on a grid, is inside
    +-z."""
    down, up, n = 3, 5, 50
    concordant = n - down - up

    def statistic(delta: float) -> float:
        rates = np.linspace(max(0.0, -delta) + 1e-9, (1 - delta) / 2 - 1e-9, 100_001)
        loglik = (down * np.log(rates) + up * np.log(rates + delta)
                  + concordant * np.log(1 - 2 * rates - delta))
        rate = rates[np.argmax(loglik)]
        return (up - down - n * delta) / math.sqrt(n * (2 * rate + delta * (1 - delta)))

    grid = np.linspace(-0.5, 0.5, 2001)
    inside = [d for d in grid if abs(statistic(d)) < Z95]
    lo, hi = score_interval(down, up, n)
    assert lo == pytest.approx(min(inside), abs=1e-3)
    assert hi == pytest.approx(max(inside), abs=1e-3)


def test_no_flip_items_to_exclude_is_the_first_size_whose_interval_clears_the_margin() -> None:
    for margin in (0.02, 0.05, 0.1, 0.3):
        n = no_flip_items_to_exclude(margin)
        assert score_interval(0, 0, n)[0] > -margin >= score_interval(0, 0, n - 1)[0]
    assert no_flip_items_to_exclude(0.05) == 73


def test_minimal_detectable_drop_known_values() -> None:
    # Binary: a drop of d needs d n flips, so an unchanged run's MDE is not zero.
    assert minimal_detectable_drop(10, spread=0.0, binary=True) == pytest.approx(0.616, abs=1e-3)
    assert minimal_detectable_drop(200, spread=0.0, binary=True) == pytest.approx(0.0388,
                                                                                  abs=1e-4)
    # More discordance (noisier items) needs a larger drop to show.
    assert minimal_detectable_drop(200, spread=0.2, binary=True) > \
        minimal_detectable_drop(200, spread=0.0, binary=True)
    # Non-binary: (z_0.975 + z_0.8) sd / sqrt(n).
    assert minimal_detectable_drop(100, spread=0.3, binary=False) == pytest.approx(
        (Z95 + 0.8416212335729143) * 0.3 / 10)
    assert minimal_detectable_drop(3, spread=0.0, binary=True) == math.inf  # 3 flips: p=0.25
    assert math.isnan(minimal_detectable_drop(1, spread=0.0, binary=True))


@given(st.integers(2, 5000), st.floats(0.0, 1.0))
@settings(max_examples=100, deadline=None)
def test_minimal_detectable_drop_shrinks_as_the_run_grows(n: int, rate: float) -> None:
    smaller = minimal_detectable_drop(n, spread=rate, binary=True)
    larger = minimal_detectable_drop(2 * n, spread=rate, binary=True)
    assert larger <= smaller
    assert 0.0 < larger <= 1.0 or larger == math.inf


def test_binary_changes_get_the_score_interval_and_mcnemar_others_the_bootstrap() -> None:
    a = np.array([1.0] * 30 + [0.0] * 10)
    b = a.copy()
    b[:6] = 0.0  # six right -> wrong
    b[-1] = 1.0  # one wrong -> right
    partial = a * 0.5 + 0.25
    binary, graded = paired_changes([(b, a, np.random.default_rng(0)),
                                     (partial - 0.1, partial, np.random.default_rng(0))],
                                    resamples=500)
    assert (binary.method, binary.flips_down, binary.flips_up, binary.n) == (SCORE, 6, 1, 40)
    assert binary.delta == pytest.approx(-5 / 40)
    assert binary.mcnemar_p == pytest.approx(scipy_stats.binomtest(1, 7, 0.5).pvalue)
    assert (binary.lo, binary.hi) == pytest.approx(score_interval(6, 1, 40))
    assert binary.mde == pytest.approx(minimal_detectable_drop(40, spread=7 / 40, binary=True))
    assert (graded.method, graded.flips_down, graded.mcnemar_p) == (BOOTSTRAP, None, None)
    assert graded.lo == graded.hi == pytest.approx(-0.1)  # every item fell by 0.1
