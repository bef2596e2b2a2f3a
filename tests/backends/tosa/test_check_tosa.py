"""`qconvert check MODEL --backend tosa [--engine reference|iree]` (backends/tosa/check.py): each
DequantizeLinear -> op -> QuantizeLinear group converted to TOSA, run on the engine and on the emulation, and
judged against onnxruntime (bit-exact with the emulation; one-step differences only at predicted near-ties);
the model end to end through the storage boundary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_module, require_tosa_python
from onnx import numpy_helper

from qconvert.check import check
from qconvert.check.backends import CaseRun, make_backend
from qconvert.check.nodes import judge, node_cases
from qconvert.check.oracle import element_types, run_oracle
from qconvert.check.report import FAIL, PASS, PASSED
from qconvert.errors import InputError

MODELS = Path(__file__).resolve().parents[3] / "models"
DIGITS = MODELS / "digits_cnn.qdq.onnx"
DIGITS_INPUTS = MODELS / "digits_cnn.inputs.npz"
# digits_cnn's groups: two Conv (+Relu), MaxPool, GlobalAveragePool, Flatten, Gemm.
DIGITS_GROUPS = {"Conv": 2, "MaxPool": 1, "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1}


def _check_digits(engine: str, **options: str) -> object:
    return check(DIGITS, str(DIGITS_INPUTS), backend="tosa", engine=engine, **options)


def _groups(report: object) -> dict[str, int]:
    found: dict[str, int] = {}
    for layer in report.layers.values():  # type: ignore[attr-defined]
        assert layer.group is not None, f"{layer.node}: only groups are cases on TOSA"
        found[layer.op_type] = found.get(layer.op_type, 0) + 1
    return found


@pytest.mark.engine
@pytest.mark.parametrize("engine", ["reference", "iree"])
def test_digits_cnn_passes_bit_exact_on_both_engines(engine: str) -> None:
    require_tosa_python()
    if engine == "iree":
        require_module("iree.runtime")
    report = _check_digits(engine)
    assert report.verdict == PASSED, report.verdict_line
    assert _groups(report) == DIGITS_GROUPS
    for layer in report.layers.values():
        assert layer.verdict == PASS and layer.elements > 0
        # Single round: the fixed-point rescale lands where onnxruntime's float32 requantization does.
        assert layer.mismatches == layer.predicted_mismatches == 0, layer.explanation
        assert "equals the emulation" in (layer.explanation or "")
    (output,) = report.outputs.values()
    assert output.verdict == PASS
    assert any("single nodes" in note for note in report.notes)


@pytest.mark.engine
def test_double_round_differences_are_one_step_and_predicted() -> None:
    require_tosa_python()
    report = _check_digits("reference", rounding="double")
    assert report.verdict == PASSED, report.verdict_line
    differing = [layer for layer in report.layers.values() if layer.mismatches]
    assert differing, "double round moves ties: some groups differ from onnxruntime"
    for layer in report.layers.values():
        assert layer.mismatches == layer.predicted_mismatches
        assert layer.max_lsb_diff is None or layer.max_lsb_diff <= 1.0
    total = sum(layer.elements for layer in report.layers.values())
    assert sum(layer.mismatches for layer in differing) <= 0.5 * total


@pytest.fixture(scope="module")
def digits_cases() -> tuple[object, list, dict[str, np.ndarray], dict[str, CaseRun]]:
    """The runner, digits_cnn's group cases, onnxruntime's values and the reference model's runs."""
    require_tosa_python()
    model = onnx.load(str(DIGITS))
    inputs = dict(np.load(DIGITS_INPUTS))
    types = element_types(model)
    values, unreturnable = run_oracle(model, inputs, types, str(DIGITS))
    values.update(inputs)
    values.update({t.name: numpy_helper.to_array(t) for t in model.graph.initializer})
    runner = make_backend("tosa", "reference")
    cases = node_cases(model, values, types, set(), unreturnable, runner.feeds_weights, runner.fused_groups())
    groups = [case for case in cases if case.group is not None and case.reason is None]
    runs = runner.run_cases(groups, lambda done: None)
    assert all(isinstance(run, CaseRun) for run in runs.values())
    return runner, groups, values, runs  # type: ignore[return-value]


@pytest.mark.engine
def test_a_difference_the_rounding_does_not_explain_fails(digits_cases: tuple) -> None:
    """onnxruntime's value moved by two steps, or by one step away from a near-tie: the group fails."""
    runner, groups, values, runs = digits_cases
    case = next(c for c in groups if c.op_type == "Conv")
    output = case.last.output[0]
    predicted = runner.predicted_mismatches(case, values)
    assert judge(case, runs[case.name].outputs, values, "tosa", predicted).verdict == PASS
    steps = (np.asarray(values[case.last.input[0]], np.float64) / float(values[case.last.input[1]])).reshape(
        -1
    )
    reference = np.asarray(values[output])
    inside = np.nonzero(
        (np.abs(steps - np.floor(steps) - 0.5) > 0.25)
        & (reference.reshape(-1) > -127)
        & (reference.reshape(-1) < 126)
    )[0][0]
    for shift in (2, 1):
        tampered = dict(values)
        moved = reference.copy().reshape(-1)
        moved[inside] += shift
        tampered[output] = moved.reshape(reference.shape)
        predicted = runner.predicted_mismatches(case, tampered)
        result = judge(case, runs[case.name].outputs, tampered, "tosa", predicted)
        assert result.verdict == FAIL and result.mismatches == 1 and predicted[0] == 0, (shift, predicted)


@pytest.mark.engine
def test_an_engine_that_differs_from_the_emulation_fails(digits_cases: tuple) -> None:
    runner, groups, values, runs = digits_cases
    case = groups[0]
    state = runner.states[case.name]
    assert state.engine_mismatches == 0  # the reference model computed what the emulation did
    state.engine_mismatches = 3
    try:
        predicted = runner.predicted_mismatches(case, values)
        assert (
            predicted is not None and predicted[0] == -1 and "differs from the TOSA emulation" in predicted[1]
        )
        assert judge(case, runs[case.name].outputs, values, "tosa", predicted).verdict == FAIL
    finally:
        state.engine_mismatches = 0


@pytest.mark.engine
def test_cli_check_backend_tosa_on_iree() -> None:
    require_tosa_python()
    require_module("iree.runtime")
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "qconvert",
            "check",
            str(DIGITS),
            "--backend",
            "tosa",
            "--engine",
            "iree",
            "--data",
            str(DIGITS_INPUTS),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    assert "PASSED: nodes: 6 passed, 0 failed, 0 not run" in completed.stdout


def test_an_unknown_engine_is_an_input_error() -> None:
    with pytest.raises(InputError, match="unknown --engine 'xla'; available: reference, iree"):
        make_backend("tosa", "xla")
