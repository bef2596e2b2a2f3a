"""Collecting statistics: onnxruntime's calibrator's tensors and values, external data, two passes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnxruntime.quantization.calibrate import CalibrationDataReader, MinMaxCalibrater
from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

from qconvert.calibrate import api
from qconvert.calibrate.api import calibrate
from qconvert.calibrate.collect import (
    VALUE_PRESERVING_OPS,
    augment_model,
    calibration_tensors,
    collect,
    collect_passes,
    load_float_model,
    value_preserving_sources,
)
from qconvert.calibrate.dataset import open_dataset
from qconvert.calibrate.methods import make_method
from qconvert.calibrate.observers import HistogramObserver, MinMaxObserver
from qconvert.errors import InputError

MODELS = Path(__file__).resolve().parents[2] / "models"


class ListReader(CalibrationDataReader):
    """onnxruntime's reader over prepared batches."""

    def __init__(self, batches: list[dict[str, np.ndarray]]) -> None:
        self.batches = iter(batches)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def digits_data(tmp_path: Path, count: int = 32) -> Path:
    path = tmp_path / "digits.npz"
    np.savez(path, image=np.random.default_rng(3).random((count, 1, 8, 8), dtype=np.float32))
    return path


def encoder_data(tmp_path: Path, count: int = 8) -> Path:
    path = tmp_path / "encoder.npz"
    np.savez(path, input_ids=np.random.default_rng(4).integers(0, 32, (count, 16), dtype=np.int64))
    return path


def onnxruntime_minmax(
    model_path: Path, batches: list[dict[str, np.ndarray]], tmp_path: Path, op_types: list[str] | None
) -> dict:
    calibrator = MinMaxCalibrater(
        str(model_path), op_types_to_calibrate=op_types, augmented_model_path=str(tmp_path / "augmented.onnx")
    )
    selected, _ = calibrator.select_tensors_to_calibrate(calibrator.model)
    calibrator.augment_graph()
    calibrator.create_inference_session()
    calibrator.collect_data(ListReader(batches))
    ranges = calibrator.compute_data()
    return {"selected": selected, "ranges": {name: ranges[name].range_value for name in selected}}


# quantize_static's default op types to quantize, which it hands to its calibrator (reference §2.2).
QUANTIZE_STATIC_OP_TYPES = sorted(set(QLinearOpsRegistry) | set(QDQRegistry))


@pytest.mark.parametrize("op_types", [None, QUANTIZE_STATIC_OP_TYPES], ids=["all-ops", "quantize-static-ops"])
@pytest.mark.parametrize(
    ("model_name", "make_data"), [("digits_cnn", digits_data), ("tiny_encoder", encoder_data)]
)
def test_same_tensors_and_bit_identical_minmax_as_onnxruntime_calibrator(
    model_name: str, make_data, op_types: list[str] | None, tmp_path: Path
) -> None:
    model_path = MODELS / f"{model_name}.onnx"
    loaded = load_float_model(model_path)
    model = loaded.model
    dataset = open_dataset(make_data(tmp_path), model)
    batches = [batch.arrays for batch in dataset.batches()]
    reference = onnxruntime_minmax(model_path, batches, tmp_path, op_types)

    augmented = augment_model(loaded, op_types=op_types)
    assert set(augmented.tensors) == reference["selected"]
    result = collect(augmented, dataset, {name: [MinMaxObserver()] for name in augmented.tensors})
    for name in augmented.tensors:
        observer = result.observers[name][0]
        low, high = reference["ranges"][name]
        assert (np.float32(observer.minimum), np.float32(observer.maximum)) == (
            np.float32(low),
            np.float32(high),
        ), name
    assert result.batches == len(batches)


