"""The C counting loops (`_counting.c`) give the numpy loops' counts bin for bin (calibrate/counting.py).

Each case counts the same values twice, with the C extension and with `_counting` set to None (the numpy
loops that define the result), and compares every bin and the zero count. The cases aim at the edges of
the C arithmetic: values just below a bin edge far from the first bin (where `y - first` rounds up), tiny
negative values next to zero, subnormals, -0.0, bins far from zero, exponents outside float32's exact
range, and the ends of the bins. The one-pass loop (bins and extrema together, into a window around the
bins) is checked the same way, and an observer taking it must end in the state the two passes leave, bit
for bit. Without the extension the tests skip (and fail under CI's QCONVERT_REQUIRE_ENGINES=1, where the
package is built with a compiler).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import struct
import threading
import time
from pathlib import Path
from types import ModuleType
from unittest import mock

import numpy as np
import pytest
from conftest import require_module
from hypothesis import given, settings
from hypothesis import strategies as st

from qconvert.calibrate import counting
from qconvert.calibrate.observers import (
    HUGE_MAGNITUDE,
    AlignedHistogramObserver,
    aligned_bin,
    aligned_exponent,
)


@pytest.fixture(scope="module")
def c_counting() -> ModuleType:
    return require_module("qconvert.calibrate._counting")


def numpy_loops() -> contextlib.AbstractContextManager[object]:
    """The numpy counting loops, as an install without a C compiler runs them."""
    return mock.patch.object(counting, "_counting", None)


def numpy_counts(values: np.ndarray, exponent: int, first_bin: int, size: int) -> tuple[np.ndarray, int]:
    counts = np.zeros(size, dtype=np.int64)
    with numpy_loops():
        zeros = counting.add_aligned_bin_counts(values, exponent, first_bin, counts)
    return counts, zeros


def aligned_layout(values: np.ndarray, max_bins: int = 4097) -> tuple[int, int, int]:
    """(exponent, first bin, number of bins) of an aligned histogram over `values`' range."""
    low, high = float(values.min()), float(values.max())
    exponent = aligned_exponent(low, high, max_bins)
    first = aligned_bin(low, exponent)
    return exponent, first, aligned_bin(high, exponent) - first + 1


def both_counts(values: np.ndarray, max_bins: int = 4097) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(C counts, numpy counts, C zeros, numpy zeros) over the aligned bins of `values`' range."""
    exponent, first, size = aligned_layout(values, max_bins)
    expected, expected_zeros = numpy_counts(values, exponent, first, size)
    counts = np.zeros(size, dtype=np.int64)
    zeros = counting.add_aligned_bin_counts(values, exponent, first, counts)
    return counts, expected, zeros, expected_zeros


def assert_same(values: np.ndarray, max_bins: int = 4097) -> None:
    counts, expected, zeros, expected_zeros = both_counts(np.asarray(values, dtype=np.float32), max_bins)
    assert zeros == expected_zeros
    np.testing.assert_array_equal(counts, expected)
    assert counts.sum() == values.size


def test_the_extension_is_what_runs_and_is_built_from_the_current_source(c_counting: ModuleType) -> None:
    assert counting.uses_c_loops()
    source = Path(counting.__file__).with_name("_counting.c")
    built = Path(c_counting.__file__)
    if source.exists():  # an editable install builds once: a later edit needs `pip install -e . --no-deps`
        assert built.stat().st_mtime >= source.stat().st_mtime, f"{built.name} is older than {source.name}"


EDGE_VALUES = [
    # bulk near zero with tiny values of both signs: floor(-tiny / w) is bin -1, not bin 0
    np.concatenate([np.linspace(-3, 5, 4001), [-1e-30, 1e-30, -1e-45, 1e-45, -0.0, 0.0, 0.0]]),
    # away from zero (the first bin is 4095): values one float32 step below each bin edge
    np.nextafter(np.float32(1024) + np.arange(4000, dtype=np.float32) / 4, np.float32(0)),
    # a negative first bin far from zero with tiny negative values: y - first rounds up to the next
    # integer (|y| < |first| / 2), which the C loop corrects
    np.array([-1e6, -3.0, -1e-20, -1e-30, -(2.0**-60), 1e-30, 0.0], dtype=np.float32),
    # a range of 1e-40 (subnormals): exponents below -126, where float32 arithmetic would not be exact
    np.array([1e-40, 2e-40, 3e-40, -1e-40, 0.0], dtype=np.float32),
    # huge values: exponents above 0
    np.array([-3e38, 3e38, 1e30, -1e20, 0.0, 7.0], dtype=np.float32),
    # two values: the first and the last of the bins
    np.array([0.5, 0.75], dtype=np.float32),
    # unit bins just below 2**24, where the C loop's float32 arithmetic is exact, and across it, where
    # it must take float64
    np.arange(2**24 - 3000, 2**24 - 2, dtype=np.float32),
    np.arange(2**24 - 3000, 2**24 + 3000, 2, dtype=np.float32),
    -np.arange(2**24 - 3000, 2**24 - 2, dtype=np.float32),
    # the narrowest bins float32 takes (width 2**-126) and the next narrower
    np.array([0.0, 2.0**-126, 3 * 2.0**-126, -(2.0**-125), 1.5 * 2.0**-115], dtype=np.float32),
    np.array([0.0, 2.0**-126, 3 * 2.0**-126, -(2.0**-125), 1.5 * 2.0**-116], dtype=np.float32),
]  # fmt: skip
EDGE_IDS = [
    "tiny-signs", "far-offset", "negative-first", "subnormal", "huge", "two-values",
    "below-2**24", "across-2**24", "negative-below-2**24", "width-2**-126", "width-2**-127",
]  # fmt: skip


