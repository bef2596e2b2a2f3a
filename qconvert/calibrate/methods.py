"""Range methods: which observers each calibration method runs, per pass, and the range it computes.

Contract (what `collect`/`api` rely on; every method is a small dataclass of its options):
- `method.first_pass_observer()` -> a fresh observer for pass 1 (exact min/max statistics, and for the
  histogram methods an exact power-of-two-aligned histogram beside them);
- `method.second_pass_observer(first)` -> a fresh observer for pass 2 built from that tensor's merged
  pass-1 observer, or None when the tensor needs no second pass. Every method here is single-pass, so
  it is always None (the hook stays for methods that need one);
- `method.compute_range(first, second)` -> `ObservedRange` (float32 min/max, and std/avg for
  Distribution), or None when no finite value was observed; `second` is None when pass 2 was skipped.
`needs_second_pass` says whether pass 2 runs at all. The list-based adapters `passes`, `first_pass`,
`next_pass` and `range` (one observer per list, `TensorRange` out) serve `api.py`'s generic loop.

Why one pass suffices: onnxruntime's histograms grow their range with the data, so their bins (and its
results) depend on batch order and on how data is split. `AlignedHistogramObserver` bins at widths 2**e
with bin edges at multiples of 2**e: binning is exact, and widening the range merges neighbouring bins
exactly, so its histogram is a function of the data alone (merge == union, bit for bit) with no first
pass to fix its range. Each method then reads the layout it needs from those bins exactly (`AlignedBins`).

Methods (CLI names, `METHODS`), each reproducing onnxruntime's rule (reference §2.3) unless stated.
`num_bins` keeps its meaning (bins of a fixed-range histogram over the method's range); the aligned
histogram gets enough bins that its bins are never wider than those (`_max_bins`):
- minmax: finite min / max; `symmetric` gives ±max(|min|, |max|).
- moving-average: mean over batches of each batch's min and max (onnxruntime's `moving_average=True`,
  a plain mean; ours is the exact mean, onnxruntime's a float32 sum, so they can differ in the last bit).
- percentile (99.999, 2048 bins): asymmetric on value bins narrower than (max - min) / 2048 (onnxruntime:
  2048 bins over [-t, t], t = max|x|, up to twice as wide); `symmetric` on |x| bins narrower than
  t / 2048, as onnxruntime's. The range is clipped to [min, max] as onnxruntime does.
- entropy: onnxruntime's KL search (`entropy.py`) on bins symmetric around 0 (`entropy_layout`), at least
  num_bins / 4 per side, i.e. at most twice as wide as onnxruntime's 2048 bins over [-t, t]. Defaults
  2048 bins, 128 quantized bins: onnxruntime's default (128, 128) has one candidate, so it always
  returns min/max. Not onnxruntime's: a pick that would clip more than a tenth of the values (values
  clustered away from 0, where the KL windows are centred: a 0/1 mask, data of one sign) gives way to
  min/max, with a note.
- mse: the range minimising the expected squared quantization error for the target storage (`mse.py`),
  on value bins narrower than (max - min) / 2048.
- distribution: onnxruntime's Distribution (float8 e4m3fn): avg/std of the bin centres of value bins
  narrower than 2t / 2048 (2048 bins over [-t, t] in onnxruntime; at least 512); scenario "p3" takes
  signed cube roots first. The range is [-t, t], as onnxruntime reports it; finalize uses `std`. A tensor
  with no spread (constant, or one occupied bin) gets std = max|x| instead of onnxruntime's 0 / NaN /
  rounding noise.

A range the sentinel guard clipped (api.py hands `compute_range` pass 1's observer with its min/max
replaced) is read from the same bins, those outside folded into the end bins: as fine as the bins over
the ordinary range allow. Float-min style values (|x| >= 2**100) are never binned, so they cost the bins
no resolution; a -10000 padding cluster is binned, so the clipped bulk gets the bins of the whole range.
With `--sentinel off` (or a `quantize` override) those huge values still stay out of the bins: a histogram
method's range is then read from the other values and the huge ones saturate (minmax keeps them in).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any, ClassVar

import numpy as np

from qconvert.calibrate.entropy import entropy_threshold, uses_c_screen
from qconvert.calibrate.mse import mse_range
from qconvert.calibrate.observers import (
    AlignedHistogramObserver,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    aligned_bin,
)
from qconvert.calibrate.ranges import TensorRange
from qconvert.errors import InputError


@dataclass(frozen=True, slots=True)
class ObservedRange:
    """A method's result for one tensor: float32 bounds (held as Python floats), std/avg for Distribution."""

    min: float
    max: float
    std: float | None = None
    avg: float | None = None
    note: str | None = None  # where the method's rule gave way, and why


