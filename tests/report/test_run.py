"""`qconvert run`: what qconvert emitted, run on the user's data, gives onnxruntime's outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from conftest import require_module, require_tosa_python
from report.report_support import DIGITS_INPUTS, DIGITS_QDQ

from qconvert.cli import main


@pytest.fixture(scope="module")
def source_logits() -> np.ndarray:
    session = ort.InferenceSession(str(DIGITS_QDQ), providers=["CPUExecutionProvider"])
    return session.run(None, dict(np.load(DIGITS_INPUTS)))[0]


def _run(tmp_path: Path, artifact: Path, *extra: str) -> dict[str, np.ndarray]:
    out = tmp_path / f"{artifact.stem}.outputs.npz"
    assert main(["run", str(artifact), "--data", str(DIGITS_INPUTS), "-o", str(out), *extra]) == 0
    return dict(np.load(out))


@pytest.mark.parametrize(
    ("to", "suffix", "engine"),
    [("stablehlo", ".mlir", "xla"), ("tosa", ".mlir", "reference"), ("onnx-storage", ".onnx", None)],
)
def test_run_gives_onnxruntimes_outputs(
    tmp_path: Path, source_logits: np.ndarray, to: str, suffix: str, engine: str | None
) -> None:
    if to == "stablehlo":
        require_module("jax")
    if to == "tosa":
        require_tosa_python()
    artifact = tmp_path / f"digits.{to}{suffix}"
    assert main(["convert", str(DIGITS_QDQ), "--to", to, "-o", str(artifact)]) == 0
    outputs = _run(tmp_path, artifact, *(["--engine", engine] if engine else []))
    assert outputs["logits"].dtype == source_logits.dtype
    np.testing.assert_array_equal(outputs["logits"], source_logits)
    if to != "stablehlo":  # storage at the boundary: the raw storage beside the dequantized floats
        assert outputs["logits.storage"].dtype == np.int8


def test_run_refuses_an_engine_of_another_backend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(DIGITS_QDQ), "--engine", "xla"]) == 2
    assert "runs on onnxruntime" in capsys.readouterr().err


def test_run_json_summary(
    tmp_path: Path, source_logits: np.ndarray, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(DIGITS_QDQ), "--data", str(DIGITS_INPUTS), "--json", "-"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["outputs"]["logits"]["shape"] == list(source_logits.shape)
    assert summary["outputs"]["logits"]["max"] == pytest.approx(float(source_logits.max()))
    assert summary["samples"] == source_logits.shape[0]