@pytest.mark.parametrize("values", EDGE_VALUES, ids=EDGE_IDS)
def test_edge_values_land_in_the_numpy_bins(c_counting: ModuleType, values: np.ndarray) -> None:
    assert_same(np.asarray(values, dtype=np.float32))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=2, max_size=300),
    st.sampled_from([3, 17, 4097, 40000]),
)
def test_any_finite_values_land_in_the_numpy_bins(
    c_counting: ModuleType, values: list[float], max_bins: int
) -> None:
    array = np.array(values, dtype=np.float32)
    if array.min() == array.max():
        return  # a constant has no bins
    assert_same(array, max_bins)


def test_bins_at_every_scale(c_counting: ModuleType) -> None:
    # 200 ranges from 1e-30 to 1e30 wide, centred anywhere: 20000 values each, ends included
    rng = np.random.default_rng(7)
    for _ in range(200):
        scale = 10.0 ** rng.uniform(-30, 30)
        centre = rng.normal() * scale * 10.0 ** rng.uniform(0, 6)
        values = (centre + scale * rng.standard_normal(20000)).astype(np.float32)
        assert_same(values)


@pytest.mark.parametrize("length", [1, 2, 15, 16, 17, 33, 1000])
def test_finite_extrema_match_numpy(c_counting: ModuleType, length: int) -> None:
    rng = np.random.default_rng(length)
    values = (rng.standard_normal(length) * 10.0 ** rng.integers(-40, 38, length)).astype(np.float32)
    with numpy_loops():
        expected = counting.finite_extrema(values)
    assert counting.finite_extrema(values) == expected
    assert expected == (float(values.min()), float(values.max()))
    for special in (np.nan, np.inf, -np.inf):  # anywhere, in the lanes or the tail
        for position in {0, length // 2, length - 1}:
            spoiled = values.copy()
            spoiled[position] = special
            assert counting.finite_extrema(spoiled) is None
            with numpy_loops():
                assert counting.finite_extrema(spoiled) is None


def test_finite_extrema_give_zero_as_plus_zero(c_counting: ModuleType) -> None:
    for values in ([-0.0, 0.0, -0.0], [0.0, -0.0], [-0.0] * 40, [1.0, -0.0, 2.0]):
        array = np.array(values, dtype=np.float32)
        for extreme in counting.finite_extrema(array) or ():
            assert math.copysign(1.0, extreme) == 1.0 or extreme != 0.0
    with pytest.raises(ValueError, match="must not be empty"):
        c_counting.finite_extrema(np.zeros(0, dtype=np.float32))


def test_exponent_fields_match_numpy(c_counting: ModuleType) -> None:
    rng = np.random.default_rng(3)
    values = np.concatenate(
        [
            (rng.standard_normal(100_003) * 10.0 ** rng.integers(-40, 38, 100_003)).astype(np.float32),
            np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, -3.4e38, 1e-45], dtype=np.float32),
        ]
    )
    fields = counting.exponent_field_counts(values)
    with numpy_loops():
        expected = counting.exponent_field_counts(values)
    np.testing.assert_array_equal(fields, expected)
    assert fields.sum() == values.size


@pytest.mark.parametrize("size", [8, 20_000], ids=["four-lanes", "one-lane"])
def test_values_outside_the_bins_are_refused_and_leave_the_counts(c_counting: ModuleType, size: int) -> None:
    counts = np.zeros(size, dtype=np.int64)
    # the bad value comes after a whole chunk of good ones, which must not be counted either
    inside = np.tile(np.array([0.0, 1.0, 7.5], dtype=np.float32), 3000)
    for bad in (float(size), -0.5, np.nan, np.inf):
        with pytest.raises(ValueError, match="outside the bins"):
            counting.add_aligned_bin_counts(np.append(inside, np.float32(bad)), 0, 0, counts)
    assert not counts.any()


