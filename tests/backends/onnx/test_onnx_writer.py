"""The IR -> ONNX writer (qconvert.backends.onnx): sample models round-trip through the IR and onnxruntime
computes the same bits on both; hand-written quant casts run on onnxruntime exactly as the interpreter
runs them; what ONNX cannot express is refused with a message naming the op or value.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from qconvert.backends.onnx import save as save_module
from qconvert.backends.onnx import save_onnx, write_onnx
from qconvert.errors import InputError, ParseError
from qconvert.frontends.onnx import import_onnx
from qconvert.frontends.onnx.summary import elide_weights
from qconvert.interpret import interpret
from qconvert.ir import ParserOptions, parse_module, print_module, verify
from qconvert.ir.attributes import DenseResourceAttr
from qconvert.ir.core import Builder, GenericOp, replace_op
from qconvert.ir.dialects.builtin import ModuleOp

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "models"
ROUND_TRIP_MODELS = [
    f"{stem}{kind}.onnx" for stem in ("digits_cnn", "tiny_encoder") for kind in ("", ".qdq", ".qop")
]


def inputs_for(name: str) -> dict[str, np.ndarray]:
    with np.load(MODELS / f"{name.split('.')[0]}.inputs.npz") as data:
        return {k: data[k] for k in data.files}


def run_onnxruntime(
    model: onnx.ModelProto | str, feed: dict[str, np.ndarray], optimize: bool = False
) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return [np.asarray(value) for value in session.run(None, feed)]


def parse(text: str) -> ModuleOp:
    module = parse_module(text, options=ParserOptions(allow_unregistered_dialect=True))
    verify(module)
    return module


# Sample models -----------------------------------------------------------------------------------
@pytest.mark.parametrize("optimize", [False, True], ids=["spec", "optimized"])
@pytest.mark.parametrize("name", ROUND_TRIP_MODELS)
def test_sample_model_round_trip_is_bit_identical_on_onnxruntime(name: str, optimize: bool) -> None:
    original = onnx.load(str(MODELS / name))
    written = write_onnx(import_onnx(MODELS / name))
    onnx.checker.check_model(written, full_check=True)
    assert [o.name for o in written.graph.output] == [o.name for o in original.graph.output]
    assert [i.name for i in written.graph.input] == [i.name for i in original.graph.input]
    feed = inputs_for(name)
    expected = run_onnxruntime(original, feed, optimize)
    actual = run_onnxruntime(written, feed, optimize)
    for want, got in zip(expected, actual, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes(), f"max |diff| {np.max(np.abs(got - want))}"


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _axis(node: onnx.NodeProto, scale: np.ndarray) -> int | None:
    if scale.size == 1:
        return None  # per-tensor: no axis in effect
    return next((a.i for a in node.attribute if a.name == "axis"), 1)


@pytest.mark.parametrize("name", [n for n in ROUND_TRIP_MODELS if ".q" in n])
def test_quantization_parameters_and_weights_match_the_original_by_node_name(name: str) -> None:
    """Every node comes back under its name with the same constant inputs: scales, zero points and
    quantized weights equal in value, type and shape (a one-element scale is read as per-tensor, 0-d).
    Constant nodes come back as initializers."""
    original = onnx.load(str(MODELS / name))
    written = write_onnx(import_onnx(MODELS / name))
    old_constants, new_constants = _constants(original), _constants(written)
    for node in original.graph.node:
        if node.op_type == "Constant":
            old_constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    before = {n.name: n for n in original.graph.node if n.op_type != "Constant"}
    after = {n.name: n for n in written.graph.node}
    assert sorted(before) == sorted(after)
    compared = 0
    for node_name, old in before.items():
        new = after[node_name]
        assert (new.op_type, new.domain) == (old.op_type, old.domain)
        assert len(new.input) >= len(old.input), node_name
        for index, old_input in enumerate(old.input):
            if old_input not in old_constants:
                continue
            want, got = old_constants[old_input], new_constants[new.input[index]]
            if want.size == 1:
                want = want.reshape(())
            assert got.dtype == want.dtype and got.shape == want.shape, (node_name, index)
            assert got.tobytes() == want.tobytes(), (node_name, index)
            compared += 1
        if old.op_type in ("QuantizeLinear", "DequantizeLinear"):
            scale = old_constants[old.input[1]]
            assert _axis(new, scale) == _axis(old, scale), node_name
    assert compared > 20


@pytest.mark.parametrize("name", ["digits_cnn.qdq.onnx", "tiny_encoder.qdq.onnx"])
def test_q_dq_names_follow_onnxruntime_conventions(name: str) -> None:
    """`<t>_QuantizeLinear` nodes get `<t>_scale`, `<t>_zero_point` and output `<t>_QuantizeLinear_Output`
    back, as onnxruntime's quantizer named them (parameters it shared between two tensors aside)."""
    original = onnx.load(str(MODELS / name))
    after = {n.name: n for n in write_onnx(import_onnx(MODELS / name)).graph.node}
    checked = 0
    for node in original.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        tensor = node.name.removesuffix(f"_{node.op_type}")
        written = after[node.name]
        if node.input[1] == f"{tensor}_scale" and node.output[0] == f"{node.name}_Output":
            assert list(written.input[1:]) == list(node.input[1:]) and written.output[0] == node.output[0]
            checked += 1
    assert checked >= 10


