"""Integer Softmax (backends/tosa/softmax.py, on by default; `--backend-option integer_softmax=false` turns
it off): an 8-bit Softmax as integer TOSA (PRO-INT alone: two i8 exp tables, i32 sums, tosa.intdiv), on the
TOSA reference model, our emulation and IREE, against onnxruntime's float path (optimizations off, check's
oracle).

Measured (4x64x64, random normal inputs): at most 1 step off, 1 to 9 of 16384 elements one step off; against
onnxruntime's optimized session (com.microsoft QLinearSoftmax, which multiplies by floor(1 / s_out)) 227 and
256 of 16384 at s_out = 1/255. tiny_encoder: each Softmax 1 of 2048 one step off in `check` (PASSED, 65
groups); end to end 184 of 2048 (max 4 steps) and 11 of 64 (3), beside the noise floor's 1126 (6) and 44 (5).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import require_module, require_tosa_python
from onnx import TensorProto, helper, numpy_helper

from qconvert.errors import InputError

pytestmark = pytest.mark.engine

MODELS = Path(__file__).resolve().parents[3] / "models"
TINY = MODELS / "tiny_encoder.qdq.onnx"
TINY_INPUTS = MODELS / "tiny_encoder.inputs.npz"


def _quant_types(module: object, key: str) -> list[object | None]:
    """The `qconvert.quant_type` of each argument (`arg_attrs`) or result (`res_attrs`) of @main."""
    from qconvert.ir.attributes import ArrayAttr, DictionaryAttr, StringAttr
    from qconvert.ir.dialects.onnx import main_function
    from qconvert.ir.parser import parse_type

    entries = main_function(module).attributes[key]  # type: ignore[arg-type]
    assert isinstance(entries, ArrayAttr)
    found: list[object | None] = []
    for entry in entries.elements:
        text = dict(entry.entries).get("qconvert.quant_type") if isinstance(entry, DictionaryAttr) else None
        found.append(parse_type(text.value) if isinstance(text, StringAttr) else None)
    return found


def _session(model: onnx.ModelProto | str, optimized: bool = False) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _softmax_model(
    shape: tuple[int, ...], input_q: tuple[float, int], output_q: tuple[float, int], dtype: type
) -> onnx.ModelProto:
    """`x -> Q -> DQ -> Softmax(axis=-1) -> Q -> DQ -> out`, both quantizations of `dtype` storage."""
    initializers = [
        numpy_helper.from_array(np.array(input_q[0], np.float32), "s_in"),
        numpy_helper.from_array(np.array(input_q[1], dtype), "zp_in"),
        numpy_helper.from_array(np.array(output_q[0], np.float32), "s_out"),
        numpy_helper.from_array(np.array(output_q[1], dtype), "zp_out"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s_in", "zp_in"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s_in", "zp_in"], ["xd"]),
        helper.make_node("Softmax", ["xd"], ["y"], name="softmax", axis=-1),
        helper.make_node("QuantizeLinear", ["y", "s_out", "zp_out"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "s_out", "zp_out"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "softmax",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


CASES = {  # input (scale, zero point), output (scale, zero point), storage
    "tiny_encoder_layer0": ((0.01785346, -15), (1 / 255, -128), np.int8),
    "tiny_encoder_layer1": ((0.0287452, -3), (1 / 255, -128), np.int8),
    "coarse_input": ((0.1, 3), (1 / 256, -128), np.int8),
    "uint8": ((0.05, 131), (1 / 256, 0), np.uint8),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_integer_softmax_is_pro_int_and_within_a_step(case: str, tmp_path: Path) -> None:
    """Strict PRO-INT validation (no extension), no float tensor; the reference model equals the emulation;
    against onnxruntime's float path at most one step off on 0.5% of the elements."""
    require_tosa_python()
    from qconvert.backends.tosa import TosaOptions, convert_to_tosa, emulate_tosa, run_reference, validate
    from qconvert.frontends.onnx import import_onnx
    from qconvert.ir.printer import print_module
    from qconvert.numerics import UniformParams, quantize

    input_q, output_q, dtype = CASES[case]
    model = _softmax_model((4, 64, 64), input_q, output_q, dtype)
    path = tmp_path / "softmax.onnx"
    onnx.save(model, str(path))
    text = print_module(convert_to_tosa(import_onnx(str(path)), TosaOptions(integer_softmax=True)))
    assert '"tosa.intdiv"' in text and "xf32>" not in text and "xi16>" not in text
    assert validate(text, ("pro_int",), strict=True) == ""
    real = (np.random.default_rng(0).standard_normal((4, 64, 64)) * 2).astype(np.float32)
    limits = np.iinfo(dtype)
    params = UniformParams(
        scale=np.float32(input_q[0]),
        zero_point=np.array(input_q[1]),
        storage_dtype=np.dtype(dtype),
        storage_type_min=int(limits.min),
        storage_type_max=int(limits.max),
    )
    stored = quantize(real, params)
    signless = stored.view(np.int8) if dtype == np.uint8 else stored
    (engine,) = run_reference(text, [signless])
    assert np.array_equal(engine, emulate_tosa(text, [signless])[0])
    (expected,) = _session(model).run(None, {"x": real})
    ours = engine.view(dtype).astype(np.int64) - output_q[1]
    steps = np.abs(ours - np.rint(expected / np.float32(output_q[0])))
    assert steps.max() <= 1
    assert np.count_nonzero(steps) <= 0.005 * steps.size


