"""What the vectorised entropy search relies on to stay bit-identical to onnxruntime while fast.

- `np.add.reduceat` over rows laid out as the search lays them out ([0.0, row..., leftovers]) sums each
  row exactly as `np.sum` does (numpy's pairwise order depends on the length, so this is checked for
  every length the search meets, on the installed numpy, with the ufunc buffer size the search sets);
- every candidate's KL divergence, not only the chosen window, equals the value onnxruntime computes:
  its own `entropy` function is wrapped to record what it returns, then called through unchanged;
- smoothing as max(count + correction, 1e-4) equals onnxruntime's `smooth_distribution`, including
  the rows (2 non-zero counts among 19,999 zeros) where it must not be used;
- the screen's bound on how far each candidate's float32 KL is from its real-valued estimate holds,
  so the candidates it rules out cannot win; in both of its implementations, numpy's and the C
  extension's (`_entropy_screen.c`), whose float32 rows also equal numpy's bit for bit.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from conftest import require_module
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from onnxruntime.quantization import calibrate

from qconvert.calibrate import entropy
from qconvert.calibrate.entropy import kl_divergences


def _reduceat_row_sums(rows: list[np.ndarray]) -> np.ndarray:
    """Each row's sum the way `entropy._block_divergences` computes it."""
    width = max(row.size for row in rows) + 1
    buffer = np.full(len(rows) * width + 1, np.float32(np.nan))  # leftovers hold anything
    grid = buffer[:-1].reshape(len(rows), width)
    grid[:, 0] = 0
    for grid_row, row in zip(grid, rows, strict=True):
        grid_row[1 : row.size + 1] = row
    starts = np.arange(len(rows)) * width
    lengths = np.array([row.size for row in rows])
    segments = np.stack([starts, starts + lengths + 1], axis=1).ravel()
    with entropy._unbuffered(), np.errstate(invalid="ignore"):
        return np.add.reduceat(buffer, segments)[::2]


@pytest.mark.parametrize("magnitudes", ["positive", "signed"])
def test_reduceat_with_a_leading_zero_sums_every_length_as_np_sum(magnitudes: str) -> None:
    rng = np.random.default_rng(0 if magnitudes == "positive" else 1)
    lengths = [*range(1, 4201), 8191, 8192, 8193, 16385, 40_000]
    rows = []
    for length in lengths:
        row = rng.standard_normal(length) * 10.0 ** rng.uniform(-3, 3, length)
        rows.append((np.abs(row) if magnitudes == "positive" else row).astype(np.float32))
    expected = np.array([np.sum(row) for row in rows], dtype=np.float32)
    for first in range(0, len(rows), 128):  # blocks of rows, as the search makes them
        block = rows[first : first + 128]
        got = _reduceat_row_sums(block)
        assert got.tobytes() == expected[first : first + len(block)].tobytes(), first


def test_reduceat_rows_are_independent_of_their_neighbours_and_alignment() -> None:
    rng = np.random.default_rng(2)
    row = rng.random(1537, dtype=np.float32)
    expected = np.sum(row)
    for neighbours in range(1, 9):  # shifts the row's offset in the buffer by the neighbours' widths
        rows = [rng.random(int(rng.integers(1, 2000)), dtype=np.float32) for _ in range(neighbours)]
        assert _reduceat_row_sums([*rows, row])[-1] == expected


def _onnxruntime_divergences(monkeypatch: pytest.MonkeyPatch, histogram: tuple, num_quantized_bins: int):
    """The KL of every candidate whose distributions onnxruntime could smooth, in its order."""
    recorded: list[float] = []
    original = calibrate.entropy

    def recording(pk, qk, *args, **kwargs):
        value = original(pk, qk, *args, **kwargs)
        recorded.append(float(value))
        return value

    monkeypatch.setattr(calibrate, "entropy", recording)
    collector = calibrate.HistogramCollector("entropy", False, 1, num_quantized_bins, 99.999, "same")
    collector.get_entropy_threshold(histogram, num_quantized_bins)
    monkeypatch.setattr(calibrate, "entropy", original)
    return np.array(recorded)


