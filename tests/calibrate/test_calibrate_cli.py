"""`qconvert calibrate`: quantize_static's numbers end to end, ranges saved and reused, bad input."""

from __future__ import annotations

import io
import json
import os
import pty
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from calibrate.parity_support import onnxruntime_qdq, save_npz, written_qdq
from onnx import TensorProto, helper

from qconvert.calibrate import counting
from qconvert.cli import main

MODELS = Path(__file__).resolve().parents[2] / "models"
DIGITS = MODELS / "digits_cnn.onnx"
ENCODER = MODELS / "tiny_encoder.onnx"


def digit_batches(count: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(11)
    return [{"image": rng.random((8, 1, 8, 8), dtype=np.float32)} for _ in range(count)]


def encoder_batches(count: int = 4) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(12)
    return [{"input_ids": rng.integers(0, 32, (2, 16), dtype=np.int64)} for _ in range(count)]


def run(model: Path, batches: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return [session.run(None, batch)[0] for batch in batches]


@pytest.mark.parametrize(
    ("model", "make_batches", "flags", "settings"),
    [
        (DIGITS, digit_batches, ["--per-channel"], {"per_channel": True}),
        (ENCODER, encoder_batches, ["--per-tensor-weights"], {}),  # onnxruntime's default scheme
        (
            DIGITS,
            digit_batches,
            ["--activation-type", "uint8", "--per-tensor-weights"],
            {"activation_type": "QUInt8"},
        ),
    ],
    ids=["digits-per-channel", "encoder-default", "digits-uint8"],
)
def test_minmax_output_equals_quantize_static_and_runs_identically(
    model: Path, make_batches, flags: list[str], settings: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    batches = make_batches()
    data = save_npz(tmp_path / "data.npz", batches)
    out = tmp_path / "ours.qdq.onnx"
    command = ["calibrate", str(model), "--data", str(data), "--out", str(out), "--outlier-channels", "off"]
    assert main([*command, *flags]) == 0
    if "uint8" in flags:
        settings = {"activation_type": ort.quantization.QuantType.QUInt8}
    reference = onnxruntime_qdq(model, batches, tmp_path, **settings)
    ours = written_qdq(onnx.load(out))
    assert ours == reference
    # Same scales, zero points and weights: onnxruntime computes the same numbers from both models.
    for mine, theirs in zip(run(out, batches), run(tmp_path / "ort.qdq.onnx", batches)):
        np.testing.assert_array_equal(mine, theirs)
    shown = capsys.readouterr().out
    assert "ranges (minmax)" in shown and f"wrote {out}" in shown


def test_ranges_saved_then_reused_give_the_same_model_and_json(tmp_path: Path) -> None:
    data = save_npz(tmp_path / "data.npz", digit_batches(2))
    first, second = tmp_path / "first.onnx", tmp_path / "second.onnx"
    ranges, result = tmp_path / "ranges.json", tmp_path / "result.json"
    common = ["--method", "percentile", "--quiet"]
    assert main(["calibrate", str(DIGITS), "--data", str(data), "-o", str(first), "--ranges", str(ranges),
                 "--json", str(result), *common]) == 0  # fmt: skip
    assert main(["calibrate", str(DIGITS), "--load-ranges", str(ranges), "-o", str(second), "--quiet"]) == 0
    assert written_qdq(onnx.load(first)) == written_qdq(onnx.load(second))
    saved = json.loads(ranges.read_text())
    assert saved["metadata"]["method"] == "percentile" and saved["metadata"]["samples"] == 16
    report = json.loads(result.read_text())
    assert report["samples"]["used"] == 16 and report["samples"]["batches"] == 2
    assert report["ranges"] == saved["tensors"]


def test_the_summary_says_when_numpys_loops_did_the_counting(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = save_npz(tmp_path / "data.npz", digit_batches(1))
    command = ["calibrate", str(DIGITS), "--data", str(data), "-o", str(tmp_path / "out.onnx")]
    monkeypatch.setattr(counting, "_counting", None)  # as installed without a C compiler
    assert main(command) == 0
    assert "counted with numpy's loops: qconvert's C extension is not built" in capsys.readouterr().out
    monkeypatch.undo()
    if counting.uses_c_loops():
        assert main(command) == 0
        assert "numpy's loops" not in capsys.readouterr().out


def test_the_summary_has_one_row_per_range_with_its_min_and_max(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data, report = save_npz(tmp_path / "data.npz", digit_batches(2)), tmp_path / "result.json"
    out = tmp_path / "out.onnx"
    assert main(["calibrate", str(DIGITS), "--data", str(data), "-o", str(out), "--json", str(report)]) == 0
    rows = capsys.readouterr().out.splitlines()
    ranges = json.loads(report.read_text())["ranges"]
    assert f"{len(ranges)} ranges (minmax)" in rows[0] and len(ranges) == 9
    written = json.loads(report.read_text())["quantization"]  # the scale and zero point of each Q/DQ
    for name, tensor_range in ranges.items():
        low, high = f"{float(tensor_range['min']):.6g}", f"{float(tensor_range['max']):.6g}"
        parameters = written.get(name)
        cells = (
            ["-", "-"]
            if parameters is None
            else [f"{parameters['scale']:.6g}", str(parameters["zero_point"])]
        )
        assert any(row.replace("│", " ").split() == [name, low, high, *cells] for row in rows), name
    assert rows[-1].startswith("calibrated 16 samples (2 batches of up to 8)") and f"wrote {out}" in rows[-1]
    assert [row for row in rows if row != row.rstrip()] == []  # piped: no cell padding at the ends of rows


@pytest.mark.parametrize("encoding", ["cp1252", "ascii"])
def test_a_piped_summary_is_drawn_in_what_stdout_can_encode(
    encoding: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Windows pipe is cp1252: rich draws the table with ASCII boxes there instead of failing."""
    stdout = io.TextIOWrapper(io.BytesIO(), encoding=encoding)
    monkeypatch.setattr(sys, "stdout", stdout)
    data, out = save_npz(tmp_path / "data.npz", digit_batches(2)), tmp_path / "out.onnx"
    # The worst-tensors table's title writes norms as ‖x - x̂‖: characters cp1252 lacks come out as ?.
    command = ["calibrate", str(DIGITS), "--data", str(data), "-o", str(out), "--evaluate", "8"]
    assert main([*command, "--worst-tensors", "2"]) == 0
    stdout.flush()
    rows = stdout.buffer.getvalue().decode(encoding).splitlines()  # type: ignore[attr-defined]
    assert rows[0].startswith("9 ranges (minmax)") and rows[-1].startswith("calibrated 16 samples")
    assert any(row.startswith("image ") and row.count("|") == 5 for row in rows), rows  # 6 columns
    assert any("relative error ?x - x?? / ?x? of their" in row for row in rows), rows


def test_the_progress_bar_shows_samples_per_second_and_eta_on_a_terminal(tmp_path: Path) -> None:
    """On a pseudo-terminal, as a user sees it (rich draws nothing when stderr is not a terminal)."""

    images = np.random.default_rng(4).random((16384, 1, 8, 8), dtype=np.float32)
    np.savez(tmp_path / "many.npz", image=images)
    cli = "import sys; from qconvert.cli import main; sys.exit(main())"
    command = [sys.executable, "-c", cli, "calibrate", str(DIGITS), "--data", str(tmp_path / "many.npz"),
               "-o", str(tmp_path / "out.onnx")]  # fmt: skip
    try:
        leader, follower = pty.openpty()
    except OSError as error:  # a container without /dev/ptmx
        pytest.skip(f"no pseudo-terminal here: {error}")
    environment = {**os.environ, "COLUMNS": "200", "TERM": "xterm"}
    process = subprocess.Popen(command, stdin=follower, stdout=follower, stderr=follower, env=environment)
    os.close(follower)
    screen = bytearray()
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the process is done
            break
        if not chunk:
            break
        screen += chunk
    os.close(leader)
    assert process.wait(timeout=120) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.decode(errors="replace"))  # colours, cursor
    assert re.search(r"calibrating .*\d+/16384 samples +[\d,]+\.\d/s +\d:\d\d:\d\d ETA \d:\d\d:\d\d", text), (
        text[-2000:]
    )
    assert f"wrote {tmp_path / 'out.onnx'}" in text


def test_nan_samples_are_excluded_with_a_warning_and_calibration_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    images = np.random.default_rng(1).random((17, 1, 8, 8), dtype=np.float32)
    images[3, 0, 2, 2] = np.nan
    np.savez(tmp_path / "data.npz", image=images)
    out = tmp_path / "out.onnx"
    assert (
        main(["calibrate", str(DIGITS), "--data", str(tmp_path / "data.npz"), "-o", str(out), "--quiet"]) == 0
    )
    assert out.exists()
    warnings = capsys.readouterr().err
    assert "1 of 17 samples contain NaN/Inf and were excluded ('image': 1)" in warnings
    assert "the last 0 samples" not in warnings  # 16 finite samples fill two batches exactly


# Bad input: exit 2, a message naming the problem, and no output file -------------------------------
def integer_model(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "a"], ["b"])],
        "integers",
        [helper.make_tensor_value_info("a", TensorProto.INT32, [2, 3])],
        [helper.make_tensor_value_info("b", TensorProto.INT32, [2, 3])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, Path, str]]:
    """case -> (model, data, expected message fragment)."""
    (tmp_path / "empty").mkdir()
    np.savez(tmp_path / "names.npz", pixels=np.zeros((8, 1, 8, 8), np.float32))
    np.savez(tmp_path / "dtype.npz", image=np.zeros((8, 1, 8, 8), np.float64))
    np.savez(tmp_path / "rank.npz", image=np.zeros((8, 64), np.float32))
    np.savez(tmp_path / "nan.npz", image=np.full((16, 1, 8, 8), np.nan, np.float32))
    np.savez(tmp_path / "ints.npz", a=np.zeros((4, 3), np.int32))
    return {
        "empty dataset": (DIGITS, tmp_path / "empty", "dataset is empty"),
        "wrong input names": (DIGITS, tmp_path / "names.npz", "missing input(s) ['image']; unknown array(s)"),
        "wrong dtype": (DIGITS, tmp_path / "dtype.npz", "input 'image' has dtype float64; the model takes"),
        "wrong rank": (DIGITS, tmp_path / "rank.npz", "input 'image' has rank 2"),
        "no float activations": (
            integer_model(tmp_path / "ints.onnx"),
            tmp_path / "ints.npz",
            "no float (f32/f16) activations to calibrate",
        ),
        "all NaN": (DIGITS, tmp_path / "nan.npz", "all 16 samples contain NaN/Inf ('image': 16)"),
    }  # fmt: skip


CASES = ["empty dataset", "wrong input names", "wrong dtype", "wrong rank", "no float activations", "all NaN"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_exits_2_with_a_message_and_writes_nothing(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model, data, message = bad_inputs(tmp_path)[case]
    out_folder = tmp_path / "out"
    out_folder.mkdir()
    out, ranges = out_folder / "model.qdq.onnx", out_folder / "ranges.json"
    code = main(["calibrate", str(model), "--data", str(data), "--out", str(out), "--ranges", str(ranges)])
    error = capsys.readouterr().err
    assert code == 2, error
    assert message in error
    assert "Traceback" not in error and "internal error" not in error
    assert error.splitlines() == [error.strip()]  # one line (no progress bar's blank line off a terminal)
    assert list(out_folder.iterdir()) == []  # no model, no ranges, no temporary file


FLOAT8 = ["--activation-type", "float8e4m3fn", "--weight-type", "float8e4m3fn"]


def test_bad_options_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = save_npz(tmp_path / "data.npz", digit_batches(1))
    cases = {
        "--batch-size 4: input 'image' has a fixed batch dim of 8": ["--batch-size", "4"],
        "--method median": ["--method", "median"],
        "--engine spark": ["--engine", "spark"],
        "activation_type 'int7'": ["--activation-type", "int7"],
        "calibrate needs --data": [],
        "--method mse searches integer storage ranges": ["--method", "mse", *FLOAT8],
        "method 'percentile' has no option num_quantized_bins": [
            "--method",
            "percentile",
            "--num-quantized-bins",
            "8",
        ],
    }
    for message, flags in cases.items():
        arguments = ["calibrate", str(DIGITS), "--quiet", "-o", str(tmp_path / "x.onnx"), *flags]
        if message != "calibrate needs --data":
            arguments += ["--data", str(data)]
        assert main(arguments) == 2, message
        assert message in capsys.readouterr().err
        assert not (tmp_path / "x.onnx").exists()


def test_num_bins_past_a_limit_exits_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = save_npz(tmp_path / "data.npz", digit_batches(1))
    out = tmp_path / "x.onnx"
    cases = {
        "--method entropy: num_bins must be at most 16384 for entropy (the KL search costs about num_bins²": [
            "--method", "entropy", "--num-bins", "65536"],
        "--method percentile: num_bins must be at most 65536 for percentile (each calibrated tensor keeps": [
            "--method", "percentile", "--num-bins", "1000000"],
        "--method mse: num_bins must be at least 16 for mse": ["--method", "mse", "--num-bins", "0"],
    }  # fmt: skip
    for message, flags in cases.items():
        assert main(["calibrate", str(DIGITS), "--data", str(data), "-o", str(out), "--quiet", *flags]) == 2
        assert message in capsys.readouterr().err, message
        assert not out.exists()


# Output paths: every one checked before calibrating, and written all or none --------------------------
def bad_outputs(tmp_path: Path, out_folder: Path) -> dict[str, tuple[list[str], str]]:
    """case -> (output flags, expected message)."""
    model_copy = tmp_path / "model.onnx"
    model_copy.write_bytes(DIGITS.read_bytes())
    (out_folder / "folder").mkdir()
    (tmp_path / "a_file").write_text("")
    out, ranges = out_folder / "model.qdq.onnx", out_folder / "ranges.json"
    missing = tmp_path / "missing" / "r.json"
    return {
        "--ranges in a missing folder": (
            ["--ranges", str(missing)], f"--ranges {missing}: folder '{missing.parent}' does not exist"),
        "--ranges is a folder": (
            ["--ranges", str(out_folder / "folder")], f"--ranges {out_folder / 'folder'}: is a folder"),
        "--json in a missing folder, after -o": (
            ["-o", str(out), "--json", str(missing)], f"--json {missing}: folder '{missing.parent}'"),
        "--json under a file": (
            ["-o", str(out), "--json", str(tmp_path / "a_file" / "r.json")],
            f"--json {tmp_path / 'a_file' / 'r.json'}: '{tmp_path / 'a_file'}' is not a folder"),
        "--ranges is -o": (
            ["-o", str(out), "--ranges", str(out)], f"--ranges {out}: --out {out} names the same file"),
        "--json is --ranges": (
            ["--ranges", str(ranges), "--json", str(out_folder / ".." / out_folder.name / "ranges.json")],
            "--ranges " + str(ranges) + " names the same file; give each output its own path"),
        "-o is the model": (
            ["-o", str(model_copy)], f"--out {model_copy}: would overwrite the model (an input)"),
        "two outputs on stdout": (["-o", "-", "--json", "-"], "--json -: --out - writes to stdout already"),
    }  # fmt: skip


@pytest.mark.parametrize(
    "case",
    ["--ranges in a missing folder", "--ranges is a folder", "--json in a missing folder, after -o",
     "--json under a file", "--ranges is -o", "--json is --ranges", "-o is the model",
     "two outputs on stdout"],
)  # fmt: skip
def test_bad_output_paths_exit_2_before_calibrating_and_write_nothing(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out_folder = tmp_path / "out"
    out_folder.mkdir()
    flags, message = bad_outputs(tmp_path, out_folder)[case]
    model = tmp_path / "model.onnx"
    before = DIGITS.read_bytes()
    # An empty dataset: had calibration started, its error would be the one reported.
    (tmp_path / "empty").mkdir()
    code = main(["calibrate", str(model), "--data", str(tmp_path / "empty"), "--quiet", *flags])
    error = capsys.readouterr().err
    assert code == 2, error
    assert message in error and "dataset is empty" not in error
    assert len(error.strip().splitlines()) == 1 and "internal error" not in error
    assert [path.name for path in out_folder.iterdir()] == ["folder"]  # no model, no JSON, no temporary
    assert model.read_bytes() == before and not (tmp_path / "-").exists()


def test_a_later_output_failing_removes_the_earlier_ones(tmp_path: Path) -> None:
    """The model fails to write: the staged JSON never appears; a JSON's rename fails after the model was
    written (a folder took its place): the model is removed again."""
    from qconvert.calibrate.outputs import TextOutput, write_outputs
    from qconvert.errors import InputError

    model, ranges, result = tmp_path / "m.onnx", tmp_path / "r.json", tmp_path / "j.json"
    texts = [TextOutput(option, path, lambda p: p.write_text("{}\n")) for option, path in
             (("--ranges", ranges), ("--json", result))]  # fmt: skip

    def failing_model() -> Path:
        raise InputError(f"cannot write '{model}': disk full")

    with pytest.raises(InputError, match="disk full"):
        write_outputs(texts, failing_model)
    assert list(tmp_path.iterdir()) == []

    def model_then_a_folder_at_the_json() -> Path:
        model.write_bytes(b"model")
        result.mkdir()
        return model

    with pytest.raises(InputError, match=f"--json {result}: cannot write"):
        write_outputs(texts, model_then_a_folder_at_the_json)
    assert [path.name for path in tmp_path.iterdir()] == ["j.json"] and result.is_dir()  # the folder only

    result.rmdir()
    write_outputs(texts, lambda: model.write_bytes(b"model") and model)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["j.json", "m.onnx", "r.json"]
    assert ranges.read_text() == "{}\n" and oct(ranges.stat().st_mode & 0o777) != "0o600"


def test_json_dash_writes_the_result_to_stdout_and_the_table_to_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    data = save_npz(tmp_path / "data.npz", digit_batches(1))
    ranges = tmp_path / "ranges.json"
    assert main(["calibrate", str(DIGITS), "--data", str(data), "--ranges", str(ranges), "--json", "-"]) == 0
    shown = capsys.readouterr()
    report = json.loads(shown.out)  # stdout holds the JSON alone
    assert report["ranges"] == json.loads(ranges.read_text())["tensors"]
    assert report["ranges_file"] == str(ranges)
    assert "ranges (minmax)" in shown.err and f"wrote {ranges}" in shown.err
    assert not (tmp_path / "-").exists()


# Node selectors, checked against the model's graph ---------------------------------------------------
def test_unknown_selector_names_exit_2_naming_them_with_a_close_match(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data = save_npz(tmp_path / "data.npz", digit_batches(1))
    out = tmp_path / "x.onnx"
    cases = {
        "--nodes (nodes_to_quantize): 'nosuchnode': no node of that name in the model": [
            "--nodes", "nosuchnode"],
        "--exclude-nodes (nodes_to_exclude): '/conv1/conv' (did you mean '/conv1/Conv'?), 'unknown': no "
        "node": ["--exclude-nodes", "unknown,/conv1/conv"],
        "--exclude-op-types (op_types_to_exclude): 'Gem' (did you mean 'Gemm'?): not an op type of the "
        "model or of ONNX": ["--exclude-op-types", "Gem"],
        "--op-types (op_types_to_quantize): 'conv' (did you mean 'Conv'?)": ["--op-types", "Relu,conv"],
    }  # fmt: skip
    for message, flags in cases.items():
        assert main(["calibrate", str(DIGITS), "--data", str(data), "-o", str(out), "--quiet", *flags]) == 2
        error = capsys.readouterr().err
        assert f"qconvert: error: {DIGITS}: {message}" in error, error
        assert not out.exists()
    # An ONNX op type the model lacks is a filter that matches nothing: accepted (as onnxruntime does).
    assert main(["calibrate", str(DIGITS), "--data", str(data), "-o", str(out), "--quiet",
                 "--exclude-op-types", "MatMul"]) == 0  # fmt: skip
    assert out.exists()


def test_unknown_selector_names_are_refused_by_the_api_with_loaded_ranges_too(tmp_path: Path) -> None:
    from qconvert.calibrate.api import calibrate
    from qconvert.errors import InputError

    ranges = tmp_path / "ranges.json"
    calibrate(DIGITS, digit_batches(1), ranges_path=ranges)
    out = tmp_path / "out.onnx"
    for options in ({"data": digit_batches(1)}, {"load_ranges": ranges}):
        with pytest.raises(InputError, match=r"'/Relu_2' \(did you mean '/Relu_1'\?\): no node of that name"):
            calibrate(DIGITS, scheme={"nodes_to_quantize": {"/Relu", "/Relu_2"}}, out=out, **options)
        assert not out.exists()


# Already-quantized models ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["digits_cnn.qdq.onnx", "digits_cnn.qop.onnx"])
def test_a_quantized_model_is_refused_with_its_quantized_nodes_counted(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = MODELS / name
    counts: dict[str, int] = {}
    for node in onnx.load(model).graph.node:
        if node.op_type.startswith(("QuantizeLinear", "DequantizeLinear", "QLinear", "QGemm")):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    assert counts["QuantizeLinear"] and counts["DequantizeLinear"]
    data = save_npz(tmp_path / "data.npz", digit_batches(1))
    out = tmp_path / "x.onnx"
    assert main(["calibrate", str(model), "--data", str(data), "-o", str(out), "--quiet"]) == 2
    error = capsys.readouterr().err
    quantize, dequantize = counts.pop("QuantizeLinear"), counts.pop("DequantizeLinear")
    found = f"{quantize} QuantizeLinear, {dequantize} DequantizeLinear"
    found += "".join(f", {counts[op_type]} {op_type}" for op_type in sorted(counts))
    assert f"{model}: already quantized ({found} nodes); calibrate takes a float model" in error, error
    assert not out.exists()


# The sentinel guard, wired through calibrate: models/bert_mask.onnx adds float-min at padded positions --
def padded_sequences(path: Path, count: int = 16, seq: int = 32) -> Path:
    rng = np.random.default_rng(21)
    lengths = rng.integers(seq // 4, seq + 1, size=count)
    lengths[0] = seq // 2  # at least one padded row
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    ids = np.where(mask == 1, rng.integers(1, 128, size=(count, seq)), 0).astype(np.int64)
    np.savez(path, input_ids=ids, attention_mask=mask)
    return path


def test_float_min_mask_tensors_stay_float_by_default_and_clip_on_request(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = MODELS / "bert_mask.onnx"
    data = padded_sequences(tmp_path / "padded.npz")
    kept, clipped = tmp_path / "kept.json", tmp_path / "clipped.json"
    out = tmp_path / "kept.onnx"
    assert (
        main(["calibrate", str(model), "--data", str(data), "-o", str(out), "--json", str(kept), "--quiet"])
        == 0
    )
    assert "(--sentinel keep)" in capsys.readouterr().err
    assert main(["calibrate", str(model), "--data", str(data), "--sentinel", "clip", "--json", str(clipped),
                 "--quiet"]) == 0  # fmt: skip
    kept_report, clipped_report = json.loads(kept.read_text()), json.loads(clipped.read_text())
    flagged = set(kept_report["keep_float"])
    assert flagged, "the mask tensors should be flagged"
    # Kept tensors are the ones whose observed range reaches float-min; no other tensor does.
    reaching = {name for name, r in kept_report["ranges"].items() if float(r["min"]) <= -1e30}
    assert flagged == reaching
    written = onnx.load(out)
    quantized = {node.input[0] for node in written.graph.node if node.op_type == "QuantizeLinear"}
    assert quantized and not quantized & flagged
    # Clipped: the same tensors get the unmasked values' range; those holding nothing else than the
    # sentinel and one value (the float-min constant, the mask of 0 and float-min) stay float.
    warnings = capsys.readouterr().err
    still_float = set(clipped_report["keep_float"])
    assert still_float < flagged and "/Constant_3_output_0" in still_float and "/Mul_output_0" in still_float
    for name in still_float:
        assert f"{name}: left in float, nothing but sentinels" in warnings, name
    for name in flagged - still_float:
        assert -1e30 < float(clipped_report["ranges"][name]["min"]) <= 0, name
        assert clipped_report["ranges"][name]["sentinel"]
    inputs = dict(np.load(data))
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert all(np.isfinite(o).all() for o in session.run(None, {k: v[:4] for k, v in inputs.items()}))


def test_sentinel_overrides_change_only_the_tensors_they_name(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Under the default keep: one flagged tensor clipped, one quantized over its whole range, and an
    unflagged one kept in float; a name that was not calibrated is refused before anything is written."""
    model = MODELS / "bert_mask.onnx"
    data = padded_sequences(tmp_path / "padded.npz")
    default, overridden = tmp_path / "default.json", tmp_path / "overridden.json"
    command = ["calibrate", str(model), "--data", str(data), "--quiet"]
    assert main([*command, "--json", str(default)]) == 0
    report = json.loads(default.read_text())
    flagged = sorted(report["keep_float"])
    clipped = tmp_path / "clipped.json"
    assert main([*command, "--sentinel", "clip", "--json", str(clipped)]) == 0
    still_float = json.loads(clipped.read_text())["keep_float"]
    clippable = [name for name in flagged if name not in still_float]
    assert len(clippable) >= 2, "bert_mask should have two masked tensors that hold unmasked values too"
    clip, quantize = clippable[:2]
    plain = next(name for name in sorted(report["ranges"]) if name not in flagged)
    out = tmp_path / "overridden.onnx"
    overrides = [f"{clip}=clip", f"{quantize}=quantize", f"{plain}=keep"]
    flags = [flag for item in overrides for flag in ("--sentinel-override", item)]
    capsys.readouterr()
    assert main([*command, "--json", str(overridden), "-o", str(out), *flags]) == 0
    warnings = capsys.readouterr().err
    assert f"{clip}: range clipped to" in warnings and "(override)" in warnings
    assert f"{quantize}: quantized anyway (override)" in warnings
    changed = json.loads(overridden.read_text())
    assert set(changed["keep_float"]) == set(flagged) - {clip, quantize} | {plain}
    assert -1e30 < float(changed["ranges"][clip]["min"]) <= 0
    assert float(changed["ranges"][quantize]["min"]) <= -1e30  # MinMax: the whole range, sentinel included
    for name in set(report["ranges"]) - {clip, quantize, plain}:
        assert changed["ranges"][name] == report["ranges"][name], name
    quantized = {node.input[0] for node in onnx.load(out).graph.node if node.op_type == "QuantizeLinear"}
    assert {clip, quantize} <= quantized and plain not in quantized

    missing = tmp_path / "missing.onnx"
    assert main([*command, "-o", str(missing), "--sentinel-override", "no_such_tensor=clip"]) == 2
    assert (
        "--sentinel-override names tensors that were not calibrated: no_such_tensor"
        in capsys.readouterr().err
    )
    assert not missing.exists()


def test_an_all_inf_tensor_stays_float_and_with_the_guard_off_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """y = Relu(x) + Log(x * 0): Log gives -Inf everywhere, and so does y."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "zero"], ["m"]),
            helper.make_node("Log", ["m"], ["l"]),
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Add", ["r", "l"], ["y"]),
        ],
        "minus_infinity",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])],
    )
    model = tmp_path / "inf.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(2).random((8, 4), dtype=np.float32))
    out = tmp_path / "inf.qdq.onnx"
    arguments = ["calibrate", str(model), "--data", str(tmp_path / "x.npz"), "-o", str(out), "--quiet"]
    assert main(arguments) == 0
    assert "l: left in float (--sentinel keep): 32 -Inf in 32 values" in capsys.readouterr().err
    quantized = {node.input[0] for node in onnx.load(out).graph.node if node.op_type == "QuantizeLinear"}
    assert "r" in quantized and not quantized & {"l", "y"}
    out.unlink()
    assert main([*arguments, "--sentinel", "off"]) == 2
    assert "tensor 'l': no finite value observed (0 NaN, 32 Inf of 32 elements)" in capsys.readouterr().err
    assert not out.exists()


def test_import_with_ranges_prints_each_range_as_a_calibrated_type(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from qconvert.calibrate.attach import calibrated_type
    from qconvert.calibrate.ranges import CalibrationRanges
    from qconvert.ir.parser import ParserOptions, parse_module
    from qconvert.ir.printer import print_module, print_type
    from qconvert.ir.types import F32

    data, ranges = save_npz(tmp_path / "data.npz", digit_batches(2)), tmp_path / "ranges.json"
    out = tmp_path / "out.onnx"
    flags = ["-o", str(out), "--ranges", str(ranges), "--quiet"]
    assert main(["calibrate", str(DIGITS), "--data", str(data), *flags]) == 0
    capsys.readouterr()
    mlir = tmp_path / "calibrated.mlir"
    assert main(["import", str(DIGITS), "--ranges", str(ranges), "--elide-weights", "-o", str(mlir)]) == 0
    text = mlir.read_text()
    saved = CalibrationRanges.load(ranges).ranges
    assert text.count("quant.qcast") == len(saved) > 0
    for tensor_range in saved.values():
        quantized = print_type(calibrated_type(F32, tensor_range))
        assert f'onnx.tensor_name = "{tensor_range.name}"}} : ' in text and quantized in text
    parsed = parse_module(text, options=ParserOptions(allow_unregistered_dialect=True))
    assert print_module(parsed) == text  # the calibrated IR parses back to the same text


def test_import_says_which_ranges_name_no_tensor_and_refuses_a_file_that_names_none(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data, ranges = save_npz(tmp_path / "data.npz", digit_batches(1)), tmp_path / "ranges.json"
    assert main(["calibrate", str(DIGITS), "--data", str(data), "--ranges", str(ranges), "--quiet"]) == 0
    saved = json.loads(ranges.read_text())
    saved["tensors"]["not_in_digits"] = saved["tensors"]["image"]
    ranges.write_text(json.dumps(saved))
    out = tmp_path / "out.mlir"
    capsys.readouterr()
    assert main(["import", str(DIGITS), "--ranges", str(ranges), "--elide-weights", "-o", str(out)]) == 0
    assert f"{ranges}: no float tensor for 1 range(s): not_in_digits" in capsys.readouterr().err
    assert out.read_text().count("quant.qcast") == len(saved["tensors"]) - 1
    saved["tensors"] = {f"other/{name}": entry for name, entry in saved["tensors"].items()}
    ranges.write_text(json.dumps(saved))
    out.unlink()
    assert main(["import", str(DIGITS), "--ranges", str(ranges), "-o", str(out)]) == 2
    assert "none of its 10 ranges names a float tensor" in capsys.readouterr().err
    assert not out.exists()


def test_a_selection_that_quantizes_nothing_says_so(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--nodes naming a real node whose op type is not quantized (Erf): a float model, with a warning."""
    data = save_npz(tmp_path / "ids.npz", encoder_batches(1))
    out = tmp_path / "out.onnx"
    arguments = ["calibrate", str(ENCODER), "--data", str(data), "-o", str(out), "--quiet"]
    assert main([*arguments, "--nodes", "/layers.0/gelu/Erf"]) == 0
    assert "nothing was quantized" in capsys.readouterr().err
    assert not {"QuantizeLinear", "DequantizeLinear"} & {node.op_type for node in onnx.load(out).graph.node}
    assert main(arguments) == 0
    assert "nothing was quantized" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--num-bins", "100"], "--num-bins"),
        (["--sentinel-override", "image=keep"], "--sentinel-override"),
        (["--method", "entropy"], "--method"),
        (["--sentinel", "off", "--workers", "2"], "--sentinel, --workers"),
        (["--engine", "ray"], "--engine"),
        (["--batch-size", "4"], "--batch-size"),
    ],
)
def test_options_that_loaded_ranges_would_ignore_are_refused(
    extra: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    data, ranges = save_npz(tmp_path / "data.npz", digit_batches(1)), tmp_path / "ranges.json"
    assert main(["calibrate", str(DIGITS), "--data", str(data), "--ranges", str(ranges), "--quiet"]) == 0
    out = tmp_path / "out.onnx"
    capsys.readouterr()
    assert main(["calibrate", str(DIGITS), "--load-ranges", str(ranges), "-o", str(out), *extra]) == 2
    error = capsys.readouterr().err
    assert "the ranges are reused as saved" in error and named in error
    assert not out.exists()


def test_a_model_that_cannot_be_written_is_refused_before_any_data_is_read(tmp_path: Path) -> None:
    """An If node (GRAPH attributes are not lifted): with -o, refused before the data source is called
    (which would fail the test); ranges alone (no -o) need no lifting and are computed."""
    from qconvert.calibrate.api import calibrate
    from qconvert.errors import InputError

    branch = helper.make_graph(
        [helper.make_node("Identity", ["m"], ["r"])],
        "b",
        [],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["m"], name="relu"),
            helper.make_node("ReduceSum", ["m"], ["s"], name="sum", keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["c"], name="positive"),
            helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch, else_branch=branch),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])],
    )
    model = tmp_path / "if.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)

    def data() -> list:
        raise AssertionError("the data was read")

    with pytest.raises(InputError, match=r"if\.onnx: the model has 1 unsupported node\(s\): 'if' \(onnx\.If"):
        calibrate(model, data, out=tmp_path / "out.onnx")
    feeds = [{"x": np.ones((2, 4), np.float32)}]
    assert calibrate(model, feeds).ranges["m"].max == 1.0


