"""`qconvert check --backend stablehlo`: every quantization node (and every fused quantized op) converted to
StableHLO on its own and run on jaxlib (XLA:CPU, or the StableHLO interpreter) on the inputs onnxruntime
gave it, bit-exact against onnxruntime; the whole converted module end to end beside the noise floor;
`--semantics stablehlo` differences counted and matched against their prediction."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import TensorProto, helper, numpy_helper

from qconvert.check import CheckReport, check
from qconvert.cli import main

pytestmark = pytest.mark.engine

MODELS = Path(__file__).resolve().parents[2] / "models"
QDQ_NODE_COUNTS = {"digits_cnn": 20, "tiny_encoder": 184}  # models/README.md
# Nodes that may be "not run", by name, with the reason the report must give. Empty: every node runs.
EXPECTED_NOT_RUN: dict[str, str] = {}
TIES = np.array([0.25, 0.75, 1.25, -0.25], np.float32)  # x / 0.5 = 0.5, 1.5, 2.5, -0.5: all ties


def sample(name: str) -> tuple[str, str]:
    return str(MODELS / f"{name}.qdq.onnx"), str(MODELS / f"{name}.inputs.npz")


RUNS = [  # (model, engine, form); the interpreter is slow on big tensors, so it runs the small model only
    ("digits_cnn", "xla", "quantized"),
    ("digits_cnn", "xla", "integer"),
    ("digits_cnn", "interpreter", "quantized"),
    ("tiny_encoder", "xla", "quantized"),
]


@pytest.fixture(scope="module")
def reports() -> dict[tuple[str, str, str], CheckReport]:
    require_module("jax")
    return {
        (name, engine, form): check(*sample(name), backend="stablehlo", engine=engine, form=form)
        for name, engine, form in RUNS
    }


@pytest.mark.parametrize(("name", "engine", "form"), RUNS)
def test_every_quantization_node_bit_exact_on_the_engine(
    reports: dict[tuple[str, str, str], CheckReport], name: str, engine: str, form: str
) -> None:
    report = reports[(name, engine, form)]
    assert (report.backend, report.engine, report.form, report.semantics) == (
        "stablehlo",
        engine,
        form,
        "onnx",
    )
    singles = [layer for layer in report.layers.values() if layer.group is None and layer.family is None]
    assert len(singles) == QDQ_NODE_COUNTS[name]
    for layer in report.layers.values():
        if layer.node in EXPECTED_NOT_RUN:
            assert (layer.verdict, layer.reason) == ("not run", EXPECTED_NOT_RUN[layer.node])
            continue
        assert (layer.verdict, layer.mismatches) == ("pass", 0), (layer.node, layer.reason)
        assert layer.elements > 0 and (layer.family is not None or layer.max_lsb_diff == 0)
        assert layer.evaluated_by is not None and form in layer.evaluated_by
    assert report.passed


@pytest.mark.parametrize(("name", "engine", "form"), RUNS)
def test_fused_quantized_ops_are_layers_of_their_own(
    reports: dict[tuple[str, str, str], CheckReport], name: str, engine: str, form: str
) -> None:
    """Each `DequantizeLinear* -> op -> QuantizeLinear` group the quantized form fuses into one quantized
    StableHLO op is checked as a whole, on the value onnxruntime computed for its QuantizeLinear; the
    integer form runs the same groups written out in integer ops."""
    report = reports[(name, engine, form)]
    fused = [layer for layer in report.layers.values() if layer.group is not None]
    node_ops = {n.name: n.op_type for n in onnx.load(sample(name)[0]).graph.node}
    for layer in fused:
        assert layer.group is not None and layer.node == f"{layer.group[-2]} (fused)"
        assert node_ops[layer.group[-1]] == "QuantizeLinear" and node_ops[layer.group[-2]] == layer.op_type
        assert {node_ops[member] for member in layer.group[:-2]} == {"DequantizeLinear"}
        assert layer.verdict == "pass" and layer.elements > 0
    # Measured: the quantized form fuses the data-movement ops (MaxPool, Flatten; the embedding Gather,
    # whose int64 indices pass through, Reshape and Transpose in the encoder): exact by construction.
    expected = {"digits_cnn": {"MaxPool", "Flatten"}, "tiny_encoder": {"Gather", "Reshape", "Transpose"}}
    assert expected[name] <= {layer.op_type for layer in fused}


@pytest.mark.parametrize(("name", "engine", "form"), RUNS)
def test_end_to_end_reported_beside_the_noise_floor(
    reports: dict[tuple[str, str, str], CheckReport], name: str, engine: str, form: str
) -> None:
    report = reports[(name, engine, form)]
    model = onnx.load(sample(name)[0])
    assert set(report.outputs) == {o.name for o in model.graph.output}
    for output in report.outputs.values():
        assert output.ours is not None, output.reason
        assert output.noise_floor is not None
        assert output.ours.elements == output.noise_floor.elements > 0
        # Measured (onnxruntime 1.32, jaxlib 0.10.2): both models are bit-exact end to end on XLA and on
        # the interpreter; onnxruntime's own optimizations move tiny_encoder by 27.7 / 33.1 dB.
        assert output.ours.sqnr_db >= output.noise_floor.sqnr_db
        assert output.verdict == "pass"  # no tolerance given: reported, not judged


# --fuse-arithmetic ------------------------------------------------------------------------------------
ARITHMETIC_OPS = {"Conv", "MatMul", "Gemm", "Add"}


def arithmetic_groups(model: onnx.ModelProto) -> tuple[set[str], set[str]]:
    """Read off the ONNX graph: the Conv/MatMul/Gemm/Add nodes whose every input is a DequantizeLinear's
    output and whose output feeds exactly one QuantizeLinear, and of those the ones StableHLO cannot fuse
    (a contraction whose rhs zero point is not 0: the spec's quantized dot_general/convolution need 0)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    initializers = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    candidates, unfusable = set(), set()
    for node in model.graph.node:
        dequantizes = [producers.get(name) for name in node.input]
        users = consumers.get(node.output[0], [])
        if (
            node.op_type in ARITHMETIC_OPS
            and all(d is not None and d.op_type == "DequantizeLinear" for d in dequantizes)
            and [u.op_type for u in users] == ["QuantizeLinear"]
        ):
            candidates.add(node.name)
            rhs = dequantizes[1]
            assert rhs is not None
            zero_point = initializers.get(rhs.input[2]) if len(rhs.input) > 2 else None
            if node.op_type != "Add" and zero_point is not None and np.any(zero_point != 0):
                unfusable.add(node.name)
    return candidates, unfusable


@pytest.fixture(scope="module")
def fused_reports() -> dict[str, CheckReport]:
    require_module("jax")
    return {
        name: check(*sample(name), backend="stablehlo", engine="xla", fuse_arithmetic=True)
        for name in QDQ_NODE_COUNTS
    }


@pytest.mark.parametrize("name", sorted(QDQ_NODE_COUNTS))
def test_fuse_arithmetic_checks_each_fused_contraction_and_add_alone_on_xla(
    fused_reports: dict[str, CheckReport],
    reports: dict[tuple[str, str, str], CheckReport],
    name: str,
) -> None:
    """`fuse_arithmetic=True`: each `DequantizeLinear* -> Conv/MatMul/Gemm/Add -> QuantizeLinear` group
    the conversion fuses is a layer run alone on XLA:CPU with onnxruntime's inputs, bit-exact against
    onnxruntime's QuantizeLinear output; without it no such group is a layer (it is not fused)."""
    report = fused_reports[name]
    model = onnx.load(sample(name)[0])
    candidates, unfusable = arithmetic_groups(model)
    fused = {
        layer.group[-2]: layer
        for layer in report.layers.values()
        if layer.group is not None and layer.op_type in ARITHMETIC_OPS
    }
    assert len(fused) > 0
    assert set(fused) == candidates - unfusable
    for layer in fused.values():
        assert (layer.verdict, layer.mismatches, layer.max_lsb_diff) == ("pass", 0, 0), layer.node
        assert layer.elements > 0 and layer.evaluated_by == "StableHLO (quantized form) on XLA:CPU"
    node_ops = {n.name: n for n in model.graph.node}
    initializers = {t.name: t for t in model.graph.initializer}
    for layer in fused.values():
        if layer.op_type in ("Conv", "Gemm"):  # input, weight and int32 bias dequantizes, all in the group
            assert layer.group is not None and len(layer.group) == 5
            bias = node_ops[layer.group[2]]
            assert bias.op_type == "DequantizeLinear"
            assert initializers[bias.input[0]].data_type == TensorProto.INT32
    singles = [layer for layer in report.layers.values() if layer.group is None and layer.family is None]
    assert len(singles) == QDQ_NODE_COUNTS[name] and report.passed
    assert any(
        note.startswith(f"--fuse-arithmetic: {len(fused)} of {len(candidates)} ") for note in report.notes
    )
    unfused = reports[(name, "xla", "quantized")]
    assert not [x for x in unfused.layers.values() if x.group is not None and x.op_type in ARITHMETIC_OPS]
    for output in report.outputs.values():  # the whole model converted with the flag, end to end
        assert output.ours is not None and output.ours.mismatches == 0, output.name


def test_cli_fuse_arithmetic_lists_the_fused_groups(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_module("jax")
    model, data = sample("digits_cnn")
    report_path = tmp_path / "report.json"
    args = ["check", model, "--data", data, "--backend", "stablehlo", "--engine", "xla", "--fuse-arithmetic"]
    assert main([*args, "--json", str(report_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--fuse-arithmetic: 3 of 3 DequantizeLinear -> Conv/MatMul/Gemm/Add -> QuantizeLinear" in out
    layers = json.loads(report_path.read_text())["layers"]
    for node in ("/conv1/Conv", "/conv2/Conv", "/fc/Gemm"):
        layer = layers[f"{node} (fused)"]
        assert layer["verdict"] == "pass" and layer["mismatches"] == 0 and node in layer["fused_group"]


# --semantics stablehlo --------------------------------------------------------------------------------
def ties_model(path: Path) -> str:
    """x -> QuantizeLinear(s 0.5, zp 3, int8) -> q, and DequantizeLinear(q) -> y: every input is a tie."""
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quantize"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dequantize"),
    ]
    graph = helper.make_graph(
        nodes,
        "ties",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [
            helper.make_tensor_value_info("q", TensorProto.INT8, [4]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
        ],
        [
            numpy_helper.from_array(np.array(0.5, np.float32), "s"),
            numpy_helper.from_array(np.array(3, np.int8), "z"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.save(proto, str(path / "ties.onnx"))
    np.savez(path / "ties.npz", x=TIES)
    return str(path / "ties.onnx")


def test_semantics_stablehlo_counts_tie_differences_and_matches_the_prediction(tmp_path: Path) -> None:
    """shared/engines/README.md: x = [0.25, 0.75, 1.25, -0.25], s 0.5, zp 3 -> StableHLO [4 4 6 2], ONNX
    [3 5 5 3]: all four differ. Measured on the engine, predicted by numerics' two rounding rules."""
    require_module("jax")
    model = ties_model(tmp_path)
    data = str(tmp_path / "ties.npz")
    for engine, form in [("xla", "quantized"), ("interpreter", "quantized"), ("xla", "integer")]:
        report = check(model, data, backend="stablehlo", engine=engine, form=form, semantics="stablehlo")
        quantize = report.layers["quantize"]
        assert (quantize.mismatches, quantize.predicted_mismatches, quantize.elements) == (4, 4, 4)
        assert quantize.verdict == "pass" and quantize.max_lsb_diff == 1
        assert quantize.explanation is not None and "zero point before rounding" in quantize.explanation
        assert report.layers["dequantize"].mismatches == 0
        assert report.layers["dequantize"].predicted_mismatches is None
        q = report.outputs["q"].ours
        assert q is not None and q.mismatches == 4  # end to end, the same four elements
        assert report.explained_mismatches == 4 and report.passed
    onnx_rounding = check(model, data, backend="stablehlo", engine="xla")
    assert onnx_rounding.layers["quantize"].mismatches == 0
    assert onnx_rounding.layers["quantize"].predicted_mismatches is None
    assert onnx_rounding.outputs["q"].ours is not None and onnx_rounding.outputs["q"].ours.mismatches == 0


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("form", ["quantized", "integer"])
def test_semantics_stablehlo_per_axis_unsigned(tmp_path: Path, dtype: type, form: str) -> None:
    """Per-axis uint8, zero points 3 and 129 (both odd), f16 and f32 inputs. x / s is a tie in 7 of the 8
    elements (row 0: 0.5 1.5 2.5 -0.5; row 1: 0.5 1.5 -0.5 and 40), and an odd zero point moves every tie:
    7 differ, measured on the engine and predicted alike."""
    require_module("jax")
    elem_type = TensorProto.FLOAT16 if dtype is np.float16 else TensorProto.FLOAT
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quantize", axis=0)
    graph = helper.make_graph(
        [node],
        "per_axis",
        [helper.make_tensor_value_info("x", elem_type, [2, 4])],
        [helper.make_tensor_value_info("q", TensorProto.UINT8, [2, 4])],
        [
            numpy_helper.from_array(np.array([0.5, 0.25], dtype), "s"),
            numpy_helper.from_array(np.array([3, 129], np.uint8), "z"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    proto.ir_version = 10
    path = tmp_path / "per_axis.onnx"
    onnx.save(proto, str(path))
    x = np.array([[0.25, 0.75, 1.25, -0.25], [0.125, 0.375, -0.125, 10.0]], dtype)
    report = check(path, {"x": x}, backend="stablehlo", form=form, semantics="stablehlo")
    layer = report.layers["quantize"]
    assert (layer.mismatches, layer.predicted_mismatches, layer.verdict) == (7, 7, "pass")
    exact = check(path, {"x": x}, backend="stablehlo", form=form)
    assert exact.layers["quantize"].mismatches == 0 and exact.passed


def test_semantics_stablehlo_with_zero_tolerance_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    require_module("jax")
    model = ties_model(tmp_path)
    data = str(tmp_path / "ties.npz")
    report_path = tmp_path / "report.json"
    assert main(["check", model, "--data", data, "--backend", "stablehlo", "--semantics", "stablehlo"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # explained differences, no tolerance: exit 0
    assert "differences from onnxruntime due to stablehlo rounding semantics" in out
    assert "│ quantize │ QuantizeLinear │ 4/4 │ 4 │ StableHLO" in out  # node, op, differing, predicted, why
    base = ["check", model, "--data", data, "--backend", "stablehlo", "--quiet"]
    code = main(
        [*base, "--semantics", "stablehlo", "--max-mismatch-fraction", "0", "--json", str(report_path)]
    )
    assert code == 1
    report = json.loads(report_path.read_text())
    assert report["passed"] is False
    assert report["semantics"] == "stablehlo" and report["mismatches_explained_by_semantics"] == 4
    assert report["layers"]["quantize"]["predicted_mismatches"] == 4
    assert report["outputs"]["q"]["failed_tolerances"]
    assert main([*base, "--max-mismatch-fraction", "0"]) == 0  # onnx rounding: exact


@pytest.mark.parametrize("name", sorted(QDQ_NODE_COUNTS))
def test_semantics_stablehlo_on_the_sample_models_matches_the_prediction(name: str) -> None:
    require_module("jax")
    report = check(*sample(name), backend="stablehlo", engine="xla", semantics="stablehlo")
    quantizes = [layer for layer in report.layers.values() if layer.op_type == "QuantizeLinear"]
    assert quantizes
    for layer in report.layers.values():
        if layer.predicted_mismatches is not None:
            assert layer.mismatches == layer.predicted_mismatches, layer.node
        else:
            assert layer.mismatches == 0, layer.node
        assert layer.verdict == "pass", (layer.node, layer.reason)
    assert all(layer.predicted_mismatches is not None for layer in quantizes)


# CLI ---------------------------------------------------------------------------------------------------
def test_cli_json_report_of_the_stablehlo_backend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require_module("jax")
    model, data = sample("digits_cnn")
    report_path = tmp_path / "report.json"
    args = ["check", model, "--data", data, "--backend", "stablehlo", "--engine", "xla", "--form", "integer"]
    assert main([*args, "--json", str(report_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps the title at the terminal's width
    assert "stablehlo on xla, integer form, onnx semantics" in out and "noise floor" in out
    report = json.loads(report_path.read_text())
    assert (report["backend"], report["engine"], report["form"], report["semantics"]) == (
        "stablehlo",
        "xla",
        "integer",
        "onnx",
    )
    assert report["passed"] is True
    assert report["summary"]["layers_failed"] == 0 and report["summary"]["layers_not_run"] == 0
    for layer in report["layers"].values():
        assert layer["evaluated_by"] == "StableHLO (integer form) on XLA:CPU"
        assert layer["verdict"] == "pass" and layer["mismatches"] == 0
    assert {"elements", "mismatches", "max_lsb_diff", "sqnr_db", "noise_floor"} <= set(
        report["outputs"]["logits"]
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--engine", "xla"],
            "--engine xla: only the stablehlo / tosa / ascendc backend takes these options",
        ),
        (["--backend", "stablehlo", "--engine", "gpu"], "unknown --engine 'gpu'"),
        (["--backend", "stablehlo", "--form", "qdq"], "unknown --form 'qdq'"),
        (["--backend", "stablehlo", "--semantics", "tf"], "unknown --semantics 'tf'"),
        (["--fuse-arithmetic"], "--fuse-arithmetic: only the stablehlo backend takes these options"),
        (
            ["--backend", "stablehlo", "--form", "integer", "--fuse-arithmetic"],
            "--fuse-arithmetic fuses quantized ops: it takes the quantized form, not --form integer",
        ),
    ],
)
def test_cli_bad_backend_options_exit_2(
    options: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model, data = sample("digits_cnn")
    assert main(["check", model, "--data", data, "--quiet", *options]) == 2
    assert message in capsys.readouterr().err


def test_node_the_backend_cannot_lower_is_not_run_and_the_verdict_is_incomplete(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Det has no StableHLO lowering: that node and the whole model are "not run" with the converter's
    reason, never passed; the Q and DQ before it still run and pass, and the verdict is INCOMPLETE (exit 1)
    unless --allow-not-run accepts it. (Was QLinearSigmoid, which now lowers; the old test expected PASSED
    with a node not run: the dishonest verdict.)"""
    require_module("jax")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quantize"),
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="dequantize"),
        helper.make_node("Det", ["d"], ["y"], name="det"),
    ]
    graph = helper.make_graph(
        nodes,
        "det",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [
            numpy_helper.from_array(np.array(0.05, np.float32), "s"),
            numpy_helper.from_array(np.array(3, np.int8), "z"),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    model = str(tmp_path / "det.onnx")
    onnx.save(proto, model)
    report = check(model, backend="stablehlo")
    det = report.layers["det"]
    assert det.verdict == "not run" and det.reason is not None
    assert det.reason.startswith("the backend cannot lower it: cannot convert to StableHLO")
    assert "onnx.Det (node 'det'): no StableHLO lowering" in det.reason
    assert (report.layers["quantize"].verdict, report.layers["dequantize"].verdict) == ("pass", "pass")
    output = report.outputs["y"]
    assert output.ours is None and output.reason is not None and "onnx.Det" in output.reason
    assert report.not_run == 2 and report.verdict == "INCOMPLETE" and not report.passed
    assert main(["check", model, "--backend", "stablehlo", "--quiet"]) == 1
    assert "INCOMPLETE (2 not run)" in capsys.readouterr().out
    assert main(["check", model, "--backend", "stablehlo", "--quiet", "--allow-not-run"]) == 0
    assert "PASSED (2 not run, accepted)" in capsys.readouterr().out
    assert check(model).passed  # the IR interpreter runs every node (onnx's reference Det)


def test_dynamic_inputs_take_static_shapes_from_the_data_on_xla() -> None:
    """bert_mask's inputs are [batch, 32]: StableHLO needs static shapes, which check takes from --data."""
    require_module("jax")
    report = check(str(MODELS / "bert_mask.onnx"), str(MODELS / "bert_mask.inputs.npz"), backend="stablehlo")
    assert report.verdict == "PASSED", [(g.what, g.example_reason) for g in report.not_run_groups()]
    assert all(output.ours is not None for output in report.outputs.values())


def test_a_bug_in_a_lowering_is_exit_3_after_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A lowering that raises (not an InputError) is a bug of ours: the report still shows what ran, the
    node and the outputs are 'not run (a bug)', and the exit code is 3, not INCOMPLETE's 1 (new-user report:
    a script keyed on exit codes could not tell a bug from an unsupported op)."""
    require_module("jax")
    from qconvert.backends.stablehlo import convert as stablehlo_convert

    stablehlo_lowerings = stablehlo_convert.stablehlo_lowerings

    def broken(*arguments: object, **keywords: object) -> object:
        raise RuntimeError("a deliberately broken lowering")

    def broken_relu_table() -> object:
        table = stablehlo_lowerings()
        table.replace("onnx.Relu", broken)  # type: ignore[arg-type]
        return table

    monkeypatch.setattr(stablehlo_convert, "stablehlo_lowerings", broken_relu_table)
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Neg", ["r"], ["y"], name="neg"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert main(["check", str(path), "--backend", "stablehlo", "--quiet"]) == 3
    captured = capsys.readouterr()
    assert "INCOMPLETE" in captured.out
    assert "internal error" in captured.err and "a deliberately broken lowering" in captured.err
