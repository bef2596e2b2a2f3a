"""Sentinel guard: find tensors whose calibrated range a sentinel would dominate, and decide what to do.

A sentinel is a value that stands for "ignore this position" rather than a magnitude: an additive attention
mask of float-min (-3.4e38, Hugging Face BERT exports), -10000 (older exports), ±Inf, NaN. A range that
includes one leaves no quantization levels for the real values (scores + float-min quantized to int8: every
real score lands on the zero point, attention turns uniform, and the model collapses).

Pass 1 runs a `MagnitudeObserver` on every tensor: counts per float32 (sign, binary exponent), i.e. per
octave, plus NaN counts and the exact min/max of the ordinary values. It is exact and mergeable by
addition, and costs one counting pass per batch (`counting.exponent_field_counts`). Histogram methods skip
it unless a tensor may be clipped: their aligned histograms give the same octaves
(`MagnitudeObserver.from_aligned`, exceptions there), which saves them that pass. `find_sentinels` reads
those counts; `apply_sentinel_policy` turns findings plus the user's policy and per-tensor overrides into
`keep_float` names (finalize leaves them in float) and clipped ranges, with one warning per tensor saying
why.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Self, TypeGuard

import numpy as np

from qconvert.calibrate.counting import FLOAT32_EXPONENT_FIELDS, exponent_field_counts
from qconvert.calibrate.observers import HUGE_EXPONENT, HUGE_MAGNITUDE, AlignedHistogramObserver
from qconvert.did_you_mean import did_you_mean
from qconvert.errors import InputError

MAGNITUDE_BINS = FLOAT32_EXPONENT_FIELDS  # counting.py: sign bit * 256 + biased exponent field
_SIGN = 256
_INF_FIELD = 255
_EXPONENT_BIAS = 127
_HUGE_FIELD = HUGE_EXPONENT + _EXPONENT_BIAS

# Isolated-cluster rule (a -10000 or -1000 padding mask added to scores of magnitude ~10): a group of values
# at most MAX_CLUSTER_OCTAVES octaves wide, separated from everything smaller by at least MIN_GAP_OCTAVES
# empty octaves (16x), above a bulk holding at least MIN_BULK_FRACTION of the nonzero values. With int8 and
# such a range the bulk would get at most 16 of the 256 levels (a -1000 mask over scores up to 16 leaves a
# 4-octave gap and cost a test attention model's output 6% of cosine). A genuine heavy tail (Laplace,
# Student-t, large dense activations) fills its octaves contiguously, so it has no such gap.
MIN_GAP_OCTAVES = 4
MAX_CLUSTER_OCTAVES = 3
MIN_BULK_FRACTION = 1e-3
# Masks against outliers. A sentinel cluster is a constant: at most MAX_SENTINEL_VALUES exact values (the mask
# itself), or one round constant C (±10**k, ±2**k, float16's max) plus values within the bulk's range (scores
# + -10000). Anything else isolated far above the bulk is the model's own massive activations (all-MiniLM's
# channel 99 at [CLS], 16 different values around 192): quantized with their range and reported as outliers.
MAX_SENTINEL_VALUES = 4
MAX_NOTED_CHANNELS = 8
_ROUND_CONSTANTS = sorted(
    {10.0**k for k in range(1, 39)}
    | {2.0**k for k in range(4, 128)}
    | {65504.0, float(np.finfo(np.float32).max)}
)


def _bounded_union(
    a: frozenset[float] | None, b: frozenset[float] | None, limit: int
) -> frozenset[float] | None:
    """Union of two bounded sets; None stands for "more than `limit`" (so merge order cannot matter)."""
    if a is None or b is None:
        return None
    union = a | b
    return union if len(union) <= limit else None


class _FarOctave:
    """What one octave of a possible isolated cluster holds: signed min/max, distinct values and channels
    (last-axis indices), each set bounded (None: more than its limit). Merges by min/max/union."""

    __slots__ = ("minimum", "maximum", "values", "channels")

    def __init__(
        self,
        minimum: float,
        maximum: float,
        values: frozenset[float] | None,
        channels: frozenset[int] | None,
    ) -> None:
        self.minimum, self.maximum, self.values, self.channels = minimum, maximum, values, channels

    def merge(self, other: _FarOctave) -> None:
        self.minimum = min(self.minimum, other.minimum)
        self.maximum = max(self.maximum, other.maximum)
        self.values = _bounded_union(self.values, other.values, MAX_SENTINEL_VALUES)
        self.channels = _bounded_union(self.channels, other.channels, MAX_NOTED_CHANNELS)  # type: ignore[arg-type]


def _magnitude(counts: np.ndarray) -> np.ndarray:
    """Ordinary nonzero counts per magnitude octave (biased exponent field), both signs together."""
    magnitude = counts[:_HUGE_FIELD] + counts[_SIGN : _SIGN + _HUGE_FIELD]
    magnitude[0] = 0
    return magnitude


def _lowest_cluster_start(magnitude: np.ndarray) -> int | None:
    """The lowest occupied octave within MAX_CLUSTER_OCTAVES of the top with MIN_GAP_OCTAVES empty ones
    below it: where an isolated cluster could start. Adding values never lowers it (gaps only fill), and
    no value ever dropped for lying below it can belong to a cluster found later: so the far-octave state
    kept from it up is a function of the union of the values, whatever the batches and merge order."""
    occupied = np.flatnonzero(magnitude)
    if occupied.size == 0:
        return None
    top = int(occupied[-1])
    for start in range(max(top - MAX_CLUSTER_OCTAVES + 1, 1), top + 1):
        if magnitude[start] and not magnitude[max(start - MIN_GAP_OCTAVES, 0) : start].any():
            return start
    return None


class MagnitudeObserver:
    """Exact per-octave counts of one tensor (float32 view), NaN counts, and min/max of ordinary values.

    Ordinary = finite with |x| < 2**100. Everything is a sum, a min or a max, so merge == observing the union.
    Values of other float dtypes are cast to float32 first (float64 beyond float32's range becomes ±Inf).
    """

    def __init__(self) -> None:
        self.counts = np.zeros(MAGNITUDE_BINS, dtype=np.int64)  # NaN excluded
        self.nan_count = 0
        self.ordinary_min = math.inf
        self.ordinary_max = -math.inf
        self.minimum = math.inf  # of all non-NaN values, sentinels included (for messages)
        self.maximum = -math.inf
        # octave field -> what it holds, from `_lowest_cluster_start` up (masks against outliers)
        self.far: dict[int, _FarOctave] = {}
        self.value_tolerance = 0.0  # how far `far`'s min/max may be from the values (a bin, aligned view)

    def observe(self, values: np.ndarray) -> None:
        array = np.asarray(values)
        x = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
        if x.size == 0:
            return
        counts = exponent_field_counts(x)
        self._observe_far(x, counts, array.shape[-1] if array.ndim else 1)
        lo, hi = float(x.min()), float(x.max())
        special = counts[_INF_FIELD] + counts[_SIGN + _INF_FIELD]
        huge = counts[_HUGE_FIELD:_INF_FIELD].sum() + counts[_SIGN + _HUGE_FIELD : _SIGN + _INF_FIELD].sum()
        if special:
            nan = np.isnan(x)
            negative_nan = int(np.count_nonzero(nan & np.signbit(x)))
            nan_total = int(np.count_nonzero(nan))
            counts[_SIGN + _INF_FIELD] -= negative_nan
            counts[_INF_FIELD] -= nan_total - negative_nan
            self.nan_count += nan_total
            if nan_total:
                lo = float(np.min(x, where=~nan, initial=np.inf))
                hi = float(np.max(x, where=~nan, initial=-np.inf))
        self.minimum = min(self.minimum, lo)
        self.maximum = max(self.maximum, hi)
        if special or huge:
            # only batches that hold a sentinel pay for the masked reductions
            ordinary = np.abs(x) < HUGE_MAGNITUDE  # False for NaN and ±Inf
            if not ordinary.any():
                self.counts += counts
                return
            lo = float(np.min(x, where=ordinary, initial=np.inf))
            hi = float(np.max(x, where=ordinary, initial=-np.inf))
        self.counts += counts
        self.ordinary_min = min(self.ordinary_min, lo)
        self.ordinary_max = max(self.ordinary_max, hi)

    def _observe_far(self, x: np.ndarray, batch_counts: np.ndarray, channels: int) -> None:
        """Update `far` with this batch's values from the lowest possible cluster start up (one pass over
        the batch, only for tensors whose octaves leave such a gap: masks and massive activations)."""
        start = _lowest_cluster_start(_magnitude(self.counts + batch_counts))
        self._prune(start)
        if start is None or not _magnitude(batch_counts)[start:].any():
            return
        magnitude = np.abs(x)
        where = np.flatnonzero((magnitude >= math.ldexp(1.0, start - 127)) & (magnitude < HUGE_MAGNITUDE))
        picked = x[where]
        fields = picked.view(np.uint32) >> 23 & 0xFF
        for octave in np.unique(fields):
            inside = fields == octave
            chosen = picked[inside]
            distinct = np.unique(chosen[:4096])
            values = (
                frozenset(float(v) for v in np.unique(chosen))
                if distinct.size <= MAX_SENTINEL_VALUES
                else None
            )
            found_channels = np.unique(where[inside] % channels)
            update = _FarOctave(
                float(chosen.min()),
                float(chosen.max()),
                values if values is None or len(values) <= MAX_SENTINEL_VALUES else None,
                frozenset(int(c) for c in found_channels)
                if found_channels.size <= MAX_NOTED_CHANNELS
                else None,
            )
            if int(octave) in self.far:
                self.far[int(octave)].merge(update)
            else:
                self.far[int(octave)] = update

    def _prune(self, start: int | None) -> None:
        self.far = {} if start is None else {k: v for k, v in self.far.items() if k >= start}

    @classmethod
    def from_aligned(cls, histogram: AlignedHistogramObserver) -> Self:
        """The same view read off an aligned histogram, so histogram methods need no magnitude pass.

        Bins of width w = 2**e have edges at multiples of w, and so does every octave boundary 2**j with
        j >= e: a bin k >= 1 lies inside octave floor(log2 k) + e, a bin k <= -2 (x in [k·w, (k+1)·w),
        |x| in (m·w, (m+1)·w], m = -k-1) inside octave floor(log2 m) + e except x = -(m+1)·w exactly: a
        negative power of two is counted one octave low, which can move a gap's edge by one octave (the
        one way this view and the exact observer disagree on a finding). Bins 0 and -1 (0 < |x| <= w, zeros
        counted apart) go to the octave just below w. That lumping does not change the isolated-cluster
        rule when max_bins >= MIN_ALIGNED_BINS_FOR_OCTAVES: w is below 2·span / (max_bins - 1), so the
        lumped octave lies at least 8 octaves under a cluster of the top 3, and any gap it shortens stays
        wider than MIN_GAP_OCTAVES. The bulk range (for clipping) is coarser when the bulk lies within
        those two bins: `needs_magnitude_observer` keeps the exact observer for clipping.
        """
        view = cls()
        counts = view.counts
        if histogram.huge_counts is not None:
            counts += histogram.huge_counts
        counts[_INF_FIELD] += histogram.positive_inf_count
        counts[_SIGN + _INF_FIELD] += histogram.negative_inf_count
        counts[0] += histogram.zero_count
        nonzero = histogram.ordinary_count - histogram.zero_count
        constant = histogram.ordinary_minimum
        if histogram.exponent is None and constant is not None and nonzero:
            counts[int(np.float32(constant).view(np.uint32)) >> 23] += nonzero
        elif histogram.exponent is not None:
            bins = np.arange(histogram.first_bin, histogram.first_bin + histogram.counts.size)
            magnitude = np.where(bins >= 0, bins, -bins - 1)  # m: the bin's |x| is about m·w to (m+1)·w
            octave = np.frexp(np.maximum(magnitude, 1).astype(np.float64))[1] - 1  # floor(log2 m)
            octave[magnitude == 0] = -1  # below w
            field = np.clip(octave + histogram.exponent + _EXPONENT_BIAS, 0, _INF_FIELD - 1)
            field[bins < 0] += _SIGN
            bin_counts = histogram.counts.copy()
            if histogram.first_bin <= 0 < histogram.first_bin + bin_counts.size:
                bin_counts[-histogram.first_bin] -= histogram.zero_count  # zeros sit in bin 0
            np.add.at(counts, field, bin_counts)
        view.nan_count = histogram.nan_count
        if histogram.ordinary_minimum is not None and histogram.ordinary_maximum is not None:
            view.ordinary_min, view.ordinary_max = histogram.ordinary_minimum, histogram.ordinary_maximum
        if histogram.minimum is not None and histogram.maximum is not None:
            view.minimum, view.maximum = histogram.minimum, histogram.maximum
        if histogram.negative_inf_count:
            view.minimum = -math.inf
        if histogram.positive_inf_count:
            view.maximum = math.inf
        view._far_from_bins(histogram)
        return view

    def _far_from_bins(self, histogram: AlignedHistogramObserver) -> None:
        """`far` read off the bins: a bin stands for one value (so a cluster of a few bins counts as a
        constant, the guard's safe side), min/max are bin edges within `value_tolerance` (one bin)."""
        start = _lowest_cluster_start(_magnitude(self.counts))
        if start is None:
            return
        if histogram.exponent is None:  # one constant: the ordinary values are all equal
            constant = histogram.ordinary_minimum
            if constant is not None:
                field_ = int(np.float32(constant).view(np.uint32)) >> 23 & 0xFF
                self.far[field_] = _FarOctave(constant, constant, frozenset([float(constant)]), None)
            return
        width = math.ldexp(1.0, histogram.exponent)
        self.value_tolerance = width
        bins = np.arange(histogram.first_bin, histogram.first_bin + histogram.counts.size)
        lower = bins[histogram.counts > 0].astype(np.float64) * width
        far = lower[np.maximum(np.abs(lower), np.abs(lower + width)) > math.ldexp(1.0, start - 127)]
        if far.size:  # one entry for the whole far side: the bins do not tell octaves apart finely
            values = frozenset(float(v) for v in far) if far.size <= MAX_SENTINEL_VALUES else None
            self.far[start] = _FarOctave(float(far.min()), float(far.max() + width), values, None)

    def merge(self, other: Self) -> None:
        for octave, state in other.far.items():
            mine = self.far.get(octave)
            if mine is None:
                self.far[octave] = _FarOctave(state.minimum, state.maximum, state.values, state.channels)
            else:
                mine.merge(state)
        self.value_tolerance = max(self.value_tolerance, other.value_tolerance)
        self.counts += other.counts
        self.nan_count += other.nan_count
        self.ordinary_min = min(self.ordinary_min, other.ordinary_min)
        self.ordinary_max = max(self.ordinary_max, other.ordinary_max)
        self.minimum = min(self.minimum, other.minimum)
        self.maximum = max(self.maximum, other.maximum)
        self._prune(_lowest_cluster_start(_magnitude(self.counts)))

    # Views on the counts -----------------------------------------------------------------------------
    @property
    def total(self) -> int:
        return int(self.counts.sum()) + self.nan_count

    @property
    def positive_inf(self) -> int:
        return int(self.counts[_INF_FIELD])

    @property
    def negative_inf(self) -> int:
        return int(self.counts[_SIGN + _INF_FIELD])

    @property
    def huge_count(self) -> int:
        """Finite values with |x| >= 2**100."""
        c = self.counts
        return int(c[_HUGE_FIELD:_INF_FIELD].sum() + c[_SIGN + _HUGE_FIELD : _SIGN + _INF_FIELD].sum())

    def octave_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Counts of ordinary nonzero values per octave [2**(e-127), 2**(e-126)), e = 1.._HUGE_FIELD-1:
        (positive, negative), each indexed by the biased exponent e."""
        positive = self.counts[:_HUGE_FIELD].copy()
        negative = self.counts[_SIGN : _SIGN + _HUGE_FIELD].copy()
        positive[0] = negative[0] = 0  # zeros and subnormals carry no magnitude
        return positive, negative


@dataclass(frozen=True)
class SentinelFinding:
    tensor: str
    reason: str
    # the range of the bulk (values other than the sentinels); None when nothing but sentinels was seen
    robust_range: tuple[float, float] | None
    sentinel_fraction: float  # of all observed values


def _octave_edge(field: int) -> float:
    """Upper edge of the octave whose biased exponent field is `field`."""
    return math.ldexp(1.0, field - 126)


def _isolated_cluster(observer: MagnitudeObserver) -> tuple[int, int] | None:
    """(first biased exponent of the far cluster, its count), or None: see the MIN_GAP_OCTAVES rule."""
    positive, negative = observer.octave_counts()
    magnitude = positive + negative
    occupied = np.flatnonzero(magnitude)
    if occupied.size < 2:
        return None
    nonzero_total = int(magnitude.sum())
    below = np.cumsum(magnitude[occupied])
    for i in range(occupied.size - 1):
        gap = int(occupied[i + 1] - occupied[i] - 1)
        if gap < MIN_GAP_OCTAVES:
            continue
        span = int(occupied[-1] - occupied[i + 1] + 1)
        if span <= MAX_CLUSTER_OCTAVES and below[i] >= MIN_BULK_FRACTION * nonzero_total:
            return int(occupied[i + 1]), nonzero_total - int(below[i])
    return None


def _bulk_range(observer: MagnitudeObserver, cluster_start: int | None) -> tuple[float, float] | None:
    """Range of the ordinary values below the isolated cluster: exact on a side the cluster does not reach,
    the upper edge of the bulk's largest octave on a side it does (at most 2x wide), 0 if the bulk has no
    value of that sign (quantization includes zero anyway)."""
    if observer.ordinary_min > observer.ordinary_max:
        return None
    lo, hi = observer.ordinary_min, observer.ordinary_max
    if cluster_start is None:
        return lo, hi
    positive, negative = observer.octave_counts()
    far = math.ldexp(1.0, cluster_start - 127)
    if -lo >= far:
        bulk = np.flatnonzero(negative[:cluster_start])
        lo = -_octave_edge(int(bulk[-1])) if bulk.size else 0.0
    if hi >= far:
        bulk = np.flatnonzero(positive[:cluster_start])
        hi = _octave_edge(int(bulk[-1])) if bulk.size else 0.0
    return min(lo, hi), max(lo, hi)


@dataclass(frozen=True)
class OutlierNote:
    """An isolated far cluster that varies: the model's own massive activations, not a mask."""

    tensor: str
    count: int
    low: float  # the cluster's range
    high: float
    bulk: tuple[float, float] | None
    channels: tuple[int, ...] | None  # last-axis indices, None when unknown (aligned view) or many

    @property
    def message(self) -> str:
        where = (
            f"channel{'s' if len(self.channels) > 1 else ''} {', '.join(map(str, self.channels))}"
            if self.channels
            else "channels not recorded by histogram methods"
            if self.channels is None
            else "many channels"
        )
        bulk = f" far from the rest [{self.bulk[0]:.4g}, {self.bulk[1]:.4g}]" if self.bulk else ""
        return (
            f"{self.tensor}: outliers, not a mask: {self.count} varying values in [{self.low:.4g}, "
            f"{self.high:.4g}]{bulk} ({where}); quantized with their range, at 16 bits where the scheme "
            "gives 8 (an --overrides entry for the tensor wins)"
        )


def _far_side(observer: MagnitudeObserver, cluster_start: int) -> _FarOctave | None:
    """The union of `observer.far` from `cluster_start` up, or None when not recorded."""
    parts = [state for octave, state in observer.far.items() if octave >= cluster_start]
    if not parts and observer.far:  # the aligned view keeps one entry from the lowest possible start
        parts = list(observer.far.values())
    if not parts:
        return None
    union = _FarOctave(parts[0].minimum, parts[0].maximum, parts[0].values, parts[0].channels)
    for part in parts[1:]:
        union.merge(part)
    return union


def _is_constant_plus_bulk(far: _FarOctave, bulk: tuple[float, float] | None, tolerance: float) -> bool:
    """Whether the cluster lies within C + twice the bulk's range, C one round constant (scores + -10000)."""
    if bulk is None:
        return False
    for sign in (-1.0, 1.0):
        for constant in _ROUND_CONSTANTS:
            c = sign * constant
            slack = tolerance + abs(c) * 2.0**-22  # float32 rounding of c + x
            # twice the bulk: the masked positions are another sample of it (their extremes may lie further)
            if (
                c + 2 * min(bulk[0], 0.0) - slack <= far.minimum
                and far.maximum <= c + 2 * max(bulk[1], 0.0) + slack
            ):
                return True
    return False


def _classify_cluster(
    observer: MagnitudeObserver, cluster_start: int, bulk: tuple[float, float] | None
) -> _FarOctave | None:
    """None when the cluster is a sentinel (a few exact values, or a round constant plus the bulk; also
    when nothing was recorded), else the cluster's state: outliers."""
    far = _far_side(observer, cluster_start)
    if far is None or far.values is not None:
        return None
    if _is_constant_plus_bulk(far, bulk, observer.value_tolerance):
        return None
    return far


def find_outliers(observers: Mapping[str, MagnitudeObserver]) -> list[OutlierNote]:
    """Isolated far clusters that vary (massive activations): `find_sentinels` leaves them out."""
    notes = []
    for name, observer in observers.items():
        cluster = _isolated_cluster(observer)
        if cluster is None:
            continue
        bulk = _bulk_range(observer, cluster[0])
        far = _classify_cluster(observer, cluster[0], bulk)
        if far is None:
            continue
        low = max(far.minimum, observer.ordinary_min)
        high = min(far.maximum, observer.ordinary_max)
        channels = None if far.channels is None else tuple(sorted(far.channels))
        notes.append(OutlierNote(name, cluster[1], low, high, bulk, channels))
    return notes


def find_sentinels(observers: Mapping[str, MagnitudeObserver]) -> list[SentinelFinding]:
    """Tensors whose range is dominated by NaN, ±Inf, |x| >= 2**100, or an isolated far cluster of a
    constant (outliers that vary are `find_outliers`')."""
    findings = []
    for name, observer in observers.items():
        total = observer.total
        if total == 0:
            continue
        reasons = []
        if observer.nan_count:
            reasons.append(f"{observer.nan_count} NaN")
        if observer.positive_inf:
            reasons.append(f"{observer.positive_inf} +Inf")
        if observer.negative_inf:
            reasons.append(f"{observer.negative_inf} -Inf")
        huge = observer.huge_count
        if huge:
            extreme = observer.minimum if -observer.minimum >= HUGE_MAGNITUDE else observer.maximum
            reasons.append(f"{huge} values with |x| >= 1.3e30 (as far as {extreme:.4g}: a float-min mask?)")
        sentinels = observer.nan_count + observer.positive_inf + observer.negative_inf + huge
        cluster = _isolated_cluster(observer)
        if cluster is not None and _classify_cluster(observer, cluster[0], _bulk_range(observer, cluster[0])):
            cluster = None  # massive activations, not a mask
        cluster_start = None
        if cluster is not None:
            cluster_start, cluster_count = cluster
            sentinels += cluster_count
            low = math.ldexp(1.0, cluster_start - 127)
            reasons.append(
                f"{cluster_count} values with |x| >= {low:.4g} isolated from the rest by "
                f"{MIN_GAP_OCTAVES}+ empty octaves (a -10000 style padding mask?)"
            )
        if not reasons:
            continue
        findings.append(
            SentinelFinding(
                tensor=name,
                reason=", ".join(reasons) + f" in {total} values",
                robust_range=_bulk_range(observer, cluster_start),
                sentinel_fraction=sentinels / total,
            )
        )
    return findings


# ----------------------------------------------------------------------------------------------------------
# Policy: what to do with the findings


class SentinelPolicy(StrEnum):
    KEEP = "keep"  # leave flagged tensors in float (default)
    CLIP = "clip"  # quantize flagged tensors with the bulk's range; sentinels saturate
    OFF = "off"  # no detection: quantize every tensor with its observed range


class SentinelAction(StrEnum):
    KEEP = "keep"
    CLIP = "clip"
    QUANTIZE = "quantize"  # ignore a finding for this tensor


@dataclass
class SentinelDecision:
    keep_float: set[str] = field(default_factory=set)
    clipped_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    outliers: list[OutlierNote] = field(default_factory=list)  # quantized, reported as notes


def parse_policy(policy: SentinelPolicy | str) -> SentinelPolicy:
    """The `--sentinel` option's value; InputError for anything but keep, clip or off."""
    try:
        return SentinelPolicy(str(policy).strip().lower())
    except ValueError:
        suggestion = did_you_mean(str(policy).strip().lower(), [p.value for p in SentinelPolicy])
        raise InputError(f"--sentinel {policy!r}: expected keep, clip or off{suggestion}") from None


def parse_overrides(items: Sequence[str]) -> dict[str, SentinelAction]:
    """`NAME=keep|clip|quantize` strings (the `--sentinel-override` option) into a dict."""
    overrides: dict[str, SentinelAction] = {}
    for item in items:
        name, sep, action = item.rpartition("=")
        if not sep or not name:
            raise InputError(f"--sentinel-override {item!r}: expected NAME=keep|clip|quantize")
        try:
            overrides[name] = SentinelAction(action.strip().lower())
        except ValueError:
            raise InputError(
                f"--sentinel-override {item!r}: unknown action {action!r} (expected keep, clip or quantize)"
                + did_you_mean(action.strip().lower(), [a.value for a in SentinelAction])
            ) from None
    return overrides


def _spans(robust_range: tuple[float, float] | None) -> TypeGuard[tuple[float, float]]:
    """Whether the values other than the sentinels span a range to clip to (more than one value)."""
    return robust_range is not None and robust_range[0] < robust_range[1]


def apply_sentinel_policy(
    findings: Sequence[SentinelFinding],
    policy: SentinelPolicy | str = SentinelPolicy.KEEP,
    overrides: Mapping[str, SentinelAction | str] | None = None,
    observed: Iterable[str] | None = None,
) -> SentinelDecision:
    """Turn findings, the policy and per-tensor overrides into float-kept names and clipped ranges.

    `observed`, when given, is the set of calibrated tensor names: an override naming another tensor is an
    InputError. An override wins over the policy, also for tensors that were not flagged (`keep` keeps any
    tensor in float; `clip` on an unflagged tensor changes nothing and says so).
    """
    policy = parse_policy(policy)
    actions = {name: SentinelAction(a) for name, a in (overrides or {}).items()}
    if observed is not None:
        known = set(observed)
        unknown = sorted(set(actions) - known)
        if unknown:
            raise InputError(
                f"--sentinel-override names tensors that were not calibrated: {', '.join(unknown)}"
            )
    decision = SentinelDecision()
    by_name = {} if policy is SentinelPolicy.OFF else {f.tensor: f for f in findings}
    default = {
        SentinelPolicy.KEEP: SentinelAction.KEEP,
        SentinelPolicy.CLIP: SentinelAction.CLIP,
        SentinelPolicy.OFF: SentinelAction.QUANTIZE,
    }[policy]
    for name in list(by_name) + [n for n in actions if n not in by_name]:
        finding = by_name.get(name)
        action = actions.get(name, default)
        why = finding.reason if finding else "not flagged"
        source = "override" if name in actions else f"--sentinel {policy.value}"
        if action is SentinelAction.KEEP:
            decision.keep_float.add(name)
            decision.warnings.append(f"{name}: left in float ({source}): {why}")
        elif action is SentinelAction.CLIP and finding is not None and _spans(finding.robust_range):
            decision.clipped_ranges[name] = finding.robust_range
            lo, hi = finding.robust_range
            decision.warnings.append(f"{name}: range clipped to [{lo:.6g}, {hi:.6g}] ({source}): {why}")
        elif action is SentinelAction.CLIP and finding is not None:
            # A mask of 0 and float-min clipped to [0, 0] would quantize to a constant: no mask at all.
            decision.keep_float.add(name)
            bulk = (
                "sentinels"
                if finding.robust_range is None
                else f"sentinels and {finding.robust_range[0] + 0.0:g}"
            )
            decision.warnings.append(
                f"{name}: left in float, nothing but {bulk} to clip to ({source}): {why}"
            )
        elif action is SentinelAction.CLIP:
            decision.warnings.append(f"{name}: clip override ignored, the tensor has no sentinel")
        elif finding is not None:
            decision.warnings.append(f"{name}: quantized anyway ({source}): {why}")
    return decision


# ----------------------------------------------------------------------------------------------------------
# Wiring into the calibration passes (qconvert/calibrate/api.py)


# Below this many bins the octave just under one bin may lie within MIN_GAP_OCTAVES of a cluster in the top
# 3: `MagnitudeObserver.from_aligned`'s lumping could then hide a gap (1025 bins leave a margin).
MIN_ALIGNED_BINS_FOR_OCTAVES = 1025


def needs_magnitude_observer(
    observers: Sequence[object],
    policy: SentinelPolicy | str = SentinelPolicy.KEEP,
    overrides: Mapping[str, object] | Sequence[str] | None = None,
) -> bool:
    """Whether pass 1 needs an exact MagnitudeObserver beside `observers`.

    Not when they hold an aligned histogram of enough bins and the guard only decides keep-or-quantize:
    `MagnitudeObserver.from_aligned` then reaches the same findings (but for values exactly at a negative
    power of two). Clipping needs the exact bulk range, which a bulk inside one bin hides."""
    policy = parse_policy(policy)
    if policy is SentinelPolicy.OFF and not overrides:
        return False
    if policy is SentinelPolicy.CLIP or overrides:
        return True
    return not any(
        isinstance(observer, AlignedHistogramObserver) and observer.max_bins >= MIN_ALIGNED_BINS_FOR_OCTAVES
        for observer in observers
    )


def magnitude_observers(table: Mapping[str, Sequence[object]]) -> dict[str, MagnitudeObserver]:
    """The per-octave view of each tensor of pass 1: its MagnitudeObserver, or its aligned histogram's."""
    found: dict[str, MagnitudeObserver] = {}
    for name, observers in table.items():
        magnitude = [o for o in observers if isinstance(o, MagnitudeObserver)]
        aligned = [o for o in observers if isinstance(o, AlignedHistogramObserver)]
        if magnitude:
            found[name] = magnitude[0]
        elif aligned:
            found[name] = MagnitudeObserver.from_aligned(aligned[0])
    return found


def sentinel_guard(
    table: Mapping[str, Sequence[object]],
    policy: SentinelPolicy | str = SentinelPolicy.KEEP,
    overrides: Mapping[str, SentinelAction | str] | Sequence[str] | None = None,
) -> tuple[list[SentinelFinding], SentinelDecision]:
    """Pass 1's observers -> findings and the decision (`keep_float` for the scheme, clipped ranges that
    replace the observed ones, and a histogram pass's fixed range; warnings to print).

    `overrides` may be the raw `--sentinel-override NAME=ACTION` strings or a parsed dict.
    """
    if overrides is not None and not isinstance(overrides, Mapping):
        overrides = parse_overrides(overrides)
    policy = parse_policy(policy)
    magnitudes = {} if policy is SentinelPolicy.OFF else magnitude_observers(table)
    findings = find_sentinels(magnitudes)
    decision = apply_sentinel_policy(findings, policy, overrides, observed=table.keys())
    decision.outliers = find_outliers(magnitudes)
    decision.warnings.extend(note.message for note in decision.outliers)
    return findings, decision
