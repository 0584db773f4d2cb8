"""The statistics of a report, in one place: bootstrap intervals, the Wilson interval, the
Pareto frontier, and paired changes (:func:`paired_changes`: for a 0/1 grader McNemar's
exact test, Tango's score interval and the minimal detectable drop). numpy only; every
table and gate calls these functions.
"""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 2000
# Entries in one index matrix; larger samples are resampled in row chunks so memory stays
# bounded (16 MiB of int32 indices plus at most 32 MiB of gathered values, per thread)
# whatever the item count. The draws are the same however they are chunked.
_CHUNK_ENTRIES = 1 << 22
_INT8_LIMIT = 127


def cell_rng(seed: int, *key: object) -> np.random.Generator:
    """A generator for one cell, derived from the run seed and the cell's key.

    Seeding per key (not one stream for the whole report) keeps a cell's interval the same
    whichever other cells, shards or categories a report happens to contain.
    """
    digest = zlib.crc32("\x1f".join(str(part) for part in key).encode("utf-8"))
    return np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, digest])


def resample_means(
    values: npt.ArrayLike, resamples: int, rng: np.random.Generator
) -> FloatArray:
    """Means of ``resamples`` bootstrap resamples of ``values``, drawn as an index matrix."""
    data = np.asarray(values, dtype=np.float64)
    n = data.size
    if n == 0 or resamples < 1:
        return np.empty(0, dtype=np.float64)
    # int32 indices halve the random bits drawn and the memory touched.
    dtype = np.int32 if n < 2**31 else np.int64
    small = _small_integers(data)
    rows_per_chunk = max(1, _CHUNK_ENTRIES // n)
    means = np.empty(resamples, dtype=np.float64)
    for start in range(0, resamples, rows_per_chunk):
        stop = min(resamples, start + rows_per_chunk)
        index = rng.integers(0, n, size=(stop - start, n), dtype=dtype)
        # Indexing (unlike np.take) casts int32 indices in small buffers, not all at once.
        if small is not None:
            # Sums of small integers are exact in any order, so the integer sum over n is
            # bit for bit the float mean, for an eighth of the memory traffic.
            means[start:stop] = small[index].sum(axis=1, dtype=np.int64) / n
        else:
            means[start:stop] = data[index].mean(axis=1)
    return means


def _small_integers(data: FloatArray) -> npt.NDArray[np.int8] | None:
    """``data`` as int8 when every value is an integer of at most 127 in magnitude (0/1
    scores and their paired differences), else None."""
    if data.size * _INT8_LIMIT >= 2**53:  # an integer sum could exceed a float's precision
        return None
    if not (np.all(np.abs(data) <= _INT8_LIMIT) and np.array_equal(data, np.trunc(data))):
        return None
    return data.astype(np.int8)


def percentile_interval(
    estimates: npt.ArrayLike, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """The central ``confidence`` interval of a bootstrap distribution (percentile method)."""
    draws = np.asarray(estimates, dtype=np.float64)
    if draws.size == 0:
        return (math.nan, math.nan)
    alpha = (1.0 - confidence) / 2.0
    lo, hi = np.percentile(draws, [100.0 * alpha, 100.0 * (1.0 - alpha)])
    return (float(lo), float(hi))


def bootstrap_ci(
    values: npt.ArrayLike,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    rng: np.random.Generator,
    confidence: float = CONFIDENCE,
) -> tuple[float, float]:
    """Seeded percentile-bootstrap interval of the mean of ``values``.

    Used for a cell's mean quality, and for a paired comparison by passing the per-item
    differences: resampling differences is resampling items, which is the paired bootstrap.
    """
    return percentile_interval(resample_means(values, resamples, rng), confidence)


def bootstrap_cis(
    samples: Sequence[tuple[npt.ArrayLike, np.random.Generator]],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = CONFIDENCE,
) -> list[tuple[float, float]]:
    """:func:`bootstrap_ci` of each (values, generator), in order, on one thread per core.

    numpy draws, gathers and sums without holding the GIL, and each sample has its own
    generator, so the intervals are exactly those of one thread, in less wall time.
    """
    def one(sample: tuple[npt.ArrayLike, np.random.Generator]) -> tuple[float, float]:
        values, rng = sample
        return bootstrap_ci(values, resamples=resamples, rng=rng, confidence=confidence)

    threads = min(len(samples), _cores())
    if threads <= 1:
        return [one(sample) for sample in samples]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(one, samples))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def is_binary(values: npt.ArrayLike) -> bool:
    """True when every value is 0 or 1 (a pass/fail grader), so a Wilson interval applies."""
    data = np.asarray(values, dtype=np.float64)
    return bool(data.size) and bool(np.all((data == 0.0) | (data == 1.0)))


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def wilson_interval(
    successes: int, n: int, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (nan, nan when n is 0)."""
    if n <= 0:
        return (math.nan, math.nan)
    z = _z(confidence)
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2.0 * n)) / denom
    half = (z / denom) * math.sqrt(p * (1.0 - p) / n + z * z / (4.0 * n * n))
    # Analytically lo <= p <= hi, with lo = 0 at p = 0 and hi = 1 at p = 1; rounding can
    # miss by 1e-17, so hold those bounds exactly.
    return (min(max(0.0, centre - half), p), max(min(1.0, centre + half), p))


def pareto_front(cost: npt.ArrayLike, quality: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Mask of the points no other point beats: lower-or-equal cost and higher-or-equal
    quality, strictly better in one. Points with a missing coordinate are never on it."""
    x = np.asarray(cost, dtype=np.float64)
    y = np.asarray(quality, dtype=np.float64)
    valid = ~(np.isnan(x) | np.isnan(y))
    # Pairwise comparison: reports have tens of points, so O(n^2) is clearer than a sweep.
    no_worse = (x[None, :] <= x[:, None]) & (y[None, :] >= y[:, None])
    better = (x[None, :] < x[:, None]) | (y[None, :] > y[:, None])
    dominated = (no_worse & better & valid[None, :]).any(axis=1)
    return valid & ~dominated


# -- paired binary changes: McNemar, the score interval, the detectable drop ---------------
POWER = 0.8
"""The power at which a run's minimal detectable drop is stated."""
SCORE, BOOTSTRAP = "tango", "bootstrap"
"""How a paired interval was made: Tango's score interval (0/1 grader) or the bootstrap."""


def mcnemar_p(flips_down: int, flips_up: int) -> float:
    """The exact (binomial) two-sided McNemar p of ``flips_down`` right-to-wrong and
    ``flips_up`` wrong-to-right items: under no change each flip goes either way with
    probability 1/2, so p = min(1, 2 P(Binomial(b + c, 1/2) <= min(b, c))).

    Summed in log space (``log C(m, k)`` by its running product), so a million flips cost
    one numpy pass and never overflow.
    """
    m, low = flips_down + flips_up, min(flips_down, flips_up)
    if m == 0 or 2 * low >= m:
        return 1.0
    k = np.arange(low, dtype=np.float64)
    log_comb = np.concatenate(([0.0], np.cumsum(np.log((m - k) / (k + 1.0)))))
    peak = float(log_comb.max())
    log_cdf = peak + math.log(float(np.exp(log_comb - peak).sum())) - m * math.log(2.0)
    return min(1.0, 2.0 * math.exp(log_cdf))


def score_interval(
    flips_down: int, flips_up: int, n: int, confidence: float = CONFIDENCE
) -> tuple[float, float]:
    """Tango's (1998) score interval of the paired change (up - down) / n of a 0/1 score.

    Unlike the bootstrap, whose resamples of n unchanged items are all zero, it widens as
    n shrinks: with no flip it is about +-z^2 / (n + z^2), +-0.28 over 10 items and +-0.019
    over 200, close to the exact binomial bound. The bounds are where the score statistic
    equals -+z, found by bisection (it falls as the change tried rises).
    """
    if n <= 0:
        return (math.nan, math.nan)
    z = _z(confidence)
    observed = (flips_up - flips_down) / n

    def statistic(delta: float) -> float:
        return _tango_statistic(flips_down, flips_up, n, delta)

    edge = 1.0 - 1e-12  # at +-1 the variance is zero
    lo = -1.0 if statistic(-edge) <= z else _bisect(statistic, -edge, observed, z)
    hi = 1.0 if statistic(edge) >= -z else _bisect(statistic, observed, edge, -z)
    return (min(lo, observed), max(hi, observed))


def _tango_statistic(down: int, up: int, n: int, delta: float) -> float:
    """(up - down - n delta) / its standard error under the change ``delta``, with the
    right-to-wrong rate at its maximum likelihood given ``delta`` (Tango 1998, eq. 3)."""
    a = 2.0 * n
    b = delta * (2.0 * n + down - up) - (down + up)
    c = -down * delta * (1.0 - delta)
    rate_down = (math.sqrt(max(b * b - 4.0 * a * c, 0.0)) - b) / (2.0 * a)
    variance = n * (2.0 * rate_down + delta * (1.0 - delta))
    numerator = up - down - n * delta
    if variance <= 0.0:
        return 0.0 if numerator == 0 else math.copysign(math.inf, numerator)
    return numerator / math.sqrt(variance)


def _bisect(falling: Callable[[float], float], lo: float, hi: float, target: float) -> float:
    """Where the decreasing ``falling`` crosses ``target`` in [lo, hi]."""
    for _ in range(60):  # 2^-60 of the range: past a float's precision
        middle = (lo + hi) / 2.0
        if falling(middle) > target:
            lo = middle
        else:
            hi = middle
    return (lo + hi) / 2.0


def minimal_detectable_drop(
    n: int,
    *,
    spread: float,
    binary: bool,
    confidence: float = CONFIDENCE,
    power: float = POWER,
) -> float:
    """The smallest fall of the mean that a paired test at ``confidence`` (two-sided) would
    show with probability ``power`` over ``n`` items: the run's minimal detectable effect.

    ``spread`` is the observed discordant rate (flips / n) for a 0/1 grader, else the
    standard deviation of the per-item differences. Non-binary: (z_a + z_p) sd / sqrt(n).
    Binary (Connor 1987, McNemar's test): the drop d solving
    sqrt(n) d = z_a sqrt(q) + z_p sqrt(q - d^2), q = max(observed rate, d), because a drop
    of d needs at least d n items to flip: so an unchanged run's MDE is not zero, it is
    about 0.62 over 10 items and 0.039 over 200. inf when no drop up to 1 is detectable,
    nan without two items.
    """
    if n < 2 or math.isnan(spread):
        return math.nan
    z_a, z_p = _z(confidence), NormalDist().inv_cdf(power)
    if not binary:
        return (z_a + z_p) * spread / math.sqrt(n)

    def shortfall(drop: float) -> float:  # < 0 while the drop is not yet detectable
        rate = max(spread, drop)
        return (math.sqrt(n) * drop - z_a * math.sqrt(rate)
                - z_p * math.sqrt(max(rate - drop * drop, 0.0)))

    if shortfall(1.0) < 0:
        return math.inf
    return _bisect(lambda drop: -shortfall(drop), 0.0, 1.0, 0.0)


@dataclass(frozen=True)
class PairedChange:
    """B minus A over the items scored in both: the mean change, its interval, and for a
    0/1 grader the flips and McNemar's exact p. Made by :func:`paired_changes`."""

    n: int
    delta: float
    lo: float
    hi: float
    method: str
    """:data:`SCORE` for a 0/1 grader, :data:`BOOTSTRAP` otherwise."""
    flips_down: int | None
    """Items right in A and wrong in B (None unless both sides are 0/1)."""
    flips_up: int | None
    mcnemar_p: float | None
    mde: float
    """:func:`minimal_detectable_drop` at this size and spread."""

    def columns(self) -> dict[str, Any]:
        """The table columns (paired.csv, diff) that carry it, n aside."""
        return {"delta": self.delta, "delta_lo": self.lo, "delta_hi": self.hi,
                "ci_method": self.method, "flips_down": self.flips_down,
                "flips_up": self.flips_up, "mcnemar_p": self.mcnemar_p, "mde": self.mde}


CHANGE_COLUMNS: tuple[str, ...] = ("delta", "delta_lo", "delta_hi", "ci_method", "flips_down",
                                   "flips_up", "mcnemar_p", "mde")
""":meth:`PairedChange.columns`, in order."""


def paired_changes(
    pairs: Sequence[tuple[npt.ArrayLike, npt.ArrayLike, np.random.Generator]],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = CONFIDENCE,
) -> list[PairedChange]:
    """The change from A to B of each (b_scores, a_scores, generator), item i of one side
    paired with item i of the other. A 0/1 grader's change gets the score interval and
    McNemar's counts; any other's the paired bootstrap (the differences resampled, the
    intervals drawn in parallel by :func:`bootstrap_cis`)."""
    prepared = []
    for b_scores, a_scores, rng in pairs:
        b, a = np.asarray(b_scores, dtype=np.float64), np.asarray(a_scores, dtype=np.float64)
        binary = bool(a.size) and is_binary(a) and is_binary(b)
        prepared.append((b - a, binary, rng))
    # A binary change needs no resampling: its bootstrap gets no values, and costs nothing.
    intervals = bootstrap_cis([(np.empty(0) if binary else diffs, rng)
                               for diffs, binary, rng in prepared],
                              resamples=resamples, confidence=confidence)
    return [_change(diffs, binary, interval, confidence)
            for (diffs, binary, _), interval in zip(prepared, intervals, strict=True)]


def _change(diffs: FloatArray, binary: bool, interval: tuple[float, float],
            confidence: float) -> PairedChange:
    n = int(diffs.size)
    delta = float(diffs.mean()) if n else math.nan
    if not binary:
        spread = float(diffs.std(ddof=1)) if n > 1 else math.nan
        return PairedChange(n, delta, *interval, BOOTSTRAP, None, None, None,
                            minimal_detectable_drop(n, spread=spread, binary=False,
                                                    confidence=confidence))
    down, up = int((diffs < 0).sum()), int((diffs > 0).sum())
    return PairedChange(n, delta, *score_interval(down, up, n, confidence), SCORE, down, up,
                        mcnemar_p(down, up),
                        minimal_detectable_drop(n, spread=(down + up) / n, binary=True,
                                                confidence=confidence))


def no_flip_items_to_exclude(margin: float, confidence: float = CONFIDENCE) -> int:
    """The fewest paired items of a 0/1 grader, none flipped, whose score interval lies
    above ``-margin``: its lower bound is -z^2 / (n + z^2), above -D once
    n > z^2 (1 - D) / D (73 items for D = 0.05, 35 for 0.1)."""
    if margin <= 0:
        raise ValueError("a margin of 0 or less is never excluded")
    z2 = _z(confidence) ** 2
    return math.floor(z2 * (1.0 - margin) / margin) + 1
