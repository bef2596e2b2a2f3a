"""TensorRT-style KL-divergence threshold search on a histogram, as onnxruntime's Entropy calibrator does it.

NOTE: the result equals onnxruntime's `HistogramCollector.get_entropy_threshold` bit for bit on the same
histogram (tests/calibrate/test_methods.py runs it): the KL curve is flat near its minimum, so
neighbouring candidates often differ in the last float32 bits and any change of arithmetic moves the
pick. Everything element-wise (outlier folding, merged bins, smoothing, normalisation, log) is
vectorised over blocks of candidates with onnxruntime's dtypes and operation order; only the three
float32 sums per candidate run one row at a time through `np.sum` on a contiguous slice of the row's
true length, because numpy's pairwise summation blocks depend on the length (zero padding would
change the rounding).

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

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

_SMOOTHING_EPSILON = 1e-4
# Candidates per vectorised block: 128 rows x 2048 bins of float32 keeps temporaries near 1 MiB each.
_CANDIDATE_BLOCK = 128


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
    for first in range(0, half_windows.size, _CANDIDATE_BLOCK):
        block = half_windows[first : first + _CANDIDATE_BLOCK]
        divergences[first : first + block.size] = _block_divergences(tables, block, num_quantized_bins)
    return divergences


class _Tables:
    """Per-histogram lookups shared by every block: prefix sums of counts, of non-zero and zero bins, and
    the counts as float32 (onnxruntime's astype(float32)), zero-padded so any window can read `num_bins`."""

    def __init__(self, histogram: np.ndarray) -> None:
        self.histogram = histogram
        self.prefix = _prefix(histogram)
        self.nonzero_prefix = _prefix(histogram != 0)
        self.zero_prefix = _prefix(histogram == 0)
        self.padded = np.zeros(2 * histogram.size, dtype=np.float32)
        self.padded[: histogram.size] = histogram


def _prefix(values: np.ndarray) -> np.ndarray:
    prefix = np.zeros(values.size + 1, dtype=np.int64)
    np.cumsum(values, out=prefix[1:])
    return prefix


def _block_divergences(tables: _Tables, half_windows: np.ndarray, num_quantized_bins: int) -> np.ndarray:
    """KL of each candidate of one block. Rows are `width` wide; past a row's length they hold garbage
    that nothing reads (counts are taken from prefix sums, row sums stop at the length)."""
    histogram, prefix = tables.histogram, tables.prefix
    num_bins = histogram.size
    zero_bin = num_bins // 2
    rows = np.arange(half_windows.size)
    starts = zero_bin - half_windows
    ends = np.minimum(zero_bin + half_windows + 1, num_bins)
    lengths = ends - starts
    width = int(lengths.max())
    has_last = lengths > 1  # p's last bin is another bin than its first

    # p: the window with the outside counts folded into its end bins (int64, then float32 as onnxruntime).
    p = sliding_window_view(tables.padded, width)[starts]
    first_bin = histogram[starts] + prefix[starts]
    last_bin = np.where(has_last, histogram[ends - 1], first_bin) + (prefix[-1] - prefix[ends])
    p[:, 0] = first_bin
    p[rows, lengths - 1] = last_bin
    # Whether folding the outliers made p's end bins non-zero (a one-bin window holds both folds).
    first_changed = (np.where(has_last, first_bin, last_bin) == 0).astype(np.int64) - (histogram[starts] == 0)
    last_changed = np.where(has_last, (last_bin == 0).astype(np.int64) - (histogram[ends - 1] == 0), 0)
    p_zeros = tables.zero_prefix[ends] - tables.zero_prefix[starts] + first_changed + last_changed

    # Quantized bins from the window without outliers; non-zero counts of p per merged bin (the
    # histogram's, corrected where the outliers changed p's end bins).
    merged = lengths // num_quantized_bins
    boundaries = starts[:, None] + np.arange(num_quantized_bins + 1)[None, :] * merged[:, None]
    sums = prefix[boundaries[:, 1:]] - prefix[boundaries[:, :-1]]
    sums[:, -1] += prefix[ends] - prefix[boundaries[:, -1]]
    norms = tables.nonzero_prefix[boundaries[:, 1:]] - tables.nonzero_prefix[boundaries[:, :-1]]
    norms[:, 0] -= first_changed
    last = lengths - 1
    fix = has_last & (last < boundaries[:, -1] - starts)
    np.add.at(norms, (rows[fix], last[fix] // merged[fix]), -last_changed[fix])
    # onnxruntime assigns `sum / norm` (float64) into an int64 array: truncation toward zero. Each
    # merged bin's value fills `merged` positions of q; the tail past num_quantized_bins·merged stays 0.
    spread = np.where(norms != 0, np.trunc(sums / np.maximum(norms, 1)), 0.0).astype(np.int64)
    spread_zeros = spread == 0
    q_zeros = spread_zeros.sum(axis=1) * merged + (lengths - num_quantized_bins * merged)

    # Smoothing (q's at merged-bin level: every position of a merged bin holds the same value).
    epsilon = np.float32(_SMOOTHING_EPSILON)
    p_smooth = p + _correction(p_zeros, lengths)[:, None]
    np.copyto(p_smooth, epsilon, where=p == 0)
    spread_smooth = spread.astype(np.float32) + _correction(q_zeros, lengths)[:, None]
    np.copyto(spread_smooth, epsilon, where=spread_zeros)
    q_smooth = np.full_like(p_smooth, epsilon)
    for size in np.unique(merged):
        same = merged == size
        q_smooth[same, : num_quantized_bins * size] = np.repeat(spread_smooth[same], size, axis=1)

    p_smooth /= _row_sums(p_smooth, lengths)[:, None]
    q_smooth /= _row_sums(q_smooth, lengths)[:, None]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # garbage past the lengths
        terms = p_smooth / q_smooth
        np.log(terms, out=terms)
        terms *= p_smooth
    divergences = np.full(half_windows.size, np.inf)
    ok = (p_zeros < lengths) & (q_zeros < lengths)  # smoothing fails on an all-zero distribution
    divergences[ok] = _row_sums(terms, lengths)[ok]
    return divergences


def _correction(zeros: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """onnxruntime's smoothing of non-zero entries, per row: float32(-1e-4 · zeros / non-zeros).

    The quotient is float64 as in Python; zeros become float32(1e-4) separately. Added to float32
    counts this is `smooth_distribution` exactly.
    """
    nonzeros = np.maximum(lengths - zeros, 1).astype(np.float64)
    return (-((_SMOOTHING_EPSILON * zeros.astype(np.float64)) / nonzeros)).astype(np.float32)


def _row_sums(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """float32 `np.sum` of each row's first `length` elements: numpy's pairwise order for that length."""
    return np.array(
        [np.add.reduce(row[:length]) for row, length in zip(values, lengths, strict=True)], np.float32
    )
