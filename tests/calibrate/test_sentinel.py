"""Sentinel guard: exact octave counts, merge == union, detection and non-detection, policy, BERT mask model.

The model test runs models/bert_mask.onnx (built by models/build_bert_mask.py: Hugging Face BERT's additive
float-min attention mask) through onnxruntime with every float intermediate exposed, and checks that the
flagged tensors are exactly the ones the graph says carry the mask: the float-min Constant (a node output,
calibrated like any activation), the Mul by it and each layer's scores + mask Add. The expectation is
derived from the graph, not from the detector.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from calibrate.parity_support import load_bert_mask_builder, mask_tensors
from conftest import require_module

from qconvert.calibrate.observers import AlignedHistogramObserver, MinMaxObserver
from qconvert.calibrate.sentinel import (
    HUGE_MAGNITUDE,
    MagnitudeObserver,
    SentinelAction,
    SentinelFinding,
    apply_sentinel_policy,
    find_sentinels,
    needs_magnitude_observer,
    parse_overrides,
)
from qconvert.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
FLOAT_MIN = float(np.finfo(np.float32).min)


def observed(*arrays: np.ndarray) -> MagnitudeObserver:
    observer = MagnitudeObserver()
    for array in arrays:
        observer.observe(array)
    return observer


def flagged(**arrays: np.ndarray) -> dict[str, SentinelFinding]:
    return {f.tensor: f for f in find_sentinels({name: observed(a) for name, a in arrays.items()})}


@pytest.fixture(scope="module")
def scores() -> np.ndarray:
    """Attention-score-like values (batch 16, 4 heads, 32 x 32), spread about ±10."""
    return (np.random.default_rng(0).standard_normal((16, 4, 32, 32)) * 3).astype(np.float32)


def padding_mask(value: float) -> np.ndarray:
    """[16, 1, 1, 32] additive mask: `value` on the last 12 positions of every other row, else 0."""
    mask = np.zeros((16, 1, 1, 32), np.float32)
    mask[::2, ..., 20:] = value
    return mask


# ----------------------------------------------------------------------------------------------------------
# The observer


def test_counts_match_frexp_octaves() -> None:
    """Bin of a normal float32 x: sign*256 + frexp exponent + 126; zero in bin 0 / 256; Inf in 255 / 511.
    200k values: more than one of the observer's bincount chunks."""
    rng = np.random.default_rng(1)
    count = 200_000
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.inf, np.nan, -np.nan, FLOAT_MIN], np.float32)
    values = np.concatenate(
        [(rng.standard_normal(count) * 10.0 ** rng.uniform(-30, 30, count)).astype(np.float32), special]
    )
    observer = observed(values)
    finite = values[np.isfinite(values) & (values != 0)].astype(np.float64)
    bins = np.where(np.signbit(finite), 256, 0) + np.frexp(finite)[1] + 126
    expected = Counter({int(b): int(c) for b, c in zip(*np.unique(bins, return_counts=True))})
    expected.update({0: 1, 256: 1, 255: 2, 511: 1})  # +0, -0, +Inf x2, -Inf
    assert {i: int(c) for i, c in enumerate(observer.counts) if c} == dict(expected)
    assert observer.nan_count == 2
    assert (observer.positive_inf, observer.negative_inf) == (2, 1)
    assert observer.huge_count == int(np.count_nonzero(np.abs(finite) >= HUGE_MAGNITUDE))
    ordinary = values[np.abs(values) < HUGE_MAGNITUDE]
    assert (observer.ordinary_min, observer.ordinary_max) == (float(ordinary.min()), float(ordinary.max()))


def test_merge_equals_observing_the_union(scores: np.ndarray) -> None:
    parts = [
        scores[:5],
        (scores[5:9] + padding_mask(FLOAT_MIN)[5:9]),
        np.array([np.nan, np.inf, -1e35], np.float32),
        scores[9:] * 1000,
        np.array([], np.float32),
        scores[:2].astype(np.float16),  # cast to float32 on the way in
    ]
    whole = observed(*parts)
    rng = np.random.default_rng(2)
    for _ in range(5):
        order = rng.permutation(len(parts))
        split = int(rng.integers(1, len(parts)))
        left = observed(*(parts[i] for i in order[:split]))
        left.merge(observed(*(parts[i] for i in order[split:])))
        np.testing.assert_array_equal(left.counts, whole.counts)
        assert left.nan_count == whole.nan_count
        assert (left.ordinary_min, left.ordinary_max) == (whole.ordinary_min, whole.ordinary_max)
        assert (left.minimum, left.maximum) == (whole.minimum, whole.maximum)


# ----------------------------------------------------------------------------------------------------------
# Detection


