"""The report statistics against scipy, closed forms and known values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_budgetbench.reports.stats import (
    bootstrap_ci,
    cell_rng,
    is_binary,
    pareto_front,
    percentile_interval,
    resample_means,
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