@pytest.mark.parametrize("size", [8, 20_000], ids=["four-lanes", "one-lane"])
def test_millions_of_values_in_few_bins_are_all_counted(c_counting: ModuleType, size: int) -> None:
    """The C loop's int32 sub-histograms are added into the totals every 2**20 values: 3·2**20 + 5 values
    in three bins cross that three times, and a value outside the bins after two of them still leaves the
    counts as they were."""
    values = np.tile(np.array([0.0, 1.0, 1.5, 7.25], dtype=np.float32), 3 * 2**18)
    values = np.append(values, np.full(5, 7.5, dtype=np.float32))
    counts = np.zeros(size, dtype=np.int64)
    assert counting.add_aligned_bin_counts(values, 0, 0, counts) == 3 * 2**18
    expected = np.zeros(size, dtype=np.int64)
    expected[[0, 1, 7]] = [3 * 2**18, 2 * 3 * 2**18, 3 * 2**18 + 5]
    np.testing.assert_array_equal(counts, expected)
    with numpy_loops():
        in_numpy = np.zeros(size, dtype=np.int64)
        counting.add_aligned_bin_counts(values, 0, 0, in_numpy)
    np.testing.assert_array_equal(in_numpy, expected)
    with pytest.raises(ValueError, match="outside the bins"):
        counting.add_aligned_bin_counts(np.append(values[: 2**21 + 7], np.float32(-1)), 0, 0, counts)
    np.testing.assert_array_equal(counts, expected)


def test_wrong_buffers_are_refused(c_counting: ModuleType) -> None:
    with pytest.raises(TypeError, match="values must hold float32"):
        c_counting.aligned_bin_counts(np.zeros(4, dtype=np.float64), 0, 0, np.zeros(4, dtype=np.int64))
    with pytest.raises(TypeError, match="counts must hold int64"):
        c_counting.aligned_bin_counts(np.zeros(4, dtype=np.float32), 0, 0, np.zeros(4, dtype=np.int32))
    with pytest.raises(ValueError, match="512 entries"):
        c_counting.exponent_field_counts(np.zeros(4, dtype=np.float32), np.zeros(4, dtype=np.int64))
    read_only = np.zeros(4, dtype=np.int64)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        c_counting.aligned_bin_counts(np.zeros(4, dtype=np.float32), 0, 0, read_only)


def test_observers_agree_with_and_without_the_extension(c_counting: ModuleType) -> None:
    rng = np.random.default_rng(11)
    batches = [
        rng.standard_normal(50_000).astype(np.float32) * 3,
        np.concatenate([rng.standard_normal(1000), [-10000.0] * 64, [0.0] * 10]).astype(np.float32),
        rng.standard_normal(30_000).astype(np.float32) * 40,
    ]

    def observe() -> AlignedHistogramObserver:
        observer = AlignedHistogramObserver()
        for batch in batches:
            observer.observe(batch)
        return observer

    with_c = observe()
    with numpy_loops():
        without = observe()
    assert (with_c.exponent, with_c.first_bin, with_c.zero_count) == (
        without.exponent,
        without.first_bin,
        without.zero_count,
    )
    np.testing.assert_array_equal(with_c.counts, without.counts)


def test_counting_releases_the_gil(c_counting: ModuleType) -> None:
    # The main thread notes the time as often as it can while another thread makes one long count. With
    # the GIL held by the count, the main thread could not run during it: one gap as long as the count.
    values = np.random.default_rng(0).standard_normal(1 << 25, dtype=np.float32)
    exponent, first, size = aligned_layout(values)
    counts = np.zeros(size, dtype=np.int64)
    window: list[float] = []
    done = threading.Event()

    def count() -> None:
        window.append(time.perf_counter())
        counting.add_aligned_bin_counts(values, exponent, first, counts)
        window.append(time.perf_counter())
        done.set()

    worker = threading.Thread(target=count)
    stamps = [time.perf_counter()]
    worker.start()
    while not done.is_set():
        stamps.append(time.perf_counter())
    worker.join()
    assert counts.sum() == values.size
    start, end = window
    inside = [start, *(t for t in stamps if start < t < end), end]
    longest_gap = max(b - a for a, b in itertools.pairwise(inside))
    assert longest_gap < 0.5 * (end - start), (longest_gap, end - start)