def test_float_min_mask_and_masked_scores_are_flagged_with_the_exact_bulk_range(scores: np.ndarray) -> None:
    mask = padding_mask(FLOAT_MIN)
    found = flagged(mask=mask, masked=scores + mask, softmax_like=np.abs(scores) / 10)
    assert set(found) == {"mask", "masked"}
    assert "1.3e30" in found["masked"].reason and "-3.403e+38" in found["masked"].reason
    # scores at unmasked positions: the bulk, exactly
    bulk = (scores + mask)[(scores + mask) > -HUGE_MAGNITUDE]
    assert found["masked"].robust_range == (float(bulk.min()), float(bulk.max()))
    assert found["mask"].robust_range == (0.0, 0.0)
    assert found["masked"].sentinel_fraction == pytest.approx(np.mean(mask < 0))


@pytest.mark.parametrize("fill", [-10000.0, -1000.0])
def test_minus_10000_mask_flags_the_masked_scores_not_the_mask(scores: np.ndarray, fill: float) -> None:
    """-10000 + scores sits 9 octaves above the scores, -1000 + scores 5 to 6: flagged. The mask alone
    ({0, -10000}) is not: an int8 range of [-10000, 0] represents both values exactly, nothing is lost."""
    mask = padding_mask(fill)
    masked = scores + mask
    found = flagged(mask=mask, masked=masked)
    assert set(found) == {"masked"}
    assert "isolated" in found["masked"].reason
    lo, hi = found["masked"].robust_range or (0.0, 0.0)
    bulk = masked[masked > fill / 10]
    assert hi == float(bulk.max())  # the positive side is exact
    assert bulk.min() >= lo >= 2 * bulk.min()  # the clustered side: an octave edge, at most 2x wide


def test_infinities_and_nan_are_flagged(scores: np.ndarray) -> None:
    with_inf = np.where(padding_mask(-1.0) < 0, -np.inf, scores).astype(np.float32)
    with_nan = scores.copy()
    with_nan[0, 0, 0, :3] = np.nan
    only_inf = np.full(8, np.inf, np.float32)
    found = flagged(with_inf=with_inf, with_nan=with_nan, only_inf=only_inf)
    assert set(found) == {"with_inf", "with_nan", "only_inf"}
    assert "-Inf" in found["with_inf"].reason and "3 NaN" in found["with_nan"].reason
    finite = with_inf[np.isfinite(with_inf)]
    assert found["with_inf"].robust_range == (float(finite.min()), float(finite.max()))
    assert found["only_inf"].robust_range is None
    assert found["only_inf"].sentinel_fraction == 1.0


def test_genuine_heavy_tails_and_large_dense_activations_are_not_flagged() -> None:
    rng = np.random.default_rng(3)
    relu_mlp = np.maximum(rng.standard_normal(200_000), 0) * 40
    found = flagged(
        laplace=rng.laplace(size=1_000_000).astype(np.float32),
        student_t3=rng.standard_t(3, size=1_000_000).astype(np.float32),
        large_dense=(rng.standard_normal(200_000) * 1e4 + 5e4).astype(np.float32),
        relu_mlp=relu_mlp.astype(np.float32),
        # a handful of tiny values far below the bulk: harmless, they round to zero
        tiny_outliers=np.concatenate([rng.standard_normal(10_000), [1e-30, -3e-28]]).astype(np.float32),
        constant=np.full(100, -10000.0, np.float32),
    )
    assert found == {}


