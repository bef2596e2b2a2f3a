"""`qconvert check`'s verdict is honest: PASSED only when every node and every output ran and passed;
anything not run makes it INCOMPLETE (exit 1, reasons grouped) unless `--allow-not-run` accepts it; every
node is judged (float nodes within their float32 bound, so a float op computed wrong fails at that node);
an output far below the noise floor fails by default; `--data` streams like `calibrate`'s."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qconvert.check import CheckReport, Tolerances, check, compare
from qconvert.check.bounds import family, judge_output
from qconvert.check.nodes import NodeCase, is_quantization_node, judge
from qconvert.check.oracle import ort_session, run_session
from qconvert.check.report import FLOOR_MARGIN_DB, OutputResult
from qconvert.cli import main

MODELS = Path(__file__).resolve().parents[2] / "models"


def save(path: Path, nodes: list[onnx.NodeProto], inputs, outputs, initializers, opset: int = 17) -> str:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    proto.ir_version = 10 if opset >= 21 else 8
    onnx.save(proto, str(path))
    return str(path)


def int4_pairs(path: Path, pairs: int) -> str:
    """`pairs` int4 QuantizeLinear -> DequantizeLinear chains: onnxruntime's Python API cannot return the
    int4 values between them, so every one of those nodes is "not run" (same op, same reason)."""
    nodes, outputs = [], []
    for index in range(pairs):
        nodes += [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], [f"q{index}"], name=f"q{index}"),
            helper.make_node("DequantizeLinear", [f"q{index}", "s", "z"], [f"y{index}"], name=f"dq{index}"),
        ]
        outputs.append(helper.make_tensor_value_info(f"y{index}", TensorProto.FLOAT, [8]))
    initializers = [
        numpy_helper.from_array(np.array(0.5, np.float32), "s"),
        helper.make_tensor("z", TensorProto.INT4, [], [1]),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8])]
    return save(path, nodes, inputs, outputs, initializers, opset=21)


# Verdict -----------------------------------------------------------------------------------------------
def test_not_run_nodes_make_the_verdict_incomplete_and_exit_1(tmp_path: Path) -> None:
    model = int4_pairs(tmp_path / "int4.onnx", 1)
    report = check(model)
    assert report.count("not run") == 2 and report.count("fail") == 0
    assert report.outputs["y0"].verdict == "pass"  # end to end ran: the nodes alone could not
    assert (report.verdict, report.passed, report.verdict_line) == (
        "INCOMPLETE",
        False,
        "INCOMPLETE (2 not run)",
    )
    json_path = tmp_path / "report.json"
    assert main(["check", model, "--quiet", "--json", str(json_path)]) == 1
    written = json.loads(json_path.read_text())
    assert (written["verdict"], written["passed"]) == ("INCOMPLETE", False)
    assert {(g["op_type"], g["count"]) for g in written["not_run"]} == {
        ("QuantizeLinear", 1),
        ("DequantizeLinear", 1),
    }


def test_allow_not_run_accepts_it_explicitly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = int4_pairs(tmp_path / "int4.onnx", 1)
    report = check(model, allow_not_run=True)
    assert (report.verdict, report.passed) == ("PASSED", True)
    assert report.verdict_line == "PASSED (2 not run, accepted)"
    assert main(["check", model, "--quiet", "--allow-not-run"]) == 0
    assert "PASSED (2 not run, accepted)" in capsys.readouterr().out
    assert main(["check", model, "--quiet"]) == 1


def test_not_run_reasons_are_grouped_by_op_and_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """40 not-run nodes: two lines (one per op type, the reason's value names folded), each with its count
    and at most three node names, never a line per node."""
    model = int4_pairs(tmp_path / "int4.onnx", 20)
    report = check(model)
    groups = report.not_run_groups()
    assert [(g.what, g.count, len(g.examples)) for g in groups] == [
        ("QuantizeLinear", 20, 3),
        ("DequantizeLinear", 20, 3),
    ]
    assert groups[0].reason == "onnxruntime's Python API does not return int4 tensors (value '…')"
    assert main(["check", model]) == 1
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("not run")]
    assert len(lines) == 2
    assert "QuantizeLinear x20 (q0, q1, q2, ...)" in lines[0]
    assert (
        out.rstrip()
        .splitlines()[-1]
        .startswith("INCOMPLETE (40 not run): nodes: 0 passed, 0 failed, 40 not run")
    )


def test_nothing_ran_is_incomplete_even_when_accepted() -> None:
    report = CheckReport(
        model="m", backend="interpreter", tolerances=Tolerances(), layers={}, outputs={}, inputs_source="-"
    )
    report.allow_not_run = True
    assert report.verdict == "INCOMPLETE" and report.verdict_line == "INCOMPLETE (nothing ran)"


# Every node judged ---------------------------------------------------------------------------------------
def test_every_node_is_judged_float_nodes_within_their_bound() -> None:
    report = check(str(MODELS / "tiny_encoder.qdq.onnx"), str(MODELS / "tiny_encoder.inputs.npz"))
    model = onnx.load(str(MODELS / "tiny_encoder.qdq.onnx"))
    assert len(report.layers) == len(model.graph.node)
    floats = [layer for layer in report.layers.values() if layer.family is not None]
    assert {layer.op_type for layer in floats} >= {"MatMul", "Softmax", "LayerNormalization", "Erf", "Add"}
    for layer in floats:
        assert layer.verdict == "pass", (layer.node, layer.bound, layer.max_bound_ratio)
        assert layer.elements > 0 and layer.bound
        # Measured: onnx's reference and onnxruntime differ by at most 4% of the bound (Erf, Softmax, MatMul):
        # the bounds are honest, not tuned to the edge.
        assert layer.max_bound_ratio is not None and layer.max_bound_ratio <= 0.25
    families = {layer.op_type: layer.family for layer in floats}
    assert families["MatMul"] == "reduction" and families["Erf"] == "transcendental"
    assert families["Reshape"] == "exact" and families["Softmax"] == "normalization"


def batch_norm_model(path: Path) -> tuple[str, dict[str, np.ndarray]]:
    """Conv -> BatchNormalization carrying the legacy `momentum` attribute -> Relu (an older exporter's)."""
    rng = np.random.default_rng(3)
    channels = 4
    initializers = [
        numpy_helper.from_array(rng.standard_normal((channels, 2, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array((rng.random(channels) + 0.5).astype(np.float32), "scale"),
        numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "bias"),
        numpy_helper.from_array(rng.standard_normal(channels).astype(np.float32), "mean"),
        numpy_helper.from_array((rng.random(channels) + 0.5).astype(np.float32), "var"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node(
            "BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"], name="bn", momentum=0.9
        ),
        helper.make_node("Relu", ["b"], ["y"], name="relu"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2, 6, 6])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, channels, 6, 6])]
    feeds = {"x": rng.standard_normal((2, 2, 6, 6)).astype(np.float32)}
    return save(path, nodes, inputs, outputs, initializers, opset=9), feeds


def test_a_float_op_computed_wrong_fails_at_that_node(tmp_path: Path) -> None:
    """A real mis-computation: onnx's reference BatchNormalization takes its training-mode path when the
    node carries `momentum` (opset 9 here), normalizing by the batch's own statistics. Judged against
    onnxruntime's value for that node, it fails at `bn` while the Conv before it passes; end to end the
    output is far below the noise floor and fails by default."""
    from onnx.reference import ReferenceEvaluator

    path, feeds = batch_norm_model(tmp_path / "bn.onnx")
    model = onnx.load(path)
    session = ort_session(model, optimized=False, label=path)
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    exposed.graph.output.extend([onnx.ValueInfoProto(name="c"), onnx.ValueInfoProto(name="b")])
    values = run_session(ort_session(exposed, optimized=False, label=path), feeds)
    values.update(feeds)
    values.update({t.name: numpy_helper.to_array(t) for t in model.graph.initializer})
    reference = ReferenceEvaluator(exposed)
    wrong = dict(zip(["y", "c", "b"], reference.run(None, feeds)))
    verdicts = {}
    # Conv and BatchNormalization read what onnx's reference computed from the same graph input (the Conv's
    # x, and a `c` equal to onnxruntime's up to float noise); Relu would read the wrong `b`: left out.
    for node in model.graph.node[:2]:
        case = NodeCase(
            name=node.name,
            op_type=node.op_type,
            domain="",
            nodes=[node],
            compared=list(node.output),
            quantization=False,
        )
        verdicts[node.name] = judge(case, {o: wrong[o] for o in node.output}, values, "onnx reference")
    assert verdicts["conv"].verdict == "pass" and verdicts["conv"].family == "reduction"
    bn = verdicts["bn"]
    assert (bn.verdict, bn.family) == ("fail", "normalization")
    assert bn.mismatches > bn.elements // 2 and bn.max_bound_ratio is not None and bn.max_bound_ratio > 1000
    # End to end: our (wrong) output against onnxruntime's, beside onnxruntime optimized against itself.
    reference_y = run_session(session, feeds)["y"]
    floor = compare(reference_y, run_session(ort_session(model, optimized=True, label=path), feeds)["y"])
    output = OutputResult(name="y", ours=compare(reference_y, wrong["y"]), noise_floor=floor)
    assert output.floor_failure is not None and output.verdict == "fail"
    report = CheckReport(
        model=path,
        backend="interpreter",
        tolerances=Tolerances(),
        layers=verdicts,
        outputs={"y": output},
        inputs_source="-",
    )
    assert report.verdict == "FAILED"


def test_check_batch_norm_with_momentum_is_judged_at_the_node(tmp_path: Path) -> None:
    """The same model through `check`: every node is judged and the verdict is PASSED only if the interpreter
    computes BatchNormalization in inference mode (the one onnxruntime runs)."""
    path, feeds = batch_norm_model(tmp_path / "bn.onnx")
    report = check(path, feeds)
    bn = report.layers["bn"]
    assert bn.family == "normalization" and bn.elements == 2 * 4 * 6 * 6
    assert (bn.verdict == "pass") == report.passed
    assert report.outputs["y"].verdict == bn.verdict


def test_float_bound_families() -> None:
    node = helper.make_node("Exp", ["x"], ["y"])
    x = np.linspace(-3, 3, 101, dtype=np.float32)
    y = np.exp(x)
    assert family(node) == "transcendental"
    assert judge_output(node, "transcendental", [x], y, y).outside == 0
    inside = y * np.float32(1 + 2**-20)  # 8 eps relative: inside 16 eps |ref|
    assert judge_output(node, "transcendental", [x], y, inside).outside == 0
    assert judge_output(node, "transcendental", [x], y, y * np.float32(1 + 2**-17)).outside == y.size
    exact = helper.make_node("Transpose", ["x"], ["y"])
    assert family(exact) == "exact"
    nudged = np.nextafter(y, np.float32(np.inf))
    assert judge_output(exact, "exact", [x], y, nudged).outside == y.size


def test_dynamic_quantize_lstm_is_run_and_counted_bit_exact(tmp_path: Path) -> None:
    """An LSTM quantized by onnxruntime's quantize_dynamic becomes one com.microsoft DynamicQuantizeLSTM: it
    is a quantization node, run per node and judged bit-exact against onnxruntime (one thread)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    steps, batch, features, hidden = 5, 2, 8, 16
    initializers = [
        numpy_helper.from_array(
            (0.3 * rng.standard_normal((1, 4 * hidden, features))).astype(np.float32), "W"
        ),
        numpy_helper.from_array((0.3 * rng.standard_normal((1, 4 * hidden, hidden))).astype(np.float32), "R"),
        numpy_helper.from_array((0.1 * rng.standard_normal((1, 8 * hidden))).astype(np.float32), "B"),
    ]
    node = helper.make_node(
        "LSTM", ["X", "W", "R", "B"], ["Y", "Y_h", "Y_c"], name="lstm", hidden_size=hidden
    )
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [steps, batch, features])]
    outputs = [
        helper.make_tensor_value_info("Y", TensorProto.FLOAT, [steps, 1, batch, hidden]),
        helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [1, batch, hidden]),
        helper.make_tensor_value_info("Y_c", TensorProto.FLOAT, [1, batch, hidden]),
    ]
    float_path = save(tmp_path / "lstm.onnx", [node], inputs, outputs, initializers, opset=14)
    quantized = str(tmp_path / "lstm_int8.onnx")
    quantize_dynamic(float_path, quantized, weight_type=QuantType.QInt8)
    assert is_quantization_node(onnx.load(quantized).graph.node[0])
    report = check(quantized, {"X": rng.standard_normal((steps, batch, features)).astype(np.float32)})
    (layer,) = report.layers.values()
    assert (layer.op_type, layer.domain, layer.family) == ("DynamicQuantizeLSTM", "com.microsoft", None)
    assert (layer.verdict, layer.mismatches) == ("pass", 0), layer.reason
    assert layer.elements == steps * batch * hidden + 2 * batch * hidden
    assert report.passed


# End to end beside the noise floor ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bert_qdq(tmp_path_factory: pytest.TempPathFactory) -> str:
    """models/bert_mask.onnx calibrated by qconvert (minmax) on its sample inputs: a MiniLM-class QDQ."""
    path = tmp_path_factory.mktemp("bert") / "bert_mask.qdq.onnx"
    code = main(
        [
            "calibrate",
            str(MODELS / "bert_mask.onnx"),
            "--data",
            str(MODELS / "bert_mask.inputs.npz"),
            "-o",
            str(path),
            "--quiet",
        ]
    )
    assert code == 0
    return str(path)


def test_minilm_class_qdq_passes_below_an_exact_floor(bert_qdq: str) -> None:
    """Cascaded quantization near-ties move a few elements by one step: the SQNR sits far under the floor
    (onnxruntime's optimizations change nothing here, the floor is exact), yet above the one-step level, so
    the default margin passes it."""
    report = check(bert_qdq, str(MODELS / "bert_mask.inputs.npz"))
    assert report.passed, [(o.name, o.failures) for o in report.outputs.values()]
    hidden = report.outputs["last_hidden_state"]
    assert hidden.ours is not None and hidden.noise_floor is not None
    step_level = hidden.ours.step_level_db
    assert step_level is not None and hidden.ours.sqnr_db > step_level
    if hidden.ours.mismatches:  # the near-ties (measured: 1 of 8192 elements, 70.7 dB)
        assert hidden.ours.sqnr_db < hidden.noise_floor.sqnr_db - FLOOR_MARGIN_DB


def test_output_far_below_the_floor_fails_by_default_and_says_why() -> None:
    rng = np.random.default_rng(0)
    reference = rng.standard_normal(1000).astype(np.float32)
    floor = compare(reference, reference)
    noisy = (reference + 0.1 * rng.standard_normal(1000)).astype(np.float32)  # 20 dB
    output = OutputResult(name="y", ours=compare(reference, noisy), noise_floor=floor)
    assert output.verdict == "fail" and "below the noise floor" in (output.floor_failure or "")
    slight = (reference + 1e-3 * rng.standard_normal(1000)).astype(np.float32)  # 60 dB: above 40 dB
    assert OutputResult(name="y", ours=compare(reference, slight), noise_floor=floor).verdict == "pass"
    # One quantization step on every element of a dequantized output is not below its level.
    step = np.float32(0.05)
    quantized = np.round(reference / step) * step
    moved = compare(quantized, quantized + step, lsb_unit=np.array(step))
    assert OutputResult(name="y", ours=moved, noise_floor=floor).verdict == "pass"
    two_steps = compare(quantized, quantized + 2 * step, lsb_unit=np.array(step))
    assert OutputResult(name="y", ours=two_steps, noise_floor=floor).verdict == "fail"


def test_comparisons_merge_across_batches() -> None:
    rng = np.random.default_rng(1)
    reference = rng.standard_normal(600).astype(np.float32)
    ours = (reference + 0.01 * rng.standard_normal(600)).astype(np.float32)
    lsb = np.array(0.02)
    whole = compare(reference, ours, lsb)
    merged = compare(reference[:250], ours[:250], lsb).merged(compare(reference[250:], ours[250:], lsb))
    assert (merged.elements, merged.mismatches, merged.max_abs_diff) == (
        whole.elements,
        whole.mismatches,
        whole.max_abs_diff,
    )
    assert merged.max_lsb_diff == whole.max_lsb_diff
    assert merged.sqnr_db == pytest.approx(whole.sqnr_db, rel=1e-12)
    assert merged.cosine == pytest.approx(whole.cosine, rel=1e-12)
    assert merged.step_level_db == pytest.approx(whole.step_level_db, rel=1e-12)


# Streaming --data ----------------------------------------------------------------------------------------
def digits_folder(path: Path, files: int) -> Path:
    """`files` .npz files of 8 digits images each (the sample batch, shifted per file)."""
    path.mkdir()
    image = np.load(MODELS / "digits_cnn.inputs.npz")["image"]
    for index in range(files):
        np.savez(path / f"{index:04d}.npz", image=np.roll(image, index, axis=3))
    return path


def test_data_folder_streams_every_sample_end_to_end(tmp_path: Path) -> None:
    folder = digits_folder(tmp_path / "data", 5)
    report = check(str(MODELS / "digits_cnn.qdq.onnx"), str(folder))
    assert (report.samples, report.node_samples) == (40, 8)
    logits = report.outputs["logits"]
    assert logits.ours is not None and logits.ours.elements == 40 * 10 and logits.samples == 40
    assert report.passed
    limited = check(str(MODELS / "digits_cnn.qdq.onnx"), str(folder), max_samples=16)
    assert limited.samples == 16 and limited.outputs["logits"].ours.elements == 160  # type: ignore[union-attr]
    assert (
        main(
            [
                "check",
                str(MODELS / "digits_cnn.qdq.onnx"),
                "--data",
                str(folder),
                "--max-samples",
                "3",
                "--quiet",
            ]
        )
        == 0
    )


def test_data_stream_memory_is_flat(tmp_path: Path) -> None:
    """Peak memory (numpy allocations, traced) for 400 samples stays that of 16: one batch at a time."""

    def peak(samples: int) -> int:
        image = np.load(MODELS / "digits_cnn.inputs.npz")["image"]
        data = [{"image": np.roll(image, i, axis=2)} for i in range(samples // 8)]
        tracemalloc.start()
        check(str(MODELS / "digits_cnn.qdq.onnx"), lambda: iter(data))
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    small, large = peak(16), peak(400)
    assert large < small * 1.5 + (1 << 20), (small, large)


def test_dynamic_inputs_take_their_shapes_from_the_data(tmp_path: Path) -> None:
    """bert_mask's inputs are [batch, 32]: the batches of 3 and then 2 samples pin the model twice."""
    arrays = dict(np.load(MODELS / "bert_mask.inputs.npz"))
    np.savez(tmp_path / "five.npz", **{k: np.concatenate([v, v[:1]]) for k, v in arrays.items()})
    report = check(str(MODELS / "bert_mask.onnx"), str(tmp_path / "five.npz"), batch_size=3)
    assert report.samples == 5 and report.node_samples == 3 and report.passed
    assert any("pinned to 2 sets of input shapes" in note for note in report.notes)
    assert report.outputs["sentence_embedding"].ours.elements == 5 * 64  # type: ignore[union-attr]