def _histogram(values: np.ndarray, num_bins: int) -> tuple:
    collector = calibrate.HistogramCollector("entropy", False, num_bins, 128, 99.999, "same")
    collector.collect({"t": [values.astype(np.float32)]})
    return collector.histogram_dict["t"]


@pytest.mark.parametrize(
    ("kind", "num_bins", "num_quantized_bins"), [(0, 768, 128), (1, 1001, 128), (2, 400, 16)]
)
def test_every_candidate_divergence_equals_onnxruntime(
    monkeypatch: pytest.MonkeyPatch, kind: int, num_bins: int, num_quantized_bins: int
) -> None:
    rng = np.random.default_rng(40 + kind)
    if kind == 0:  # normal with outliers: most wide windows are empty bins
        values = rng.standard_normal(50_000)
        values[:3] = [25.0, -14.0, 9.0]
    elif kind == 1:  # ReLU output
        values = np.maximum(rng.standard_normal(50_000), 0)
    else:  # heavy tails
        values = rng.standard_t(3, 20_000)
    histogram = _histogram(values, num_bins)
    theirs = _onnxruntime_divergences(monkeypatch, histogram, num_quantized_bins)
    ours = kl_divergences(histogram[0], num_quantized_bins)
    assert theirs.size > 0
    assert ours[np.isfinite(ours)].tobytes() == theirs.tobytes()