# What pass 1 observes for a tensor: exact extremes (every method but moving-average) or per-batch means.
FirstObserver = MinMaxObserver | MovingAverageMinMaxObserver
Bounds = tuple[float, float]


def _float32(value: float) -> float:
    return float(np.float32(value))


def _symmetric(low: float, high: float) -> tuple[float, float]:
    bound = max(abs(low), abs(high))
    return -bound, bound


class Method:
    """Base of every range method: the contract in the module docstring, plus `api.py`'s list adapters."""

    name: ClassVar[str]
    needs_second_pass: ClassVar[bool] = False
    # Whether `range` runs on every core at once (api.py): worth it where a range is a search spending its
    # time in code that releases the GIL (MSE's long numpy loops: two threads halved a BERT encoder's 159;
    # entropy's C screen: 0.19-0.26 s against 0.32-0.38 alone). Short numpy calls gain nothing.
    parallel_ranges: ClassVar[bool] = False

    def first_pass_observer(self) -> MinMaxObserver | MovingAverageMinMaxObserver:
        return MinMaxObserver()

    def second_pass_observer(self, first: FirstObserver) -> HistogramObserver | None:
        return None

    def compute_range(self, first: FirstObserver, second: HistogramObserver | None) -> ObservedRange | None:
        raise NotImplementedError

    # List adapters: one observer per pass, as api.py's generic loop hands them around.

    @property
    def passes(self) -> int:
        return 2 if self.needs_second_pass else 1

    def first_pass(self, tensor: str) -> list[Any]:
        return [self.first_pass_observer()]

    def next_pass(self, number: int, tensor: str, previous: list[Any]) -> list[Any]:
        if number != 1:
            raise ValueError(f"method {self.name!r} has no pass {number + 1}")
        second = self.second_pass_observer(previous[0])
        return [] if second is None else [second]

    def range(self, tensor: str, first: list[Any], final: list[Any]) -> TensorRange:
        """The `TensorRange` of `tensor` from its pass-1 observers and its last pass's observers."""
        histograms = [observer for observer in final if isinstance(observer, HistogramObserver)]
        second = histograms[0] if self.needs_second_pass and histograms else None
        result = self.compute_range(first[0], second)
        extrema = _extrema(first[0])
        if result is None:
            raise InputError(
                f"tensor '{tensor}': no finite value observed ({extrema.nan_count} NaN, "
                f"{extrema.positive_inf_count + extrema.negative_inf_count} Inf of {extrema.count} elements)"
            )
        return TensorRange(
            name=tensor,
            min=result.min,
            max=result.max,
            method=self.name,
            std=result.std,
            nan_count=extrema.nan_count,
            inf_count=extrema.positive_inf_count + extrema.negative_inf_count,
            note=result.note,
        )


def _extrema(first: FirstObserver) -> MinMaxObserver:
    return first.extrema if isinstance(first, MovingAverageMinMaxObserver) else first


def _finite_range(first: FirstObserver) -> Bounds | None:
    extrema = _extrema(first)
    if extrema.minimum is None or extrema.maximum is None:
        return None
    return extrema.minimum, extrema.maximum


