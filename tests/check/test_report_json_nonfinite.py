"""`check --json` writes non-finite numbers as strings, so the report stays valid (strict) JSON: before, a
node whose max_abs_diff was infinite made json.dumps(allow_nan=False) raise."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from qconvert.check.report import FAIL, CheckReport, LayerResult, Tolerances, json_safe


def _strict_load(text: str) -> object:
    def refuse(constant: str) -> object:
        raise AssertionError(f"non-standard JSON constant {constant} written")

    return json.loads(text, parse_constant=refuse)


def test_check_report_writes_infinite_and_nan_values_as_strings(tmp_path: Path) -> None:
    layer = LayerResult(
        node="q0",
        op_type="QuantizeLinear",
        domain="",
        verdict=FAIL,
        elements=4,
        mismatches=2,
        max_lsb_diff=np.float64(np.inf),  # a bit-exact node's steps off when one side is infinite
    )
    report = CheckReport(
        model="m.onnx",
        backend="ascendc",
        tolerances=Tolerances(atol=float("inf"), rtol=float("nan"), min_sqnr=-math.inf),
        layers={"q0": layer},
        outputs={},
        inputs_source="-",
    )
    path = tmp_path / "report.json"
    report.write_json(path)
    written = _strict_load(path.read_text())
    assert isinstance(written, dict)
    entry = written["layers"]["q0"]
    assert entry["max_lsb_diff"] == "inf"
    assert written["tolerances"] == {
        "atol": "inf",
        "rtol": "nan",
        "max_lsb": None,
        "max_mismatch_fraction": None,
        "min_sqnr": "-inf",
    }
    assert entry["mismatches"] == 2 and entry["elements"] == 4


def test_json_safe_keeps_finite_numbers_and_structure() -> None:
    value = {"a": (1, np.int64(2), np.float64(0.1)), "b": [np.bool_(True), None, "x"], "c": -math.inf}
    assert json_safe(value) == {"a": [1, 2, 0.1], "b": [True, None, "x"], "c": "-inf"}
    assert json.dumps(json_safe(value), allow_nan=False)
