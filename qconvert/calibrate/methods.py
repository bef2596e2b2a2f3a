"""Range methods: which observers each calibration method runs, per pass, and the range it computes.

Contract (what `collect`/`api` rely on; every method is a small dataclass of its options):
- `method.first_pass_observer()` -> a fresh observer for pass 1 (exact min/max statistics);
- `method.second_pass_observer(first)` -> a fresh observer for pass 2 built from that tensor's merged
  pass-1 observer (a histogram over the range pass 1 saw), or None when the tensor needs no second
  pass (the method is single-pass, or the tensor is constant or had no finite value);
- `method.compute_range(first, second)` -> `ObservedRange` (float32 min/max, and std/avg for
  Distribution), or None when no finite value was observed; `second` is None when pass 2 was skipped.
`needs_second_pass` says whether pass 2 runs at all. The list-based adapters `passes`, `first_pass`,
`next_pass` and `range` (one observer per list, `TensorRange` out) serve `api.py`'s generic loop.

Why two passes: a histogram whose range is fixed before it sees data is exact, merges by addition and
does not depend on batch order, unlike onnxruntime's, whose range grows with the data it sees (so its
result depends on batch order and on how data is split into `collect_data` calls).

Methods (CLI names, `METHODS`), each reproducing onnxruntime's rule (reference §2.3) unless stated:
- minmax: finite min / max; `symmetric` gives ±max(|min|, |max|).
- moving-average: mean over batches of each batch's min and max (onnxruntime's `moving_average=True`,
  a plain mean; ours is the exact mean, onnxruntime's a float32 sum, so they can differ in the last bit).
- percentile (99.999, 2048 bins): asymmetric uses a value histogram over [min, max] (onnxruntime:
  [-t, t], t = max|x|, i.e. up to half the resolution); `symmetric` an |x| histogram over [0, t], as
  onnxruntime. The range is clipped to [min, max] as onnxruntime does.
- entropy: onnxruntime's KL search (`entropy.py`) on a value histogram over [-t, t]. Defaults 2048 bins,
  128 quantized bins: onnxruntime's default (128, 128) has one candidate, so it always returns min/max.
- mse: the range minimising the expected squared quantization error for the target storage (`mse.py`).
- distribution: onnxruntime's Distribution (float8 e4m3fn): avg/std of the bin centres of a value
  histogram over [-t, t] (2048 bins, at least 512); scenario "p3" takes signed cube roots first. The range
  is the histogram's [-t, t], as onnxruntime reports it; finalize uses `std`. A tensor with no spread
  (constant, or one occupied bin) gets std = max|x| instead of onnxruntime's 0 / NaN / rounding noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, ClassVar

import numpy as np

from qconvert.calibrate.entropy import entropy_threshold
from qconvert.calibrate.mse import mse_range
from qconvert.calibrate.observers import HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver
from qconvert.calibrate.ranges import TensorRange
from qconvert.errors import InputError


@dataclass(frozen=True, slots=True)
class ObservedRange:
    """A method's result for one tensor: float32 bounds (held as Python floats), std/avg for Distribution."""

    min: float
    max: float
    std: float | None = None
    avg: float | None = None


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


class _HistogramMethod(Method):
    """A method whose second pass is a histogram over a range fixed by pass 1."""

    needs_second_pass: ClassVar[bool] = True
    num_bins: int

    def _histogram_range(self, bounds: Bounds) -> tuple[float, float, bool]:
        """(low, high, absolute) of the second-pass histogram; the default is onnxruntime's [-t, t]."""
        bound = _absolute_maximum(bounds)
        return -bound, bound, False

    def second_pass_observer(self, first: FirstObserver) -> HistogramObserver | None:
        bounds = _finite_range(first)
        if bounds is None or bounds[0] == bounds[1]:
            return None  # nothing to histogram: no finite value, or one constant
        low, high, absolute = self._histogram_range(bounds)
        return HistogramObserver(low, high, self.num_bins, absolute=absolute)

    def compute_range(self, first: FirstObserver, second: HistogramObserver | None) -> ObservedRange | None:
        bounds = _finite_range(first)
        if bounds is None:
            return None
        if second is None or second.total == 0:
            return ObservedRange(_float32(bounds[0]), _float32(bounds[1]))
        return self._from_histogram(bounds, second)

    def _from_histogram(self, bounds: Bounds, second: HistogramObserver) -> ObservedRange:
        raise NotImplementedError


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
        if not 0 <= self.percentile <= 100:
            raise ValueError(f"percentile must be in [0, 100], got {self.percentile}")

    def _histogram_range(self, bounds: Bounds) -> tuple[float, float, bool]:
        if self.symmetric:
            return 0.0, _absolute_maximum(bounds), True
        return bounds[0], bounds[1], False

    def _from_histogram(self, bounds: Bounds, second: HistogramObserver) -> ObservedRange:
        low, high = percentile_range(
            second.counts, second.edges, bounds[0], bounds[1], self.percentile, self.symmetric
        )
        return ObservedRange(_float32(low), _float32(high))


@dataclass(frozen=True, slots=True)
class EntropyMethod(_HistogramMethod):
    """onnxruntime's Entropy (TensorRT KL search) with defaults that search: 2048 bins, 128 quantized."""

    name: ClassVar[str] = "entropy"
    num_bins: int = 2048
    num_quantized_bins: int = 128

    def __post_init__(self) -> None:
        if not 1 <= self.num_quantized_bins // 2 < self.num_bins // 2:
            raise ValueError(
                f"entropy needs 2 <= num_quantized_bins < num_bins to have more than one candidate, "
                f"got {self.num_quantized_bins} quantized bins for {self.num_bins} bins"
            )

    def _from_histogram(self, bounds: Bounds, second: HistogramObserver) -> ObservedRange:
        low, high = entropy_threshold(
            second.counts, second.edges, bounds[0], bounds[1], self.num_quantized_bins
        )
        return ObservedRange(_float32(low), _float32(high))


@dataclass(frozen=True, slots=True)
class MseMethod(_HistogramMethod):
    """The range with the least expected squared quantize-dequantize error for `quant_type` (see mse.py)."""

    name: ClassVar[str] = "mse"
    quant_type: str = "int8"
    symmetric: bool = False
    reduce_range: bool = False
    num_bins: int = 2048

    def _histogram_range(self, bounds: Bounds) -> tuple[float, float, bool]:
        return bounds[0], bounds[1], False

    def _from_histogram(self, bounds: Bounds, second: HistogramObserver) -> ObservedRange:
        low, high = mse_range(
            second.counts,
            second.edges,
            self.quant_type,
            symmetric=self.symmetric,
            reduce_range=self.reduce_range,
        )
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

    def __post_init__(self) -> None:
        if self.num_bins < 512:
            raise ValueError(f"distribution needs at least 512 bins, got {self.num_bins}")
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

    def _from_histogram(self, bounds: Bounds, second: HistogramObserver) -> ObservedRange:
        avg, std = histogram_avg_std(second.counts, second.edges.astype(np.float32), self.scenario)
        # One occupied bin has no measurable spread: onnxruntime's E[c²] - E[c]² then returns rounding
        # noise (or NaN), which would make the float8 scale arbitrary.
        if np.count_nonzero(second.counts) < 2 or not std > 0:
            std = _spread_fallback(bounds)
        low, high = _float32(second.low), _float32(second.high)
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
    return _method_class(name)(**options)


def _method_class(name: str) -> type[Method]:
    if name not in METHODS:
        raise ValueError(f"unknown calibration method '{name}' (expected one of {', '.join(METHODS)})")
    return METHODS[name]