@dataclass(frozen=True, slots=True)
class MinMaxMethod(Method):
    """onnxruntime's MinMax: the finite min and max (±max|x| when symmetric)."""

    name: ClassVar[str] = "minmax"
    symmetric: bool = False

    def compute_range(self, first: FirstObserver, second: HistogramObserver | None) -> ObservedRange | None:
        bounds = _finite_range(first)
        if bounds is None:
            return None
        low, high = _float32(bounds[0]), _float32(bounds[1])
        if self.symmetric:
            low, high = _symmetric(low, high)
        return ObservedRange(low, high)


@dataclass(frozen=True, slots=True)
class MovingAverageMethod(Method):
    """onnxruntime's MinMax with moving_average=True: mean of per-batch minima / maxima (exact mean)."""

    name: ClassVar[str] = "moving-average"
    symmetric: bool = False

    def first_pass_observer(self) -> MovingAverageMinMaxObserver:
        return MovingAverageMinMaxObserver()

    def compute_range(self, first: FirstObserver, second: HistogramObserver | None) -> ObservedRange | None:
        if not isinstance(first, MovingAverageMinMaxObserver):
            raise TypeError(f"moving-average needs a MovingAverageMinMaxObserver, got {type(first).__name__}")
        low, high = first.average_minimum, first.average_maximum
        if low is None or high is None:
            return None
        low, high = _float32(low), _float32(high)
        if self.symmetric:
            low, high = _symmetric(low, high)
        return ObservedRange(low, high)


@dataclass(frozen=True, slots=True)
class AlignedBins:
    """Counts of bins `first_bin ..` of width W = factor·2**exponent (bin k holds [k·W, (k+1)·W)), int64.

    Every edge is a multiple of the observer's 2**exponent, so merging its bins into these is exact."""

    counts: np.ndarray
    first_bin: int
    exponent: int
    factor: int = 1

    @property
    def edges(self) -> np.ndarray:
        """The len(counts) + 1 edges, exact (k·factor·2**exponent in float64)."""
        bins = np.arange(self.first_bin, self.first_bin + self.counts.size + 1, dtype=np.float64)
        return np.ldexp(bins * self.factor, self.exponent)

    def merged(self, factor: int) -> AlignedBins:
        """The same data in bins `factor` times wider (bin k -> floor(k / factor): zero stays an edge)."""
        if factor == 1:
            return self
        targets = np.arange(self.first_bin, self.first_bin + self.counts.size, dtype=np.int64) // factor
        counts = np.zeros(int(targets[-1] - targets[0]) + 1, dtype=np.int64)
        np.add.at(counts, targets - targets[0], self.counts)
        return AlignedBins(counts, int(targets[0]), self.exponent, self.factor * factor)

    def symmetric(self) -> AlignedBins:
        """The bins widened with empty ones to [-K·w, K·w) (K = as many as the farther side needs)."""
        last = self.first_bin + self.counts.size - 1
        half = max(-self.first_bin, last + 1, 1)
        counts = np.zeros(2 * half, dtype=np.int64)
        counts[self.first_bin + half : last + half + 1] = self.counts
        return AlignedBins(counts, -half, self.exponent, self.factor)

    def absolute(self) -> AlignedBins:
        """Counts of |x| from bin 0: value bins k >= 0 and -k-1 both hold |x| in [k·w, (k+1)·w] (the
        negative one with its upper edge closed instead of its lower one)."""
        bins = np.arange(self.first_bin, self.first_bin + self.counts.size, dtype=np.int64)
        targets = np.where(bins >= 0, bins, -bins - 1)
        counts = np.zeros(int(targets.max()) + 1, dtype=np.int64)
        np.add.at(counts, targets, self.counts)
        return AlignedBins(counts, 0, self.exponent, self.factor)


def aligned_bins(observer: AlignedHistogramObserver, bounds: Bounds) -> AlignedBins | None:
    """The observer's bins over `bounds` (its own [min, max], or the narrower range the sentinel guard
    clipped it to: bins outside fold into the end bins, as values outside a fixed range do), or None when
    there are no bins (no finite value, or a constant)."""
    if observer.exponent is None or bounds[0] >= bounds[1]:
        return None
    last = observer.first_bin + observer.counts.size - 1
    low = min(max(aligned_bin(bounds[0], observer.exponent), observer.first_bin), last)
    high = min(max(aligned_bin(bounds[1], observer.exponent), low), last)
    start, stop = low - observer.first_bin, high - observer.first_bin + 1
    counts = observer.counts[start:stop].copy()
    counts[0] += observer.counts[:start].sum()
    counts[-1] += observer.counts[stop:].sum()
    return AlignedBins(counts, low, observer.exponent)