@pytest.mark.parametrize("max_bins", [257, 4097])
def test_an_aligned_histogram_gives_the_guard_the_same_findings(scores: np.ndarray, max_bins: int) -> None:
    """Histogram methods run no MagnitudeObserver: the guard reads the octaves off their aligned bins
    (`MagnitudeObserver.from_aligned`). Same tensors, reasons and fractions as the exact observer, on every
    case above, each observed in two batches and merged. The robust ranges are the same too, except where
    the bulk lies below one bin of the whole range: then its edge is that bin's (the histogram has nothing
    finer to offer): with the methods' 4097 bins (width 4 here) only for a bulk of ±0.01 under a -10000
    mask, with 257 bins (width 64) also for scores of ±10."""
    rng = np.random.default_rng(3)
    with_inf = np.where(padding_mask(-1.0) < 0, -np.inf, scores).astype(np.float32)
    with_nan = scores.copy()
    with_nan[0, 0, 0, :3] = np.nan
    cases = {
        "float_min_mask": padding_mask(FLOAT_MIN),
        "float_min_masked": scores + padding_mask(FLOAT_MIN),
        "mask": padding_mask(-10000.0),
        "masked": scores + padding_mask(-10000.0),
        "masked_small": scores / 1000 + padding_mask(-10000.0),  # the bulk far below one bin
        "with_inf": with_inf,
        "with_nan": with_nan,
        "only_inf": np.full(8, np.inf, np.float32),
        "laplace": rng.laplace(size=100_000).astype(np.float32),
        "student_t3": rng.standard_t(3, size=100_000).astype(np.float32),
        "relu_mlp": (np.maximum(rng.standard_normal(100_000), 0) * 40).astype(np.float32),
        "tiny_outliers": np.concatenate([rng.standard_normal(10_000), [1e-30, -3e-28]]).astype(np.float32),
        "constant": np.full(100, -10000.0, np.float32),
        "zeros_and_cluster": np.concatenate([np.zeros(1000), np.full(10, 5000.0)]).astype(np.float32),
    }
    exact = {name: observed(values) for name, values in cases.items()}
    aligned, widths = {}, {}
    for name, values in cases.items():
        halves = [AlignedHistogramObserver(max_bins=max_bins) for _ in range(2)]
        halves[0].observe(values.reshape(-1)[::2])
        halves[1].observe(values.reshape(-1)[1::2])
        halves[0].merge(halves[1])
        aligned[name] = MagnitudeObserver.from_aligned(halves[0])
        widths[name] = halves[0].width or 0.0
    expected = find_sentinels(exact)
    assert {f.tensor for f in expected} >= {"float_min_masked", "masked", "masked_small"}
    found = find_sentinels(aligned)
    assert [(f.tensor, f.reason, f.sentinel_fraction) for f in found] == [
        (f.tensor, f.reason, f.sentinel_fraction) for f in expected
    ]
    coarser = []
    for ours, theirs in zip(found, expected, strict=True):
        if ours.robust_range == theirs.robust_range:
            continue
        assert ours.robust_range is not None and theirs.robust_range is not None
        (low, high), (exact_low, exact_high) = ours.robust_range, theirs.robust_range
        width = widths[ours.tensor]
        assert low <= exact_low and high >= exact_high
        assert low in (exact_low, -width) and high in (exact_high, width)
        coarser.append(ours.tensor)
    assert coarser == (["masked_small"] if max_bins == 4097 else ["masked", "masked_small"])


def test_the_aligned_view_reads_a_negative_power_of_two_one_octave_low() -> None:
    """The one documented disagreement: -16384 sits on a bin's lower edge, so the aligned view counts it in
    the octave below and sees a 3-octave gap where the exact observer sees 4. Positive +16384 is exact."""
    rng = np.random.default_rng(7)
    bulk = rng.uniform(-1000, 1000, 20_000).astype(np.float32)
    for value, aligned_flags in ((-16384.0, False), (16384.0, True)):
        values = np.concatenate([bulk, np.full(50, value, np.float32)])
        histogram = AlignedHistogramObserver(max_bins=4097)
        histogram.observe(values)
        exact = find_sentinels({"t": observed(values)})
        assert len(exact) == 1
        assert bool(find_sentinels({"t": MagnitudeObserver.from_aligned(histogram)})) is aligned_flags


def test_histogram_methods_skip_the_magnitude_observer_only_when_the_view_suffices() -> None:
    fine, coarse = [AlignedHistogramObserver(max_bins=4097)], [AlignedHistogramObserver(max_bins=257)]
    assert not needs_magnitude_observer(fine)
    assert needs_magnitude_observer(coarse)  # lumping could hide a gap
    assert needs_magnitude_observer(fine, "clip")  # clipping needs the exact bulk range
    assert needs_magnitude_observer(fine, "keep", ["t=clip"])
    assert not needs_magnitude_observer([MinMaxObserver()], "off")  # no guard at all
    assert needs_magnitude_observer([MinMaxObserver()])


# ----------------------------------------------------------------------------------------------------------
# Policy


FINDINGS = [
    SentinelFinding("scores_plus_mask", "1 values with |x| >= 1.3e30", (-9.0, 7.5), 0.25),
    SentinelFinding("all_inf", "8 +Inf in 8 values", None, 1.0),
]


def test_default_policy_keeps_flagged_tensors_in_float_and_warns_with_the_reason() -> None:
    decision = apply_sentinel_policy(FINDINGS)
    assert decision.keep_float == {"scores_plus_mask", "all_inf"}
    assert decision.clipped_ranges == {}
    assert len(decision.warnings) == 2
    assert "scores_plus_mask" in decision.warnings[0] and "1.3e30" in decision.warnings[0]


def test_clip_policy_uses_the_robust_range_and_keeps_tensors_with_nothing_to_clip_to() -> None:
    decision = apply_sentinel_policy(FINDINGS, "clip")
    assert decision.clipped_ranges == {"scores_plus_mask": (-9.0, 7.5)}
    assert decision.keep_float == {"all_inf"}