def test_float_weights_keep_their_initializer_names() -> None:
    original = onnx.load(str(MODELS / "digits_cnn.onnx"))
    written = write_onnx(import_onnx(MODELS / "digits_cnn.onnx"))
    big = {t.name for t in original.graph.initializer if np.prod(t.dims) >= 64}
    assert big and big <= {t.name for t in written.graph.initializer}


def contrib_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Every com.microsoft QOperator op the frontend lifts, chained, with constant parameters."""
    rng = np.random.default_rng(3)
    u8, i8, f32 = np.uint8, np.int8, np.float32
    params = {
        "xs": np.array(0.05, f32), "xz": np.array(120, u8), "ss": np.array(2**-8, f32), "sz": np.array(0, u8),
        "ls": np.array(0.04, f32), "lz": np.array(100, u8), "as": np.array(0.06, f32), "az": np.array(90, u8),
        "ms": np.array(0.3, f32), "mz": np.array(128, u8), "cs": np.array(0.25, f32), "cz": np.array(10, u8),
        "ps": np.array(0.2, f32), "pz": np.array(7, u8), "gs": np.array(0.1, f32), "gz": np.array(3, u8),
        "b": rng.integers(-128, 128, (16, 8)).astype(i8), "bs": rng.uniform(0.001, 0.03, 8).astype(f32),
        "bz": np.zeros(8, i8), "bias": rng.standard_normal(8).astype(f32),
        "qs": np.array(0.02, f32), "qz": np.array(4, u8), "c": rng.integers(-3000, 3000, 8).astype(np.int32),
        "ys": np.array(0.07, f32), "yz": np.array(6, u8),
    }  # fmt: skip
    node = onnx.helper.make_node
    ms = "com.microsoft"
    nodes = [
        node("QLinearSigmoid", ["x", "xs", "xz", "ss", "sz"], ["s"], domain=ms, name="sigmoid"),
        node("QLinearLeakyRelu", ["x", "xs", "xz", "ls", "lz"], ["l"], domain=ms, name="leaky", alpha=0.2),
        node("QLinearAdd", ["s", "ss", "sz", "l", "ls", "lz", "as", "az"], ["a"], domain=ms, name="add"),
        node("QLinearMul", ["a", "as", "az", "x", "xs", "xz", "ms", "mz"], ["m"], domain=ms, name="mul"),
        node("QLinearConcat", ["cs", "cz", "m", "ms", "mz", "s", "ss", "sz"], ["c1"], domain=ms, axis=1),
        node("QLinearAveragePool", ["c1", "cs", "cz", "ps", "pz"], ["pool"], domain=ms, kernel_shape=[2, 2],
             strides=[2, 2], name="pool"),
        node("QLinearGlobalAveragePool", ["pool", "ps", "pz", "gs", "gz"], ["gap"], domain=ms, name="gap"),
        node("DynamicQuantizeMatMul", ["f", "b", "bs", "bz", "bias"], ["dqmm"], domain=ms, name="dqmm"),
        node("QGemm", ["q", "qs", "qz", "b", "bs", "bz", "", "ys", "yz"], ["gemm_q"], domain=ms, name="gq"),
        node("QGemm", ["q", "qs", "qz", "b", "bs", "bz", "c"], ["gemm_f"], domain=ms, name="gf", alpha=0.5),
    ]  # fmt: skip
    feed = {
        "x": rng.integers(0, 256, (1, 3, 8, 8)).astype(u8),
        "f": rng.standard_normal((5, 16)).astype(f32),
        "q": rng.integers(0, 256, (5, 16)).astype(u8),
    }
    value_info = onnx.helper.make_tensor_value_info
    graph = onnx.helper.make_graph(
        nodes,
        "contrib",
        [value_info(k, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feed.items()],
        [onnx.ValueInfoProto(name=name) for name in ("gap", "pool", "dqmm", "gemm_q", "gemm_f")],
        [numpy_helper.from_array(v, k) for k, v in params.items()],
    )
    opsets = [onnx.helper.make_opsetid("", 21), onnx.helper.make_opsetid(ms, 1)]
    model = onnx.helper.make_model(graph, opset_imports=opsets, ir_version=10)
    return model, feed


def test_every_lifted_contrib_qoperator_op_writes_back_bit_exactly() -> None:
    model, feed = contrib_model()
    module = import_onnx(model)
    lifted = [op.name for op in module.walk() if op.name.startswith(("qconvert.", "onnx."))]
    assert len(lifted) == len(model.graph.node) and all(n.startswith("qconvert.") for n in lifted), lifted
    written = write_onnx(module)
    assert [(n.domain, n.op_type) for n in written.graph.node] == [
        (n.domain, n.op_type) for n in model.graph.node
    ]
    expected = run_onnxruntime(model, feed)
    for want, got in zip(expected, run_onnxruntime(written, feed), strict=True):
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def test_generic_fnuz_quantize_linear_is_written_back_as_a_node() -> None:
    """The frontend keeps FNUZ float8 Q/DQ generic (no MLIR storage type): they come back as nodes."""
    helper = onnx.helper
    zero_point = helper.make_tensor("zp", onnx.TensorProto.FLOAT8E4M3FNUZ, [], [0.0])
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="q"),
            helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="dq"),
        ],
        "fnuz",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [6])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "s"), zero_point],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    module = import_onnx(model)
    assert "onnx.QuantizeLinear" in [op.name for op in module.walk()]
    written = write_onnx(module)
    assert [n.op_type for n in written.graph.node] == ["QuantizeLinear", "DequantizeLinear"]
    x = np.array([0.1, 1.3, -7.0, 300.0, 1e6, -0.0], np.float32)
    (want,), (got,) = run_onnxruntime(model, {"x": x}), run_onnxruntime(written, {"x": x})
    assert got.tobytes() == want.tobytes()


def test_absent_optional_inputs_and_outputs_stay_absent() -> None:
    helper = onnx.helper
    graph = helper.make_graph(
        [
            helper.make_node("LayerNormalization", ["x", "s"], ["y", "", "inv"], name="ln"),
            helper.make_node("Clip", ["y", "", "top"], ["c"], name="clip"),
        ],
        "absent",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
        [
            helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("inv", onnx.TensorProto.FLOAT, None),
        ],
        [
            numpy_helper.from_array(np.ones(4, np.float32), "s"),
            numpy_helper.from_array(np.float32(0.5), "top"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    written = write_onnx(import_onnx(model))
    layer_norm, clip = written.graph.node
    assert layer_norm.output[1] == "" and layer_norm.output[2] == "inv" and clip.input[1] == ""
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    for want, got in zip(run_onnxruntime(model, {"x": x}), run_onnxruntime(written, {"x": x}), strict=True):
        assert got.tobytes() == want.tobytes()


def test_an_unknown_qconvert_op_is_refused() -> None:
    """The qconvert dialect is registered: the parser refuses an op it does not define, as MLIR does; one
    built in code (an unregistered generic op) is refused by the writer."""
    text = """
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = "qconvert.frobnicate"(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}"""
    with pytest.raises(ParseError, match=r"unregistered operation 'qconvert\.frobnicate' found in dialect"):
        parse(text)
    module = parse(text.replace("qconvert.frobnicate", "onnx.Identity"))
    identity = next(op for op in module.walk() if op.name == "onnx.Identity")
    unknown = GenericOp("qconvert.frobnicate", identity.operands, identity.result_types)
    Builder.before(identity).insert(unknown)
    replace_op(identity, unknown.results)
    with pytest.raises(
        InputError, match=r"'qconvert\.frobnicate' is not a qconvert op the ONNX writer knows"
    ):
        write_onnx(module)


# Hand-written quant casts against the interpreter --------------------------------------------------
SUB_CHANNEL = "{0:1, 1:3}, {{0.5:1, 0.25}, {0.125:-2, 1.0}, {0.5, 0.5}, {0.75:3, 0.25:-1}}"
QUANT_TYPES = {
    "i8 per-tensor": "!quant.uniform<i8:f32, 0.0625:-3>",
    "u8 per-tensor": "!quant.uniform<u8:f32, 0.0390625:128>",
    "i16 per-tensor": "!quant.uniform<i16:f32, 1.0E-3:100>",
    "u16 per-tensor": "!quant.uniform<u16:f32, 2.0E-3:30000>",
    "i4 per-tensor": "!quant.uniform<i4:f32, 0.5:1>",
    "u4 per-tensor": "!quant.uniform<u4:f32, 0.25:8>",
    "i8 per-axis 1": "!quant.uniform<i8:f32:1, {0.1:1, 0.2:-2, 0.05, 0.3:4, 0.15, 0.25:-1}>",
    "u8 per-axis 0": "!quant.uniform<u8:f32:0, {0.01:128, 0.02:100, 0.05:3, 0.03:250}>",
    "i16 per-axis 0": "!quant.uniform<i16:f32:0, {1.0E-4:7, 2.0E-4, 5.0E-4:-9, 1.0E-3}>",
    "i4 per-axis 1": "!quant.uniform<i4:f32:1, {0.5:1, 0.25, 0.125:-2, 1.0, 0.75:3, 0.3:-1}>",
    "i4 blocked": f"!quant.uniform<i4:f32:{SUB_CHANNEL}>",
    # sub-channel types that are ONNX blocked with one block along the other axis, per-axis, per-element
    "i4 blocked one block on axis 0": "!quant.uniform<i4:f32:{0:4, 1:3}, {{0.5:1, 0.25}}>",
    "i8 sub-channel per-row": "!quant.uniform<i8:f32:{0:1, 1:6}, {{0.5:1}, {0.25:2}, {0.125}, {1.0:-3}}>",
    "i8 sub-channel per-element": "!quant.uniform<i8:f32:{0:1, 1:1}, {"
    + ", ".join(
        "{" + ", ".join(f"{0.05 * (r + 1) + 0.01 * c}:{c - r}" for c in range(6)) + "}" for r in range(4)
    )
    + "}>",
}
NARROW_I8 = "!quant.uniform<i8<-127:127>:f32, 0.0625>"
READABLE_STORAGE = ("i8", "u8", "i16", "u16")  # onnxruntime's Python API cannot return int4


def cast_module(quant_type: str, return_storage: bool, opset: int = 21) -> ModuleOp:
    storage_result = f', tensor<4x6x{quant_type}> {{onnx.name = "q"}}' if return_storage else ""
    storage_value = ", %q" if return_storage else ""
    storage_type = f", tensor<4x6x{quant_type}>" if return_storage else ""
    return parse(f"""