def test_exponents_past_float64s_exact_range_are_refused(c_counting: ModuleType) -> None:
    counts = np.zeros(4, dtype=np.int64)
    with pytest.raises(ValueError, match="width 2\\*\\*2000"):
        c_counting.aligned_bin_counts(np.zeros(2, dtype=np.float32), 2000, 0, counts)
    assert not counts.any()


# One pass: add_aligned_bin_counts_and_extrema --------------------------------------------------------------


def numpy_one_pass(values: np.ndarray, exponent: int, first_bin: int, size: int) -> tuple[object, np.ndarray]:
    counts = np.zeros(size, dtype=np.int64)
    with numpy_loops():
        result = counting.add_aligned_bin_counts_and_extrema(values, exponent, first_bin, counts)
    return result, counts


def assert_one_pass_same(values: np.ndarray, exponent: int, first_bin: int, size: int) -> None:
    expected, expected_counts = numpy_one_pass(values, exponent, first_bin, size)
    counts = np.zeros(size, dtype=np.int64)
    result = counting.add_aligned_bin_counts_and_extrema(values, exponent, first_bin, counts)
    assert result == expected
    np.testing.assert_array_equal(counts, expected_counts)
    if result is not None:  # the two calls it stands for
        zeros, low, high = result
        assert (low, high) == counting.finite_extrema(values)
        assert all(extreme != 0 or math.copysign(1.0, extreme) == 1.0 for extreme in (low, high))
        reference, reference_zeros = numpy_counts(values, exponent, first_bin, size)
        assert zeros == reference_zeros
        np.testing.assert_array_equal(counts, reference)


@pytest.mark.parametrize("values", EDGE_VALUES, ids=EDGE_IDS)
def test_one_pass_counts_and_extremes_match_numpy(c_counting: ModuleType, values: np.ndarray) -> None:
    array = np.asarray(values, dtype=np.float32)
    exponent, first, size = aligned_layout(array)
    for below, above in [(0, 0), (7, 20), (size, size)]:  # the bins alone, then windows around them
        assert_one_pass_same(array, exponent, first - below, size + below + above)
    # the bins without their first or last: a value outside, refused by both
    assert_one_pass_same(array, exponent, first + 1, size - 1)
    assert_one_pass_same(array, exponent, first, size - 1)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=2, max_size=300),
    st.sampled_from([3, 17, 4097]),
    st.integers(-3, 40),
    st.integers(-3, 40),
)
def test_one_pass_over_any_finite_values_matches_numpy(
    c_counting: ModuleType, values: list[float], max_bins: int, below: int, above: int
) -> None:
    array = np.array(values, dtype=np.float32)
    if array.min() == array.max():
        return  # a constant has no bins
    exponent, first, size = aligned_layout(array, max_bins)
    if size + below + above >= 1:
        assert_one_pass_same(array, exponent, first - below, size + below + above)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 100.0, -100.0])
@pytest.mark.parametrize("where", [0, 5000, 9999])
def test_one_pass_gives_none_and_leaves_the_counts_on_a_value_it_cannot_count(
    c_counting: ModuleType, bad: float, where: int
) -> None:
    values = np.random.default_rng(3).uniform(-4, 4, 10_000).astype(np.float32)
    values[where] = bad
    for loops in (contextlib.nullcontext(), numpy_loops()):
        counts = np.arange(2000, dtype=np.int64)  # bins of 2**-7 from -1000: [-7.8, 7.8)
        with loops:
            assert counting.add_aligned_bin_counts_and_extrema(values, -7, -1000, counts) is None
        np.testing.assert_array_equal(counts, np.arange(2000))
    with pytest.raises(ValueError, match="must not be empty"):
        c_counting.aligned_bin_counts_and_extrema(np.zeros(0, dtype=np.float32), 0, 0, np.zeros(4, np.int64))


def test_one_pass_gives_zero_extremes_as_plus_zero(c_counting: ModuleType) -> None:
    for values in ([-0.0, 1.0, -0.0], [-1.0, -0.0], [-0.0, -0.0, 0.0], [0.0, -0.0]):
        array = np.array(values * 20, dtype=np.float32)  # past one vector of lanes
        zeros, low, high = counting.add_aligned_bin_counts_and_extrema(array, 0, -2, np.zeros(5, np.int64))
        assert zeros == np.count_nonzero(array == 0)
        for extreme in (low, high):
            assert extreme != 0 or math.copysign(1.0, extreme) == 1.0