@pytest.mark.parametrize("seed", range(3))
def test_every_candidate_divergence_equals_onnxruntime_on_small_histograms(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    # One-bin windows, a single merged bin, merged bins of size 0, odd bin counts.
    rng = np.random.default_rng(seed)
    for case in range(25):
        num_bins = int(rng.integers(2, 80))
        num_quantized_bins = int(rng.integers(1, num_bins + 1))
        if num_quantized_bins // 2 > num_bins // 2:
            continue
        values = rng.standard_normal(int(rng.integers(1, 300))) * rng.uniform(0.1, 3)
        histogram = _histogram(np.round(values) if case % 2 else values, num_bins)
        theirs = _onnxruntime_divergences(monkeypatch, histogram, num_quantized_bins)
        ours = kl_divergences(histogram[0], num_quantized_bins)
        assert ours[np.isfinite(ours)].tobytes() == theirs.tobytes(), (num_bins, num_quantized_bins, case)


@pytest.mark.parametrize(("nonzero", "zeros"), [(5, 3), (2, 19_999), (3, 29_990), (1, 9_998)])
def test_smoothing_equals_onnxruntime_even_where_the_correction_nears_minus_one(
    nonzero: int, zeros: int
) -> None:
    # The search smooths as max(count + correction, 1e-4); where 1 + correction < 1e-4 (about 10^4
    # zeros per non-zero count) a count of 1 would be clamped, so those rows take the exact path.
    from onnxruntime.quantization.quant_utils import smooth_distribution

    rng = np.random.default_rng(zeros)
    counts = np.zeros(nonzero + zeros, dtype=np.int64)
    counts[rng.choice(counts.size, nonzero, replace=False)] = rng.integers(1, 3, nonzero)
    theirs = smooth_distribution(counts)
    correction = entropy._correction(np.array([zeros]), np.array([counts.size]))
    ours = np.empty((1, counts.size), dtype=np.float32)
    entropy._smooth(counts.astype(np.float32)[None, :], correction, out=ours)
    assert ours[0].tobytes() == theirs.tobytes()


# The screen: a real-valued KL per candidate with a bound on onnxruntime's float32 error, so that only
# candidates that can win get the float32 rows.
def _screens(counts: np.ndarray, num_quantized_bins: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(estimates, bounds) of numpy's screen and, when built, of the C one, whose candidates must equal
    numpy's to the bit (they feed the float32 rows)."""
    tables, candidates = entropy._prepare(counts, num_quantized_bins)
    screens = [entropy._estimates(tables, candidates, num_quantized_bins)]
    if entropy.uses_c_screen():
        in_c, estimates, bounds = entropy.screen_in_c(tables.histogram, num_quantized_bins)
        for field in dataclasses.fields(candidates):
            ours, theirs = getattr(in_c, field.name), getattr(candidates, field.name)
            assert ours.dtype == theirs.dtype and ours.tobytes() == theirs.tobytes(), field.name
        # Both are float64 estimates of one real number: only their sums' order and the C screen's own
        # logarithm (within 1e-15·(|log x| + 1)) differ, far inside the bound's float64 term.
        numpy_estimates, numpy_bounds = screens[0]
        both = np.isfinite(bounds) & np.isfinite(numpy_bounds)
        assert np.array_equal(np.isfinite(bounds), np.isfinite(numpy_bounds))
        difference = np.abs(estimates - numpy_estimates)[both]
        assert np.all(difference <= 1e-12 * (1 + np.abs(numpy_estimates[both]))), np.max(difference)
        screens.append((estimates, bounds))
    return screens


def _assert_screen_holds(counts: np.ndarray, num_quantized_bins: int) -> int:
    """The bound holds on every screened candidate, in each implementation, and the winner is the full
    search's; returns how many candidates numpy's screen could not rule out."""
    exact = kl_divergences(counts, num_quantized_bins)
    screens = _screens(counts, num_quantized_bins)
    for estimates, bounds in screens:
        screened = np.isfinite(bounds)
        errors = np.abs(exact - estimates)[screened]
        assert np.all(errors <= bounds[screened]), np.max(errors / bounds[screened])
    assert entropy.best_candidate(counts, num_quantized_bins) == int(np.argmin(exact))
    with mock.patch.object(entropy, "_entropy_screen", None):
        assert entropy.best_candidate(counts, num_quantized_bins) == int(np.argmin(exact))
    estimates, bounds = screens[0]
    finite = np.isfinite(exact)
    if not finite.any():
        return exact.size
    least_upper = np.min((estimates + bounds)[finite])
    return int(np.count_nonzero(finite & (estimates - bounds <= least_upper)))


def _shaped_counts(kind: str, num_bins: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "normal":
        values = rng.standard_normal(200_000)
    elif kind == "relu":
        values = np.maximum(rng.standard_normal(200_000), 0)
    elif kind == "heavy":
        values = rng.standard_t(2, 200_000)
    else:  # "outliers": a narrow bulk, so most wide windows are empty bins (large corrections)
        values = rng.standard_normal(200_000)
        values[:4] = [400.0, -250.0, 90.0, -60.0]
    limit = np.abs(values).max()
    return np.histogram(values, bins=num_bins, range=(-limit, limit))[0]


@pytest.mark.parametrize("kind", ["normal", "relu", "heavy", "outliers"])
@pytest.mark.parametrize(("num_bins", "num_quantized_bins"), [(1200, 128), (4096, 128), (512, 16)])
def test_screen_bounds_every_candidate_and_keeps_the_winner(
    kind: str, num_bins: int, num_quantized_bins: int
) -> None:
    counts = _shaped_counts(kind, num_bins, np.random.default_rng(num_bins))
    contenders = _assert_screen_holds(counts, num_quantized_bins)
    # What makes it worth having: most candidates never need the float32 rows (here 1 to 87 of 249 to
    # 1985; 5% over the activations of a BERT encoder).
    assert contenders <= 0.25 * (num_bins // 2 - num_quantized_bins // 2 + 1), contenders


@pytest.mark.parametrize("scale", [2**20, 2**30, 2**40])
def test_screen_holds_on_counts_float32_cannot_hold(scale: int) -> None:
    # Counts above 2**24 round when onnxruntime converts them to float32: part of the bound.
    counts = (_shaped_counts("normal", 1500, np.random.default_rng(7)).astype(np.int64) * scale) + 3
    _assert_screen_holds(counts, 128)


@pytest.mark.parametrize(
    ("num_bins", "num_quantized_bins"),
    [(2000, 1), (4096, 128), (10001, 128)],
)
def test_screen_holds_where_the_smoothing_correction_is_large(num_bins: int, num_quantized_bins: int) -> None:
    """One count among thousands of empty bins: corrections near -0.2 (beyond -0.5 in the widest windows
    of 10001 bins, where the screen leaves them to the full search), so the Taylor remainder is most of
    the bound."""
    counts = np.zeros(num_bins, dtype=np.int64)
    counts[num_bins // 2 + 3] = 1
    _assert_screen_holds(counts, num_quantized_bins)


@pytest.mark.parametrize(("num_bins", "num_quantized_bins"), [(4, 5), (6, 7), (8, 9), (12, 13)])
def test_screen_holds_on_windows_shorter_than_q(num_bins: int, num_quantized_bins: int) -> None:
    """An odd Q over fewer bins: the widest windows are cut at the histogram's ends, shorter than Q, so
    they merge 0 bins per quantized bin (both screens leave those to the full search)."""
    counts = np.arange(1, num_bins + 1, dtype=np.int64) ** 2
    assert (entropy._geometry(num_bins, num_quantized_bins)[2] == 0).any()
    _assert_screen_holds(counts, num_quantized_bins)


def test_a_large_correction_picks_onnxruntimes_window(monkeypatch: pytest.MonkeyPatch) -> None:
    values = np.concatenate([np.full(3, 0.01), [-40.0, 35.0]])  # a narrow bulk, two far outliers
    histogram = _histogram(values, 3000)
    theirs = _onnxruntime_divergences(monkeypatch, histogram, 128)
    assert int(np.argmin(theirs)) == entropy.best_candidate(histogram[0], 128)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 2**40), min_size=4, max_size=700),
    st.sampled_from([1, 2, 3, 8, 9, 16, 127, 128]),  # the C screen sums in 8 lanes, then the rest
    st.integers(0, 3),
)
def test_screen_holds_on_any_histogram(counts: list[int], num_quantized_bins: int, sparsity: int) -> None:
    """Sparse and tiny ones, one-bin and single-merged-bin windows, huge counts: the bound holds
    wherever the screen applies and the winner is always the full search's."""
    histogram = np.array(counts, dtype=np.int64)
    histogram[np.arange(histogram.size) % 4 < sparsity] = 0  # up to 3 zeros in 4 bins
    assume(num_quantized_bins // 2 <= histogram.size // 2)
    _assert_screen_holds(histogram, num_quantized_bins)


def test_the_c_screen_is_what_runs_and_is_built_from_the_current_source() -> None:
    screen = require_module("qconvert.calibrate._entropy_screen")
    assert entropy.uses_c_screen()
    source = Path(entropy.__file__).with_name("_entropy_screen.c")
    built = Path(screen.__file__ or "")
    if source.exists():  # an editable install builds once: a later edit needs `pip install -e . --no-deps`
        assert built.stat().st_mtime >= source.stat().st_mtime, f"{built.name} is older than {source.name}"


def test_the_c_screen_refuses_candidates_outside_the_histogram() -> None:
    require_module("qconvert.calibrate._entropy_screen")
    histogram = np.arange(16, dtype=np.int64)
    candidates, _, _ = entropy.screen_in_c(histogram, 4)
    outputs = [np.empty_like(candidates.p_correction) for _ in range(3)]
    starts = candidates.starts.copy()
    starts[-1] = 9  # its window of 16 bins would end past bin 15
    lengths, merged = candidates.lengths.copy(), candidates.merged.copy()
    lengths[0] = 2**63 - 4  # start + length overflows int64
    merged[0] = lengths[0] // 4
    for first, length, size in (
        (starts, candidates.lengths, candidates.merged),
        (candidates.starts, lengths, merged),
    ):
        with pytest.raises(ValueError, match=r"candidate \d+ is outside the histogram"):
            entropy._entropy_screen.entropy_screen(  # type: ignore[union-attr]
                histogram, 4, 30, first, length, size, *outputs,
                np.empty_like(candidates.q_values), np.empty_like(candidates.ok),
                np.empty(first.size), np.empty(first.size),
            )  # fmt: skip
