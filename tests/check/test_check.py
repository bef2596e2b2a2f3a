"""`qconvert check` on the sample models: every quantization node bit-exact against onnxruntime (optimizations
off), every float node within its float32 bound, the end-to-end report beside the noise floor, exit 1 on a
tolerance that fails, exit 2 on bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qconvert.check import (
    EVALUATED_BY_NUMERICS,
    CheckReport,
    Tolerances,
    broadcast_scale,
    check,
    compare,
    random_inputs,
)
from qconvert.cli import main
from qconvert.errors import InputError

MODELS = Path(__file__).resolve().parents[2] / "models"
QDQ_NODE_COUNTS = {"digits_cnn": 20, "tiny_encoder": 184}  # models/README.md: 7 + 13, 73 + 111 Q/DQ
NODE_COUNTS = {"digits_cnn": 26, "tiny_encoder": 271}  # every node of the graph


def sample(name: str, variant: str) -> tuple[str, str]:
    return str(MODELS / f"{name}.{variant}.onnx"), str(MODELS / f"{name}.inputs.npz")


@pytest.fixture(scope="module")
def qdq_reports() -> dict[str, CheckReport]:
    return {name: check(*sample(name, "qdq")) for name in QDQ_NODE_COUNTS}


@pytest.mark.parametrize("name", sorted(QDQ_NODE_COUNTS))
def test_check_qdq_sample_every_quantization_node_bit_exact(
    qdq_reports: dict[str, CheckReport], name: str
) -> None:
    report = qdq_reports[name]
    assert len(report.layers) == NODE_COUNTS[name]  # every node is judged, not only Q/DQ
    quantization = [layer for layer in report.layers.values() if layer.family is None]
    assert len(quantization) == QDQ_NODE_COUNTS[name]
    for layer in quantization:
        assert (layer.verdict, layer.mismatches) == ("pass", 0), (layer.node, layer.reason)
        assert layer.evaluated_by == EVALUATED_BY_NUMERICS  # Q/DQ lift to quant casts, never generic
        assert layer.elements > 0
        assert layer.max_lsb_diff == 0
    for layer in report.layers.values():
        assert layer.verdict == "pass", (layer.node, layer.reason, layer.bound)
    assert report.passed and report.verdict == "PASSED"


@pytest.mark.parametrize("name", sorted(QDQ_NODE_COUNTS))
def test_check_qdq_sample_end_to_end_beside_noise_floor(
    qdq_reports: dict[str, CheckReport], name: str
) -> None:
    report = qdq_reports[name]
    assert set(report.outputs) == {o.name for o in onnx.load(sample(name, "qdq")[0]).graph.output}
    for output in report.outputs.values():
        assert output.ours is not None and output.noise_floor is not None
        # Measured (onnxruntime 1.32.0): the interpreter equals the oracle bit for bit end to end; the
        # noise floor is exact for digits_cnn and 27.7 / 33.1 dB for tiny_encoder's two outputs.
        assert output.ours.mismatches == 0
        assert output.ours.sqnr_db >= output.noise_floor.sqnr_db
        assert output.ours.max_lsb_diff == 0  # both models' outputs come straight from a DequantizeLinear


def test_check_tiny_encoder_noise_floor_is_not_zero(qdq_reports: dict[str, CheckReport]) -> None:
    floor = qdq_reports["tiny_encoder"].outputs["last_hidden_state"].noise_floor
    assert floor is not None and floor.mismatches > 0 and math.isfinite(floor.sqnr_db)
    assert floor.max_lsb_diff is not None and floor.max_lsb_diff >= 1


def test_check_cli_json_has_the_documented_keys(tmp_path: Path) -> None:
    model, data = sample("digits_cnn", "qdq")
    report_path = tmp_path / "report.json"
    assert main(["check", model, "--data", data, "--json", str(report_path), "--quiet"]) == 0
    report = json.loads(report_path.read_text())
    assert report["passed"] is True
    metrics = {"elements", "mismatches", "max_abs_diff", "max_lsb_diff", "sqnr_db"}
    assert metrics <= set(report["outputs"]["logits"])
    assert metrics <= set(report["outputs"]["logits"]["noise_floor"])
    assert report["verdict"] == "PASSED" and report["not_run"] == []
    assert len(report["layers"]) == 26
    for layer in report["layers"].values():
        assert {"elements", "mismatches", "max_lsb_diff", "judged"} <= set(layer)
    assert report["summary"] == {
        "layers_passed": 26,
        "layers_failed": 0,
        "layers_not_run": 0,
        "outputs_not_run": 0,
    }
    assert list(tmp_path.iterdir()) == [report_path]  # the temporary file was renamed, not left


def test_check_cli_prints_table(capsys: pytest.CaptureFixture[str]) -> None:
    model, data = sample("digits_cnn", "qdq")
    assert main(["check", model, "--data", data]) == 0
    out = capsys.readouterr().out
    assert "QuantizeLinear" in out and "noise floor" in out
    assert "PASSED: nodes: 26 passed, 0 failed, 0 not run; outputs: 1 passed" in out
    rows = out.splitlines()
    assert [row for row in rows if row != row.rstrip()] == []  # piped: no padding of titles and cells
    assert any(row.startswith(f"per node: {model} (") and row.endswith(f"inputs {data})") for row in rows)


@pytest.fixture
def float_noise_model(tmp_path: Path) -> Path:
    """Q -> DQ beside a float Exp: onnx's reference and onnxruntime round Exp differently in the last ulp."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dq"),
        helper.make_node("Exp", ["x"], ["e"], name="exp"),
        helper.make_node("Add", ["d", "e"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256])],
        [
            numpy_helper.from_array(np.array(0.02, np.float32), "s"),
            numpy_helper.from_array(np.array(3, np.int8), "z"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    path = tmp_path / "exp.onnx"
    onnx.save(proto, str(path))
    return path


def test_check_tolerance_that_cannot_be_met_exits_1(float_noise_model: Path, tmp_path: Path) -> None:
    report_path = tmp_path / "r.json"
    assert main(["check", str(float_noise_model), "--quiet"]) == 0  # no tolerance: reported only
    code = main(
        ["check", str(float_noise_model), "--min-sqnr", "1000", "--json", str(report_path), "--quiet"]
    )
    assert code == 1
    report = json.loads(report_path.read_text())
    assert report["passed"] is False
    assert report["outputs"]["y"]["failed_tolerances"]
    assert report["summary"]["layers_failed"] == 0  # the per-node verdicts still pass
    assert main(["check", str(float_noise_model), "--atol", "0", "--quiet"]) == 1
    assert main(["check", str(float_noise_model), "--max-mismatch-fraction", "0", "--quiet"]) == 1


def test_check_exact_sample_meets_any_tolerance() -> None:
    model, data = sample("digits_cnn", "qdq")
    args = ["--min-sqnr", "1000", "--atol", "0", "--max-lsb", "0", "--max-mismatch-fraction", "0"]
    assert main(["check", model, "--data", data, *args, "--quiet"]) == 0


def write_npz(path: Path, **arrays: np.ndarray) -> str:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return str(path)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing_input", "missing input(s) ['image']"),
        ("extra_input", "unknown array(s) ['mask']"),
        ("wrong_dtype", "input 'image' has dtype float64; the model takes float32[8,1,8,8]"),
        ("wrong_shape", "input 'image' has rank 2 (shape [8, 64])"),
        ("garbage_npz", "not a readable .npz"),
        ("garbage_model", "not a valid ONNX model"),
        ("missing_model", "no such model file"),
        ("corrupt_weight", "corrupt.onnx: initializer 'conv2.bias_quantized_scale': raw_data holds 124"),
        ("unknown_backend", "unknown backend 'iree'"),
        ("bad_input_shape", "--input-shape 'image'"),
    ],
)
def test_check_bad_input_exits_2_without_json(
    case: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, data = sample("digits_cnn", "qdq")
    image = np.load(data)["image"]
    extra: list[str] = []
    if case == "missing_input":
        data = write_npz(tmp_path / "in.npz", pixels=image)
    elif case == "extra_input":
        data = write_npz(tmp_path / "in.npz", image=image, mask=image)
    elif case == "wrong_dtype":
        data = write_npz(tmp_path / "in.npz", image=image.astype(np.float64))
    elif case == "wrong_shape":
        data = write_npz(tmp_path / "in.npz", image=image.reshape(8, 64))
    elif case == "garbage_npz":
        (tmp_path / "in.npz").write_bytes(b"not a zip file")
        data = str(tmp_path / "in.npz")
    elif case == "garbage_model":
        (tmp_path / "m.onnx").write_bytes(b"\x08\x07garbage\xff\xff")
        model = str(tmp_path / "m.onnx")
    elif case == "missing_model":
        model = str(tmp_path / "absent.onnx")
    elif case == "corrupt_weight":  # a raw_data shorter than its dims: refused by name before any engine
        proto = onnx.load(model)
        (scale,) = [t for t in proto.graph.initializer if t.name == "conv2.bias_quantized_scale"]
        scale.raw_data = scale.raw_data[:-4]
        model = str(tmp_path / "corrupt.onnx")
        onnx.save(proto, model)
    elif case == "unknown_backend":
        extra = ["--backend", "iree"]
    elif case == "bad_input_shape":
        extra = ["--input-shape", "image"]
    report_path = tmp_path / "report.json"
    code = main(["check", model, "--data", data, "--json", str(report_path), "--quiet", *extra])
    captured = capsys.readouterr()
    assert code == 2
    assert message in captured.err
    assert "Traceback" not in captured.err + captured.out
    assert not report_path.exists()
    assert not list(tmp_path.glob("*.tmp"))


def test_check_random_inputs_are_seeded_and_in_token_range() -> None:
    model = onnx.load(sample("tiny_encoder", "qdq")[0])
    first, second = random_inputs(model), random_inputs(model)
    ids = first["input_ids"]
    assert ids.dtype == np.int64 and ids.shape == (2, 16)
    assert ids.min() >= 0 and ids.max() < 32  # the embedding table has 32 rows
    np.testing.assert_array_equal(ids, second["input_ids"])
    report = check(sample("tiny_encoder", "qdq")[0])
    assert report.inputs_source == "random (seed 0)" and report.passed and report.count("fail") == 0


def test_check_qoperator_cnn_every_node_bit_exact() -> None:
    """QLinearConv and com.microsoft QLinearGlobalAveragePool / QGemm are lifted to quant-typed `qconvert.*`
    ops (frontends/onnx/qoperator.py) and run on onnxruntime's kernels as qconvert.numerics reproduces them:
    every node bit-exact, and the whole model end to end."""
    report = check(*sample("digits_cnn", "qop"))
    quantization = {name: layer for name, layer in report.layers.items() if layer.family is None}
    verdicts = {name: (layer.op_type, layer.verdict) for name, layer in quantization.items()}
    assert verdicts == {
        "image_QuantizeLinear": ("QuantizeLinear", "pass"),
        "/conv1/Conv_quant": ("QLinearConv", "pass"),
        "/conv2/Conv_quant": ("QLinearConv", "pass"),
        "/gap/GlobalAveragePool_quant": ("QLinearGlobalAveragePool", "pass"),
        "/fc/Gemm_quant": ("QGemm", "pass"),
        "logits_DequantizeLinear": ("DequantizeLinear", "pass"),
    }
    assert {layer.evaluated_by for layer in quantization.values()} == {EVALUATED_BY_NUMERICS}
    assert {layer.verdict for layer in report.layers.values()} == {"pass"}  # MaxPool, Flatten too
    logits = report.outputs["logits"]
    assert logits.verdict == "pass" and logits.ours is not None
    assert report.passed


def test_check_qoperator_encoder_qlinearmatmul_tie_is_bit_exact() -> None:
    """onnx's reference QLinearMatMul requantizes `C * (a_scale * b_scale / y_scale)` in float64; onnxruntime
    (and `numerics.requantize_mlas`) in float32. At [0, 9, 51] of /layers.0/v/MatMul_quant, C = -19932:
    float32 gives exactly -35.5 (a tie, rounds to even -36, + zp 10 = -26, onnxruntime's value), float64
    -35.49999997 (-> -25). Lifted, every node of the encoder is bit-exact, QLinearAdd / QLinearMul too."""
    report = check(*sample("tiny_encoder", "qop"))
    by_op: dict[str, set[str]] = {}
    for entry in report.layers.values():
        if entry.family is None:
            by_op.setdefault(entry.op_type, set()).add(entry.verdict)
    assert by_op == {
        "QuantizeLinear": {"pass"},
        "DequantizeLinear": {"pass"},
        "QLinearMatMul": {"pass"},
        "QLinearAdd": {"pass"},
        "QLinearMul": {"pass"},
    }
    assert report.layers["/layers.0/v/MatMul_quant"].evaluated_by == EVALUATED_BY_NUMERICS
    assert report.passed


def test_check_int4_nodes_not_run_because_onnxruntime_cannot_return_them(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q4"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq4"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
        [
            numpy_helper.from_array(np.array(0.5, np.float32), "s"),
            helper.make_tensor("z", TensorProto.INT4, [], [1]),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    proto.ir_version = 10
    onnx.save(proto, str(tmp_path / "int4.onnx"))
    report = check(tmp_path / "int4.onnx")
    for layer in report.layers.values():
        assert layer.verdict == "not run"
        assert layer.reason == "onnxruntime's Python API does not return int4 tensors (value 'q')"
    assert report.outputs["y"].ours is not None and report.outputs["y"].ours.mismatches == 0


def test_check_arrays_given_in_memory_are_validated() -> None:
    with pytest.raises(InputError, match="missing input"):
        check(sample("digits_cnn", "qdq")[0], {})


def test_compare_counts_bits_nan_and_steps() -> None:
    reference = np.array([1.0, np.nan, 0.5, -0.0], np.float32)
    ours = np.array([1.0, np.nan, 1.0, 0.0], np.float32)
    comparison = compare(reference, ours, lsb_unit=np.array(0.25))
    assert comparison.mismatches == 2  # 0.5 vs 1.0, and -0.0 vs +0.0 (bits differ)
    assert comparison.max_abs_diff == 0.5 and comparison.max_lsb_diff == 2
    integers = compare(np.array([3, -7], np.int8), np.array([3, -5], np.int8))
    assert (integers.mismatches, integers.max_lsb_diff) == (1, 2)
    assert compare(np.ones(3, np.float32), np.ones(3, np.float32)).sqnr_db == math.inf
    assert Tolerances().to_json() == dict.fromkeys(
        ("atol", "rtol", "max_lsb", "max_mismatch_fraction", "min_sqnr")
    )


def test_broadcast_scale_per_axis_and_blocked() -> None:
    assert broadcast_scale(np.array([1.0, 2.0]), (3, 2), axis=1, block_size=0).shape == (1, 2)
    blocked = broadcast_scale(np.array([[1.0, 2.0]]), (1, 5), axis=1, block_size=3)
    np.testing.assert_array_equal(blocked, [[1.0, 1.0, 1.0, 2.0, 2.0]])


@pytest.mark.parametrize(
    ("target", "message"), [("missing/report.json", "does not exist"), (".", "is a folder")]
)
def test_check_unwritable_json_exits_2_before_any_work(
    target: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--json /no/such/dir/r.json` was an internal error (exit 3) after the whole check had run."""
    model, data = sample("digits_cnn", "qdq")
    assert main(["check", model, "--data", data, "--quiet", "--json", str(tmp_path / target)]) == 2
    error = capsys.readouterr().err
    assert message in error and "internal error" not in error
    assert list(tmp_path.iterdir()) == []


def test_data_that_does_not_fit_a_dynamic_model_is_named(tmp_path: Path) -> None:
    """onnxruntime refuses the model once pinned to the data's shapes: the message says the data did it."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "table"], ["y"], name="add")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "positions"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(np.zeros((1, 4), np.float32), "table")],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    data = write_npz(tmp_path / "in.npz", x=np.zeros((2, 5), np.float32))
    with pytest.raises(InputError, match=r"pinned to the shapes of the data's arrays, x=2x5"):
        check(str(path), data)
