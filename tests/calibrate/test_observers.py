"""Observers: merging partial observers equals observing the union, bit for bit, whatever the split."""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Callable
from dataclasses import astuple, fields
from typing import Any

import numpy as np
import pytest

from qconvert.calibrate.observers import (
    HUGE_MAGNITUDE,
    AlignedHistogramObserver,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    batch_extrema,
)


def _batches(seed: int) -> list[np.ndarray]:
    """Batches of varied shapes and scales, some with NaN / ±Inf, one empty, one all-NaN."""
    rng = np.random.default_rng(seed)
    batches = []
    for index in range(int(rng.integers(5, 12))):
        shape = tuple(int(d) for d in rng.integers(1, 7, size=int(rng.integers(1, 4))))
        values = (rng.standard_normal(shape) * rng.uniform(0.1, 10) + rng.uniform(-3, 3)).astype(np.float32)
        if index % 3 == 1:
            flat = values.reshape(-1)
            flat[rng.integers(0, flat.size)] = rng.choice([np.nan, np.inf, -np.inf])
        batches.append(values)
    batches.append(np.zeros((0, 3), dtype=np.float32))
    batches.append(np.full((2, 2), np.nan, dtype=np.float32))
    return batches


def _observe_split(make: Callable[[], Any], batches: list[np.ndarray], seed: int) -> Any:
    """Deal the batches to 1..3 workers in a shuffled order, then merge the workers in a shuffled order."""
    rng = np.random.default_rng(seed + 1000)
    workers = [make() for _ in range(int(rng.integers(1, 4)))]
    for batch_index in rng.permutation(len(batches)):
        workers[int(rng.integers(0, len(workers)))].observe(batches[batch_index])
    order = rng.permutation(len(workers))
    merged = workers[order[0]]
    for worker_index in order[1:]:
        merged.merge(workers[worker_index])
    return merged


def _state(observer: object) -> tuple:
    """Every field, arrays as bytes, nested observers flattened, so equality means bit-identical."""
    values = []
    for item in fields(observer):  # type: ignore[arg-type]
        value = getattr(observer, item.name)
        if isinstance(value, np.ndarray):
            values.append((value.dtype.str, value.tobytes()))
        elif isinstance(value, MinMaxObserver):
            values.append(astuple(value))
        else:
            values.append(value)
    return tuple(values)


def _global_range(batches: list[np.ndarray]) -> tuple[float, float]:
    finite = np.concatenate([b.reshape(-1) for b in batches])
    finite = finite[np.isfinite(finite)]
    return float(finite.min()), float(finite.max())


@pytest.mark.parametrize("seed", range(8))
def test_minmax_merge_equals_union(seed: int) -> None:
    batches = _batches(seed)
    sequential = MinMaxObserver()
    for batch in batches:
        sequential.observe(batch)
    assert _state(_observe_split(MinMaxObserver, batches, seed)) == _state(sequential)
    everything = np.concatenate([b.reshape(-1) for b in batches])
    assert sequential.count == everything.size
    assert sequential.nan_count == int(np.isnan(everything).sum())
    assert sequential.positive_inf_count == int((everything == np.inf).sum())
    assert sequential.negative_inf_count == int((everything == -np.inf).sum())
    assert (sequential.minimum, sequential.maximum) == _global_range(batches)


