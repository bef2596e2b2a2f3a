"""TensorRT-style KL-divergence threshold search on a histogram, as onnxruntime's Entropy calibrator does it.

NOTE: the result equals onnxruntime's `HistogramCollector.get_entropy_threshold` bit for bit on the same
histogram (tests/calibrate/test_methods.py runs it): the KL curve is flat near its minimum, so
neighbouring candidates often differ in the last float32 bits and any change of arithmetic moves the
pick. Everything is vectorised with onnxruntime's dtypes and operation order: what each candidate needs
per merged bin or per window (end bins, corrections, q's values) for all candidates at once, then the
full-length p and q rows for blocks of candidates, one row each. onnxruntime's three float32 `np.sum`s
per candidate use numpy's pairwise summation, whose blocks depend on the length (zero padding would
change the rounding); one `np.add.reduceat` call sums every row of a block at once in that order:
reduceat adds a segment's first element to numpy's pairwise sum of the rest, so each row starts with a
0.0 column and its segment is [0.0, row...] (the columns past the row's length form segments of their
own, ignored). tests/calibrate/test_entropy_speed.py checks this against `np.sum` for every length up
to 4200 (and a few longer) on the installed numpy, and every candidate's KL against onnxruntime's.

The algorithm (reference §2.3), for `nb` bins, zero bin `z = nb // 2`, `Q` quantized bins, `h = Q // 2`,
candidates `i = h .. z`:
- window `[z - i, min(z + i + 1, nb))`; `p` = the window with the outside counts added to its end bins;
- `m = len(window) // Q`; quantized bin `j < Q` sums window bins `[j·m, (j+1)·m)` (without outliers),
  the last one also the tail `[Q·m, len)`; `q` spreads each quantized bin's sum over its `m` positions
  as `trunc(sum / nonzero count of p there)` (0 where that count is 0, and over the tail);
- p and q smoothed (zeros become 1e-4, non-zeros lose 1e-4·zeros/non-zeros), normalised, and
  `KL(p‖q)` in float32; the lowest KL wins (the first on ties), its window's edges clipped to the
  observed [min, max] are the range.

NOTE: `entropy_threshold` runs that float32 arithmetic only on the candidates that can win. A screen
first computes each candidate's KL as a real number in O(Q) (float64 from prefix sums, p·log p by a
second-order Taylor expansion in the smoothing correction, whose remainder is bounded), with a bound on
how far onnxruntime's float32 result can be from it (`_estimates`). A candidate whose lowest possible
float32 KL is above the least highest possible one cannot be the first minimum; the rest get the exact
rows (5% of the candidates over a BERT encoder's activations). The bound, per candidate, with
u = 2**-24 and d the depth of numpy's pairwise sum over the row (`_pairwise_depth`):
- each p and q entry carries a relative error of at most (d + 5)·u: float32 rounding of count +
  correction (2u: counts up to 2**24 convert exactly, larger ones dwarf the correction), the sum's d·u,
  the division's u, and the sum of the rounded entries against the sum of the real ones (2u);
- so log(p / q) is off by at most (2d + 11)·u + 8u·|log(p / q)| (numpy's float32 log is within 4 ulp,
  at most 8u relative; libm's within 1), each term p·log(p / q) by p·u·((d + 14)·|log(p / q)| + 2d + 11),
  and the final sum adds d·u·Σ|terms|;
- in all, |KL_float32 - KL| <= u·((2d + 14)·A + 2d + 11) up to O(u²), where A = Σ p·|log(p / q)| <=
  2·H(p) + KL (p and q are at most 1). The screen doubles that, as a margin for the O(u²) terms.
Measured: float32 errors reach 20% of the undoubled bound on generated histograms, 6% of the doubled one
on the 159 histograms of a BERT encoder's Entropy calibration (the median histogram's 0.7%); with the
Taylor remainder a single count in 2000 bins reaches 70%. The screen is skipped when the candidates have
many merged sizes (few quantized bins): its cost is per merged size. tests/calibrate/test_entropy_speed.py
checks the bound on every candidate and the winner against the full search on generated histograms.

NOTE: the screen has two implementations with one result, as the counting loops do (counting.py): numpy's
`_candidates` and `_estimates`, and `_entropy_screen.c`, built with the package where a C compiler is found.
The C one computes the same float32 rows bit for bit and estimates within the same bound; it replaces a
few hundred numpy calls per histogram (1.5 ms) with loops that gcc vectorises and that release the GIL,
so the ranges are searched on every core (`EntropyMethod.parallel_ranges`). The screens of a 6-layer BERT
encoder's 159 histograms take 0.05 s of one core with AVX-512, 0.07 s with AVX2 (0.12 s with libm's log).
tests/calibrate/test_entropy_speed.py runs both.

onnxruntime keeps each KL in its histogram edges' dtype: with float16 activations its KLs are rounded to
float16, which moved the pick in 4 of 120 generated histograms. qconvert keeps them in float32 for every
activation dtype (float16 values are binned as float32): its picks equal onnxruntime's for float32 ones.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import as_strided

try:
    from qconvert.calibrate import _entropy_screen  # type: ignore[attr-defined]
except ImportError:  # installed without a C compiler: `_candidates` and `_estimates` below
    _entropy_screen = None

_SMOOTHING_EPSILON = 1e-4
# The screen loops over merged sizes (about num_bins / (2·Q) of them): at 10000 bins with Q = 3 its 1666
# iterations cost more than the full search (282 against 273 ms); with Q = 128, 39 of them, it is 7x faster.
_MAX_SCREENED_SIZES = 256
# Candidates per vectorised block: 128 rows of p and 128 of q, up to ~2048 float32 each (~2 MiB);
# 96 to 256 measured alike, 64 slower (numpy's per-call cost), 384 slower (cache).
_CANDIDATE_BLOCK = 128
# numpy's smallest ufunc buffer: with its default 8192, numpy copies each row's broadcast value (a
# row sum, a correction) to lengthen rows shorter than that, which doubles the cost of those operations.
_UNBUFFERED = 16


def uses_c_screen() -> bool:
    """Whether the screen runs in C (the extension was built), rather than in numpy."""
    return _entropy_screen is not None


def entropy_threshold(
    counts: np.ndarray,
    edges: np.ndarray,
    minimum: float,
    maximum: float,
    num_quantized_bins: int = 128,
) -> tuple[float, float]:
    """The (low, high) of the window with the least KL divergence, clipped to [minimum, maximum].

    `counts` has `nb` bins symmetric around zero (edges[nb // 2] is 0 for an even `nb`), `edges` its
    `nb + 1` edges; returned bounds are elements of `edges` (or the clip values).
    """
    best = best_candidate(counts, num_quantized_bins)
    num_bins = len(counts)
    zero_bin = num_bins // 2
    half_window = num_quantized_bins // 2 + best
    low = float(edges[zero_bin - half_window])
    high = float(edges[min(zero_bin + half_window + 1, num_bins)])
    return max(low, float(minimum)), min(high, float(maximum))


def kl_divergences(counts: np.ndarray, num_quantized_bins: int) -> np.ndarray:
    """The KL divergence (float32 values in a float64 array) of each candidate window, narrowest first."""
    tables, candidates = _prepare(counts, num_quantized_bins)
    return _divergences(tables, candidates, [slice(0, candidates.starts.size)])


def best_candidate(counts: np.ndarray, num_quantized_bins: int) -> int:
    """`argmin(kl_divergences(counts, num_quantized_bins))`, the first on ties, computing the float32
    KL only of the candidates that the screen (`_estimates`) cannot rule out."""
    screen: tuple[np.ndarray, np.ndarray] | None = None  # (estimates, bounds)
    if _entropy_screen is not None:
        tables = _Tables(_histogram(counts, num_quantized_bins))
        candidates, estimates, bounds = screen_in_c(tables.histogram, num_quantized_bins)
        screen = (estimates, bounds)
    else:
        tables, candidates = _prepare(counts, num_quantized_bins)
        # Its loop over merged sizes costs more than it saves with many of them.
        if len(_runs(candidates.merged)) <= _MAX_SCREENED_SIZES:
            screen = _estimates(tables, candidates, num_quantized_bins)
    if not candidates.ok.any():
        return 0  # every divergence is inf
    if screen is None:
        runs = [slice(0, candidates.starts.size)]
    else:
        # A candidate whose lowest possible KL is above the least upper bound is above the float32 KL of
        # the candidate with that bound: it cannot win.
        estimates, bounds = screen
        least_upper = np.min((estimates + bounds)[candidates.ok])
        contenders = np.flatnonzero(candidates.ok & (estimates - bounds <= least_upper))
        split = np.split(contenders, np.flatnonzero(np.diff(contenders) != 1) + 1)
        runs = [slice(run[0], run[-1] + 1) for run in split]
    return int(np.argmin(_divergences(tables, candidates, runs)))


def screen_in_c(histogram: np.ndarray, num_quantized_bins: int) -> tuple[_Candidates, np.ndarray, np.ndarray]:
    """`_candidates` and `_estimates` of one int64 histogram, computed by the C extension."""
    assert _entropy_screen is not None
    starts, lengths, merged = _geometry(histogram.size, num_quantized_bins)
    count = starts.size
    p_correction, p_first, p_last = (np.empty(count, dtype=np.float32) for _ in range(3))
    q_values = np.empty((count, num_quantized_bins + 1), dtype=np.float32)
    ok = np.empty(count, dtype=bool)
    estimates, bounds = np.empty(count), np.empty(count)
    depth = _pairwise_depth(int(lengths.max()) + 1)
    _entropy_screen.entropy_screen(
        np.ascontiguousarray(histogram),
        num_quantized_bins,
        depth,
        starts,
        lengths,
        merged,
        p_correction,
        p_first,
        p_last,
        q_values,
        ok,
        estimates,
        bounds,
    )
    candidates = _Candidates(starts, lengths, p_correction, p_first, p_last, merged, q_values, ok)
    return candidates, estimates, bounds


def _histogram(counts: np.ndarray, num_quantized_bins: int) -> np.ndarray:
    histogram = np.asarray(counts, dtype=np.int64)
    num_bins = histogram.size
    if num_quantized_bins < 1 or num_quantized_bins // 2 > num_bins // 2:
        raise ValueError(
            f"the entropy search needs 1 <= num_quantized_bins <= num_bins ({num_bins}), "
            f"got {num_quantized_bins}"
        )
    return histogram


def _prepare(counts: np.ndarray, num_quantized_bins: int) -> tuple[_Tables, _Candidates]:
    tables = _Tables(_histogram(counts, num_quantized_bins))
    return tables, _candidates(tables, num_quantized_bins)


def _geometry(num_bins: int, num_quantized_bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per candidate (narrowest first): its window's first bin, its length, and its merged size."""
    zero_bin = num_bins // 2
    half_windows = np.arange(num_quantized_bins // 2, zero_bin + 1)
    starts = zero_bin - half_windows
    lengths = np.minimum(zero_bin + half_windows + 1, num_bins) - starts
    return starts, lengths, lengths // num_quantized_bins


def _divergences(tables: _Tables, candidates: _Candidates, runs: list[slice]) -> np.ndarray:
    """The float32 KL of the candidates in `runs` (slices of consecutive candidates); inf elsewhere."""
    divergences = np.full(candidates.starts.size, np.inf)
    widest_run = max(run.stop - run.start for run in runs)
    buffers = _Buffers(min(widest_run, _CANDIDATE_BLOCK), tables.histogram.size + 1)
    for run in runs:
        for first in range(run.start, run.stop, _CANDIDATE_BLOCK):
            block = slice(first, min(first + _CANDIDATE_BLOCK, run.stop))
            divergences[block] = _block_divergences(tables, candidates, block, buffers)
    divergences[~candidates.ok] = np.inf  # smoothing fails on an all-zero distribution
    return divergences


class _Tables:
    """Per-histogram lookups shared by every block: prefix sums of counts, of non-zero and zero bins;
    windows of the counts as float32 (onnxruntime's astype(float32)): row s of `windows` starts at bin
    s - 1 (a zero before bin 0), and zeros follow the last bin, so any row can read `num_bins + 1`; and
    the count sum and non-zero count of every run of m bins, per m (q's values and the screen read them).
    The prefix sums are made on first use: with the C screen, only the float32 rows read the tables."""

    def __init__(self, histogram: np.ndarray) -> None:
        self.histogram = histogram
        padded = np.zeros(2 * histogram.size + 2, dtype=np.float32)
        padded[1 : histogram.size + 1] = histogram
        self.windows = as_strided(padded, (histogram.size + 1, histogram.size + 1), 2 * padded.strides)
        self._runs: dict[int, np.ndarray] = {}

    @functools.cached_property
    def prefix(self) -> np.ndarray:
        return _prefix(self.histogram)

    @functools.cached_property
    def nonzero_prefix(self) -> np.ndarray:
        return _prefix(self.histogram != 0)

    @functools.cached_property
    def zero_prefix(self) -> np.ndarray:
        return _prefix(self.histogram == 0)

    def runs(self, merged: int) -> np.ndarray:
        """Row 0, k: the count sum of bins [k, k + merged); row 1, k: how many of them are non-zero."""
        if merged not in self._runs:
            self._runs[merged] = np.stack(
                [
                    self.prefix[merged:] - self.prefix[:-merged],
                    self.nonzero_prefix[merged:] - self.nonzero_prefix[:-merged],
                ]
            )
        return self._runs[merged]

    def quotients(self, merged: int, starts: np.ndarray, num_quantized_bins: int) -> np.ndarray:
        """(row r, j): the q value of bins [starts[r] + j·merged, starts[r] + (j+1)·merged), for starts one
        apart and decreasing (`_run_view`)."""
        sums, norms = self.runs(merged)
        return _run_view(_quotient(sums, norms), merged, starts, num_quantized_bins)


def _run_view(runs: np.ndarray, merged: int, starts: np.ndarray, num_quantized_bins: int) -> np.ndarray:
    """(..., row r, j) -> runs[..., starts[r] + j·merged] (runs[..., k]: a value of bins [k, k + merged)),
    for starts one apart and decreasing: a strided view (`np.ndarray` checks it stays inside `runs`;
    as_strided, which does not, costs 6x more and runs thousands of times per search)."""
    runs = np.ascontiguousarray(runs)
    step = runs.strides[-1]
    shape = (*runs.shape[:-1], starts.size, num_quantized_bins)
    strides = (*runs.strides[:-1], -step, step * merged)
    return np.ndarray(shape, runs.dtype, runs, int(starts[0]) * step, strides)


class _Buffers:
    """float32 space every block reuses (fresh arrays would cost page faults each time): p's rows above
    q's in one buffer, so that one reduceat and one division serve both, and epsilons as large as p."""

    def __init__(self, num_rows: int, width: int) -> None:
        self.pq = np.empty(2 * num_rows * width + 1, dtype=np.float32)  # + 1: reduceat's last index
        self.epsilon = np.full(num_rows * width, np.float32(_SMOOTHING_EPSILON))


def _prefix(values: np.ndarray, dtype: type = np.int64) -> np.ndarray:
    """prefix[k]: the sum of values[:k]."""
    prefix = np.zeros(values.size + 1, dtype=dtype)
    np.cumsum(values, out=prefix[1:])
    return prefix


@dataclass(frozen=True)
class _Candidates:
    """Per candidate window: its first bin and length; p's smoothing correction and smoothed end bins
    (the outside counts folded in); q's merged size and smoothed values (one per merged bin, then the
    tail's); whether onnxruntime could smooth both p and q."""

    starts: np.ndarray
    lengths: np.ndarray
    p_correction: np.ndarray
    p_first: np.ndarray
    p_last: np.ndarray
    merged: np.ndarray
    q_values: np.ndarray
    ok: np.ndarray


def _candidates(tables: _Tables, num_quantized_bins: int) -> _Candidates:
    """Everything about each candidate but its full-length rows, for all candidates at once."""
    histogram, prefix = tables.histogram, tables.prefix
    starts, lengths, merged = _geometry(histogram.size, num_quantized_bins)
    ends = starts + lengths
    has_last = lengths > 1  # p's last bin is another bin than its first

    # p's end bins with the outside counts folded in (int64 as onnxruntime), and p's zero count.
    first_bin = histogram[starts] + prefix[starts]
    last_bin = np.where(has_last, histogram[ends - 1], first_bin) + (prefix[-1] - prefix[ends])
    # Whether folding the outliers made p's end bins non-zero (a one-bin window holds both folds).
    first_changed = (np.where(has_last, first_bin, last_bin) == 0).astype(np.int64) - (histogram[starts] == 0)
    last_changed = np.where(has_last, (last_bin == 0).astype(np.int64) - (histogram[ends - 1] == 0), 0)
    p_zeros = tables.zero_prefix[ends] - tables.zero_prefix[starts] + first_changed + last_changed

    # Quantized bins: merged bin j of the window starting at s sums bins [s + j·m, s + (j+1)·m) (the last
    # one also the tail up to the end); onnxruntime assigns `sum / norm` (float64, norm = p's non-zero
    # count there) into an int64 q, truncating, where the norm is not 0 (a zero norm means a zero sum,
    # but for the tail). Away from p's end bins that depends on the run of bins only (tables.quotients);
    # the first and last merged bins are redone with p's end bins (the last bin is in merged bin Q - 1
    # when there is no tail) and the tail.
    tail = lengths - num_quantized_bins * merged
    spread = np.zeros((starts.size, num_quantized_bins))
    for size, group in _runs(merged):
        if size:
            spread[group] = tables.quotients(size, starts[group], num_quantized_bins)
    nonzero_prefix = tables.nonzero_prefix
    last_start = starts + (num_quantized_bins - 1) * merged
    last_norm = nonzero_prefix[last_start + merged] - nonzero_prefix[last_start]
    last_norm -= np.where(tail == 0, last_changed, 0)
    if num_quantized_bins == 1:
        last_norm -= first_changed
    else:
        first_norm = nonzero_prefix[starts + merged] - nonzero_prefix[starts] - first_changed
        spread[:, 0] = _quotient(prefix[starts + merged] - prefix[starts], first_norm)
    spread[:, -1] = _quotient(prefix[ends] - prefix[last_start], last_norm)
    q_zeros = np.count_nonzero(spread == 0, axis=1) * merged + tail

    # Smoothing: count + correction where the count is non-zero, epsilon where it is zero, computed as
    # max(count + correction, epsilon) since a count of 1 or more stays above epsilon (checked per row).
    # q's tail (column Q) is all zeros: epsilon.
    p_correction = _correction(p_zeros, lengths)
    q_values = np.full((starts.size, num_quantized_bins + 1), np.float32(_SMOOTHING_EPSILON))
    with _unbuffered():
        _smooth(spread.astype(np.float32), _correction(q_zeros, lengths), out=q_values[:, :-1])
    return _Candidates(
        starts=starts,
        lengths=lengths,
        p_correction=p_correction,
        p_first=_smoothed(first_bin, p_correction),
        p_last=_smoothed(last_bin, p_correction),
        merged=merged,
        q_values=q_values,
        ok=(p_zeros < lengths) & (q_zeros < lengths),
    )


def _block_divergences(
    tables: _Tables, candidates: _Candidates, block: slice, buffers: _Buffers
) -> np.ndarray:
    """KL of the candidates of one block, whose rows are `width` wide: 0.0, the candidate's `length`
    values, then values that only the ignored reduceat segments read (candidates that could not be
    smoothed get values that kl_divergences replaces)."""
    starts, lengths = candidates.starts[block], candidates.lengths[block]
    rows = np.arange(starts.size)
    width = int(lengths[-1]) + 1  # the widest window is the last
    windows = tables.windows[starts[-1] : starts[0] + 1, :width][::-1]  # column c: window bin c - 1
    pq = buffers.pq[: 2 * rows.size * width].reshape(2 * rows.size, width)
    p, q = pq[: rows.size], pq[rows.size :]
    # Row r's segment is [r·width, r·width + lengths[r] + 1); the rest of the row is a segment of its own.
    segments = np.stack([rows * width, rows * width + lengths + 1], axis=1).ravel()
    segments = np.concatenate([segments, segments + rows.size * width])
    # Values past the lengths may overflow or be 0 / 0; they are never read.
    with _unbuffered(), np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        epsilons = buffers.epsilon[: p.size].reshape(p.shape)
        _smooth(windows, candidates.p_correction[block], out=p, epsilons=epsilons)
        p[:, 1] = candidates.p_first[block]
        p[rows, lengths] = candidates.p_last[block]
        _expand(candidates.q_values[block], candidates.merged[block], q)

        # Normalised (onnxruntime divides each element by the float32 sum), then KL = sum(p·log(p / q)).
        pq[:, 0] = 0
        sums_space = buffers.pq[: pq.size + 1]
        pq /= np.add.reduceat(sums_space, segments)[::2, None]
        np.divide(p, q, out=q)
        np.log(q, out=q)
        q *= p
        q[:, 0] = 0
        return np.add.reduceat(sums_space, segments[2 * rows.size :])[::2]


def _estimates(
    tables: _Tables, candidates: _Candidates, num_quantized_bins: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per candidate, its KL computed from real-valued p and q, and a bound on how far onnxruntime's
    float32 KL is from it (see the module's note); inf bounds where the screen does not apply.

    The real p is count + correction (or epsilon) inside the window and its end bins' float32 values;
    the real q is q's float32 values. With totals P = Σp and T = Σq, KL = (Σp·log p - Σp·log q) / P -
    log P + log T. q is constant over each merged bin j (q_j): Σp·log q is Σ_j log q_j · (p's sum over bin j),
    from prefix sums. Σp·log p over the window's inner bins is Σ g(c + r) for the correction r and
    g(x) = x·log x: g(c) + r·g'(c) + r²/2·g''(c) summed from prefix sums, plus a remainder of at most
    |r|³ / (6·(1 - |r|)²) per non-zero count (the third derivative of g is -1/x², and x >= 1 - |r|).
    """
    histogram, prefix, nonzero_prefix = tables.histogram, tables.prefix, tables.nonzero_prefix
    starts, lengths, merged = candidates.starts, candidates.lengths, candidates.merged
    ends = starts + lengths
    tail_starts = starts + num_quantized_bins * merged
    epsilon = float(np.float32(_SMOOTHING_EPSILON))
    correction = candidates.p_correction.astype(np.float64)

    def p_sum(first: np.ndarray, end: np.ndarray) -> np.ndarray:
        """p's sum over window bins [first, end) as inner bins: count + correction, or epsilon for a zero."""
        nonzeros = nonzero_prefix[end] - nonzero_prefix[first]
        return (prefix[end] - prefix[first]) + (correction - epsilon) * nonzeros + epsilon * (end - first)

    # What p's end bins add to their merged bins (the first's is 0; the last's Q - 1, or the tail).
    first_bin, last_bin = histogram[starts], histogram[ends - 1]
    first_extra = candidates.p_first - np.where(first_bin == 0, epsilon, first_bin + correction)
    last_extra = candidates.p_last - np.where(last_bin == 0, epsilon, last_bin + correction)
    p_total = p_sum(starts, ends) + first_extra + last_extra
    q_total = merged * candidates.q_values[:, :-1].sum(axis=1, dtype=np.float64) + epsilon * (
        lengths - num_quantized_bins * merged
    )
    # Σ_j log q_j · (p's sum over merged bin j): row dot products per merged size with strided views of
    # the count sums and non-zero counts of every run of that many bins (as inner bins, like p_sum).
    log_q = np.log(candidates.q_values[:, :-1], dtype=np.float64)
    p_log_q = np.log(epsilon) * p_sum(tail_starts, ends) + epsilon * merged * log_q.sum(axis=1)
    for size, group in _runs(merged):
        if size == 0:
            continue  # all of q is the tail's: onnxruntime cannot smooth it (not ok)
        views = _run_view(tables.runs(size).astype(np.float64), size, starts[group], num_quantized_bins)
        sums, nonzeros = np.einsum("ij,kij->ki", log_q[group], views)
        p_log_q[group] += sums + (correction[group] - epsilon) * nonzeros
    tail_log_q = np.where(tail_starts == ends, log_q[:, -1], np.log(epsilon))
    p_log_q += first_extra * log_q[:, 0] + last_extra * tail_log_q
    with np.errstate(divide="ignore", invalid="ignore"):
        # Σ g(p) over the inner bins (s, e - 1) and the two end bins.
        nonzero = histogram != 0
        logs = np.log(np.where(nonzero, histogram, 1).astype(np.float64))
        # Prefix sums over the non-zero counts c of g(c), g'(c) and g''(c).
        g_prefix, slope_prefix, curvature_prefix = (
            _prefix(np.where(nonzero, term, 0.0), np.float64)
            for term in (histogram * logs, logs + 1.0, 1.0 / np.maximum(histogram, 1))
        )
        inner = (starts + 1, ends - 1)
        inner_nonzeros = nonzero_prefix[inner[1]] - nonzero_prefix[inner[0]]
        inner_zeros = lengths - 2 - inner_nonzeros
        p_log_p = (
            g_prefix[inner[1]]
            - g_prefix[inner[0]]
            + correction * (slope_prefix[inner[1]] - slope_prefix[inner[0]])
            + correction**2 / 2 * (curvature_prefix[inner[1]] - curvature_prefix[inner[0]])
            + inner_zeros * (epsilon * np.log(epsilon))
        )
        for end in (candidates.p_first, candidates.p_last):
            p_log_p += end * np.log(end, dtype=np.float64)
        estimates = (p_log_p - p_log_q) / p_total - np.log(p_total) + np.log(q_total)
        entropy = np.log(p_total) - p_log_p / p_total

        # The screen's own error: the Taylor remainder, and float64 rounding. Each sum above has at most
        # num_bins + Q + 2 terms below 44·P (counts below 2**63, so logs below 44): its rounding is below
        # (num_bins + Q + 2)·2**-53·44 in KL units, and (num_bins + Q + 8)·2**-40 covers 180 such sums at
        # any size (the + 8 for histograms of fewer than 59 bins). The C screen's logarithms of q (within
        # 1e-15·(|log q| + 1)), weighted by at most 3·P in all, add below 3·45·1e-15 < 2**-42 in KL units,
        # which the same + 8 covers 32 times.
        magnitude = np.abs(correction)
        remainder = magnitude**3 / (6 * (1 - magnitude) ** 2) * inner_nonzeros / p_total
        screen = remainder + (histogram.size + num_quantized_bins + 8) * 2.0**-40
        weighted = 2 * (entropy + screen) + estimates + screen  # bounds Σ p·|log(p / q)|
        depth = _pairwise_depth(int(lengths.max()) + 1)
        error_bounds = 2 * 2.0**-24 * ((2 * depth + 14) * weighted + 2 * depth + 11) + screen
    # The expansion and the error analysis assume corrections above -1/2 (the remainder grows as the
    # correction nears -1), windows of two bins or more; the other conditions hold wherever onnxruntime
    # could smooth (ok) and only guard the arithmetic.
    applies = (
        candidates.ok
        & (magnitude <= 0.5)
        & (lengths >= 2)
        & (merged >= 1)
        & (candidates.q_values.min(axis=1) > 0)
        & (candidates.p_first > 0)
        & (candidates.p_last > 0)
        & np.isfinite(estimates)
        & np.isfinite(error_bounds)
    )
    return np.where(applies, estimates, 0.0), np.where(applies, error_bounds, np.inf)


def _pairwise_depth(length: int) -> int:
    """At least the additions on any path of numpy's pairwise sum of `length` elements, plus one: within a
    block of 128, eight accumulators of up to 16 elements (15 additions), their
    three-level combination and up to seven leftovers; one level per halving above, and one spare (the
    halves are rounded to multiples of 8, so the larger may need one more halving)."""
    halvings = max(0, math.ceil(math.log2(max(length, 1) / 128)))
    return 25 + 1 + halvings + 1


@contextlib.contextmanager
def _unbuffered() -> Iterator[None]:
    """numpy's smallest ufunc buffer, restored after (numpy 1.x's errstate does not restore it)."""
    previous = np.setbufsize(_UNBUFFERED)
    try:
        yield
    finally:
        np.setbufsize(previous)


def _quotient(sums: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """onnxruntime's q value of a merged bin: trunc(sum / norm) in float64, 0 where the norm is 0."""
    return np.where(norms != 0, np.trunc(sums / np.maximum(norms, 1)), 0.0)


def _runs(merged: np.ndarray) -> list[tuple[int, slice]]:
    """(merged size, rows) of each run of rows with one merged size (it grows with the row)."""
    edges = [0, *(np.flatnonzero(np.diff(merged)) + 1).tolist(), merged.size]
    return [(int(merged[first]), slice(first, end)) for first, end in itertools.pairwise(edges)]


def _smooth(
    counts: np.ndarray, corrections: np.ndarray, out: np.ndarray, epsilons: np.ndarray | None = None
) -> None:
    """onnxruntime's smoothing of float32 counts, one correction per row: count + correction, or
    epsilon for a zero count. `epsilons` (an array of them shaped as `out`) only saves time."""
    np.add(counts, corrections[:, None], out=out)
    np.maximum(out, np.float32(_SMOOTHING_EPSILON) if epsilons is None else epsilons, out=out)
    unsafe = np.float32(1) + corrections < np.float32(_SMOOTHING_EPSILON)  # 10^4 zeros per non-zero
    if unsafe.any():
        out[unsafe] = np.where(
            counts[unsafe] == 0, np.float32(_SMOOTHING_EPSILON), counts[unsafe] + corrections[unsafe, None]
        )


def _smoothed(counts: np.ndarray, corrections: np.ndarray) -> np.ndarray:
    """`_smooth` of one int64 count per row (converted to float32 as onnxruntime's astype does)."""
    return np.where(counts == 0, np.float32(_SMOOTHING_EPSILON), counts.astype(np.float32) + corrections)


def _expand(values: np.ndarray, merged: np.ndarray, out: np.ndarray) -> None:
    """Row r of `out` from column 1: values[r, j] repeated merged[r] times for each merged bin j, then
    values[r, -1] (the tail's) to the end. Column 0 gets any of the row's values."""
    num_quantized_bins = values.shape[1] - 1
    for size, rows in _runs(merged):
        # The fastest of numpy's ways for each size (measured): take for 2..4, repeat for 5..7, and a
        # broadcast copy from 8 (no temporary; its inner loops are long enough by then).
        if 2 <= size <= 4:
            columns = _expansion(num_quantized_bins, size, out.shape[1])
            np.take(values[rows], columns, axis=1, out=out[rows], mode="clip")
            continue
        main = num_quantized_bins * size
        count = rows.stop - rows.start
        if size >= 8:
            out[rows, 1 : main + 1].reshape(count, num_quantized_bins, size)[...] = values[rows, :-1, None]
        else:
            out[rows, 1 : main + 1] = (
                values[rows, :-1] if size == 1 else np.repeat(values[rows, :-1], size, axis=1)
            )
        out[rows, main + 1 :] = values[rows, -1:]


@functools.lru_cache(maxsize=64)
def _expansion(num_quantized_bins: int, merged: int, width: int) -> np.ndarray:
    """The merged bin read by each column of `_expand`'s rows (num_quantized_bins: the tail)."""
    positions = np.maximum(np.arange(width) - 1, 0)
    return (
        np.minimum(positions // merged, num_quantized_bins) if merged else np.full(width, num_quantized_bins)
    )


def _correction(zeros: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """onnxruntime's smoothing of non-zero entries, per row: float32(-1e-4 · zeros / non-zeros).

    The quotient is float64 as in Python; zeros become float32(1e-4) separately. Added to float32
    counts this is `smooth_distribution` exactly.
    """
    nonzeros = np.maximum(lengths - zeros, 1).astype(np.float64)
    return (-((_SMOOTHING_EPSILON * zeros.astype(np.float64)) / nonzeros)).astype(np.float32)
