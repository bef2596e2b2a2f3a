"""Calibration ranges: JSON round trip (exact floats, clear errors) and attaching them to the lifted IR."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from qconvert.calibrate.attach import attach_ranges
from qconvert.calibrate.ranges import CalibrationRanges, TensorRange
from qconvert.calibrate.tensor_names import tensor_values
from qconvert.errors import InputError
from qconvert.frontends.onnx import import_onnx
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp
from qconvert.ir.parser import ParserOptions, parse_module
from qconvert.ir.printer import print_module
from qconvert.ir.quant_types import CalibratedQuantizedType
from qconvert.ir.verify import verify

MODELS = Path(__file__).resolve().parents[2] / "models"
CNN = MODELS / "digits_cnn.onnx"


def sample_ranges() -> CalibrationRanges:
    ranges = CalibrationRanges(metadata={"model": str(CNN), "method": "minmax", "samples": 8})
    ranges.add(TensorRange("image", 0.0, 1.0, samples=8))
    ranges.add(TensorRange("/conv1/Conv_output_0", -1.5, 2.25, samples=8))
    ranges.add(TensorRange("/Relu_output_0", 0.0, 2.25))
    ranges.add(TensorRange("logits", -5.0, 7.1, std=1.25, nan_count=2, sentinel=None))
    return ranges


def test_json_round_trip_is_exact(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ranges = CalibrationRanges(metadata={"model": "m.onnx"})
    values = rng.standard_normal(200).astype(np.float32) * np.float32(1e3) ** rng.integers(-12, 12, 200)
    values = np.concatenate(
        [values, np.array([np.finfo(np.float32).min, np.finfo(np.float32).tiny], np.float32)]
    )
    for i in range(0, len(values), 2):
        low, high = sorted(values[i : i + 2])
        ranges.add(TensorRange(f"t{i}", low, high, method="percentile", std=abs(high), samples=i))
    ranges.add(TensorRange("masked", float("-inf"), 1.0, sentinel="adds float-min", inf_count=3))
    path = tmp_path / "ranges.json"
    ranges.save(path)
    loaded = CalibrationRanges.load(path)
    assert loaded.metadata == ranges.metadata
    assert loaded.ranges == ranges.ranges
    for name, original in ranges.ranges.items():
        assert np.float32(loaded[name].min).tobytes() == np.float32(original.min).tobytes()
    assert json.loads(path.read_text())["tensors"]["masked"]["min"] == "-inf"
    assert not list(tmp_path.glob(".ranges.json.*"))  # no temp file left behind


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "invalid JSON"),
        ('{"format": "other"}', "not a qconvert ranges file"),
        ('{"format": "qconvert.calibration_ranges", "version": 99, "tensors": {}}', "version 99"),
        (
            '{"format": "qconvert.calibration_ranges", "version": 1, "tensors": {"x": {"min": 1}}}',
            'missing "max"',
        ),
        (
            '{"format": "qconvert.calibration_ranges", "version": 1, "tensors": {"x": {"min": 2, "max": 1}}}',
            "must not exceed",
        ),
        (
            '{"format": "qconvert.calibration_ranges", "version": 1, '
            '"tensors": {"x": {"min": "a", "max": 1}}}',
            "must be a number",
        ),
        (
            '{"format": "qconvert.calibration_ranges", "version": 1, '
            '"tensors": {"x": {"min": 0, "max": 1, "samples": -1}}}',
            "non-negative integer",
        ),
        (
            '{"format": "qconvert.calibration_ranges", "version": 1, '
            '"tensors": {"x": {"min": 0, "max": 1e39}}}',
            '"max" 1e\\+39 is past float32\'s largest value',
        ),
        (
            '{"format": "qconvert.calibration_ranges", "version": 1, '
            '"tensors": {"x": {"min": "nan", "max": 1}}}',
            '"min" is NaN; a range needs numbers',
        ),
        (
            '{"format": "qconvert.calibration_ranges", "version": 1, "tensors": {"x": {"min": 0, "max": 1, '
            '"note": 3}}}',
            '"note" must be a string',
        ),
    ],
)
def test_bad_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(InputError, match=message) as caught:
        CalibrationRanges.load(path)
    assert str(path) in caught.value.message


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read ranges file"):
        CalibrationRanges.load(tmp_path / "absent.json")


def test_attach_puts_calibrated_pairs_on_observed_values() -> None:
    module = import_onnx(CNN)
    unmatched = attach_ranges(module, sample_ranges())
    assert unmatched == []
    verify(module)
    text = print_module(module)
    assert "!quant.calibrated<f32<-1.500000e+00:2.250000e+00>>" in text
    pairs = [op for op in module.walk() if isinstance(op, QuantizeCastOp)]
    assert len(pairs) == 4
    for quantize in pairs:
        assert isinstance(quantize.result.type.element_type, CalibratedQuantizedType)
        (user,) = [owner for owner, _ in quantize.result.uses]
        assert isinstance(user, DequantizeCastOp)
    # The Conv output now reaches the Relu only through the dcast.
    relu = next(op for op in module.walk() if op.name == "onnx.Relu")
    assert isinstance(relu.operands[0].owner_op(), DequantizeCastOp)
    # The printed module parses back to the same text.
    reparsed = parse_module(text, options=ParserOptions(allow_unregistered_dialect=True))
    verify(reparsed)
    assert print_module(reparsed) == text


def test_attach_reports_unknown_and_integer_tensors() -> None:
    module = import_onnx(MODELS / "tiny_encoder.onnx")
    ranges = CalibrationRanges(metadata={"model": str(MODELS / "tiny_encoder.onnx")})
    ranges.add(TensorRange("input_ids", 0.0, 31.0))  # int64: no float value to calibrate
    ranges.add(TensorRange("no_such_tensor", 0.0, 1.0))
    assert attach_ranges(module, ranges) == ["input_ids", "no_such_tensor"]


def test_tensor_values_name_initializers_and_constants() -> None:
    module = import_onnx(MODELS / "tiny_encoder.onnx")
    values = tensor_values(module, MODELS / "tiny_encoder.onnx")
    import onnx

    model = onnx.load(MODELS / "tiny_encoder.onnx")
    every = {name for node in model.graph.node for name in [*node.input, *node.output] if name}
    assert every <= set(values)
    for initializer in model.graph.initializer:
        if initializer.name in values:
            producer = values[initializer.name].owner_op()
            assert producer.attributes["onnx.name"].value == initializer.name


def test_tensor_values_refuse_another_model() -> None:
    module = import_onnx(CNN)
    with pytest.raises(InputError, match="does not come from this model"):
        tensor_values(module, MODELS / "tiny_encoder.onnx")


def test_degenerate_range_widens_to_include_zero() -> None:
    module = import_onnx(CNN)
    ranges = CalibrationRanges(metadata={"model": str(CNN)})
    ranges.add(TensorRange("image", 0.5, 0.5))
    attach_ranges(module, ranges)
    quantize = next(op for op in module.walk() if isinstance(op, QuantizeCastOp))
    element = quantize.result.type.element_type
    assert (element.min, element.max) == (0.0, 0.5)


def test_all_zero_range_keeps_onnxruntime_parameters() -> None:
    from qconvert.numerics.calibration import compute_scale_zp

    module = import_onnx(CNN)
    ranges = CalibrationRanges(metadata={"model": str(CNN)})
    ranges.add(TensorRange("image", 0.0, 0.0))
    attach_ranges(module, ranges)
    text = print_module(module)
    reparsed = parse_module(text, options=ParserOptions(allow_unregistered_dialect=True))
    quantize = next(op for op in reparsed.walk() if isinstance(op, QuantizeCastOp))
    element = quantize.result.type.element_type
    for symmetric in (False, True):
        params = compute_scale_zp(element.min, element.max, -128, 127, symmetric)
        assert (float(params.scale), params.zero_point) == (1.0, 0)


def test_nan_range_is_refused_naming_the_tensor() -> None:
    module = import_onnx(CNN)
    ranges = CalibrationRanges(metadata={"model": str(CNN)})
    ranges.add(TensorRange("image", float("nan"), float("nan")))
    with pytest.raises(InputError, match="tensor 'image'"):
        attach_ranges(module, ranges)


def test_block_edit_applies_insertions_and_erasures_in_order() -> None:
    from qconvert.calibrate.block_edit import BlockEdit
    from qconvert.ir.core import Block, GenericOp
    from qconvert.ir.types import F32

    block = Block([F32])
    first, second, last = (block.append(GenericOp(f"t.{n}", [], [F32])) for n in ("a", "b", "c"))
    edit = BlockEdit(block)
    new = {n: GenericOp(f"t.{n}", [], [F32]) for n in ("start", "x", "y", "z", "w")}
    edit.insert_after(first, new["x"], new["y"])
    edit.insert_after(first, new["z"])  # after the same anchor: after the earlier insertions
    edit.insert_after(new["y"], new["w"])  # anchored to a pending op
    edit.insert_after(None, new["start"])
    edit.erase(first)  # its followers stay in its place
    edit.insert_after(second)  # nothing to insert: a no-op
    assert [op.name for op in block.ops] == ["t.a", "t.b", "t.c"]  # nothing changes before commit
    edit.commit()
    assert [op.name for op in block.ops] == ["t.start", "t.x", "t.y", "t.w", "t.z", "t.b", "t.c"]
    assert all(op.parent is block for op in block.ops) and first.parent is None and last.parent is block


def test_tensor_values_follow_nodes_lifted_generically_or_not() -> None:
    """A Constant with `value_float` stays a generic op, one with `value` becomes arith.constant, a
    DequantizeLinear of a constant becomes quant casts: every tensor is still named."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Constant", [], ["two"], name="", value_float=2.0),
        helper.make_node("Constant", [], ["three"], name="", value=numpy_helper.from_array(np.float32(3.0))),
        helper.make_node("DequantizeLinear", ["w_q", "w_s"], ["w"], name="dq"),
        helper.make_node("Mul", ["x", "two"], ["a"], name=""),
        helper.make_node("Mul", ["a", "three"], ["b"], name=""),
        helper.make_node("Add", ["b", "w"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [
            numpy_helper.from_array(np.array([1, 2, 3, 4], np.int8), "w_q"),
            numpy_helper.from_array(np.float32(0.5), "w_s"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    module = import_onnx(model)
    values = tensor_values(module, model)
    assert {"x", "two", "three", "w", "a", "b", "y"} <= set(values)
    assert values["two"].owner_op().name == "onnx.Constant"
    assert values["three"].owner_op().name == "arith.constant"
    assert isinstance(values["w"].owner_op(), DequantizeCastOp)
    assert values["b"].owner_op().operands[0] is values["a"]