@pytest.mark.parametrize("seed", range(8))
def test_moving_average_merge_equals_union(seed: int) -> None:
    batches = _batches(seed)
    sequential = MovingAverageMinMaxObserver()
    for batch in batches:
        sequential.observe(batch)
    merged = _observe_split(MovingAverageMinMaxObserver, batches, seed)
    assert _state(merged) == _state(sequential)
    assert (merged.average_minimum, merged.average_maximum) == (
        sequential.average_minimum,
        sequential.average_maximum,
    )
    # The mean over batches that have a finite value, as numpy's nanmean of the batch extremes (which
    # differs from the exact mean by float64 rounding only).
    minima = [batch_extrema(b).minimum for b in batches]
    expected = np.mean([m for m in minima if m is not None])
    assert merged.average_minimum == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("absolute", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_histogram_merge_equals_union(seed: int, absolute: bool) -> None:
    batches = _batches(seed)
    low, high = _global_range(batches)
    if absolute:
        low, high = 0.0, max(abs(low), abs(high))

    def make() -> HistogramObserver:
        return HistogramObserver(low, high, 257, absolute=absolute)

    sequential = make()
    for batch in batches:
        sequential.observe(batch)
    assert _state(_observe_split(make, batches, seed)) == _state(sequential)
    everything = np.concatenate([b.reshape(-1) for b in batches])
    assert sequential.total == int((~np.isnan(everything)).sum())  # ±Inf clip to the end bins


def test_histogram_agrees_with_numpy_away_from_edges() -> None:
    rng = np.random.default_rng(7)
    values = rng.standard_normal(200_000).astype(np.float32)
    low, high = float(values.min()), float(values.max())
    observer = HistogramObserver(low, high, 2048)
    observer.observe(values)
    edges = observer.edges
    width = edges[1] - edges[0]
    # Values more than 1e-3 bin widths from every edge land where np.histogram puts them.
    distance = np.abs(
        (values.astype(np.float64) - low) / width - np.rint((values.astype(np.float64) - low) / width)
    )
    clear = values[distance > 1e-3]
    expected, _ = np.histogram(clear, bins=edges)
    clear_observer = HistogramObserver(low, high, 2048)
    clear_observer.observe(clear)
    np.testing.assert_array_equal(clear_observer.counts, expected)
    assert observer.total == values.size


def test_histogram_edge_rule() -> None:
    # Exactly representable edges: a value on an interior edge goes to the bin on its right, `high` to the
    # last bin, out-of-range values and ±Inf to the end bins, NaN nowhere.
    observer = HistogramObserver(-4.0, 4.0, 8)
    observer.observe(np.array([-4.0, -1.0, 0.0, 3.0, 4.0, -9.0, 9.0, np.inf, -np.inf, np.nan], np.float32))
    np.testing.assert_array_equal(observer.counts, [3, 0, 0, 1, 1, 0, 0, 4])
    absolute = HistogramObserver(0.0, 4.0, 4, absolute=True)
    absolute.observe(np.array([-3.5, 3.5, -1.0, 0.0, -4.0], np.float16))
    np.testing.assert_array_equal(absolute.counts, [1, 1, 0, 3])


def test_histogram_constant_range_and_chunking() -> None:
    constant = HistogramObserver(2.5, 2.5, 16)
    constant.observe(np.full(100_000, 2.5, np.float32))  # several chunks
    assert constant.counts[0] == 100_000 and constant.total == 100_000
    big = np.random.default_rng(3).uniform(-1, 1, 100_003).astype(np.float32)
    whole = HistogramObserver(-1.0, 1.0, 64)
    whole.observe(big)
    pieces = HistogramObserver(-1.0, 1.0, 64)
    for part in np.array_split(big, 7):
        pieces.observe(part)
    np.testing.assert_array_equal(whole.counts, pieces.counts)


def test_histogram_of_float16_and_float64_is_that_of_their_float32_values() -> None:
    values = np.random.default_rng(4).standard_normal(70_000)  # more than two chunks
    for dtype in (np.float16, np.float64):
        typed = values.astype(dtype)
        direct = HistogramObserver(-3.0, 3.0, 100)
        direct.observe(typed)
        via_float32 = HistogramObserver(-3.0, 3.0, 100)
        via_float32.observe(typed.astype(np.float32))
        np.testing.assert_array_equal(direct.counts, via_float32.counts)
        assert direct.total == values.size


def test_histogram_over_a_float_min_sentinel_range_bins_every_value() -> None:
    # A range from -FLT_MAX to FLT_MAX (an unguarded float-min mask) is wider than float32 can hold:
    # x - low would overflow, so the arithmetic runs in float64 and positive values keep their bins.
    biggest = float(np.finfo(np.float32).max)
    observer = HistogramObserver(-biggest, biggest, 2048)
    values = np.array([-biggest, -1.0, 0.0, 1e37, 2e38, biggest], np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        observer.observe(values)
    width = 2 * biggest / 2048
    expected = np.floor((values.astype(np.float64) + biggest) / width).clip(0, 2047).astype(int)
    np.testing.assert_array_equal(np.nonzero(observer.counts)[0], np.unique(expected))
    assert observer.total == values.size


def test_histogram_refuses_mismatched_merge_and_bad_range() -> None:
    with pytest.raises(ValueError, match="same bins"):
        HistogramObserver(0.0, 1.0, 8).merge(HistogramObserver(0.0, 2.0, 8))
    with pytest.raises(ValueError, match="finite"):
        HistogramObserver(0.0, float("inf"), 8)
    with pytest.raises(ValueError, match="starts at 0"):
        HistogramObserver(-1.0, 1.0, 8, absolute=True)
    with pytest.raises(TypeError, match="float"):
        MinMaxObserver().observe(np.arange(3))


def test_minmax_all_nan_and_empty() -> None:
    observer = MinMaxObserver()
    observer.observe(np.full(4, np.nan, np.float32))
    observer.observe(np.zeros(0, np.float32))
    assert observer.minimum is None and observer.maximum is None
    assert (observer.count, observer.nan_count, observer.finite_count) == (4, 4, 0)
    moving = MovingAverageMinMaxObserver()
    moving.observe(np.full(4, np.inf, np.float32))
    assert moving.average_minimum is None and moving.extrema.positive_inf_count == 4


def test_observers_pickle() -> None:
    values = np.linspace(-2, 3, 1000, dtype=np.float32)
    observers = (
        MinMaxObserver(),
        MovingAverageMinMaxObserver(),
        HistogramObserver(-2.0, 3.0, 32),
        AlignedHistogramObserver(max_bins=33),
    )
    for observer in observers:
        observer.observe(values)
        assert _state(pickle.loads(pickle.dumps(observer))) == _state(observer)


# --- the power-of-two-aligned histogram ------------------------------------------------------------------


def _check_aligned(observer: AlignedHistogramObserver, values: np.ndarray) -> None:
    """The bins are np.histogram's of the ordinary values (finite, below HUGE_MAGNITUDE) over the
    observer's exact edges, and the exponent is the smallest that fits their [min, max] in max_bins bins
    (np.histogram's bins are [a, b) with exact edge comparisons; no value reaches the last edge, which lies
    above the maximum)."""
    finite = values[np.isfinite(values)].astype(np.float64)
    assert (observer.minimum, observer.maximum) == (finite.min(), finite.max())
    finite = finite[np.abs(finite) < HUGE_MAGNITUDE]
    assert (observer.ordinary_minimum, observer.ordinary_maximum) == (finite.min(), finite.max())
    assert observer.zero_count == np.count_nonzero(finite == 0)
    assert observer.exponent is not None
    edges = observer.edges
    assert edges[0] <= finite.min() and finite.max() < edges[-1]
    expected, _ = np.histogram(finite, bins=edges)
    np.testing.assert_array_equal(observer.counts, expected)
    assert observer.counts.size <= observer.max_bins and observer.counts[0] and observer.counts[-1]
    finer = 2.0 ** (observer.exponent - 1)
    assert np.floor(finite.max() / finer) - np.floor(finite.min() / finer) + 1 > observer.max_bins


@pytest.mark.parametrize("max_bins", [2, 257, 4097])
@pytest.mark.parametrize("seed", range(8))
def test_aligned_histogram_merge_equals_union(seed: int, max_bins: int) -> None:
    batches = _batches(seed)
    batches.insert(1, np.full(3, 0.25, np.float32))  # a constant start: no bins until the range opens

    def make() -> AlignedHistogramObserver:
        return AlignedHistogramObserver(max_bins=max_bins)

    sequential = make()
    for batch in batches:
        sequential.observe(batch)
    assert _state(_observe_split(make, batches, seed)) == _state(sequential)
    everything = np.concatenate([b.reshape(-1) for b in batches])
    _check_aligned(sequential, everything)
    assert sequential.total == sequential.finite_count == int(np.isfinite(everything).sum())


def test_aligned_histogram_from_a_constant_to_a_range_and_back_to_none() -> None:
    observer = AlignedHistogramObserver(max_bins=16)
    observer.observe(np.full(5, -1.5, np.float32))
    assert observer.exponent is None and observer.total == 0 and observer.finite_count == 5
    other = AlignedHistogramObserver(max_bins=16)
    other.observe(np.full(2, -1.5, np.float32))
    observer.merge(other)  # the same constant: still no bins
    assert observer.exponent is None and observer.finite_count == 7
    observer.observe(np.array([2.0, np.nan], np.float32))
    _check_aligned(observer, np.array([-1.5] * 7 + [2.0], np.float32))
    empty = AlignedHistogramObserver(max_bins=16)
    empty.observe(np.array([np.nan, np.inf], np.float32))
    empty.merge(AlignedHistogramObserver(max_bins=16))
    assert empty.minimum is None and empty.exponent is None and empty.positive_inf_count == 1
    with pytest.raises(ValueError, match="same max_bins"):
        observer.merge(AlignedHistogramObserver(max_bins=8))


def test_aligned_histogram_bins_tiny_and_huge_values_exactly() -> None:
    # Bins 2**85 wide: the smallest subnormals must still land on their side of zero (-1e-45 in bin -1,
    # not 0), so such widths are computed in float64.
    values = np.array([-1e29, -1e-45, 0.0, -0.0, 1e-45, 5.0, 1e27], np.float32)
    observer = AlignedHistogramObserver(max_bins=64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        observer.observe(values)
    _check_aligned(observer, values)
    assert observer.exponent is not None and observer.exponent > 80 and observer.huge_count == 0


def test_aligned_histogram_of_a_range_narrower_than_float32_can_scale() -> None:
    # Widths below 2**-126: 2**-e overflows float32, so the bins are computed in float64.
    for values in ([0.0, 1e-36], [0.0, 5e-45], [1e-38, 2e-38, 3e-38]):
        array = np.array(values, np.float32)
        observer = AlignedHistogramObserver(max_bins=4097)
        observer.observe(array)
        _check_aligned(observer, array)
        assert observer.exponent is not None and observer.exponent < -126


def test_signed_zero_extremes_do_not_depend_on_the_order() -> None:
    one, other = AlignedHistogramObserver(max_bins=16), AlignedHistogramObserver(max_bins=16)
    one.observe(np.array([-0.0, 1.0], np.float32))
    one.observe(np.array([0.0, 2.0], np.float32))
    other.observe(np.array([0.0, 2.0], np.float32))
    other.observe(np.array([-0.0, 1.0], np.float32))
    assert _state(one) == _state(other) and str(one.minimum) == "0.0"


def test_aligned_histogram_counts_huge_sentinels_apart_and_bins_the_rest() -> None:
    # A float-min mask (and float-max) would make the bins 2**117 wide: they are counted per octave
    # instead, stay in minimum/maximum, and the bins keep the ordinary values' resolution.
    biggest = float(np.finfo(np.float32).max)
    batches = [
        np.array([-biggest, -3.0, 0.0, 2.5], np.float32),
        np.array([-biggest, -biggest, 1e31, 1.25], np.float32),
        np.array([0.5, -0.75], np.float32),
    ]
    observer = AlignedHistogramObserver(max_bins=64)
    for batch in batches:
        observer.observe(batch)
    everything = np.concatenate(batches)
    _check_aligned(observer, everything)
    assert observer.exponent is not None and observer.exponent < -2
    assert observer.huge_count == 4 and observer.ordinary_count == 6 == observer.total
    huge = everything[np.abs(everything) >= HUGE_MAGNITUDE]
    expected = np.bincount(huge.view(np.uint32) >> 23, minlength=512)
    assert observer.huge_counts is not None
    np.testing.assert_array_equal(observer.huge_counts, expected)
    split = AlignedHistogramObserver(max_bins=64)
    split.observe(batches[2])
    rest = AlignedHistogramObserver(max_bins=64)
    rest.observe(batches[1])
    rest.observe(batches[0])
    split.merge(rest)
    assert _state(split) == _state(observer)
    only_huge = AlignedHistogramObserver(max_bins=64)
    only_huge.observe(np.array([-biggest], np.float32))
    assert only_huge.ordinary_minimum is None and only_huge.exponent is None and only_huge.huge_count == 1
    # A range one float32 step wide far from zero: bins of 2**-30 around 1000.
    close = np.array([1000.0, np.nextafter(np.float32(1000.0), np.float32(2000.0))], np.float32)
    narrow = AlignedHistogramObserver(max_bins=4097)
    narrow.observe(close)
    _check_aligned(narrow, close)


def test_aligned_histogram_of_float16_and_float64_is_that_of_their_float32_values() -> None:
    values = np.random.default_rng(4).standard_normal(70_000) * 3  # more than two chunks
    for dtype in (np.float16, np.float64):
        typed = values.astype(dtype)
        direct = AlignedHistogramObserver(max_bins=1001)
        direct.observe(typed)
        via_float32 = AlignedHistogramObserver(max_bins=1001)
        via_float32.observe(typed.astype(np.float32))
        assert _state(direct) == _state(via_float32)
        _check_aligned(direct, typed.astype(np.float32))