module attributes {{onnx.opset_import = {{ai.onnx = {opset} : i64}}}} {{
  func.func @main(%x: tensor<4x6xf32> {{onnx.name = "x"}})
      -> (tensor<4x6xf32> {{onnx.name = "y"}}{storage_result}) {{
    %q = quant.qcast %x : tensor<4x6xf32> to tensor<4x6x{quant_type}>
    %y = quant.dcast %q : tensor<4x6x{quant_type}> to tensor<4x6xf32>
    return %y{storage_value} : tensor<4x6xf32>{storage_type}
  }}
}}""")


def probe_input(scale: float, reach: float, seed: int = 0) -> np.ndarray:
    """Multiples of half a scale (ties to round) reaching `reach` scales beyond zero, both signs."""
    rng = np.random.default_rng(seed)
    steps = int(2 * reach)
    return (rng.integers(-steps, steps, (4, 6)) * (scale / 2)).astype(np.float32)


@pytest.mark.parametrize("label", sorted(QUANT_TYPES))
def test_hand_written_casts_run_on_onnxruntime_as_the_interpreter_runs_them(label: str) -> None:
    quant_type = QUANT_TYPES[label]
    module = cast_module(quant_type, return_storage=label.split()[0] in READABLE_STORAGE)
    written = write_onnx(module)
    width = int(label.split()[0][1:])
    for seed, scale in enumerate((0.0625, 0.5, 1.0e-3)):
        x = probe_input(scale, reach=2 ** (width - 1) * 1.5, seed=seed)
        ours = interpret(module, {"x": x})
        theirs = run_onnxruntime(written, {"x": x})
        for output, value in zip(written.graph.output, theirs, strict=True):
            mine = ours[output.name]
            assert mine.dtype == value.dtype, output.name
            assert mine.tobytes() == value.tobytes(), f"{output.name}: ours {mine}, onnxruntime {value}"


def test_storage_types_and_opsets_of_the_written_casts() -> None:
    cases = {
        "u8 per-axis 0": (onnx.TensorProto.UINT8, 21, 0, None),
        "i4 blocked": (onnx.TensorProto.INT4, 21, 1, 3),
        "i16 per-tensor": (onnx.TensorProto.INT16, 21, None, None),
        "i4 blocked one block on axis 0": (onnx.TensorProto.INT4, 21, 1, 3),
        "i8 sub-channel per-row": (onnx.TensorProto.INT8, 21, 0, None),
        "i8 sub-channel per-element": (onnx.TensorProto.INT8, 21, 0, 1),
    }
    for label, (elem_type, opset, axis, block_size) in cases.items():
        written = write_onnx(cast_module(QUANT_TYPES[label], return_storage=False))
        assert written.opset_import[0].version == opset
        quantize = next(n for n in written.graph.node if n.op_type == "QuantizeLinear")
        zero_point = next(t for t in written.graph.initializer if t.name == quantize.input[2])
        assert zero_point.data_type == elem_type, label
        attributes = {a.name: a.i for a in quantize.attribute}
        assert attributes.get("axis") == axis and attributes.get("block_size") == block_size, label


def test_blocks_along_two_axes_are_refused() -> None:
    module = cast_module("!quant.uniform<i8:f32:{0:2, 1:3}, {{0.5, 0.25}, {0.1, 0.2}}>", return_storage=False)
    with pytest.raises(InputError, match=r"blocks along axes \[0, 1\]: ONNX blocked quantization has one"):
        write_onnx(module)


def test_narrowed_storage_bounds_are_written_as_the_full_storage_type() -> None:
    """Documented loss (qdq.py): ONNX saturates to [-128, 127], the IR type to [-127, 127]."""
    module = cast_module(NARROW_I8, return_storage=True)
    x = np.full((4, 6), -100.0, np.float32)  # far below -127 * 0.0625
    (_, storage) = run_onnxruntime(write_onnx(module), {"x": x})
    assert int(storage.min()) == -128 and int(interpret(module, {"x": x})["q"].min()) == -127


def test_a_model_opset_is_raised_for_int16_and_other_nodes_are_adapted() -> None:
    # ReduceMean takes `axes` as an attribute at opset 17 and as an input from 18: the version converter
    # must move it for the opset-21 model that int16 storage needs.
    quant_type = QUANT_TYPES["i16 per-tensor"]
    module = parse(f"""
