"""Mergeable observers: exact min/max, moving-average min/max, aligned and fixed-range histograms.

NOTE: every observer here is exact and order-independent: observing A, B on one observer and observing
them on two observers then merging give bit-identical state, whatever the split and order, so
`--workers N` reproduces `--workers 1`. That is why the moving average keeps exact rational sums and
why histograms either take a fixed range (`HistogramObserver`) or grow only by merging whole bins of
power-of-two width (`AlignedHistogramObserver`, which the histogram methods use: one pass, no range
needed first) instead of re-binning approximately as onnxruntime's do.

Non-finite values are counted, never folded into a range: NaN is ignored (as numpy's nanmin), +Inf and
-Inf are counted separately, and `min`/`max` are over finite values only. onnxruntime's ReduceMin keeps
±Inf (its range becomes infinite); the calibrate report shows the counts instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from qconvert.calibrate.counting import (
    FLOAT32_EXPONENT_FIELDS,
    HISTOGRAM_CHUNK,
    add_aligned_bin_counts,
    add_aligned_bin_counts_and_extrema,
    aligned_bin,
    exponent_field_counts,
    finite_extrema,
)

# |x| >= 2**100 (1.27e30): the float-min / float-max class of sentinels. No trained activation gets there;
# masks built from torch.finfo(float32).min (3.4e38) and "large negative" constants (-1e30, -1e38) do.
HUGE_EXPONENT = 100
HUGE_MAGNITUDE = 2.0**HUGE_EXPONENT
# A one-pass window may be this many bins wider than its batch has values: clearing a bin of it costs about
# what the second pass costs per value (0.6 against 0.4 ns), so much wider windows cost more than they save.
ONE_PASS_SPARE_BINS = 1 << 14


@dataclass(slots=True)
class BatchExtrema:
    """One batch of one tensor reduced: finite min/max (None when no finite value) and the counts."""

    minimum: float | None
    maximum: float | None
    count: int
    nan_count: int
    positive_inf_count: int
    negative_inf_count: int


def batch_extrema(values: np.ndarray) -> BatchExtrema:
    """Finite min/max and element / NaN / ±Inf counts of `values`, in one pass when all are finite."""
    array = np.asarray(values)
    if not np.issubdtype(array.dtype, np.floating):
        raise TypeError(f"observers take float tensors, got {array.dtype}")
    count = int(array.size)
    if count == 0:
        return BatchExtrema(None, None, 0, 0, 0, 0)
    extrema = finite_extrema(array)
    if extrema is not None:
        return BatchExtrema(*extrema, count, 0, 0, 0)
    nan_count = int(np.count_nonzero(np.isnan(array)))
    positive_inf_count = int(np.count_nonzero(array == np.inf))
    negative_inf_count = int(np.count_nonzero(array == -np.inf))
    finite = array[np.isfinite(array)]
    if finite.size == 0:
        return BatchExtrema(None, None, count, nan_count, positive_inf_count, negative_inf_count)
    return BatchExtrema(
        float(finite.min()), float(finite.max()), count, nan_count, positive_inf_count, negative_inf_count
    )


# `+ 0.0` makes -0.0 0.0: min(0.0, -0.0) is whichever came first, and merges must not depend on order.
def _min_or_none(a: float | None, b: float | None) -> float | None:
    values = [value for value in (a, b) if value is not None]
    return min(values) + 0.0 if values else None


def _max_or_none(a: float | None, b: float | None) -> float | None:
    values = [value for value in (a, b) if value is not None]
    return max(values) + 0.0 if values else None


@dataclass(slots=True)
class MinMaxObserver:
    """Exact min/max over finite values, with element, NaN, +Inf and -Inf counts.

    `minimum`/`maximum` are None until a finite value is seen; they keep the input's precision (a float32
    tensor gives float32 values held as Python floats).
    """

    minimum: float | None = None
    maximum: float | None = None
    count: int = 0
    nan_count: int = 0
    positive_inf_count: int = 0
    negative_inf_count: int = 0
    batch_count: int = 0

    def observe(self, values: np.ndarray) -> None:
        self.fold(batch_extrema(values))

    def fold(self, batch: BatchExtrema) -> None:
        """Fold an already reduced batch (observers that need the same reduction share one pass)."""
        self.minimum = _min_or_none(self.minimum, batch.minimum)
        self.maximum = _max_or_none(self.maximum, batch.maximum)
        self.count += batch.count
        self.nan_count += batch.nan_count
        self.positive_inf_count += batch.positive_inf_count
        self.negative_inf_count += batch.negative_inf_count
        self.batch_count += 1

    def merge(self, other: MinMaxObserver) -> None:
        self.minimum = _min_or_none(self.minimum, other.minimum)
        self.maximum = _max_or_none(self.maximum, other.maximum)
        self.count += other.count
        self.nan_count += other.nan_count
        self.positive_inf_count += other.positive_inf_count
        self.negative_inf_count += other.negative_inf_count
        self.batch_count += other.batch_count

    @property
    def finite_count(self) -> int:
        return self.count - self.nan_count - self.positive_inf_count - self.negative_inf_count

    @property
    def absolute_maximum(self) -> float | None:
        """max(|min|, |max|) over finite values, or None before any finite value."""
        if self.minimum is None or self.maximum is None:
            return None
        return max(abs(self.minimum), abs(self.maximum))


@dataclass(slots=True)
class MovingAverageMinMaxObserver:
    """The mean over batches of each batch's min and max (onnxruntime's `moving_average=True`), exactly.

    onnxruntime averages per-batch ReduceMin/ReduceMax outputs with `nanmean` (a plain mean, not an
    exponential average). The sums here are exact rationals (every float is a dyadic rational), so the
    mean is the correctly rounded mean of the batch extremes whatever the batch order or worker split.
    A batch with no finite value does not count, as `nanmean` skips NaN. `extrema` keeps the exact
    min/max and counts of the same data.
    """

    extrema: MinMaxObserver = field(default_factory=MinMaxObserver)
    minimum_sum: Fraction = Fraction(0)
    maximum_sum: Fraction = Fraction(0)
    averaged_batches: int = 0

    def observe(self, values: np.ndarray) -> None:
        batch = batch_extrema(values)
        self.extrema.fold(batch)
        if batch.minimum is None or batch.maximum is None:
            return
        self.minimum_sum += Fraction(batch.minimum)
        self.maximum_sum += Fraction(batch.maximum)
        self.averaged_batches += 1

    def merge(self, other: MovingAverageMinMaxObserver) -> None:
        self.extrema.merge(other.extrema)
        self.minimum_sum += other.minimum_sum
        self.maximum_sum += other.maximum_sum
        self.averaged_batches += other.averaged_batches

    @property
    def average_minimum(self) -> float | None:
        """The correctly rounded (float64) mean of the batch minima, None before a finite batch."""
        if self.averaged_batches == 0:
            return None
        return float(self.minimum_sum / self.averaged_batches)

    @property
    def average_maximum(self) -> float | None:
        """The correctly rounded (float64) mean of the batch maxima, None before a finite batch."""
        if self.averaged_batches == 0:
            return None
        return float(self.maximum_sum / self.averaged_batches)


@dataclass(slots=True)
class HistogramObserver:
    """Counts of values in `num_bins` equal bins over the fixed range [low, high] (int64, exact).

    Bin rule (what a value on an edge does): with `k = num_bins / (high - low)`, a value x goes to bin
    `clamp(floor((x - low) * k), 0, num_bins - 1)`, each step rounded to float32 (float64 when the
    width or k does not fit float32: a range spanning a float-min sentinel, or a subnormal width). So
    bin i holds [low + i·w, low + (i+1)·w) (w = (high - low) / num_bins) except that a value within
    rounding of an interior edge may land in the neighbouring bin, the top edge `high` falls in the last
    bin, and values outside [low, high] (including ±Inf) clip to the end bins. NaN is not counted. The
    bin is a pure function of the value, so counts are order-independent and merge by addition.
    float16/float64 inputs are converted to the compute type first. `high == low` (a constant tensor)
    puts every value in bin 0.

    `absolute=True` histograms |x| instead (low must then be 0): onnxruntime's symmetric Percentile.
    """

    low: float
    high: float
    num_bins: int
    absolute: bool = False
    counts: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        if self.num_bins < 1:
            raise ValueError(f"a histogram needs at least one bin, got {self.num_bins}")
        if not (math.isfinite(self.low) and math.isfinite(self.high)) or self.high < self.low:
            raise ValueError(
                f"histogram range must be finite with low <= high, got [{self.low}, {self.high}]"
            )
        if self.absolute and self.low != 0:
            raise ValueError(f"an absolute-value histogram starts at 0, got low={self.low}")
        self.counts = np.zeros(self.num_bins, dtype=np.int64)

    @property
    def edges(self) -> np.ndarray:
        """The num_bins + 1 bin edges (float64), as np.histogram's uniform edges."""
        return np.linspace(self.low, self.high, self.num_bins + 1)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def _compute_type(self) -> tuple[type[np.floating], float]:
        """(float type of the bin arithmetic, k): float32 unless the width or k overflows it."""
        span = self.high - self.low
        scale = 0.0 if span == 0 else self.num_bins / span
        float32_max = float(np.finfo(np.float32).max)
        if span > float32_max or scale > float32_max:
            return np.float64, scale
        return np.float32, scale

    def observe(self, values: np.ndarray) -> None:
        array = np.asarray(values)
        if not np.issubdtype(array.dtype, np.floating):
            raise TypeError(f"observers take float tensors, got {array.dtype}")
        flat = array.reshape(-1)
        if flat.size == 0:
            return
        compute, scale_value = self._compute_type()
        convert = flat.dtype != compute  # per chunk: no full-size copy of a float16 tensor
        scale = compute(scale_value)
        low = compute(self.low)
        zero = compute(0)
        last = compute(self.num_bins - 1)
        chunk = min(HISTOGRAM_CHUNK, flat.size)
        positions = np.empty(chunk, dtype=compute)
        indices = np.empty(chunk, dtype=np.intp)
        nan_count = 0
        # Values far outside the range may overflow to ±Inf, which clips to the end bin like them.
        with np.errstate(over="ignore", invalid="ignore"):
            for start in range(0, flat.size, chunk):
                part = flat[start : start + chunk]
                if convert:
                    part = part.astype(compute)
                position = positions[: part.size]
                index = indices[: part.size]
                if self.absolute:
                    np.abs(part, out=position)
                else:
                    np.subtract(part, low, out=position)
                np.multiply(position, scale, out=position)
                nans = int(np.count_nonzero(np.isnan(part)))
                if nans:
                    # fmax/fmin map NaN to the bound: NaN lands in bin 0 and is taken back out below.
                    np.fmax(position, zero, out=position)
                    np.fmin(position, last, out=position)
                    nan_count += nans
                else:
                    np.clip(position, zero, last, out=position)  # one pass; typed bounds keep the dtype
                index[...] = position  # truncation == floor on non-negative values
                self.counts += np.bincount(index, minlength=self.num_bins)
        self.counts[0] -= nan_count

    def merge(self, other: HistogramObserver) -> None:
        if (self.low, self.high, self.num_bins, self.absolute) != (
            other.low,
            other.high,
            other.num_bins,
            other.absolute,
        ):
            raise ValueError(
                "histograms merge only over the same bins: "
                f"[{self.low}, {self.high}]x{self.num_bins} vs [{other.low}, {other.high}]x{other.num_bins}"
            )
        self.counts += other.counts


