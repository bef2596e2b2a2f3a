"""An i8 add of a splat constant as a tosa.table (TosaOptions.constant_sum_tables, issue 19): MiniLM's GELU
`erf(x) + 1` with onnxruntime's quantizer's scales (erf at 2/255, the constant 1.0 at 1/255 zero point -128,
the sum at 2/255 zero point -128) puts every exact sum on a half step, which the accumulator add's RESCALE
rounds up while onnxruntime's float32 lands just below it. Every int8 input code, on the TOSA reference model
(and our emulation), against onnxruntime: the table gives its bits on all 256.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import require_tosa_python
from onnx import TensorProto, helper, numpy_helper

pytestmark = pytest.mark.engine

ERF_SCALE = np.float32(2 / 255)  # the corpus MiniLM's: Erf_output_0_scale, Add_output_0_scale
ONE_SCALE = np.float32(1 / 255)  # Constant_1_output_0_scale (zero point -128: 1.0 stored as 127)


def _gelu_add() -> onnx.ModelProto:
    """x -> Q -> DQ, + DQ(Q(1.0)), -> Q -> DQ: the GELU add of the corpus MiniLM (QDQ) alone, as written."""
    initializers = {
        "s_x": ERF_SCALE,
        "z_x": np.int8(0),
        "one": np.float32(1.0),
        "s_one": ONE_SCALE,
        "z_one": np.int8(-128),
        "s_y": ERF_SCALE,
        "z_y": np.int8(-128),
    }
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "s_x", "z_x"], ["x_dq"]),
        helper.make_node("QuantizeLinear", ["one", "s_one", "z_one"], ["one_q"]),
        helper.make_node("DequantizeLinear", ["one_q", "s_one", "z_one"], ["one_dq"]),
        helper.make_node("Add", ["x_dq", "one_dq"], ["sum"]),
        helper.make_node("QuantizeLinear", ["sum", "s_y", "z_y"], ["y_q"]),
        helper.make_node("DequantizeLinear", ["y_q", "s_y", "z_y"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "gelu_add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _steps_off(constant_sum_tables: bool) -> tuple[np.ndarray, str]:
    """The converted add's storage minus onnxruntime's on every int8 input, and the module's text."""
    import onnxruntime as ort

    from qconvert.backends.tosa import TosaOptions, convert_to_tosa, emulate_tosa, run_reference
    from qconvert.frontends.onnx import import_onnx
    from qconvert.ir.printer import print_module

    model = _gelu_add()
    # --allow-float: without it the float 1.0 quantize is refused before any pattern sees the add
    options = TosaOptions(allow_float=True, constant_sum_tables=constant_sum_tables)
    text = print_module(convert_to_tosa(import_onnx(model), options))
    storage = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)
    (got,) = run_reference(text, [storage])
    (emulated,) = emulate_tosa(text, [storage])
    assert np.array_equal(emulated, got), "the emulation differs from the reference model"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": storage.astype(np.float32) * ERF_SCALE})
    want = np.clip(np.rint(expected / ERF_SCALE) - 128, -128, 127).astype(np.int64)
    return got.astype(np.int64) - want, text


def test_gelu_add_is_a_table_with_onnxruntimes_bits() -> None:
    require_tosa_python()
    from qconvert.backends.tosa import validate

    rescaled, plain = _steps_off(constant_sum_tables=False)
    tabled, text = _steps_off(constant_sum_tables=True)
    assert np.abs(rescaled).max() <= 1
    assert np.count_nonzero(rescaled) > 0.5 * rescaled.size  # the half steps RESCALE rounds up
    assert np.count_nonzero(tabled) == 0
    assert '"tosa.table"' in text and '"tosa.table"' not in plain and '"tosa.rescale"' not in text
    assert validate(text, ("pro_int",)) == ""


def test_unsigned_constant_minus_value_is_a_table_with_onnxruntimes_bits() -> None:
    """The other order and op, uint8 storage (TABLE indexes the signless bits), the constant a stored uint8
    initializer: `DQ(c) - DQ(x)` requantized, on every code."""
    require_tosa_python()
    import onnxruntime as ort

    from qconvert.backends.tosa import TosaOptions, convert_to_tosa, emulate_tosa, run_reference
    from qconvert.frontends.onnx import import_onnx
    from qconvert.ir.printer import print_module

    scale_x, scale_c, scale_y = np.float32(0.0213), np.float32(0.0071), np.float32(0.0187)
    initializers = {
        "s_x": scale_x,
        "z_x": np.uint8(131),
        "c_q": np.uint8(200),
        "s_c": scale_c,
        "z_c": np.uint8(17),
        "s_y": scale_y,
        "z_y": np.uint8(121),
    }
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "s_x", "z_x"], ["x_dq"]),
        helper.make_node("DequantizeLinear", ["c_q", "s_c", "z_c"], ["c_dq"]),
        helper.make_node("Sub", ["c_dq", "x_dq"], ["difference"]),
        helper.make_node("QuantizeLinear", ["difference", "s_y", "z_y"], ["y_q"]),
        helper.make_node("DequantizeLinear", ["y_q", "s_y", "z_y"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "constant_minus_value",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in initializers.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    text = print_module(convert_to_tosa(import_onnx(model), TosaOptions()))
    assert '"tosa.table"' in text and '"tosa.rescale"' not in text
    codes = np.arange(256, dtype=np.uint8).reshape(1, 256)
    (got,) = run_reference(text, [codes.view(np.int8)])
    (emulated,) = emulate_tosa(text, [codes.view(np.int8)])
    assert np.array_equal(emulated, got)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {"x": (codes.astype(np.float32) - 131) * scale_x}
    (expected,) = session.run(None, feeds)
    want = (np.rint(expected / scale_y) + 121).astype(np.int64)
    assert 0 < np.count_nonzero(want == 255) < 128  # saturation at the top is exercised, not everywhere
    assert np.array_equal(got.view(np.uint8).astype(np.int64), want)
