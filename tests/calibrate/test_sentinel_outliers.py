"""The sentinel guard tells masks (constants) from outliers (the model's own massive activations).

Sentinels are one or a few exact values (-10000, float-min, -Inf), or a round constant added to the bulk
(scores + -10000 mask). Outliers vary: all-MiniLM's FFN output has channel 99 at [CLS] around 192 on every
row, 16+ different values, the rest within ±8. Those must be quantized and reported as outliers, never kept
float as a "padding mask?".
"""

from __future__ import annotations

import numpy as np
import pytest

from qconvert.calibrate.observers import AlignedHistogramObserver
from qconvert.calibrate.sentinel import (
    MagnitudeObserver,
    find_outliers,
    find_sentinels,
    sentinel_guard,
)

FLOAT_MIN = float(np.finfo(np.float32).min)


def massive_activation(rows: int = 32, seed: int = 0) -> np.ndarray:
    """[rows, 16, 64] hidden states within about ±5, channel 13 at position 0 between 185 and 200."""
    rng = np.random.default_rng(seed)
    hidden = (rng.standard_normal((rows, 16, 64)) * 1.2).astype(np.float32)
    hidden[:, 0, 13] = rng.uniform(185.0, 200.0, rows).astype(np.float32)
    return hidden


def scores_with(fill: float) -> np.ndarray:
    rng = np.random.default_rng(1)
    scores = (rng.standard_normal((8, 2, 16, 16)) * 3).astype(np.float32)
    mask = np.zeros((8, 1, 1, 16), np.float32)
    mask[::2, ..., 10:] = fill
    return scores + mask


def observed(*parts: np.ndarray) -> MagnitudeObserver:
    observer = MagnitudeObserver()
    for part in parts:
        observer.observe(part)
    return observer


def test_varying_massive_channel_is_an_outlier_naming_its_channel_not_a_mask() -> None:
    observer = observed(massive_activation())
    assert find_sentinels({"ffn": observer}) == []
    (note,) = find_outliers({"ffn": observer})
    assert note.channels == (13,) and note.count == 32
    assert 185.0 <= note.low < note.high <= 200.0
    _, decision = sentinel_guard({"ffn": [observer]})
    assert decision.keep_float == set()
    assert any("outliers, not a mask" in w and "channel 13" in w for w in decision.warnings)


@pytest.mark.parametrize("fill", [-10000.0, -1000.0, FLOAT_MIN])
def test_masks_added_to_scores_are_still_guarded(fill: float) -> None:
    findings, decision = sentinel_guard({"masked": [observed(scores_with(fill))]})
    assert [f.tensor for f in findings] == ["masked"]
    assert decision.keep_float == {"masked"} and decision.outliers == []


def test_a_constant_cluster_is_a_sentinel_even_off_round_values() -> None:
    """A few exact values far above the bulk (a mask of 0 / -7777 added to nothing) stay guarded."""
    bulk = np.random.default_rng(2).standard_normal(5000).astype(np.float32)
    values = np.concatenate([bulk, np.full(300, -7777.0, np.float32), np.full(20, -5555.5, np.float32)])
    assert [f.tensor for f in find_sentinels({"x": observed(values)})] == ["x"]
    assert find_outliers({"x": observed(values)}) == []


def test_far_state_is_bit_identical_whatever_the_split_and_order() -> None:
    """Mergeable: the kept cluster state (min/max, bounded values and channels) is a function of the union."""
    parts = [massive_activation(8, seed) for seed in range(4)] + [scores_with(-10000.0).reshape(-1, 64)]
    parts.append(np.full((2, 64), 3.0, np.float32))
    whole = observed(*parts)

    def state(observer: MagnitudeObserver) -> dict[int, tuple[object, ...]]:
        return {k: (v.minimum, v.maximum, v.values, v.channels) for k, v in observer.far.items()}

    rng = np.random.default_rng(3)
    for _ in range(4):
        order = rng.permutation(len(parts))
        split = int(rng.integers(1, len(parts)))
        left = observed(*(parts[i] for i in order[:split]))
        left.merge(observed(*(parts[i] for i in order[split:])))
        assert state(left) == state(whole)
    one_by_one = [observed(p) for p in parts[::-1]]
    for other in one_by_one[1:]:
        one_by_one[0].merge(other)
    assert state(one_by_one[0]) == state(whole)


def test_histogram_methods_view_reaches_the_same_verdicts() -> None:
    """The aligned-histogram view (percentile, entropy...) has no values, only bins: same classification."""
    cases = {
        "ffn": massive_activation(),
        "masked": scores_with(-10000.0),
        "float_min": scores_with(FLOAT_MIN),
    }
    views = {}
    for name, values in cases.items():
        histogram = AlignedHistogramObserver(max_bins=4097)
        histogram.observe(values)
        views[name] = MagnitudeObserver.from_aligned(histogram)
    assert {f.tensor for f in find_sentinels(views)} == {"masked", "float_min"}
    (note,) = find_outliers(views)
    assert note.tensor == "ffn" and note.channels is None
