"""`qconvert inspect` names every quantization style with counts, on the corpus and on tiny graphs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from corpus_manifest import ENTRIES, CorpusEntry
from onnx import TensorProto, helper, numpy_helper

from qconvert.cli import main
from qconvert.frontends.onnx.load import read_model
from qconvert.frontends.onnx.summary import quantization_styles

CORPUS_STYLE_NAMES = {
    "float": [],
    "dynamic": ["dynamic"],
    "qdq": ["static Q/DQ"],
    "qop": ["QOperator"],
    "weight_only": ["weight-only"],
    "dynamic_per_channel": ["dynamic"],
    "qdq_u8": ["static Q/DQ"],
    "weight_only_dq": ["weight-only"],
    "nbits": ["block-wise (MatMulNBits)"],
    "nbits_qdq": ["weight-only"],
}


def styles_of(model: onnx.ModelProto) -> dict[str, dict[str, int]]:
    return {style.name: dict(style.counts) for style in quantization_styles(model)}


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.name)
def test_corpus_entry_style(corpus_dir, entry: CorpusEntry) -> None:
    model = read_model(corpus_dir / entry.file)[0]
    found = styles_of(model)
    assert list(found) == CORPUS_STYLE_NAMES[entry.style], found
    ops = [n.op_type for n in model.graph.node]
    if entry.style.startswith("dynamic"):
        assert found["dynamic"]["DynamicQuantizeLinear"] == ops.count("DynamicQuantizeLinear")
        integer_ops = ops.count("MatMulInteger") + ops.count("ConvInteger") + ops.count("DynamicQuantizeLSTM")
        assert sum(found["dynamic"].values()) == ops.count("DynamicQuantizeLinear") + integer_ops
    if entry.style == "weight_only":  # one Cast -> Mul per quantized weight, all counted
        assert sum(found["weight-only"].values()) == ops.count("Cast") - _casts_in(entry, corpus_dir)
    if entry.style in ("weight_only_dq", "nbits_qdq"):  # one DequantizeLinear per weight, nothing else
        assert sum(found["weight-only"].values()) == ops.count("DequantizeLinear")
    if entry.style == "nbits":
        assert found["block-wise (MatMulNBits)"] == {"MatMulNBits (4-bit)": ops.count("MatMulNBits")}


def _casts_in(entry: CorpusEntry, corpus_dir: Path) -> int:
    """Casts the float export already had (shape arithmetic), which are not weight-only patterns."""
    float_model = onnx.load(str(corpus_dir / f"{entry.architecture}.float.onnx"), load_external_data=False)
    return sum(n.op_type == "Cast" for n in float_model.graph.node)


def test_inspect_prints_the_style_of_a_dynamic_lstm(corpus_dir, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(corpus_dir / "lstm_speech.dynamic.onnx")]) == 0
    printed = capsys.readouterr().out
    assert "quantization style: dynamic\n" in printed
    assert (
        "1 DynamicQuantizeLSTM" in printed
        and "1 ConvInteger" in printed
        and "2 DynamicQuantizeLinear" in printed
    )


# Tiny graphs, one per style ------------------------------------------------------------------------------


def save(tmp_path: Path, nodes: list, inputs: list, initializers: list, opsets: dict[str, int]) -> Path:
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return path


X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
WEIGHT_I8 = numpy_helper.from_array(np.arange(-8, 8, dtype=np.int8).reshape(4, 4), "w")
WEIGHT_U8 = numpy_helper.from_array(np.arange(16, dtype=np.uint8).reshape(4, 4), "w")
SCALE = numpy_helper.from_array(np.full(4, 0.1, np.float32), "scale")


def cli_styles(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["inspect", str(path)]) == 0
    return next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("quantization style")
    )


def test_weight_only_cast_mul(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = [
        helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["wf", "scale"], ["wd"]),
        helper.make_node("MatMul", ["x", "wd"], ["y"]),
    ]
    path = save(tmp_path, nodes, [X], [WEIGHT_I8, SCALE], {"": 17})
    assert styles_of(read_model(path)[0]) == {"weight-only": {"Cast -> Mul -> MatMul": 1}}
    assert cli_styles(path, capsys) == "quantization style: weight-only"


def test_weight_only_cast_sub_mul_through_transpose(tmp_path: Path) -> None:
    zero_point = numpy_helper.from_array(np.full(4, 3.0, np.float32), "zp")
    nodes = [
        helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["wf", "zp"], ["ws"]),
        helper.make_node("Mul", ["ws", "scale"], ["wd"]),
        helper.make_node("Transpose", ["wd"], ["wt"], perm=[1, 0]),
        helper.make_node("Gemm", ["x", "wt"], ["y"]),
    ]
    path = save(tmp_path, nodes, [X], [WEIGHT_U8, SCALE, zero_point], {"": 17})
    assert styles_of(read_model(path)[0]) == {"weight-only": {"Cast -> Mul -> Gemm": 1}}


def test_weight_only_dequantize_linear_of_initializer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "scale"], ["wd"], axis=1),
        helper.make_node("MatMul", ["x", "wd"], ["y"]),
    ]
    path = save(tmp_path, nodes, [X], [WEIGHT_I8, SCALE], {"": 21})
    assert styles_of(read_model(path)[0]) == {"weight-only": {"DequantizeLinear -> MatMul": 1}}
    assert cli_styles(path, capsys) == "quantization style: weight-only"


def test_static_qdq_is_not_weight_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    activation_scale = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    activation_zero = numpy_helper.from_array(np.array(0, np.int8), "z")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "scale"], ["wd"], axis=1),
        helper.make_node("MatMul", ["xd", "wd"], ["y"]),
    ]
    path = save(tmp_path, nodes, [X], [WEIGHT_I8, SCALE, activation_scale, activation_zero], {"": 21})
    found = styles_of(read_model(path)[0])
    assert found == {
        "static Q/DQ": {"QuantizeLinear -> DequantizeLinear": 1, "DequantizeLinear of a constant": 1}
    }
    assert cli_styles(path, capsys) == "quantization style: static Q/DQ"


def test_dynamic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("MatMulInteger", ["xq", "w", "xz"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["accf", "xs"], ["y"]),
    ]
    path = save(tmp_path, nodes, [X], [WEIGHT_U8], {"": 17})
    assert styles_of(read_model(path)[0]) == {"dynamic": {"DynamicQuantizeLinear": 1, "MatMulInteger": 1}}
    assert cli_styles(path, capsys) == "quantization style: dynamic"


def test_qoperator_and_microsoft_dynamic_matmul(tmp_path: Path) -> None:
    scalars = [
        numpy_helper.from_array(np.array(0.1, np.float32), "s"),
        numpy_helper.from_array(np.array(0, np.uint8), "z"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("QLinearMatMul", ["xq", "s", "z", "w", "s", "z", "s", "z"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "s", "z"], ["yd"]),
        helper.make_node("DynamicQuantizeMatMul", ["yd", "w", "s", "z"], ["y"], domain="com.microsoft"),
    ]
    path = save(tmp_path, nodes, [X], [WEIGHT_U8, *scalars], {"": 17, "com.microsoft": 1})
    found = styles_of(read_model(path)[0])
    assert found == {"QOperator": {"QLinearMatMul": 1}, "dynamic": {"DynamicQuantizeMatMul": 1}}


def test_matmul_nbits(tmp_path: Path) -> None:
    packed = numpy_helper.from_array(np.zeros((4, 1, 8), np.uint8), "packed")
    scales = numpy_helper.from_array(np.ones(4, np.float32), "scales")
    nodes = [
        helper.make_node(
            "MatMulNBits",
            ["x", "packed", "scales"],
            ["y"],
            domain="com.microsoft",
            K=4,
            N=4,
            bits=4,
            block_size=16,
        )
    ]
    path = save(tmp_path, nodes, [X], [packed, scales], {"": 17, "com.microsoft": 1})
    assert styles_of(read_model(path)[0]) == {"block-wise (MatMulNBits)": {"MatMulNBits (4-bit)": 1}}


def test_float_graph_has_no_style(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    shape_cast = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Cast", ["shape"], ["shape_f"], to=TensorProto.FLOAT),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
    ]
    path = save(tmp_path, shape_cast, [X], [weight], {"": 17})
    assert styles_of(read_model(path)[0]) == {}
    assert cli_styles(path, capsys) == "quantization style: none (no quantization op or pattern)"


def test_inspect_names_the_style_when_lifting_fails(corpus_dir, capsys: pytest.CaptureFixture[str]) -> None:
    """onnxruntime's int4 QDQ weights carry negative scales, which lifting refuses (today): the error still
    says what kind of model it is. Once lifting takes them, the summary says it."""
    code = main(["inspect", str(corpus_dir / "minilm.nbits_qdq.onnx")])
    printed = capsys.readouterr()
    if code == 2:
        assert "scale must be finite and > 0" in printed.err and "Traceback" not in printed.err
        assert (
            "quantization style, read from the graph: weight-only: 12 DequantizeLinear -> MatMul"
            in printed.err
        )
    else:
        assert code == 0
        assert (
            "quantization style: weight-only\n" in printed.out
            and "12 DequantizeLinear -> MatMul" in printed.out
        )