def exact_state(observer: AlignedHistogramObserver) -> dict[str, object]:
    """Every field of `observer`, floats by their bits (-0.0 is not 0.0) and arrays by dtype and bytes."""
    state: dict[str, object] = {}
    for field in dataclasses.fields(AlignedHistogramObserver):
        value = getattr(observer, field.name)
        if isinstance(value, float):
            value = struct.pack("<d", value)
        elif isinstance(value, np.ndarray):
            value = (value.dtype.str, value.tobytes())
        state[field.name] = value
    return state


def observed_both_ways(
    batches: list[np.ndarray], max_bins: int
) -> tuple[dict[str, object], dict[str, object]]:
    """The exact states after observing `batches` with the one pass allowed, and with two passes only."""
    one, two = AlignedHistogramObserver(max_bins=max_bins), AlignedHistogramObserver(max_bins=max_bins)
    for batch in batches:
        one.observe(batch)
    with mock.patch.object(AlignedHistogramObserver, "_observe_in_one_pass", return_value=False):
        for batch in batches:
            two.observe(batch)
    return exact_state(one), exact_state(two)


def test_observing_in_one_pass_leaves_the_state_two_passes_leave(c_counting: ModuleType) -> None:
    # Batches that keep the bins, widen them inside the window (the exponent grows: re-binned), widen
    # them past it, bring NaN, ±Inf, a float-min mask, a float16 batch, and shrink back.
    rng = np.random.default_rng(5)
    normal = rng.standard_normal(40_000).astype(np.float32)
    batches = [
        normal,
        normal[:10_000] * 0.9,
        normal[:10_000] * 1.4,
        normal[:10_000] * 50,
        np.append(normal[:100], [np.nan, np.inf, -np.inf]).astype(np.float32),
        np.append(normal[:1000], np.float32(-3.4e38)),
        (normal[:5000] * 60).astype(np.float16),
        np.array([-0.0, 0.0, 1e-30], dtype=np.float32),
        normal[:7] * 0.5,
    ]
    for max_bins in (5, 257, 4097, 65537):  # the last: windows far wider than most batches
        one, two = observed_both_ways(batches, max_bins)
        assert one == two, max_bins
    calls = []
    original = counting.add_aligned_bin_counts_and_extrema

    def spy(*args: object) -> object:
        calls.append(original(*args))  # type: ignore[arg-type]
        return calls[-1]

    with mock.patch("qconvert.calibrate.observers.add_aligned_bin_counts_and_extrema", spy):
        observed_both_ways(batches, 4097)
    # the first batch has no bins yet; the one pass took batches 2, 3 and the last ones, not NaN/Inf/mask
    assert sum(result is not None for result in calls) >= 4 and None in calls


@pytest.mark.parametrize("sign", [-1, 1])
def test_a_window_reaching_a_huge_magnitude_leaves_it_to_the_huge_counts(
    c_counting: ModuleType, sign: int
) -> None:
    # Two bins of 2**98 next to 2**100: the window's far edge is exactly ±2**100, which is huge (counted
    # per octave), never an ordinary value of the bins.
    below_huge = float(np.nextafter(np.float32(HUGE_MAGNITUDE), np.float32(0)))
    batches = [
        np.array([sign * below_huge, sign * 2.0**99], dtype=np.float32),
        np.array([sign * HUGE_MAGNITUDE, sign * below_huge], dtype=np.float32),
    ]
    one, two = observed_both_ways(batches, max_bins=2)
    assert one == two
    assert two["huge_counts"] is not None


def test_batches_of_any_layout_are_counted_whole(c_counting: ModuleType) -> None:
    values = np.random.default_rng(1).standard_normal((64, 48)).astype(np.float32)
    one, two = observed_both_ways([values.reshape(-1), values, values.T, values[::2, ::3]], max_bins=257)
    assert one == two
    assert two["count"] == values.size * 3 + values[::2, ::3].size


def test_one_pass_windows_from_bins_float32_cannot_hold(c_counting: ModuleType) -> None:
    # Unit bins (exponent 0) from first bins around 2**24 + 1, which float32 cannot hold: the C loop must
    # take its float64 arithmetic there.
    values = np.array([2.0**24 + 2, 2.0**24 + 4, 2.0**24 + 8], dtype=np.float32)
    for first in (2**24 - 3, 2**24 - 1, 2**24 + 1):
        size = 2**24 + 16 - first
        counts = np.zeros(size, dtype=np.int64)
        assert counting.add_aligned_bin_counts_and_extrema(values, 0, first, counts) == (
            0,
            2.0**24 + 2,
            2.0**24 + 8,
        )
        expected = np.zeros(size, dtype=np.int64)
        np.add.at(expected, values.astype(np.int64) - first, 1)
        np.testing.assert_array_equal(counts, expected)