module attributes {{onnx.opset_import = {{ai.onnx = 17 : i64}}}} {{
  func.func @main(%x: tensor<4x6xf32> {{onnx.name = "x"}}) -> (tensor<4x1xf32> {{onnx.name = "y"}}) {{
    %m = "onnx.ReduceMean"(%x) {{axes = array<i64: 1>, keepdims = 1 : i64, onnx.node_name = "mean"}}
        : (tensor<4x6xf32>) -> tensor<4x1xf32>
    %q = quant.qcast %m : tensor<4x1xf32> to tensor<4x1x{quant_type}>
    %y = quant.dcast %q : tensor<4x1x{quant_type}> to tensor<4x1xf32>
    return %y : tensor<4x1xf32>
  }}
}}""")
    written = write_onnx(module)
    assert written.opset_import[0].version == 21
    mean = next(n for n in written.graph.node if n.op_type == "ReduceMean")
    assert len(mean.input) == 2 and not any(a.name == "axes" for a in mean.attribute)
    x = probe_input(1.0e-3, reach=40000)
    (value,) = run_onnxruntime(written, {"x": x})
    assert value.tobytes() == interpret(module, {"x": x})["y"].tobytes()


@pytest.mark.parametrize(("name", "opset"), [("tiny_encoder.qdq.onnx", 21), ("digits_cnn.qop.onnx", 25)])
def test_a_sample_model_converted_to_a_newer_opset_computes_the_same_bits(name: str, opset: int) -> None:
    # The converter sees the graph with its weights swapped for stubs: they must all come back.
    written = write_onnx(import_onnx(MODELS / name), opset=opset)
    assert written.opset_import[0].version == opset
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in written.graph.initializer)
    feed = inputs_for(name)
    expected = run_onnxruntime(onnx.load(str(MODELS / name)), feed)
    for want, got in zip(expected, run_onnxruntime(written, feed), strict=True):
        assert got.tobytes() == want.tobytes()


def test_an_opset_the_converter_cannot_reach_is_refused_clearly() -> None:
    module = import_onnx(MODELS / "tiny_encoder.onnx")  # LayerNormalization exists from opset 17
    with pytest.raises(InputError, match=r"from opset 17 to opset 13.*LayerNormalization"):
        write_onnx(module, opset=13)


def test_q_dq_models_are_not_written_past_opset_25() -> None:
    module = cast_module(QUANT_TYPES["i8 per-tensor"], return_storage=False, opset=28)
    assert write_onnx(module).opset_import[0].version == 25
    with pytest.raises(InputError, match="past opset 25"):
        write_onnx(module, opset=26)


BOUNDARY_MODULES = {
    # a graph input returned as is, a value returned twice, a constant returned: Identity nodes
    "pass-through": """
