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
    """The KL divergence (float32 values in a float64 array) of each candidate window, smallest first."""
    histogram = np.asarray(counts, dtype=np.int64)
    num_bins = histogram.size
    zero_bin = num_bins // 2
    half_quantized = num_quantized_bins // 2
    if num_quantized_bins < 1 or half_quantized > zero_bin:
        raise ValueError(
            f"the entropy search needs 1 <= num_quantized_bins <= num_bins ({num_bins}), "
            f"got {num_quantized_bins}"
        )
    prefix = np.zeros(num_bins + 1, dtype=np.int64)
    np.cumsum(histogram, out=prefix[1:])
    half_windows = np.arange(half_quantized, zero_bin + 1)
    divergences = np.empty(half_windows.size, dtype=np.float64)
    for first in range(0, half_windows.size, _CANDIDATE_BLOCK):
        block = half_windows[first : first + _CANDIDATE_BLOCK]
        divergences[first : first + block.size] = _block_divergences(
            histogram, prefix, block, num_quantized_bins
        )
    return divergences


def _block_divergences(
    histogram: np.ndarray, prefix: np.ndarray, half_windows: np.ndarray, num_quantized_bins: int
) -> np.ndarray:
    num_bins = histogram.size
    zero_bin = num_bins // 2
    rows = np.arange(half_windows.size)
    starts = zero_bin - half_windows
    ends = np.minimum(zero_bin + half_windows + 1, num_bins)
    lengths = ends - starts
    width = int(lengths.max())
    positions = np.arange(width)
    valid = positions[None, :] < lengths[:, None]

    # p: the window (zero-padded past its length) with the outside counts folded into its end bins.
    p = np.where(valid, histogram[np.minimum(starts[:, None] + positions[None, :], num_bins - 1)], 0)
    p[:, 0] += prefix[starts]
    p[rows, lengths - 1] += prefix[-1] - prefix[ends]

    # Quantized bins from the window without outliers, each spread over its merged bins.
    merged = lengths // num_quantized_bins
    boundaries = np.arange(num_quantized_bins + 1)[None, :] * merged[:, None]
    sums = prefix[starts[:, None] + boundaries[:, 1:]] - prefix[starts[:, None] + boundaries[:, :-1]]
    sums[:, -1] += prefix[ends] - prefix[starts + boundaries[:, -1]]
    # Non-zero counts of p per merged bin: the histogram's, corrected where outliers changed p's end bins.
    nonzero_prefix = np.zeros(num_bins + 1, dtype=np.int64)
    np.cumsum(histogram != 0, out=nonzero_prefix[1:])
    norms = (
        nonzero_prefix[starts[:, None] + boundaries[:, 1:]]
        - nonzero_prefix[starts[:, None] + boundaries[:, :-1]]
    )
    norms[:, 0] += (p[:, 0] != 0).astype(np.int64) - (histogram[starts] != 0)
    last = lengths - 1
    last_chunk = last // merged
    fix = (last > 0) & (last < boundaries[:, -1])
    np.add.at(
        norms,
        (rows[fix], last_chunk[fix]),
        (p[rows[fix], last[fix]] != 0).astype(np.int64) - (histogram[ends[fix] - 1] != 0),
    )
    # onnxruntime assigns `sum / norm` (float64) into an int64 array: truncation toward zero.
    spread = np.where(norms != 0, np.trunc(sums / np.maximum(norms, 1)), 0.0).astype(np.int64)
    quantized_index = np.minimum(positions[None, :] // merged[:, None], num_quantized_bins - 1)
    in_merged = positions[None, :] < boundaries[:, -1:]
    q = np.where(in_merged, np.take_along_axis(spread, quantized_index, axis=1), 0)

    p_smooth, p_ok = _smooth(p, valid, lengths)
    q_smooth, q_ok = _smooth(q, valid, lengths)
    divergences = np.full(half_windows.size, np.inf)
    p_total = _row_sums(p_smooth, lengths)
    q_total = _row_sums(q_smooth, lengths)
    with np.errstate(divide="ignore", invalid="ignore"):
        p_normal = p_smooth / p_total[:, None]
        q_normal = q_smooth / q_total[:, None]
        terms = p_normal * np.log(p_normal / q_normal)
    kl = _row_sums(terms, lengths)
    ok = p_ok & q_ok
    divergences[ok] = kl[ok]
    return divergences


def _smooth(counts: np.ndarray, valid: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """onnxruntime's `smooth_distribution` per row (float32), and whether each row had a non-zero.

    Zeros become float32(1e-4); non-zeros `float32(count) + float32(-1e-4 · zeros / non-zeros)`, the
    per-row correction computed in float64 as Python does. Padding past a row's length is left 0.
    """
    is_zero = (counts == 0) & valid
    zeros = is_zero.sum(axis=1)
    nonzeros = lengths - zeros
    correction = (_SMOOTHING_EPSILON * zeros.astype(np.float64)) / np.maximum(nonzeros, 1).astype(np.float64)
    smoothed = counts.astype(np.float32) + (-correction).astype(np.float32)[:, None]
    smoothed = np.where(is_zero, np.float32(_SMOOTHING_EPSILON), smoothed)
    smoothed[~valid] = 0
    return smoothed, nonzeros > 0


def _row_sums(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """float32 `np.sum` of each row's first `length` elements: numpy's pairwise order for that length."""
    return np.array(
        [np.add.reduce(row[:length]) for row, length in zip(values, lengths, strict=True)], np.float32
    )
