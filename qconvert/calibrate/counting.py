"""The observers' per-element work: float32 values into power-of-two-aligned bins, per exponent field, and the
extrema of a batch.

NOTE: each count has two implementations with one result. The numpy loops here define it; `_counting.c`, built
with the package where a C compiler is found (setuptools' optional extension), does the same count in one
loop, 2-3x faster per element and without the GIL. Every element of every calibrated tensor goes through one
of these (about a billion per 128 samples of a small BERT), which is why they are not plain numpy:
`benchmarks/calibrate.py --tools qconvert,qconvert-numpy` ran Distribution on 128 samples in 4.2 s with them
and 5.7 s without. tests/calibrate/test_counting.py checks both bin for bin, edge values included;
`uses_c_loops()` says which one runs (CI prints it, `qconvert calibrate` says when numpy's do). An editable
install builds the extension once: after editing `_counting.c`, `pip install -e . --no-deps` rebuilds it
(test_counting.py fails on a stale build).
"""

from __future__ import annotations

import math

import numpy as np

try:
    from qconvert.calibrate import _counting  # type: ignore[attr-defined]
except ImportError:  # installed without a C compiler: the numpy loops below
    _counting = None


def uses_c_loops() -> bool:
    """Whether the counts run in C (the extension was built), rather than in numpy's loops."""
    return _counting is not None


# float32 bits >> 23: sign bit * 256 + biased exponent field (0: zero or subnormal, 255: Inf/NaN)
FLOAT32_EXPONENT_FIELDS = 512
# bincount over 64 Ki elements at a time keeps its temporaries (the shifted uint32 and bincount's intp copy)
# in cache: measured 1.5-2x faster than one call over 4M floats.
_FIELD_CHUNK = 1 << 16
# 32 Ki float32 elements (128 KiB) per step keeps the histogram's temporaries in L2; measured fastest of
# 8 Ki..128 Ki on 10M floats.
HISTOGRAM_CHUNK = 1 << 15


def aligned_bin(value: float, exponent: int) -> int:
    """floor(value / 2**exponent), exactly: scaling a float32 value by a power of two is exact in float64."""
    return math.floor(math.ldexp(value, -exponent))


def finite_extrema(values: np.ndarray) -> tuple[float, float] | None:
    """(min, max) of a non-empty float array when every value is finite (a zero extreme as +0.0), else None.

    float32 arrays take the C loop's one pass; numpy's min() and max() are two."""
    if _counting is not None and values.dtype == np.float32 and values.flags.c_contiguous:
        return _counting.finite_extrema(values)
    low, high = values.min(), values.max()
    # min/max propagate NaN and reach ±Inf, so finite extremes prove every element is finite.
    if not (np.isfinite(low) and np.isfinite(high)):
        return None
    return float(low) + 0.0, float(high) + 0.0


def exponent_field_counts(values: np.ndarray) -> np.ndarray:
    """int64 counts of `values` (as float32) per `bits >> 23`, i.e. per sign and octave (±Inf and NaN in
    fields 255 and 511)."""
    flat = np.require(values, dtype=np.float32, requirements=("C", "A")).reshape(-1)
    counts = np.zeros(FLOAT32_EXPONENT_FIELDS, dtype=np.int64)
    if _counting is not None:
        _counting.exponent_field_counts(flat, counts)
        return counts
    bits = flat.view(np.uint32)
    for start in range(0, bits.size, _FIELD_CHUNK):
        counts += np.bincount(bits[start : start + _FIELD_CHUNK] >> 23, minlength=FLOAT32_EXPONENT_FIELDS)
    return counts


def add_aligned_bin_counts(values: np.ndarray, exponent: int, first_bin: int, counts: np.ndarray) -> int:
    """counts[floor(x / 2**exponent) - first_bin] += 1 for each x of `values` (1-D, finite float32 or
    float16, every bin inside `counts`, an int64 array); returns how many x are zero (+0.0 or -0.0).

    Both loops are exact for first bins up to 2**52 in magnitude and any float32 exponent; the C loop
    refuses |exponent| > 800.
    """
    if values.size == 0:
        return 0
    if _counting is not None and values.dtype == np.float32:
        aligned = np.require(values, requirements=("C", "A"))
        return int(_counting.aligned_bin_counts(aligned, exponent, first_bin, counts))
    zeros = int(np.count_nonzero(values == 0))  # 2.6x faster than size - count_nonzero(values)
    # x · 2**-e is exact in float32 when -126 <= e <= 0 (the product stays below ~2**38); for e > 0 tiny
    # values could underflow (a tiny negative value would reach -0.0 and bin 0), and below -126 2**-e
    # itself overflows float32 (a range narrower than ~1e-35), so use float64 there; past 2**24 bins,
    # where a bin index is no longer exact in float32; and for a first bin float32 cannot hold (an aligned
    # histogram's has at most 24 significant bits, a window around one may have more).
    narrow = -126 <= exponent <= 0 and counts.size <= 1 << 24 and int(np.float32(first_bin)) == first_bin
    compute = np.float32 if narrow else np.float64
    scale = compute(np.ldexp(1.0, -exponent))
    first = compute(first_bin)
    chunk = min(HISTOGRAM_CHUNK, values.size)
    positions = np.empty(chunk, dtype=compute)
    indices = np.empty(chunk, dtype=np.intp)
    for start in range(0, values.size, chunk):
        part = values[start : start + chunk]
        position = positions[: part.size]
        index = indices[: part.size]
        np.multiply(part, scale, out=position, casting="unsafe")  # float16 widens exactly
        np.floor(position, out=position)
        np.subtract(position, first, out=position)  # integers: exact
        index[...] = position
        counts += np.bincount(index, minlength=counts.size)
    return zeros


def add_aligned_bin_counts_and_extrema(
    values: np.ndarray, exponent: int, first_bin: int, counts: np.ndarray
) -> tuple[int, float, float] | None:
    """`add_aligned_bin_counts` and `finite_extrema` of a non-empty 1-D `values` (float32 or float16) when
    every value is finite and lands in `counts`: (zeros, minimum, maximum). Else None, and `counts` is
    unchanged. The C loop reads float32 values once for both, where the two calls read them twice."""
    if _counting is not None and values.dtype == np.float32:
        aligned = np.require(values, requirements=("C", "A"))
        return _counting.aligned_bin_counts_and_extrema(aligned, exponent, first_bin, counts)
    extrema = finite_extrema(values)
    if extrema is None:
        return None
    low, high = extrema
    if aligned_bin(low, exponent) < first_bin or aligned_bin(high, exponent) >= first_bin + counts.size:
        return None
    return add_aligned_bin_counts(values, exponent, first_bin, counts), low, high
