"""MSE range search: the range whose quantize-dequantize round trip loses the least, on a histogram.

NOTE: the error of a candidate range is measured, not modelled: its scale and zero point come from
finalize's rule (`activation_params`'s [qmin, qmax] and onnxruntime's `compute_scale_zp`, as
`numerics.calibration.compute_scales_zero_points` for all of a step's candidates at once), and each
non-empty bin's centre goes through `numerics.quantize`/`dequantize` (onnxruntime's QuantizeLinear /
DequantizeLinear arithmetic), weighted by its count. So the error includes clipping (values past the
range saturate), rounding, and the zero point's rounding, exactly as the deployed model sees them; the
one approximation is that a bin's values are represented by its centre (bins are 1/2048 of the range,
much finer than a quantization step at 8 bits). Candidates of one search step run as one per-axis
quantize call (axis 0 = candidate).

Search, over ranges that contain zero (finalize widens any range to contain zero anyway), with
`[lo, hi] = [min(min, 0), max(max, 0)]`, in fractions f of those ends. A 1-D search tries f = 1/32 ..
32/32 (and the current f), then f ± 1/32 around the best in steps of 1/512: 66 candidates, resolution
1/512 of the observed range (scales and zero points of a step's candidates are computed together).
- symmetric: `±f·max(|lo|, |hi|)`;
- asymmetric: first `[f·lo, f·hi]` (shrink both ends together), then coordinate descent from the best:
  the high end `f·hi` for the current low end, then the low end `f·lo` for that high end, until neither
  moves (at most 8 rounds). Every search includes the current range, so the error never rises and the
  result is never worse than min/max (f = 1).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from qconvert.numerics import UniformParams, dequantize, quantize
from qconvert.numerics.calibration import (
    FLOAT8,
    STORAGE_DTYPES,
    compute_scales_zero_points,
    full_range,
    qmin_qmax,
)

COARSE_STEPS = 32
FINE_STEPS = 16  # per coarse step, on each side of the coarse best
_MAX_ROUNDS = 8
RangeOf = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def mse_range(
    counts: np.ndarray,
    edges: np.ndarray,
    quant_type: str = "int8",
    *,
    symmetric: bool = False,
    reduce_range: bool = False,
) -> tuple[float, float]:
    """The (low, high) with the least expected squared error for `quant_type`, searched as described above."""
    if quant_type == FLOAT8:
        raise ValueError("mse searches integer storage ranges; float8e4m3fn scales come from 'distribution'")
    counts = np.asarray(counts)
    edges = np.asarray(edges, dtype=np.float64)
    occupied = counts > 0
    centres = ((edges[:-1] + edges[1:]) * 0.5)[occupied]
    weights = counts[occupied].astype(np.float64)
    lowest, highest = min(float(edges[0]), 0.0), max(float(edges[-1]), 0.0)
    if centres.size == 0 or lowest == highest:
        return lowest, highest
    search = _Search(centres, weights, quant_type, symmetric, reduce_range)
    if symmetric:
        bound = max(-lowest, highest)
        best = search.fraction(lambda f: (-bound * f, bound * f), 1.0)
        return -bound * best, bound * best
    # Zero lies in every candidate: a side with no values (lowest or highest 0) stays at zero.
    shrink = search.fraction(lambda f: (lowest * f, highest * f), 1.0)
    low_fraction = high_fraction = shrink
    for _ in range(_MAX_ROUNDS):
        low = lowest * low_fraction
        new_high = search.fraction(lambda f, low=low: (np.full(f.size, low), highest * f), high_fraction)
        high = highest * new_high
        new_low = search.fraction(lambda f, high=high: (lowest * f, np.full(f.size, high)), low_fraction)
        if (new_low, new_high) == (low_fraction, high_fraction):
            break
        low_fraction, high_fraction = new_low, new_high
    return lowest * low_fraction, highest * high_fraction


class _Search:
    """Evaluates candidate ranges on one histogram (bin centres and counts)."""

    def __init__(
        self, centres: np.ndarray, weights: np.ndarray, quant_type: str, symmetric: bool, reduce_range: bool
    ) -> None:
        self.centres = centres.astype(np.float32)
        self.weights = weights
        self.quant_type = quant_type
        self.symmetric = symmetric
        self.storage_min, self.storage_max = full_range(quant_type)
        # activation_params's [qmin, qmax], for compute_scales_zero_points (its rule, all candidates at once).
        self.scale_range = qmin_qmax(quant_type, reduce_range=reduce_range, symmetric=symmetric)

    def errors(self, lows: np.ndarray, highs: np.ndarray) -> np.ndarray:
        """Sum over bins of count · (centre - dequantize(quantize(centre)))², one per candidate range."""
        scales, zero_points = compute_scales_zero_points(lows, highs, *self.scale_range, self.symmetric)
        params = UniformParams(
            scale=scales.astype(np.float64),
            zero_point=zero_points,
            storage_dtype=STORAGE_DTYPES[self.quant_type],
            storage_type_min=self.storage_min,
            storage_type_max=self.storage_max,
            quantized_dimension=0,
        )
        values = np.broadcast_to(self.centres, (scales.size, self.centres.size))
        restored = dequantize(quantize(values, params), params)
        difference = restored.astype(np.float64) - values
        return (difference * difference) @ self.weights

    def fraction(self, range_of: RangeOf, current: float) -> float:
        """The fraction f in (0, 1] whose range `range_of(f)` has the least error: coarse grid, then fine.

        `current` is always a candidate; on ties the first candidate wins.
        """
        coarse = np.append(np.arange(1, COARSE_STEPS + 1) / COARSE_STEPS, current)
        best = self._best(coarse, range_of)
        step = 1.0 / (COARSE_STEPS * FINE_STEPS)
        fine = best + np.arange(-FINE_STEPS, FINE_STEPS + 1) * step
        fine = np.append(fine[(fine > 0) & (fine <= 1)], best)
        return self._best(fine, range_of)

    def _best(self, fractions: np.ndarray, range_of: RangeOf) -> float:
        return float(fractions[int(np.argmin(self.errors(*range_of(fractions))))])