func.func @main(%x: tensor<?x4xf32> {onnx.name = "x"}) -> (tensor<?x4xf32> {onnx.name = "x"},
    tensor<?x4xf32> {onnx.name = "relu"}, tensor<2xf32> {onnx.name = "c"},
    tensor<?x4xf32> {onnx.name = "again"}) {
  %c = arith.constant dense<[1.0, 2.0]> : tensor<2xf32>
  %y = "onnx.Relu"(%x) : (tensor<?x4xf32>) -> tensor<?x4xf32>
  return %x, %y, %c, %y : tensor<?x4xf32>, tensor<?x4xf32>, tensor<2xf32>, tensor<?x4xf32>
}""",
    # an i8 argument read as u8 storage: the graph input is uint8 (no onnx.elem_type needed)
    "unsigned storage input": """
func.func @main(%q: tensor<4xi8> {onnx.name = "q"}) -> (tensor<4xf32> {onnx.name = "y"}) {
  %s = quant.scast %q : tensor<4xi8> to tensor<4x!quant.uniform<u8:f32, 0.5:128>>
  %y = quant.dcast %s : tensor<4x!quant.uniform<u8:f32, 0.5:128>> to tensor<4xf32>
  return %y : tensor<4xf32>
}""",
    # an f16 quantization in an opset-17 module: raised to 19 (f16 scales)
    "f16 at opset 17": """
