"""Issue 26's calibration features as a new user meets them (helper G's review): a flag that would be
ignored is refused (--target-output or --eval-data without a target, --worst-tensors with a search), errors
name the flag and the user's file (--eval-data, not --data; the model, not --smooth-quant's temporary
copy), every output path is checked before any work (--report, the search's --ranges/--json, two outputs on
stdout), --load-ranges checks the widened outliers it reapplies, the help and examples state what the code
does, AscendC's refusal of int16 sites names --outlier-channels off, and the API takes one condition or
output as a plain string. Each refusal: one line on stderr, exit 2, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import typer
from onnx import TensorProto, helper, numpy_helper

import qconvert
from qconvert.calibrate.channel_spread import OUTLIER_SPREAD
from qconvert.cli import app, main

MODEL = Path(__file__).resolve().parents[2] / "models" / "digits_cnn.onnx"
DATA = MODEL.with_name("digits_cnn.inputs.npz")


def calibrate_command(tmp_path: Path, *flags: str) -> list[str]:
    return ["calibrate", str(MODEL), "--data", str(DATA), "--quiet", "-o", str(tmp_path / "q.onnx"), *flags]


def refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    """The one-line error of a refused command (exit 2, nothing written)."""
    capsys.readouterr()
    assert main(calibrate_command(tmp_path, "--json", str(tmp_path / "r.json"), *flags)) == 2
    assert not (tmp_path / "q.onnx").exists() and not (tmp_path / "r.json").exists()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qconvert: error: "), lines
    return lines[0]


def test_worst_tensors_with_a_search_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = refused(tmp_path, capsys, "--target-cosine", "0.9", "--worst-tensors", "3")  # was dropped silently
    assert "--worst-tensors is not combined with --target-cosine/--target-metric" in line


def test_search_flags_without_a_target_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, --target-output alone calibrated as if it were not given; --eval-data's refusal named only
    # --target-cosine although --target-metric reads it too.
    for flags in (("--target-output", "logits"), ("--eval-data", str(DATA))):
        line = refused(tmp_path, capsys, *flags)
        assert flags[0] in line and "--target-cosine or --target-metric" in line, line


def test_eval_data_errors_name_eval_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "held.npz"
    line = refused(tmp_path, capsys, "--target-cosine", "0.99", "--eval-data", str(missing))
    assert line == f"qconvert: error: --eval-data {missing}: no such file or folder"  # was "--data ..."
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, pixels=np.zeros((8, 1, 8, 8), np.float32))
    line = refused(tmp_path, capsys, "--target-metric", "top1:logits>=0.9", "--eval-data", str(wrong))
    assert line.startswith(f"qconvert: error: --eval-data {wrong}: missing input(s) ['image']"), line


def test_help_states_the_outlier_threshold_the_code_uses() -> None:
    command = typer.main.get_command(app).commands["calibrate"]  # type: ignore[attr-defined]
    helps = {option: parameter.help for parameter in command.params for option in parameter.opts}
    assert f">= {OUTLIER_SPREAD:g}x their median one" in helps["--outlier-channels"]  # said 32x after 16
    assert "--target-metric" in helps["--eval-data"] and "--target-metric" in helps["--target-output"]
    assert "else float" not in helps["--target-cosine"]  # the search widens to int16; no float fallback


def test_ascendc_refusal_of_16_bit_activations_names_the_calibrate_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, the refusal listed each int16 Q/DQ site and left the user to find --outlier-channels off.
    model = tmp_path / "wide.qdq.onnx"
    command = ["calibrate", str(MODEL), "--data", str(DATA), "--quiet", "--evaluate", "0"]
    assert main([*command, "--activation-type", "int16", "-o", str(model)]) == 0
    capsys.readouterr()
    out = tmp_path / "wide.asc"
    assert main(["convert", str(model), "--to", "ascendc", "-o", str(out)]) == 2 and not out.exists()
    error = capsys.readouterr().err
    assert error.startswith("qconvert: error: --to ascendc") and "int16 destination" in error
    last = error.rstrip().splitlines()[-1]
    assert last.startswith("  - 16-bit activations have no AscendC form: calibrate"), last
    assert "--outlier-channels off" in error
    narrow = tmp_path / "narrow.qdq.onnx"
    assert main([*command, "-o", str(narrow)]) == 0
    capsys.readouterr()
    assert main(["convert", str(narrow), "--to", "ascendc", "-o", str(out)]) == 0 and out.exists()


def test_api_takes_one_condition_or_output_as_a_string(tmp_path: Path) -> None:
    # Before, a plain string was iterated: `target_metrics="cosine>=0.9"` failed on the condition 'c', and
    # `target_cosine="0.9"` (as a config file gives it) raised TypeError from inside the search.
    result = qconvert.calibrate(
        MODEL, DATA, eval_data=str(DATA), target_cosine="0.9", target_outputs="logits", evaluate_samples=0
    )
    assert result.search is not None and result.search.outputs == ["logits"]
    assert [c.metric for c in result.search.conditions] == ["cosine"]
    result = qconvert.calibrate(MODEL, DATA, eval_data=str(DATA), target_metrics="top1:logits>=0.5")
    assert result.search is not None and [(c.metric, c.output) for c in result.search.conditions] == [
        ("top1", "logits")
    ]
    with pytest.raises(qconvert.InputError, match=r"^error: `target_cosine` 'high': expected a number$"):
        qconvert.calibrate(MODEL, DATA, target_cosine="high")


def test_search_summary_says_its_comparison_is_on_held_out_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, the table said "first 8 samples" as for the plain path's calibration samples; a search
    # compares the written model on its held-out samples.
    capsys.readouterr()
    command = [
        "calibrate",
        str(MODEL),
        "--data",
        str(DATA),
        "--eval-data",
        str(DATA),
        "-o",
        str(tmp_path / "s.onnx"),
    ]
    assert main([*command, "--target-cosine", "0.9"]) == 0
    shown = capsys.readouterr().out
    assert (
        "QDQ model against float in onnxruntime (ORT_ENABLE_ALL), 8 samples held out (--eval-data)" in shown
    )
    assert "first 8 samples" not in shown


def test_per_channel_default_says_nothing_of_vector_weights(tmp_path: Path) -> None:
    # Before, the per-channel default noted "per-channel axis 1 is out of range for rank 1" for every
    # LayerNorm scale of a transformer (13 on MiniLM), a flag the user never gave; they take one scale.
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["normed"], axis=-1, name="norm"),
        helper.make_node("MatMul", ["normed", "w"], ["y"], name="project"),
    ]
    weights = {
        "gamma": rng.uniform(0.5, 1.5, 8),
        "beta": rng.uniform(-0.1, 0.1, 8),
        "w": rng.normal(size=(8, 4)),
    }
    graph = helper.make_graph(
        nodes,
        "norm_project",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )
    model = tmp_path / "norm_project.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    data = [{"x": rng.normal(size=(2, 8)).astype(np.float32)} for _ in range(4)]
    out = tmp_path / "norm_project.qdq.onnx"
    result = qconvert.calibrate(model, data, out=out)
    assert not [note for note in result.notes if "out of range for rank" in note], result.notes
    scales = {t.name: numpy_helper.to_array(t) for t in onnx.load(out).graph.initializer if "scale" in t.name}
    assert scales["gamma_scale"].shape == () and scales["w_scale"].shape == (4,)  # per tensor, per channel


def test_load_ranges_checks_the_widened_outliers_it_reapplies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before, a ranges file whose widened_outliers named no tensor of the model (or was not a mapping) was
    # taken silently, widening nothing, while its keep_float entries were checked.
    saved = tmp_path / "ranges.json"
    assert main(["calibrate", str(MODEL), "--data", str(DATA), "--quiet", "--ranges", str(saved)]) == 0
    stored = json.loads(saved.read_text())
    assert stored["metadata"]["widened_outliers"] == {}  # digits: nothing widened
    for value, expected in (
        (
            {"/conv1/Conv_outptu_0": "outlier channels: spread 20x"},
            "its widened_outliers entries name no tensor",
        ),
        (["/conv1/Conv_output_0"], "its widened_outliers is not an object"),
    ):
        stored["metadata"]["widened_outliers"] = value
        edited = tmp_path / "edited.json"
        edited.write_text(json.dumps(stored))
        capsys.readouterr()
        assert (
            main(["calibrate", str(MODEL), "--load-ranges", str(edited), "-o", str(tmp_path / "l.onnx")]) == 2
        )
        assert expected in capsys.readouterr().err and not (tmp_path / "l.onnx").exists()
    stored["metadata"]["widened_outliers"] = {
        "/conv1/Conv_output_0": "outlier channels: spread 20x (channel 3)"
    }
    edited.write_text(json.dumps(stored))
    result = qconvert.calibrate(MODEL, None, load_ranges=str(edited), out=tmp_path / "w.onnx")
    assert result.widened_outliers == {"/conv1/Conv_output_0": "outlier channels: spread 20x (channel 3)"}


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--report", "{tmp}/missing/r.html"), "--report {tmp}/missing/r.html: folder"),
        (("--report", "{tmp}/q.onnx"), "--report {tmp}/q.onnx: --out {tmp}/q.onnx names the same file"),
        (
            ("--target-cosine", "0.9", "--ranges", "{tmp}/missing/r.json"),
            "--ranges {tmp}/missing/r.json: folder",
        ),
        (("--target-cosine", "0.9", "--json", "{tmp}/missing/r.json"), "--json {tmp}/missing/r.json: folder"),
        (
            ("--target-cosine", "0.9", "--report", "{tmp}/missing/r.html"),
            "--report {tmp}/missing/r.html: folder",
        ),
    ],
)
def test_outputs_are_checked_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], said: str
) -> None:
    # Before, --report was checked only when written, after the model (a bad folder: the model written and
    # exit 2; the model's own path: the model overwritten by the page, exit 0), and the search wrote its
    # model before failing on --ranges/--json (an internal error).
    tmp = str(tmp_path)
    command = ["calibrate", str(MODEL), "--data", str(DATA), "--quiet", "-o", f"{tmp}/q.onnx"]
    capsys.readouterr()
    assert main([*command, *(flag.format(tmp=tmp) for flag in flags)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"qconvert: error: {said.format(tmp=tmp)}") and "\n" not in error, error
    assert not list(tmp_path.iterdir())  # nothing written


def test_search_refuses_two_outputs_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    command = [
        "calibrate",
        str(MODEL),
        "--data",
        str(DATA),
        "--target-cosine",
        "0.9",
        "-o",
        "-",
        "--json",
        "-",
    ]
    capsys.readouterr()
    assert main(command) == 2  # before: both written to stdout, one after the other, exit 0
    captured = capsys.readouterr()
    assert captured.out == "" and "--json -: --out - writes to stdout already" in captured.err


def test_calibrate_examples_use_listed_flags_and_no_default_as_a_flag() -> None:
    # The second example gave --per-channel, the default since issue 26; it now shows the accuracy search.
    from qconvert.cli_help import EXAMPLES

    command = typer.main.get_command(app).commands["calibrate"]  # type: ignore[attr-defined]
    listed = {option for parameter in command.params if not parameter.hidden for option in parameter.opts}
    flags = [word for example in EXAMPLES["calibrate"] for word in example.split() if word.startswith("-")]
    assert set(flags) <= listed and "--per-channel" not in flags and "--target-cosine" in flags


def test_smooth_quant_errors_name_the_users_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before, an already quantized model given with --smooth-quant was smoothed first, then refused under
    # the temporary file's name (/tmp/qconvert-smoothed-.../smoothed.onnx), and so were other model errors.
    quantized = tmp_path / "digits.qdq.onnx"
    command = ["calibrate", str(MODEL), "--data", str(DATA), "--quiet", "--evaluate", "0"]
    assert main([*command, "-o", str(quantized)]) == 0
    capsys.readouterr()
    again = [
        "calibrate",
        str(quantized),
        "--data",
        str(DATA),
        "--smooth-quant",
        "0.5",
        "-o",
        str(tmp_path / "x"),
    ]
    assert main(again) == 2
    assert capsys.readouterr().err.startswith(f"qconvert: error: {quantized}: already quantized (")
    assert main([*command, "--smooth-quant", "0.5", "--nodes", "nosuch", "-o", str(tmp_path / "y.onnx")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"qconvert: error: {MODEL} (smoothed): ") and "smoothed.onnx" not in error
    assert sorted(path.name for path in tmp_path.iterdir()) == ["digits.qdq.onnx"]


def test_api_errors_about_in_memory_eval_data_name_eval_data() -> None:
    # Before: "data item 0: missing input(s) ['image']", as if the calibration data were wrong.
    held = [{"pixels": np.zeros((8, 1, 8, 8), np.float32)}]
    with pytest.raises(
        qconvert.InputError, match=r"^error: `eval_data` item 0: missing input\(s\) \['image'\]"
    ):
        qconvert.calibrate(MODEL, DATA, target_cosine=0.9, eval_data=held)


def test_load_ranges_missing_tensors_names_the_file_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: "no calibrated range for 2 tensor(s) that must be quantized: ..." without the file or a hint.
    saved = tmp_path / "conv_only.json"
    command = ["calibrate", str(MODEL), "--data", str(DATA), "--quiet", "--op-types", "Conv", "--ranges"]
    assert main([*command, str(saved)]) == 0
    capsys.readouterr()
    assert main(["calibrate", str(MODEL), "--load-ranges", str(saved), "-o", str(tmp_path / "q.onnx")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"qconvert: error: --load-ranges {saved}: no calibrated range for ")
    assert error.endswith(
        "(saved with other --op-types/--nodes, or without --smooth-quant or with other alphas?)"
    )
    assert not (tmp_path / "q.onnx").exists()


def test_smooth_quant_json_to_stdout_carries_the_smoothing_notes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, --smooth-quant --json - wrote the JSON to stdout without the SmoothQuant notes, then wrote it
    # again, with them, to a file named '-' in the working folder.
    rng = np.random.default_rng(1)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="project")],
        "project",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])],
        [numpy_helper.from_array(rng.normal(size=(8, 3)).astype(np.float32), "w")],
    )
    model = tmp_path / "project.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    data = tmp_path / "x.npz"
    np.savez(data, x=(rng.normal(size=(16, 8)) * np.linspace(0.1, 30, 8)).astype(np.float32))
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    command = ["calibrate", str(model), "--data", str(data), "--smooth-quant", "0.5", "-o", "q.onnx"]
    assert main([*command, "--json", "-"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert any(note.startswith("SmoothQuant: ") for note in shown["notes"]), shown["notes"]
    assert not (tmp_path / "-").exists()