def test_integer_softmax_on_iree_and_the_float_island_when_off(tmp_path: Path) -> None:
    """IREE runs tosa.intdiv and the tables as the emulation does; with integer_softmax=false the Softmax is
    a float island: refused, or float TOSA under --allow-float."""
    require_tosa_python()
    require_module("iree.compiler")
    from qconvert.backends.tosa import TosaOptions, convert_to_tosa, emulate_tosa, run_iree
    from qconvert.frontends.onnx import import_onnx
    from qconvert.ir.printer import print_module

    path = tmp_path / "softmax.onnx"
    onnx.save(_softmax_model((2, 3, 16), (0.05, 2), (1 / 255, -128), np.int8), str(path))
    text = print_module(convert_to_tosa(import_onnx(str(path))))  # on by default
    stored = np.random.default_rng(1).integers(-128, 128, (2, 3, 16)).astype(np.int8)
    (compiled,) = run_iree(text, [stored])
    assert np.array_equal(compiled, emulate_tosa(text, [stored])[0])
    with pytest.raises(InputError, match=r"stablehlo\.exponential"):
        convert_to_tosa(import_onnx(str(path)), TosaOptions(integer_softmax=False))
    floating = TosaOptions(allow_float=True, integer_softmax=False)
    floating = print_module(convert_to_tosa(import_onnx(str(path)), floating))
    assert '"tosa.exp"' in floating and '"tosa.intdiv"' not in floating


def test_tiny_encoder_softmax_is_integer_and_end_to_end_beside_the_noise_floor() -> None:
    """tiny_encoder with --allow-float and integer_softmax: only its 5 LayerNormalization stay float; the
    reference model equals the emulation; end to end, no output is further from onnxruntime's float path
    than onnxruntime's own optimized session is (the noise floor)."""
    require_tosa_python()
    from qconvert.backends.tosa import TosaOptions, convert_to_tosa, emulate_tosa, run_reference, validate
    from qconvert.frontends.onnx import import_onnx
    from qconvert.ir.printer import print_module
    from qconvert.ir.quant_types import uniform_params
    from qconvert.numerics import dequantize

    module = convert_to_tosa(import_onnx(str(TINY)), TosaOptions(allow_float=True, integer_softmax=True))
    text = print_module(module)
    header = text.splitlines()[0]
    assert "5 ONNX nodes kept float" in header and "Softmax" not in header
    assert text.count('"tosa.intdiv"') == 2 and '"tosa.exp"' not in text
    assert validate(text, ("pro_int", "pro_fp"), strict=True) == ""
    feeds = dict(np.load(TINY_INPUTS))
    names = [i.name for i in _session(str(TINY)).get_inputs()]
    arguments = [feeds[name].astype(np.int32) for name in names]
    outputs = run_reference(text, arguments)
    assert all(np.array_equal(a, b) for a, b in zip(outputs, emulate_tosa(text, arguments), strict=True))
    spec = _session(str(TINY)).run(None, {name: feeds[name] for name in names})
    optimized = _session(str(TINY), optimized=True).run(None, {name: feeds[name] for name in names})
    for stored, reference, floor, quant in zip(
        outputs, spec, optimized, _quant_types(module, "res_attrs"), strict=True
    ):
        params = uniform_params(quant)  # type: ignore[arg-type]
        steps = np.abs(dequantize(stored.view(params.storage_dtype), params) - reference) / params.scale
        noise = np.abs(floor - reference) / params.scale
        assert float(steps.max()) <= float(noise.max()) + 1e-6
        assert np.count_nonzero(np.round(steps)) <= np.count_nonzero(np.round(noise))