module attributes {onnx.opset_import = {ai.onnx = 17 : i64}} {
  func.func @main(%x: tensor<4xf16> {onnx.name = "x"}) -> (tensor<4xf16> {onnx.name = "y"}) {
    %q = quant.qcast %x : tensor<4xf16> to tensor<4x!quant.uniform<i8:f16, 0.5:1>>
    %y = quant.dcast %q : tensor<4x!quant.uniform<i8:f16, 0.5:1>> to tensor<4xf16>
    return %y : tensor<4xf16>
  }
}""",
}
BOUNDARY_FEEDS = {
    "pass-through": {"x": np.array([[-1.5, 0.0, 2.0, 3.5]] * 3, np.float32)},
    "unsigned storage input": {"q": np.array([0, 128, 255, 3], np.uint8)},
    "f16 at opset 17": {"x": np.array([0.25, 0.75, -1.25, 100.0], np.float16)},
}


@pytest.mark.parametrize("label", sorted(BOUNDARY_MODULES))
def test_graph_boundaries_run_on_onnxruntime_as_the_interpreter_runs_them(label: str) -> None:
    module = parse(BOUNDARY_MODULES[label])
    written = write_onnx(module)
    feed = BOUNDARY_FEEDS[label]
    assert [i.name for i in written.graph.input] == list(feed)
    ours = interpret(module, feed)
    theirs = run_onnxruntime(written, feed)
    assert [o.name for o in written.graph.output] == list(ours)
    for output, value in zip(written.graph.output, theirs, strict=True):
        assert ours[output.name].dtype == value.dtype and ours[output.name].tobytes() == value.tobytes()
    if label == "f16 at opset 17":
        assert written.opset_import[0].version == 19


def test_a_quantized_tensor_takes_the_name_calibration_recorded() -> None:
    module = parse("""