def aligned_exponent(low: float, high: float, max_bins: int) -> int:
    """The smallest e such that [low, high] (low < high) spans at most `max_bins` bins of width 2**e.

    Monotone: a range containing another never needs a smaller e, so the e of a union is the largest e
    any part of it needed, and it only grows as data arrives.
    """
    exponent = math.frexp((high - low) / max_bins)[1]  # 2**(e-1) <= span / max_bins < 2**e: near the answer
    while aligned_bin(high, exponent) - aligned_bin(low, exponent) + 1 > max_bins:
        exponent += 1
    while aligned_bin(high, exponent - 1) - aligned_bin(low, exponent - 1) + 1 <= max_bins:
        exponent -= 1
    return exponent


@dataclass(slots=True)
class AlignedHistogramObserver(MinMaxObserver):
    """Exact min/max and counts (as MinMaxObserver) plus a histogram whose bins are aligned to powers of two.

    Bin k of width w = 2**exponent holds [k·w, (k+1)·w): a value x goes to bin floor(x / w), and dividing a
    float32 by a power of two is exact, so the bin is exact (no rounding near an edge). `exponent` is the
    smallest that fits [ordinary_minimum, ordinary_maximum] in at most `max_bins` bins (`aligned_exponent`);
    `counts[i]` is bin `first_bin + i`. When data widens the range, the exponent grows by d and bin k becomes
    bin floor(k / 2**d), which is what binning with the wider width directly gives. So the state is a
    function of the data's multiset alone: observing in any order and merging any split give bit-identical
    results, in one pass without knowing the range first.

    Ordinary values are the finite ones below HUGE_MAGNITUDE: only they are binned. A float-min mask would
    otherwise widen the bins to 2**116 and leave the real values one bin; huge values are counted per
    octave instead (`huge_counts`, float32 exponent layout) and stay in `minimum`/`maximum`, which keep
    MinMaxObserver's meaning (all finite values). `zero_count` counts exact zeros. With the bins these
    give the sentinel guard its per-octave view without a pass of its own (`MagnitudeObserver.from_aligned`).

    Resolution: the ordinary range spans between about max_bins / 2 and max_bins bins (exactly: the width
    is below 2·(ordinary_maximum - ordinary_minimum) / (max_bins - 1)). NaN and ±Inf are counted (as
    MinMaxObserver), never binned. An ordinary constant (ordinary_minimum == ordinary_maximum) has no
    exponent and no bins. float16 and float64 values are binned as their float32 values (float64 past
    float32's range counts as ±Inf), and the min/max are those float32 values too.
    """

    max_bins: int = 4097
    exponent: int | None = None
    first_bin: int = 0
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ordinary_minimum: float | None = None
    ordinary_maximum: float | None = None
    zero_count: int = 0
    huge_counts: np.ndarray | None = None  # counts per float32 bits >> 23 of |x| >= HUGE_MAGNITUDE

    def __post_init__(self) -> None:
        if self.max_bins < 2:
            raise ValueError(f"an aligned histogram needs at least 2 bins, got {self.max_bins}")

    @property
    def width(self) -> float | None:
        return None if self.exponent is None else math.ldexp(1.0, self.exponent)

    @property
    def edges(self) -> np.ndarray:
        """The len(counts) + 1 bin edges (float64, exact: k·2**exponent)."""
        if self.exponent is None:
            return np.zeros(0)
        bins = np.arange(self.first_bin, self.first_bin + self.counts.size + 1, dtype=np.float64)
        return np.ldexp(bins, self.exponent)

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @property
    def huge_count(self) -> int:
        return 0 if self.huge_counts is None else int(self.huge_counts.sum())

    @property
    def ordinary_count(self) -> int:
        return self.finite_count - self.huge_count

    def observe(self, values: np.ndarray) -> None:
        array = np.asarray(values)
        if not np.issubdtype(array.dtype, np.floating):
            raise TypeError(f"observers take float tensors, got {array.dtype}")
        if array.dtype == np.float64 or array.dtype.itemsize > 4:
            with np.errstate(over="ignore"):
                array = array.astype(np.float32)
        if self._observe_in_one_pass(array):
            return
        batch = batch_extrema(array)
        previous = self._snapshot()
        self.fold(batch)
        if batch.minimum is None or batch.maximum is None:
            return
        flat = array.reshape(-1)
        if batch.nan_count or batch.positive_inf_count or batch.negative_inf_count:
            flat = flat[np.isfinite(flat)]
        low, high = batch.minimum, batch.maximum
        if -low >= HUGE_MAGNITUDE or high >= HUGE_MAGNITUDE:  # only a batch holding a sentinel pays
            huge = np.abs(flat) >= HUGE_MAGNITUDE
            self._add_huge(exponent_field_counts(flat[huge]))
            flat = flat[~huge]
            if flat.size == 0:
                return
            low, high = float(flat.min()), float(flat.max())
        self._widen(low, high, previous)
        if self.exponent is None:  # still constant: nothing to bin
            self.zero_count += flat.size if low == 0 else 0
        else:
            self.zero_count += add_aligned_bin_counts(flat, self.exponent, self.first_bin, self.counts)

    def _observe_in_one_pass(self, array: np.ndarray) -> bool:
        """Once there are bins: count `array` at their exponent into a window around them, taking its extrema
        in the same pass (the values are read once, not twice), then fold it in as `observe` does. False,
        with nothing changed, when a value is not finite or lies outside the window, and without trying
        before the first bins, for an empty batch, or when the window reaches a huge value or is far wider
        than the batch; `observe` then reads the batch's extrema first.

        The window, bins last + 1 - max_bins to first + max_bins - 1 of the current ones, holds every batch
        after which the range still fits `max_bins` bins of this width; a batch that widens the exponent but
        lands in it is re-binned exactly (floor(floor(x / w) / 2**d) = floor(x / (w·2**d))).
        """
        if self.exponent is None or array.size == 0:
            return False
        exponent = self.exponent
        first = self.first_bin + self.counts.size - self.max_bins
        size = 2 * self.max_bins - self.counts.size
        if size > array.size + ONE_PASS_SPARE_BINS:
            return False
        # Every value in the window must be ordinary: a huge one is counted per octave, never binned.
        low_edge, high_edge = math.ldexp(first, exponent), math.ldexp(first + size, exponent)
        if low_edge <= -HUGE_MAGNITUDE or high_edge > HUGE_MAGNITUDE:
            return False
        window = np.zeros(size, dtype=np.int64)
        counted = add_aligned_bin_counts_and_extrema(array.reshape(-1), exponent, first, window)
        if counted is None:
            return False
        zeros, low, high = counted
        previous = self._snapshot()
        self.fold(BatchExtrema(low, high, array.size, 0, 0, 0))
        self._widen(low, high, previous)
        self.zero_count += zeros
        start, stop = aligned_bin(low, exponent) - first, aligned_bin(high, exponent) - first + 1
        self._add((exponent, first + start, window[start:stop], None, 0))
        return True

    def merge(self, other: MinMaxObserver) -> None:
        if not isinstance(other, AlignedHistogramObserver) or other.max_bins != self.max_bins:
            raise ValueError("aligned histograms merge only with aligned histograms of the same max_bins")
        previous = self._snapshot()
        MinMaxObserver.merge(self, other)
        self.zero_count += other.zero_count
        if other.huge_counts is not None:
            self._add_huge(other.huge_counts)
        self._widen(other.ordinary_minimum, other.ordinary_maximum, previous)
        # No bins: no ordinary value on either side, or both are the same constant (in ordinary_count).
        if self.exponent is not None:
            self._add(other._snapshot())

    # Internals: a snapshot is (exponent, first_bin, counts, constant value, its count), enough to re-bin.

    def _add_huge(self, counts: np.ndarray) -> None:
        if self.huge_counts is None:
            self.huge_counts = np.zeros(FLOAT32_EXPONENT_FIELDS, dtype=np.int64)
        self.huge_counts += counts

    def _widen(
        self,
        low: float | None,
        high: float | None,
        previous: tuple[int | None, int, np.ndarray, float | None, int],
    ) -> None:
        """Take [low, high] (None: no ordinary value) into the ordinary range and re-lay the bins for it,
        folding `previous` into them (`_rebin`)."""
        self.ordinary_minimum = _min_or_none(self.ordinary_minimum, low)
        self.ordinary_maximum = _max_or_none(self.ordinary_maximum, high)
        if self.ordinary_minimum is not None:
            self._rebin(previous)

    def _snapshot(self) -> tuple[int | None, int, np.ndarray, float | None, int]:
        return self.exponent, self.first_bin, self.counts, self.ordinary_minimum, self.ordinary_count

    def _rebin(self, previous: tuple[int | None, int, np.ndarray, float | None, int]) -> None:
        """Re-lay the bins for the current ordinary range, folding `previous` (the state before the range
        changed) into them; `previous`'s values are then counted here, nothing else is."""
        low, high = self.ordinary_minimum, self.ordinary_maximum
        assert low is not None and high is not None
        if low == high:
            return  # constant so far: no bins
        exponent = aligned_exponent(low, high, self.max_bins)
        first = aligned_bin(low, exponent)
        size = aligned_bin(high, exponent) - first + 1
        if (exponent, first, size) == (self.exponent, self.first_bin, self.counts.size):
            return
        self.exponent, self.first_bin = exponent, first
        self.counts = np.zeros(size, dtype=np.int64)
        self._add(previous)

    def _add(self, state: tuple[int | None, int, np.ndarray, float | None, int]) -> None:
        """Add another histogram state (coarser or equal exponent never occurs: ours is the union's)."""
        assert self.exponent is not None
        exponent, first, counts, constant, ordinary = state
        if exponent is None:
            if constant is not None and ordinary:
                self.counts[aligned_bin(constant, self.exponent) - self.first_bin] += ordinary
            return
        shift = self.exponent - exponent
        if shift < 0:
            raise AssertionError("an aligned histogram is never finer than a part of its data")
        if shift == 0:  # the same bins, only more of them (the usual growth after the first batch)
            offset = first - self.first_bin
            self.counts[offset : offset + counts.size] += counts
            return
        # Old bin k -> floor(k / 2**shift): an arithmetic right shift, non-decreasing in k.
        targets = (np.arange(first, first + counts.size, dtype=np.int64) >> shift) - self.first_bin
        starts = np.flatnonzero(np.diff(targets, prepend=-1))
        self.counts[targets[starts]] += np.add.reduceat(counts, starts)