@pytest.mark.parametrize("method", ["minmax", "entropy"])
def test_rearranged_tensors_share_their_sources_observers_and_get_the_same_ranges(
    method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reshape/Transpose outputs are not exposed nor observed: their source's observers serve them. Their
    ranges equal those of observing every tensor directly (same multiset of values per batch)."""
    model_path = MODELS / "tiny_encoder.onnx"
    loaded = load_float_model(model_path)
    model = loaded.model
    data = encoder_data(tmp_path)
    exposed: list[str] = []

    def recording_augment(*args, **kwargs):
        augmented = augment_model(*args, **kwargs)
        exposed.extend(augmented.tensors)
        return augmented

    monkeypatch.setattr(api, "augment_model", recording_augment)
    result = calibrate(model_path, data, method=method)
    tensors = list(result.ranges.ranges)
    sources = value_preserving_sources(model, tensors)
    producers = {node.output[0]: node.op_type for node in model.graph.node}
    assert len(sources) >= 4 and {producers[name] for name in sources} <= VALUE_PRESERVING_OPS
    assert {producers[name] for name in sources} >= {"Reshape", "Transpose"}
    assert exposed and not set(exposed) & set(sources)  # neither exposed by the model nor observed

    chosen = make_method(method)
    augmented = augment_model(loaded, tensors)
    direct = collect(augmented, open_dataset(data, model), {n: chosen.first_pass(n) for n in tensors})
    for name in tensors:
        expected = chosen.range(name, direct.observers[name], direct.observers[name])
        ours = result.ranges.ranges[name]
        assert (ours.name, ours.min, ours.max) == (name, expected.min, expected.max), name


def test_tensors_are_float_node_inputs_and_outputs_never_initializers() -> None:
    model = load_float_model(MODELS / "digits_cnn.onnx").model
    tensors = calibration_tensors(model)
    initializers = {t.name for t in model.graph.initializer}
    assert not set(tensors) & initializers
    assert next(iter(tensors)) == "image" and list(tensors)[-1] == "logits"
    assert set(tensors.values()) == {"f32"}


def test_weights_external_detached_or_both_give_identical_values(tmp_path: Path) -> None:
    """Weights kept in a proto, in an external-data file (read by onnxruntime from the model's folder),
    detached on load and handed over as arrays, or some of each: the same min/max everywhere."""
    folders = {"external": 0, "mixed": 2048}  # size_threshold: mixed keeps fc.weight (1280 B) inline
    for kind, threshold in folders.items():
        (tmp_path / kind).mkdir()
        onnx.save(
            onnx.load(str(MODELS / "digits_cnn.onnx")),
            str(tmp_path / kind / "model.onnx"),
            save_as_external_data=True,
            location="model.data",
            size_threshold=threshold,
        )
    data = digits_data(tmp_path, 16)
    results = []
    for path in (MODELS / "digits_cnn.onnx", *(tmp_path / kind / "model.onnx" for kind in folders)):
        loaded = load_float_model(path)
        augmented = augment_model(loaded)
        observers = {n: [MinMaxObserver()] for n in augmented.tensors}
        results.append(collect(augmented, open_dataset(data, loaded.model), observers))
        if path.parent.name == "external":
            assert augmented.external_data_folder == str(path.parent) and not augmented.weights
            assert len(augmented.model_bytes) < (path.parent / "model.data").stat().st_size  # not copied
        elif path.parent.name == "mixed":
            assert augmented.external_data_folder == str(path.parent)
            assert set(augmented.weights) == {"fc.weight"}
        else:  # the embedded weights travel beside the proto, not serialized in it
            assert augmented.external_data_folder is None and len(augmented.weights) >= 2
            assert len(augmented.model_bytes) < sum(w.nbytes for w in augmented.weights.values())
    for name, (embedded,) in results[0].observers.items():
        for other in results[1:]:
            (theirs,) = other.observers[name]
            assert (embedded.minimum, embedded.maximum) == (theirs.minimum, theirs.maximum)


def test_a_weight_whose_raw_data_does_not_fit_its_shape_is_refused_by_name(tmp_path: Path) -> None:
    model = onnx.load(str(MODELS / "digits_cnn.onnx"))
    (weight,) = [t for t in model.graph.initializer if t.name == "fc.weight"]
    weight.raw_data = weight.raw_data[:-4]
    onnx.save(model, str(tmp_path / "corrupt.onnx"))
    message = r"corrupt\.onnx: initializer 'fc\.weight': raw_data holds 1276 bytes, but dims \[10, 32\]"
    with pytest.raises(InputError, match=message):
        calibrate(tmp_path / "corrupt.onnx", digits_data(tmp_path, 8))


def test_a_model_without_float_activations_is_refused() -> None:
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        "integers",
        [helper.make_tensor_value_info(n, TensorProto.INT32, [2]) for n in ("a", "b")],
        [helper.make_tensor_value_info("c", TensorProto.INT32, [2])],
    )
    loaded = load_float_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.raises(InputError, match=r"no float \(f32/f16\) activations to calibrate"):
        augment_model(loaded)


def test_two_passes_seed_histograms_from_exact_minmax_and_progress_spans_both(tmp_path: Path) -> None:
    loaded = load_float_model(MODELS / "digits_cnn.onnx")
    augmented = augment_model(loaded, ["/conv1/Conv_output_0"])
    dataset = open_dataset(digits_data(tmp_path, 24), loaded.model)
    seen: list[tuple[int, int | None]] = []

    def second(previous):
        (extrema,) = previous["/conv1/Conv_output_0"]
        return {"/conv1/Conv_output_0": [HistogramObserver(extrema.minimum, extrema.maximum, 64)]}

    first, histogram = collect_passes(
        augmented,
        dataset,
        [lambda _: {"/conv1/Conv_output_0": [MinMaxObserver()]}, second],
        progress=lambda done, total: seen.append((done, total)),
    )
    (extrema,) = first.observers["/conv1/Conv_output_0"]
    (counts,) = histogram.observers["/conv1/Conv_output_0"]
    assert counts.total == extrema.count == 24 * 16 * 8 * 8
    assert seen[-1] == (48, 48) and all(total == 48 for _, total in seen)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


def test_computing_ranges_imports_neither_the_ir_nor_the_lifter() -> None:
    # Ranges alone (no model written) need the ONNX loader and the observers: the IR and the lifter are
    # a tenth of a second of imports that every ranges-only run (benchmarks/calibrate.py's) would pay.
    script = (
        "import sys; import qconvert.calibrate.api as api; "
        f"api.calibrate({str(MODELS / 'digits_cnn.onnx')!r}, {str(MODELS / 'digits_cnn.inputs.npz')!r}); "
        "heavy = ('qconvert.ir', 'qconvert.frontends.onnx.lift'); "
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