func.func @main(%x: tensor<4xf32> {onnx.name = "x"}) -> (tensor<4xf32> {onnx.name = "y"}) {
  %r = "onnx.Relu"(%x) {onnx.node_name = "/Relu"} : (tensor<4xf32>) -> tensor<4xf32>
  %q = quant.qcast %r {onnx.node_name = "/Relu_output_0_QuantizeLinear", onnx.tensor_name = "/Relu_output_0"}
      : tensor<4xf32> to tensor<4x!quant.uniform<u8:f32, 0.5>>
  %y = quant.dcast %q : tensor<4x!quant.uniform<u8:f32, 0.5>> to tensor<4xf32>
  return %y : tensor<4xf32>
}""")
    nodes = write_onnx(module).graph.node
    assert [list(n.output) for n in nodes] == [
        ["/Relu_output_0"],
        ["/Relu_output_0_QuantizeLinear_Output"],
        ["y"],
    ]
    assert nodes[2].name == "DequantizeLinear_0"  # unnamed: a generated name, its Q node's parameters
    assert list(nodes[1].input) == ["/Relu_output_0", "/Relu_output_0_scale", "/Relu_output_0_zero_point"]
    assert list(nodes[2].input[1:]) == ["/Relu_output_0_scale", "/Relu_output_0_zero_point"]


def test_two_results_with_one_name_are_refused() -> None:
    module = parse("""
func.func @main(%x: tensor<4xf32>) -> (tensor<4xf32> {onnx.name = "y"}, tensor<4xf32> {onnx.name = "y"}) {
  return %x, %x : tensor<4xf32>, tensor<4xf32>
}""")
    with pytest.raises(InputError, match="result 1 of @main is named 'y'"):
        write_onnx(module)


# Refusals ------------------------------------------------------------------------------------------
def test_an_opset_too_old_for_the_storage_type_is_refused() -> None:
    module = cast_module(QUANT_TYPES["i4 per-tensor"], return_storage=False)
    with pytest.raises(InputError, match=r"opset 17 is too old.*need opset 21"):
        write_onnx(module, opset=17)


def test_a_calibrated_type_is_refused_naming_the_value() -> None:
    module = parse("""
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %q = quant.qcast %x {onnx.node_name = "act_q"} : tensor<4xf32> to tensor<4x!quant.calibrated<f32<-1.0:1.0>>>
  %y = quant.dcast %q : tensor<4x!quant.calibrated<f32<-1.0:1.0>>> to tensor<4xf32>
  return %y : tensor<4xf32>
}""")
    with pytest.raises(InputError, match=r"result 0 of 'quant.qcast' \(node 'act_q'\).*calibrated.*finalize"):
        write_onnx(module)


def test_an_op_of_another_dialect_is_refused_naming_it() -> None:
    module = parse("""
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = "stablehlo.add"(%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}""")
    with pytest.raises(InputError, match=r"'stablehlo\.add' has no ONNX equivalent"):
        write_onnx(module)


def test_a_call_is_refused_with_the_pass_that_removes_it() -> None:
    module = parse("""
