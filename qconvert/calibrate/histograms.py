"""The histogram a calibration method binned for a tensor, in the compact form `calibrate --json` writes.

The histogram methods (percentile, entropy, mse, distribution) hold each tensor's counts in uniform bins
(`HistogramObserver`, `AlignedHistogramObserver`); the report (qconvert/report) draws them beside the
chosen range. The JSON keeps the span of non-empty bins, merged into at most `EXPORTED_BINS` bins, so a
65536-bin histogram of hundreds of tensors stays a few kilobytes each. Counts are exact sums of the
observer's bins; only the bin width grows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

EXPORTED_BINS = 128


def exported_histogram(observers: Iterable[object]) -> dict[str, object] | None:
    """The first histogram among a tensor's observers as `{"start", "width", "counts", "absolute"}`
    (bin i covers [start + i·width, start + (i+1)·width); `absolute`: the counts are of |x|), or None
    when no observer holds one (minmax, moving-average) or it counted nothing."""
    for observer in observers:
        counts = getattr(observer, "counts", None)
        if not isinstance(counts, np.ndarray) or counts.size == 0 or not counts.any():
            continue
        edges = np.asarray(observer.edges, dtype=np.float64)  # type: ignore[attr-defined]
        if edges.size != counts.size + 1:
            continue
        nonzero = np.flatnonzero(counts)
        first, last = int(nonzero[0]), int(nonzero[-1]) + 1
        factor = max(1, math.ceil((last - first) / EXPORTED_BINS))
        span = counts[first:last]
        padded = np.zeros(math.ceil(span.size / factor) * factor, dtype=np.int64)
        padded[: span.size] = span
        width = float(edges[1] - edges[0]) * factor
        return {
            "start": float(edges[first]),
            "width": width,
            "counts": [int(c) for c in padded.reshape(-1, factor).sum(axis=1)],
            "absolute": bool(getattr(observer, "absolute", False)),
        }
    return None


__all__ = ["EXPORTED_BINS", "exported_histogram"]
