"""One CLI vocabulary (issue 22): help on every verb, workflow order, did-you-mean, old spellings, lists."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import numpy as np
import onnx
import pytest

from qconvert.cli import main

MODELS = Path(__file__).resolve().parents[2] / "models"
DIGITS_QDQ = MODELS / "digits_cnn.qdq.onnx"
DIGITS_FLOAT = MODELS / "digits_cnn.onnx"
DIGITS_DATA = MODELS / "digits_cnn.inputs.npz"
WORKFLOW = ["inspect", "calibrate", "check", "convert", "import", "opt"]


def test_the_verbs_are_listed_in_workflow_order(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-h"]) == 0
    text = capsys.readouterr().out
    listed = {verb: text.index(f"│ {verb} ") for verb in WORKFLOW}
    assert sorted(listed, key=listed.__getitem__) == WORKFLOW
    assert "--version" in text


@pytest.mark.parametrize("verb", ["inspect", "calibrate", "check", "convert", "import"])
def test_every_verb_takes_h_shows_flags_as_flags_and_ends_with_examples(
    verb: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([verb, "-h"]) == 0
    text = capsys.readouterr().out
    assert "<bool>" not in text  # a boolean option is a flag: no value shown after it
    examples = text[text.index("Examples:") :]
    assert examples.count(f"$ qconvert {verb} ") >= 1


def test_opt_takes_h_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["opt", "-h"]) == 0
    assert capsys.readouterr().err.startswith("usage: qconvert opt")


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"qconvert {metadata.version('qconvert')}"


@pytest.mark.parametrize(
    ("arguments", "suggestion"),
    [
        (["calibrate", str(DIGITS_FLOAT), "--data", str(DIGITS_DATA), "--method", "entropi"], "'entropy'"),
        (["calibrate", str(DIGITS_FLOAT), "--data", str(DIGITS_DATA), "--executor", "rey"], "'ray'"),
        (
            ["calibrate", str(DIGITS_FLOAT), "--data", str(DIGITS_DATA), "--activation-type", "int88"],
            "'int8'",
        ),
        (["convert", str(DIGITS_QDQ), "--form", "int"], "'integer'"),
        (["convert", str(DIGITS_QDQ), "--to", "stablehl"], "'stablehlo'"),
        (["check", str(DIGITS_QDQ), "--backend", "stablehl"], "'stablehlo'"),
        (["opt", "-", "--lower-quant-op"], "'--lower-quant-ops'"),
        (["calibrat", str(DIGITS_FLOAT)], "'calibrate'"),
    ],
)
def test_a_misspelled_choice_says_which_it_is_near(
    arguments: list[str], suggestion: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    writes = arguments[0] in ("calibrate", "convert")
    assert main([*arguments, "-o", str(tmp_path / "out")] if writes else arguments) == 2
    error = capsys.readouterr().err
    assert f"did you mean {suggestion}?" in error.lower().replace("\n", " ").replace("│", "")
    assert "Traceback" not in error and not (tmp_path / "out").exists()


def test_old_spellings_stay_as_hidden_aliases(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """calibrate's --out and --engine still work, are not shown, and clash with their new spellings."""
    out = tmp_path / "q.onnx"
    common = ["calibrate", str(DIGITS_FLOAT), "--data", str(DIGITS_DATA), "--quiet", "--evaluate", "0"]
    assert main([*common, "--out", str(out), "--engine", "local"]) == 0 and out.exists()
    assert main([*common, "--out", str(out), "-o", str(tmp_path / "other.onnx")]) == 2
    assert "-o/--output and --out (its old spelling) are the same option" in capsys.readouterr().err
    assert main(["calibrate", "-h"]) == 0
    text = capsys.readouterr().out
    assert "--executor" in text and "--output" in text and "--out " not in text and "--engine" not in text


def test_list_flags_take_commas_as_repetition(capsys: pytest.CaptureFixture[str]) -> None:
    """`--input-shape a=..,b=..` is two shapes (and `x=1,128` stays one): the second name is reported."""
    shape = "image=8x1x8x8,nosuch=1,2"
    assert main(["import", str(DIGITS_QDQ), "--elide-weights", "--input-shape", shape, "-o", "-"]) == 2
    assert "nosuch" in capsys.readouterr().err
    assert (
        main(["import", str(DIGITS_QDQ), "--elide-weights", "--input-shape", "image=8,1,8,8", "-o", "-"]) == 0
    )


def test_inspect_names_each_input_output_opset_and_quantized_tensor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Checked against the ONNX model itself: declared types, opsets, every Q node's scale and zero point."""
    import json

    assert main(["inspect", str(DIGITS_QDQ), "--json", "-"]) == 0
    summary = json.loads(capsys.readouterr().out)
    model = onnx.load(str(DIGITS_QDQ))
    declared = model.graph.input[0].type.tensor_type
    assert summary["input_types"] == [
        {
            "name": model.graph.input[0].name,
            "dtype": "float32",
            "shape": [d.dim_value for d in declared.shape.dim],
        }
    ]
    assert summary["opsets"] == {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
    tensors = {entry["tensor"]: entry for entry in summary["quantized_tensors"]}
    initializers = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    quantizers = [node for node in model.graph.node if node.op_type == "QuantizeLinear"]
    assert quantizers
    for node in quantizers:
        entry = tensors[node.input[0]]
        assert np.float32(entry["scale"]) == initializers[node.input[1]]
        assert entry["zero_point"] == int(initializers[node.input[2]])
    per_axis = [entry for entry in tensors.values() if entry["scheme"] == "per-axis"]
    assert per_axis and all(len(entry["scales"]) == len(entry["zero_points"]) for entry in per_axis)
    assert main(["inspect", str(DIGITS_QDQ)]) == 0
    text = capsys.readouterr().out
    assert "image: float32 [8, 1, 8, 8]" in text and f"quantized tensors ({len(tensors)})" in text
    assert "more (--verbose lists all)" in text  # 13 tensors, 12 shown
    assert main(["inspect", str(DIGITS_QDQ), "--verbose"]) == 0
    assert "more (--verbose" not in capsys.readouterr().out