func.func private @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = func.call @f(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}""")
    with pytest.raises(InputError, match=r"inline them first \(qconvert opt --inline\)"):
        write_onnx(module)


def test_quantizing_to_int32_is_refused() -> None:
    module = parse("""
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %q = quant.qcast %x : tensor<4xf32> to tensor<4x!quant.uniform<i32:f32, 0.5>>
  %y = quant.dcast %q : tensor<4x!quant.uniform<i32:f32, 0.5>> to tensor<4xf32>
  return %y : tensor<4xf32>
}""")
    with pytest.raises(
        InputError, match=r"'quant\.qcast' as QuantizeLinear: QuantizeLinear cannot produce int32"
    ):
        write_onnx(module)


def test_elided_weights_are_refused() -> None:
    module = import_onnx(MODELS / "digits_cnn.onnx")
    assert elide_weights(module) > 0
    with pytest.raises(InputError, match="has no data"):
        write_onnx(parse(print_module(module)))


# Saving ------------------------------------------------------------------------------------------
def test_save_with_external_data_runs_from_its_folder(tmp_path: Path) -> None:
    module = import_onnx(MODELS / "tiny_encoder.qdq.onnx")
    path = save_onnx(module, tmp_path / "encoder.onnx", external_data=True)
    assert sorted(os.listdir(tmp_path)) == ["encoder.onnx", "encoder.onnx.data"]
    in_memory = write_onnx(module).ByteSize()
    data_size = (tmp_path / "encoder.onnx.data").stat().st_size
    assert data_size > 100_000 and (tmp_path / "encoder.onnx").stat().st_size < in_memory - 90_000
    feed = inputs_for("tiny_encoder")
    expected = run_onnxruntime(onnx.load(str(MODELS / "tiny_encoder.qdq.onnx")), feed)
    for want, got in zip(expected, run_onnxruntime(str(path), feed), strict=True):
        assert got.tobytes() == want.tobytes()


def test_memory_mapped_weights_are_saved_again(tmp_path: Path) -> None:
    """A model whose weights are external data is lifted with memory-mapped dense_resource constants;
    saving it again (external data too) reads them from the mapping."""
    source = tmp_path / "source"
    source.mkdir()
    model = onnx.load(str(MODELS / "tiny_encoder.qdq.onnx"))
    onnx.save(
        model, str(source / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=256
    )
    module = import_onnx(source / "m.onnx")
    out = save_onnx(module, tmp_path / "out.onnx", external_data=True)
    feed = inputs_for("tiny_encoder")
    expected = run_onnxruntime(str(MODELS / "tiny_encoder.qdq.onnx"), feed)
    assert any(isinstance(op.attributes.get("value"), DenseResourceAttr) for op in module.walk())
    for want, got in zip(expected, run_onnxruntime(str(out), feed), strict=True):
        assert got.tobytes() == want.tobytes()


def test_weights_near_the_protobuf_limit_go_to_external_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2 GiB of weights is too slow for a unit test: lower the limit save_onnx compares against.
    monkeypatch.setattr(save_module, "EXTERNAL_DATA_THRESHOLD", 1_000)
    path = save_onnx(import_onnx(MODELS / "digits_cnn.qdq.onnx"), tmp_path / "cnn.onnx")
    assert sorted(os.listdir(tmp_path)) == ["cnn.onnx", "cnn.onnx.data"]
    feed = inputs_for("digits_cnn")
    (want,) = run_onnxruntime(onnx.load(str(MODELS / "digits_cnn.qdq.onnx")), feed)
    (got,) = run_onnxruntime(str(path), feed)
    assert got.tobytes() == want.tobytes()


def test_an_unwritable_target_is_an_input_error(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").mkdir()  # a directory where the file should go
    with pytest.raises(InputError, match="cannot write"):
        save_onnx(import_onnx(MODELS / "digits_cnn.qdq.onnx"), tmp_path / "model.onnx")
    with pytest.raises(InputError, match="does not exist"):
        save_onnx(import_onnx(MODELS / "digits_cnn.qdq.onnx"), tmp_path / "missing" / "model.onnx")
    assert os.listdir(tmp_path) == ["model.onnx"]


def test_a_failed_save_leaves_the_existing_file_alone(tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(b"previous")
    module = parse("""
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = "stablehlo.add"(%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}""")
    with pytest.raises(InputError):
        save_onnx(module, target)
    assert target.read_bytes() == b"previous" and os.listdir(tmp_path) == ["model.onnx"]