class _HistogramMethod(Method):
    """A single-pass method on a power-of-two-aligned histogram (`AlignedHistogramObserver`).

    The histogram is exact and order-independent without a first pass for its range. `num_bins` is the
    resolution today's fixed-range histograms had (onnxruntime's meaning of it); the observer gets enough
    aligned bins (`_max_bins`) that its bins are never wider than those were, see each method.
    """

    num_bins: int
    # `num_bins` limits, each with its reason for the message. Below: bins wider than a step of int4's 16
    # levels cannot place a range within one step. Above: every calibrated tensor keeps 2·num_bins + 1 (or
    # 4·num_bins + 1) int64 counts in each worker, 1-2 MiB at 65536, already one bin per int16 level.
    min_num_bins: ClassVar[int] = 16
    min_reason: ClassVar[str] = "fewer bins than int4 has levels cannot resolve one quantization step"
    max_num_bins: ClassVar[int] = 65536
    max_reason: ClassVar[str] = (
        "each calibrated tensor keeps up to 4·num_bins + 1 int64 counts in every worker, 2 MiB at 65536, "
        "already finer than int16's 65536 levels"
    )

    def _check_num_bins(self) -> None:
        if self.num_bins < self.min_num_bins:
            raise ValueError(
                f"num_bins must be at least {self.min_num_bins} for {self.name} ({self.min_reason}), "
                f"got {self.num_bins}"
            )
        if self.num_bins > self.max_num_bins:
            raise ValueError(
                f"num_bins must be at most {self.max_num_bins} for {self.name} ({self.max_reason}), "
                f"got {self.num_bins}"
            )

    def _max_bins(self) -> int:
        # Aligned bins are narrower than 2·span / (max_bins - 1): with 2·num_bins + 1 they are narrower
        # than span / num_bins, the bins of a num_bins histogram over [min, max] (or wider ranges).
        return 2 * self.num_bins + 1

    def first_pass_observer(self) -> AlignedHistogramObserver:
        return AlignedHistogramObserver(max_bins=self._max_bins())

    def compute_range(self, first: FirstObserver, second: HistogramObserver | None) -> ObservedRange | None:
        bounds = _finite_range(first)
        if bounds is None:
            return None
        bins = aligned_bins(first, bounds) if isinstance(first, AlignedHistogramObserver) else None
        if bins is None or bins.counts.sum() == 0:
            return ObservedRange(_float32(bounds[0]), _float32(bounds[1]))
        return self._from_histogram(bounds, bins)

    def _from_histogram(self, bounds: Bounds, bins: AlignedBins) -> ObservedRange:
        raise NotImplementedError


