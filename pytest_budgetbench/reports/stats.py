"""The statistics of a report, in one place: bootstrap intervals, the Wilson interval and
the Pareto frontier. numpy only; every table and gate calls these functions.
"""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from statistics import NormalDist

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
