"""TensorRT-style KL-divergence threshold search on a histogram, as onnxruntime's Entropy calibrator does it.

NOTE: the result equals onnxruntime's `HistogramCollector.get_entropy_threshold` bit for bit on the same
histogram (tests/calibrate/test_methods.py runs it): the KL curve is flat near its minimum, so
neighbouring candidates often differ in the last float32 bits and any change of arithmetic moves the
pick. Everything is vectorised over blocks of candidates, one row each, with onnxruntime's dtypes and
operation order. Its three float32 `np.sum`s per candidate use numpy's pairwise summation, whose blocks
depend on the length (zero padding would change the rounding); one `np.add.reduceat` call sums every
row of a block at once in that order: reduceat adds a segment's first element to numpy's pairwise sum
of the rest, so each row starts with a 0.0 column and its segment is [0.0, row...] (the columns past
the row's length form segments of their own, ignored). tests/calibrate/test_entropy_speed.py checks
this against `np.sum` for every length up to 4200 (and a few longer) on the installed numpy.

The algorithm (reference §2.3), for `nb` bins, zero bin `z = nb // 2`, `Q` quantized bins, `h = Q // 2`,
candidates `i = h .. z`:
- window `[z - i, min(z + i + 1, nb))`; `p` = the window with the outside counts added to its end bins;
- `m = len(window) // Q`; quantized bin `j < Q` sums window bins `[j·m, (j+1)·m)` (without outliers),
  the last one also the tail `[Q·m, len)`; `q` spreads each quantized bin's sum over its `m` positions
  as `trunc(sum / nonzero count of p there)` (0 where that count is 0, and over the tail);
- p and q smoothed (zeros become 1e-4, non-zeros lose 1e-4·zeros/non-zeros), normalised, and
  `KL(p‖q)` in float32; the lowest KL wins (the first on ties), its window's edges clipped to the
  observed [min, max] are the range.
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.lib.stride_tricks import as_strided

_SMOOTHING_EPSILON = 1e-4
# Candidates per vectorised block: 128 rows of p and 128 of q, up to ~2048 float32 each, fit in L2.
_CANDIDATE_BLOCK = 128
# numpy's smallest ufunc buffer: with its default 8192, numpy copies each row's broadcast value (a
# row sum, a correction) to lengthen rows shorter than that, which doubles the cost of those operations.
_UNBUFFERED = 16


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
    divergences = kl_divergences(counts, num_quantized_bins)
    best = int(np.argmin(divergences))
    num_bins = len(counts)
    zero_bin = num_bins // 2
    half_window = num_quantized_bins // 2 + best
    low = float(edges[zero_bin - half_window])
    high = float(edges[min(zero_bin + half_window + 1, num_bins)])
    return max(low, float(minimum)), min(high, float(maximum))


def kl_divergences(counts: np.ndarray, num_quantized_bins: int) -> np.ndarray:
    """The KL divergence (float32 values in a float64 array) of each candidate window, narrowest first."""
    histogram = np.asarray(counts, dtype=np.int64)
    num_bins = histogram.size
    zero_bin = num_bins // 2
    half_quantized = num_quantized_bins // 2
    if num_quantized_bins < 1 or half_quantized > zero_bin:
        raise ValueError(
            f"the entropy search needs 1 <= num_quantized_bins <= num_bins ({num_bins}), "
            f"got {num_quantized_bins}"
        )
    tables = _Tables(histogram)
    half_windows = np.arange(half_quantized, zero_bin + 1)
    divergences = np.empty(half_windows.size, dtype=np.float64)
    buffers = _Buffers(min(half_windows.size, _CANDIDATE_BLOCK), num_bins + 1)
    for first in range(0, half_windows.size, _CANDIDATE_BLOCK):
        block = half_windows[first : first + _CANDIDATE_BLOCK]
        divergences[first : first + block.size] = _block_divergences(
            tables, block, num_quantized_bins, buffers
        )
    return divergences


class _Tables:
    """Per-histogram lookups shared by every block: prefix sums of counts, of non-zero and zero bins, and
    windows of the counts as float32 (onnxruntime's astype(float32)): row s of `windows` starts at bin
    s - 1 (a zero before bin 0), and zeros follow the last bin, so any row can read `num_bins + 1`."""

    def __init__(self, histogram: np.ndarray) -> None:
        self.histogram = histogram
        self.prefix = _prefix(histogram)
        self.nonzero_prefix = _prefix(histogram != 0)
        self.zero_prefix = _prefix(histogram == 0)
        padded = np.zeros(2 * histogram.size + 2, dtype=np.float32)
        padded[1 : histogram.size + 1] = histogram
        self.windows = as_strided(padded, (histogram.size + 1, histogram.size + 1), 2 * padded.strides)


class _Buffers:
    """float32 space every block reuses (fresh arrays would cost page faults each time): p's rows above
    q's in one buffer, so that one reduceat and one division serve both, and a row of epsilons."""

    def __init__(self, num_rows: int, width: int) -> None:
        self.pq = np.empty(2 * num_rows * width + 1, dtype=np.float32)  # + 1: reduceat's last index
        self.epsilon = np.full(num_rows * width, np.float32(_SMOOTHING_EPSILON))


def _prefix(values: np.ndarray) -> np.ndarray:
    prefix = np.zeros(values.size + 1, dtype=np.int64)
    np.cumsum(values, out=prefix[1:])
    return prefix


def _block_divergences(
    tables: _Tables, half_windows: np.ndarray, num_quantized_bins: int, buffers: _Buffers
) -> np.ndarray:
    """KL of each candidate of one block (consecutive half windows). Row r holds 0.0 then its candidate's
    `lengths[r]` values; past that it holds values that only the ignored reduceat segments read."""
    histogram, prefix = tables.histogram, tables.prefix
    num_bins = histogram.size
    zero_bin = num_bins // 2
    rows = np.arange(half_windows.size)
    starts = zero_bin - half_windows
    ends = np.minimum(zero_bin + half_windows + 1, num_bins)
    lengths = ends - starts
    width = int(lengths.max()) + 1
    has_last = lengths > 1  # p's last bin is another bin than its first

    # p's end bins with the outside counts folded in (int64 as onnxruntime), and p's zero count.
    first_bin = histogram[starts] + prefix[starts]
    last_bin = np.where(has_last, histogram[ends - 1], first_bin) + (prefix[-1] - prefix[ends])
    # Whether folding the outliers made p's end bins non-zero (a one-bin window holds both folds).
    first_changed = (np.where(has_last, first_bin, last_bin) == 0).astype(np.int64) - (histogram[starts] == 0)
    last_changed = np.where(has_last, (last_bin == 0).astype(np.int64) - (histogram[ends - 1] == 0), 0)
    p_zeros = tables.zero_prefix[ends] - tables.zero_prefix[starts] + first_changed + last_changed

    # Quantized bins from the window without outliers (the last one also sums the tail up to the end);
    # non-zero counts of p per merged bin (the histogram's, corrected where the outliers changed p's
    # end bins: the first is in merged bin 0, the last in bin Q - 1 when there is no tail).
    merged = lengths // num_quantized_bins
    boundaries = starts[:, None] + np.arange(num_quantized_bins + 1) * merged[:, None]
    norms = np.diff(tables.nonzero_prefix.take(boundaries), axis=1)
    boundaries[:, -1] = ends
    sums = np.diff(prefix.take(boundaries), axis=1)
    norms[:, 0] -= first_changed
    norms[:, -1] -= np.where(lengths == num_quantized_bins * merged, last_changed, 0)
    # onnxruntime assigns `sum / norm` (float64) into an int64 array (truncation toward zero) where the
    # norm is not 0; a zero norm means zero counts, hence a zero sum, except in the last bin (its tail).
    spread = np.trunc(sums / np.maximum(norms, 1))
    spread[:, -1] *= norms[:, -1] != 0
    spread_zeros = spread == 0
    q_zeros = np.count_nonzero(spread_zeros, axis=1) * merged + (lengths - num_quantized_bins * merged)

    # Smoothing: count + correction where the count is non-zero, epsilon where it is zero, computed as
    # max(count + correction, epsilon) since a count of 1 or more stays above epsilon (checked per row).
    # q has one value per merged bin (each repeated `merged` times), then epsilon for the tail.
    epsilon = np.float32(_SMOOTHING_EPSILON)
    p_correction = _correction(p_zeros, lengths)
    q_values = np.full((rows.size, num_quantized_bins + 1), epsilon)
    _smooth(spread.astype(np.float32), _correction(q_zeros, lengths), out=q_values[:, :-1])
    windows = tables.windows[starts[-1] : starts[0] + 1, :width][::-1]  # column c: window bin c - 1
    pq = buffers.pq[: 2 * rows.size * width].reshape(2 * rows.size, width)
    p, q = pq[: rows.size], pq[rows.size :]
    # Row r's segment is [r·width, r·width + lengths[r] + 1); the rest of the row is a segment of its own.
    segments = np.stack([rows * width, rows * width + lengths + 1], axis=1).ravel()
    segments = np.concatenate([segments, segments + rows.size * width])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # values past the lengths
        np.setbufsize(_UNBUFFERED)
        _smooth(windows, p_correction, out=p, epsilons=buffers.epsilon[: p.size].reshape(p.shape))
        p[:, 1] = _smoothed(first_bin, p_correction)
        p[rows, lengths] = _smoothed(last_bin, p_correction)
        _expand(q_values, merged, q)

        # Normalised (onnxruntime divides each element by the float32 sum), then KL = sum(p·log(p / q)).
        pq[:, 0] = 0
        sums_space = buffers.pq[: pq.size + 1]
        pq /= np.add.reduceat(sums_space, segments)[::2, None]
        np.divide(p, q, out=q)
        np.log(q, out=q)
        q *= p
        q[:, 0] = 0
        kl = np.add.reduceat(sums_space, segments[2 * rows.size :])[::2]
    divergences = np.full(half_windows.size, np.inf)
    ok = (p_zeros < lengths) & (q_zeros < lengths)  # smoothing fails on an all-zero distribution
    divergences[ok] = kl[ok]
    return divergences


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
    first = 0
    sizes, counts = np.unique(merged, return_counts=True)
    for size, count in zip(sizes.tolist(), counts.tolist(), strict=True):
        rows = slice(first, first + count)  # merged grows with the row
        first += count
        if size < 8:  # a broadcast copy of so few elements at a time is slower than take
            np.take(
                values[rows],
                _expansion(num_quantized_bins, size, out.shape[1]),
                axis=1,
                out=out[rows],
                mode="clip",
            )
            continue
        main = num_quantized_bins * size
        out[rows, 1 : main + 1].reshape(count, num_quantized_bins, size)[...] = values[rows, :-1, None]
        out[rows, main + 1 :] = values[rows, -1:]
        out[rows, 0] = 0


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