def test_off_policy_and_overrides() -> None:
    off = apply_sentinel_policy(FINDINGS, "off")
    assert (off.keep_float, off.clipped_ranges, off.warnings) == (set(), {}, [])
    overrides = parse_overrides(["scores_plus_mask=clip", "all_inf=quantize", "other=keep"])
    assert overrides["all_inf"] is SentinelAction.QUANTIZE
    decision = apply_sentinel_policy(
        FINDINGS, "keep", overrides, observed={"scores_plus_mask", "all_inf", "other"}
    )
    assert decision.clipped_ranges == {"scores_plus_mask": (-9.0, 7.5)}
    assert decision.keep_float == {"other"}  # a user may keep any tensor in float
    assert any("all_inf" in w and "quantized anyway" in w for w in decision.warnings)


@pytest.mark.parametrize("item", ["noequals", "=keep", "x=drop"])
def test_bad_overrides_are_input_errors(item: str) -> None:
    with pytest.raises(InputError, match="--sentinel-override"):
        parse_overrides([item])


def test_override_of_an_unknown_tensor_is_an_input_error() -> None:
    with pytest.raises(InputError, match="typo"):
        apply_sentinel_policy(FINDINGS, "keep", {"typo": "keep"}, observed={"scores_plus_mask", "all_inf"})


# ----------------------------------------------------------------------------------------------------------
# The BERT model with Hugging Face's float-min mask


def test_bert_mask_model_flags_exactly_the_mask_and_masked_scores() -> None:
    from qconvert.calibrate.collect import augment_model, collect, load_float_model
    from qconvert.calibrate.dataset import open_dataset

    build_bert_mask = load_bert_mask_builder()
    loaded = load_float_model(MODELS / "bert_mask.onnx")
    model = loaded.model  # its large float weights are detached: read the constants from the file
    expected = set().union(*mask_tensors(onnx.load(str(MODELS / "bert_mask.onnx"))))
    layers = sum(1 for n in model.graph.node if n.op_type == "Softmax")
    assert len(expected) == 2 + layers  # the graph is what build_bert_mask.py says it is
    augmented = augment_model(loaded)
    dataset = open_dataset(list(build_bert_mask.batches(seed=11, count=4)), model, batch_size=4)
    result = collect(augmented, dataset, {name: [MagnitudeObserver()] for name in augmented.tensors})
    magnitudes = {name: observers[0] for name, observers in result.observers.items()}
    findings = find_sentinels(magnitudes)  # type: ignore[arg-type]
    assert {f.tensor for f in findings} == expected
    for finding in findings:
        lo, hi = finding.robust_range or (0.0, 0.0)
        assert -100 < lo <= 0 <= hi < 100, finding  # the real scores (mask: [0, 0], constant: None)
    decision = apply_sentinel_policy(findings)
    assert decision.keep_float == expected
    softmax_outputs = {n.output[0] for n in model.graph.node if n.op_type == "Softmax"}
    assert not softmax_outputs & decision.keep_float


def test_unknown_policy_is_an_input_error() -> None:
    with pytest.raises(InputError, match="--sentinel 'drop'"):
        apply_sentinel_policy(FINDINGS, "drop")


def test_bert_mask_data_has_padded_and_full_rows_in_every_batch() -> None:
    build_bert_mask = load_bert_mask_builder()
    for source in (build_bert_mask.calibration_data, build_bert_mask.evaluation_data):
        for batch in source():
            lengths = batch["attention_mask"].sum(1)
            assert lengths.min() < 32 and lengths.max() == 32
            assert (batch["input_ids"][batch["attention_mask"] == 0] == build_bert_mask.PAD_ID).all()
            assert (batch["input_ids"][batch["attention_mask"] == 1] != build_bert_mask.PAD_ID).all()


@pytest.mark.slow
def test_build_bert_mask_regenerates_the_committed_model(tmp_path: Path) -> None:
    """Same graph (op types, inputs, outputs) as the committed file; byte-identical on the machine that built
    it (float training may round differently on another CPU, so bytes are not compared here)."""
    require_module("torch")
    result = subprocess.run(
        [sys.executable, str(MODELS / "build_bert_mask.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rebuilt, committed = (
        onnx.load(str(tmp_path / "bert_mask.onnx")),
        onnx.load(str(MODELS / "bert_mask.onnx")),
    )
    onnx.checker.check_model(rebuilt, full_check=True)
    assert Counter(n.op_type for n in rebuilt.graph.node) == Counter(n.op_type for n in committed.graph.node)
    assert [i.name for i in rebuilt.graph.input] == [i.name for i in committed.graph.input]
    assert [o.name for o in rebuilt.graph.output] == [o.name for o in committed.graph.output]
    assert mask_tensors(rebuilt) == mask_tensors(committed)