def load_edited_ranges(tmp_path: Path, edit: Callable[[dict], None], capsys: pytest.CaptureFixture) -> str:
    """Calibrate digits, `edit` the saved ranges JSON, then --load-ranges it: exit 2 and no model, and the
    error message returned."""
    data, ranges = save_npz(tmp_path / "data.npz", digit_batches(1)), tmp_path / "ranges.json"
    assert main(["calibrate", str(DIGITS), "--data", str(data), "--ranges", str(ranges), "--quiet"]) == 0
    edited = json.loads(ranges.read_text())
    edit(edited)
    ranges.write_text(json.dumps(edited))
    out = tmp_path / "out.onnx"
    capsys.readouterr()
    assert main(["calibrate", str(DIGITS), "--load-ranges", str(ranges), "-o", str(out)]) == 2
    assert not out.exists()
    return capsys.readouterr().err


def test_a_misspelt_keep_float_entry_in_loaded_ranges_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    error = load_edited_ranges(
        tmp_path, lambda r: r["metadata"].update(keep_float={"imagee": "by hand"}), capsys
    )
    assert "keep_float entries name no tensor of the model: 'imagee' (did you mean 'image'?)" in error


def test_a_range_missing_from_loaded_ranges_is_named_as_the_model_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    error = load_edited_ranges(
        tmp_path, lambda r: r["tensors"].pop("/gap/GlobalAveragePool_output_0"), capsys
    )
    assert (
        "no calibrated range for 1 tensor(s) that must be quantized: '/gap/GlobalAveragePool_output_0'"
        in error
    )