def entropy_layout(bins: AlignedBins, num_bins: int) -> AlignedBins:
    """The symmetric [-K·W, K·W) layout onnxruntime's KL search takes (zero is the edge of bin K, as in its
    `num_bins` histogram over [-t, t]), from aligned bins exactly: K0 bins per side merged `factor` at a
    time, the largest factor that keeps K >= num_bins / 4 per side and W below 4t / num_bins, i.e. bins at
    most twice as wide as that histogram's 2t / num_bins (t = max|x|; 16x finer than onnxruntime's
    default of 128 bins). The search costs about K² operations: an integer factor lands K just above
    num_bins / 4 (powers of two left it anywhere up to num_bins / 2), about half the work."""
    layout = bins.symmetric()
    half = layout.counts.size // 2
    # (half - 1)·w < t: a factor of at most (half - 1) / quarter keeps W = factor·w below t / quarter.
    quarter = max(num_bins // 4, 1)
    return layout.merged(max(1, (half - 1) // quarter))


def _share_outside(bins: AlignedBins, low: float, high: float) -> float:
    """The share of the binned values in bins wholly outside [low, high]."""
    total = int(bins.counts.sum())
    outside = bins.counts[(bins.edges[1:] <= low) | (bins.edges[:-1] > high)].sum()
    return float(outside) / total if total else 0.0


def _absolute_maximum(bounds: Bounds) -> float:
    return max(abs(bounds[0]), abs(bounds[1]))


def percentile_range(
    counts: np.ndarray,
    edges: np.ndarray,
    minimum: float,
    maximum: float,
    percentile: float,
    symmetric: bool,
) -> tuple[float, float]:
    """onnxruntime's `compute_percentile` on one histogram: the edges where the CDF reaches the percentile.

    Symmetric (`counts` of |x|): ±edges[searchsorted(cdf, p/100)]; otherwise the edges at
    (100 - p)/200 and 1 - (100 - p)/200 of the CDF. Both clipped to [minimum, maximum].
    """
    if not 0 <= percentile <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {percentile}")
    counts = np.asarray(counts)
    cdf = np.cumsum(counts / counts.sum())
    if symmetric:
        bound = float(edges[np.searchsorted(cdf, percentile / 100.0)])
        low, high = -bound, bound
    else:
        tail = (100.0 - percentile) / 200.0
        low = float(edges[np.searchsorted(cdf, tail)])
        high = float(edges[np.searchsorted(cdf, 1.0 - tail)])
    return max(low, float(minimum)), min(high, float(maximum))


@dataclass(frozen=True, slots=True)
class PercentileMethod(_HistogramMethod):
    """onnxruntime's Percentile (default 99.999 %, 2048 bins; asymmetric as quantize_static's default)."""

    name: ClassVar[str] = "percentile"
    percentile: float = 99.999
    symmetric: bool = False
    num_bins: int = 2048

    def __post_init__(self) -> None:
        self._check_num_bins()
        if not 0 <= self.percentile <= 100:
            raise ValueError(f"percentile must be in [0, 100], got {self.percentile}")

    def _max_bins(self) -> int:
        # Symmetric: the |x| bins must be narrower than max|x| / num_bins, and the value range is up to
        # 2·max|x| wide, so twice the value bins of the asymmetric case.
        return 4 * self.num_bins + 1 if self.symmetric else 2 * self.num_bins + 1

    def _from_histogram(self, bounds: Bounds, bins: AlignedBins) -> ObservedRange:
        if self.symmetric:
            bins = bins.absolute()
        low, high = percentile_range(
            bins.counts, bins.edges, bounds[0], bounds[1], self.percentile, self.symmetric
        )
        return ObservedRange(_float32(low), _float32(high))


@dataclass(frozen=True, slots=True)
class EntropyMethod(_HistogramMethod):
    """onnxruntime's Entropy (TensorRT KL search) with defaults that search: 2048 bins, 128 quantized."""

    name: ClassVar[str] = "entropy"
    parallel_ranges: ClassVar[bool] = uses_c_screen()  # the numpy screen is short calls
    num_bins: int = 2048
    num_quantized_bins: int = 128
    # The KL search costs about num_bins² per tensor once its screen cannot prune (past ~512·Q bins, or at
    # any size for few quantized bins): measured per tensor of 200k normal values, 0.5 s at 16384 bins with
    # 3 quantized bins, 2.2 s at 32768; 2.1 s at 65536 with the default 128 (110 s on tiny_encoder).
    max_num_bins: ClassVar[int] = 16384
    max_reason: ClassVar[str] = (
        "the KL search costs about num_bins² per tensor: 2 s per tensor at 65536 bins, 110 s on tiny_encoder"
    )

    def __post_init__(self) -> None:
        self._check_num_bins()
        if not 1 <= self.num_quantized_bins // 2 < self.num_bins // 2:
            raise ValueError(
                f"entropy needs 2 <= num_quantized_bins < num_bins to have more than one candidate, "
                f"got {self.num_quantized_bins} quantized bins for {self.num_bins} bins"
            )

    def _from_histogram(self, bounds: Bounds, bins: AlignedBins) -> ObservedRange:
        layout = entropy_layout(bins, self.num_bins)
        if layout.counts.size // 2 < self.num_quantized_bins // 2:
            # Fewer bins per side than the narrowest window needs: only a sentinel-clipped range inside
            # very wide bins gets here; its clipped min/max is all the histogram can tell.
            return ObservedRange(_float32(bounds[0]), _float32(bounds[1]))
        low, high = entropy_threshold(
            layout.counts, layout.edges, bounds[0], bounds[1], self.num_quantized_bins
        )
        # The KL windows are centred on 0: values clustered away from it (all of one sign, a 0/1 mask's
        # ones) leave narrow windows holding only folded outliers, whose KL is ~0 (onnxruntime's search
        # picks those too). Ordinary picks clip at most a few percent (3% on a ReLU output with 95%
        # zeros); one clipping more than a tenth of the values: min/max instead, said in a note.
        outside = _share_outside(layout, low, high)
        if outside > 0.1:
            note = (
                f"entropy's pick [{low:.6g}, {high:.6g}] would clip {outside:.1%} of the values (its KL "
                f"windows are centred on 0, and these values cluster away from it): min/max instead"
            )
            return ObservedRange(_float32(bounds[0]), _float32(bounds[1]), note=note)
        return ObservedRange(_float32(low), _float32(high))


@dataclass(frozen=True, slots=True)
class MseMethod(_HistogramMethod):
    """The range with the least expected squared quantize-dequantize error for `quant_type` (see mse.py)."""

    name: ClassVar[str] = "mse"
    parallel_ranges: ClassVar[bool] = True
    quant_type: str = "int8"
    symmetric: bool = False
    reduce_range: bool = False
    num_bins: int = 2048

    def __post_init__(self) -> None:
        self._check_num_bins()

    def _from_histogram(self, bounds: Bounds, bins: AlignedBins) -> ObservedRange:
        low, high = mse_range(
            bins.counts, bins.edges, self.quant_type, symmetric=self.symmetric, reduce_range=self.reduce_range
        )
        # The outer edges may lie up to one bin past the data: never report more than [min, max] ∪ {0}.
        low, high = max(low, min(bounds[0], 0.0)), min(high, max(bounds[1], 0.0))
        return ObservedRange(_float32(low), _float32(high))


def histogram_avg_std(counts: np.ndarray, edges: np.ndarray, scenario: str = "same") -> tuple[float, float]:
    """onnxruntime's `_avg_std`: count-weighted mean and standard deviation of the bin centres.

    Scenario "p3" first maps each centre c to sign(c)·|c|^(1/3). Centres and their squares are computed
    in the edges' dtype, the sums in float64 (int64 counts times float), as onnxruntime does; except
    that halves are added (equal to halving the sum, without its overflow near the float max) and
    squares that would overflow are taken in float64.
    """
    counts = np.asarray(counts)
    edges = np.asarray(edges)
    centres = edges[:-1] * 0.5 + edges[1:] * 0.5
    if scenario == "p3":
        centres = np.abs(centres) ** (1.0 / 3.0) * np.where(centres < 0, -1, 1).astype(centres.dtype)
    elif scenario != "same":
        raise ValueError(f"scenario must be 'same' or 'p3', got {scenario!r}")
    largest = float(np.abs(centres).max()) if centres.size else 0.0
    squares_fit = largest < math.sqrt(float(np.finfo(centres.dtype).max))
    squares = centres**2 if squares_fit else centres.astype(np.float64) ** 2
    total = counts.sum()
    avg = (counts * centres).sum() / total
    std = ((counts * squares).sum() / total - avg**2) ** 0.5
    return float(avg), float(std)


@dataclass(frozen=True, slots=True)
class DistributionMethod(_HistogramMethod):
    """onnxruntime's Distribution (float8 e4m3fn scales from `std`), 2048 bins, scenario same | p3."""

    name: ClassVar[str] = "distribution"
    num_bins: int = 2048
    scenario: str = "same"
    min_num_bins: ClassVar[int] = 512
    min_reason: ClassVar[str] = "its std comes from the bin centres, which fewer bins make too coarse"

    def __post_init__(self) -> None:
        self._check_num_bins()
        if self.scenario not in ("same", "p3"):
            raise ValueError(f"scenario must be 'same' or 'p3', got {self.scenario!r}")

    def compute_range(self, first: FirstObserver, second: HistogramObserver | None) -> ObservedRange | None:
        result = super(DistributionMethod, self).compute_range(first, second)
        if result is None or result.std is not None:
            return result
        # A constant tensor (no histogram): no spread to measure, see `_spread_fallback`.
        value = result.max
        if self.scenario == "p3":
            value = math.copysign(abs(value) ** (1 / 3), value)
        bounds = (result.min, result.max)
        return ObservedRange(result.min, result.max, std=_spread_fallback(bounds), avg=_float32(value))

    def _from_histogram(self, bounds: Bounds, bins: AlignedBins) -> ObservedRange:
        avg, std = histogram_avg_std(bins.counts, bins.edges.astype(np.float32), self.scenario)
        # One occupied bin has no measurable spread: onnxruntime's E[c²] - E[c]² then returns rounding
        # noise (or NaN), which would make the float8 scale arbitrary.
        if np.count_nonzero(bins.counts) < 2 or not std > 0:
            std = _spread_fallback(bounds)
        low, high = _symmetric(_float32(bounds[0]), _float32(bounds[1]))  # onnxruntime reports [-t, t]
        return ObservedRange(low, high, std=_float32(std), avg=_float32(avg))


def _spread_fallback(bounds: Bounds) -> float:
    """The std used when the data shows no spread: max|x| (1.0 for all zeros).

    float8 scales are `std / std(e4m3fn)`, so a zero std would be a zero scale (onnxruntime produces
    one, or NaN, for such a tensor). max|x| puts the values at about ±std(e4m3fn) ≈ ±100 on the float8
    grid, well inside its range.
    """
    bound = _absolute_maximum(bounds)
    return _float32(bound) if bound else 1.0


METHODS: dict[str, type[Method]] = {
    method.name: method
    for method in (
        MinMaxMethod,
        MovingAverageMethod,
        PercentileMethod,
        EntropyMethod,
        MseMethod,
        DistributionMethod,
    )
}


def method_options(name: str) -> tuple[str, ...]:
    """The option names `make_method(name, ...)` accepts (the method's dataclass fields)."""
    method = _method_class(name)
    return tuple(item.name for item in fields(method)) if is_dataclass(method) else ()


def make_method(name: str, **options: object) -> Method:
    """The method registered as `name` (a CLI name) with `options`; ValueError names what is wrong."""
    accepted = method_options(name)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"method '{name}' has no option {', '.join(unknown)} (options: {', '.join(accepted) or 'none'})"
        )
    method = _method_class(name)
    for item in fields(method) if is_dataclass(method) else ():
        if item.name in options and item.default is not MISSING:
            _check_option_type(name, item.name, options[item.name], item.default)
    return method(**options)


def _check_option_type(method: str, option: str, value: object, default: object) -> None:
    """ValueError unless `value` has the kind of the option's default: a bool, an integer, a number, a str."""
    kinds: list[tuple[type, tuple[type, ...], str]] = [
        (bool, (bool, np.bool_), "true or false"),
        (int, (numbers.Integral,), "an integer"),
        (float, (numbers.Real,), "a number"),
        (str, (str,), "a string"),
    ]
    for default_type, accepted, wanted in kinds:
        if isinstance(default, default_type):
            # bool is an int: only a bool option takes True/False.
            wrong_bool = isinstance(value, bool) and default_type is not bool
            if wrong_bool or not isinstance(value, accepted):
                got = f"{type(value).__name__} {value!r}"
                raise ValueError(f"method '{method}' option {option} must be {wanted}, got {got}")
            return


def _method_class(name: str) -> type[Method]:
    if name not in METHODS:
        raise ValueError(f"unknown calibration method '{name}' (expected one of {', '.join(METHODS)})")
    return METHODS[name]
