"""The TOSA engines' runner (qconvert.backends.tosa.run): finding tosa-tools' venv, per-graph statuses,
tosa-opt's validation. The engine cases run the real reference model and tosa-opt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import require_tosa_python

from qconvert.backends.tosa import (
    TOSA_PYTHON_ENV,
    EngineError,
    ReferenceJob,
    missing_message,
    run_reference,
    run_reference_jobs,
    tosa_python,
    validate,
)
from qconvert.errors import InputError
from qconvert.numerics.tosa import TosaRounding, rescale


def rescale_text(shift: int, rounding: str = "SINGLE_ROUND") -> str:
    """i8 -> i8 RESCALE by 2**30 * 2**-shift, input zero point -3, output zero point 5."""
    return f"""func.func @main(%x: tensor<8xi8>) -> tensor<8xi8> {{
  %m = "tosa.const"() <{{values = dense<1073741824> : tensor<1xi32>}}> : () -> tensor<1xi32>
  %s = "tosa.const"() <{{values = dense<{shift}> : tensor<1xi8>}}> : () -> tensor<1xi8>
  %iz = "tosa.const"() <{{values = dense<-3> : tensor<1xi8>}}> : () -> tensor<1xi8>
  %oz = "tosa.const"() <{{values = dense<5> : tensor<1xi8>}}> : () -> tensor<1xi8>
  %y = "tosa.rescale"(%x, %m, %s, %iz, %oz) <{{scale32 = true, \
rounding_mode = #tosa.rounding_mode<{rounding}>, per_channel = false, input_unsigned = false, \
output_unsigned = false}}> : (tensor<8xi8>, tensor<1xi32>, tensor<1xi8>, tensor<1xi8>, tensor<1xi8>) \
-> tensor<8xi8>
  return %y : tensor<8xi8>
}}"""


X = np.array([-128, -4, -3, -2, 0, 1, 2, 127], np.int8)


def test_a_missing_environment_is_an_input_error_that_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "no-venv" / "bin" / "python"
    monkeypatch.setenv(TOSA_PYTHON_ENV, str(missing))
    assert tosa_python() is None
    assert str(missing) in missing_message()
    assert "pip install tosa-tools==2026.8.0" in missing_message()
    with pytest.raises(InputError, match="pip install tosa-tools"):
        run_reference(rescale_text(31), [X])


@pytest.mark.engine
def test_each_graph_gets_its_own_status() -> None:
    require_tosa_python()
    valid, unpredictable, unparsable, wrong_input = run_reference_jobs(
        [
            ReferenceJob(inputs=(X,), mlir=rescale_text(31, "DOUBLE_ROUND")),
            ReferenceJob(inputs=(X,), mlir=rescale_text(70)),  # REQUIRE: shift within [2, 62]
            ReferenceJob(inputs=(X,), mlir="func.func @main("),
            ReferenceJob(inputs=(X.astype(np.int32),), mlir=rescale_text(31)),  # the graph takes i8
        ]
    )
    assert valid.status == "TOSA_VALID"
    expected = rescale(
        X, 1 << 30, 31, output_type="i8", input_zp=-3, output_zp=5, rounding=TosaRounding.DOUBLE
    )
    assert np.array_equal(valid.outputs[0], expected)
    assert valid.outputs[0].tolist() == [-57, 5, 5, 6, 7, 7, 8, 70]
    assert unpredictable.status == "TOSA_UNPREDICTABLE" and unpredictable.outputs == ()
    assert "shift" in unpredictable.messages and "70" in unpredictable.messages
    assert unparsable.status == "SERIALIZE_FAILED" and "error" in unparsable.messages
    assert wrong_input.status == "RUN_FAILED"


@pytest.mark.engine
def test_run_reference_raises_unless_the_graph_is_valid() -> None:
    require_tosa_python()
    (y,) = run_reference(rescale_text(30), [X])
    assert y.tolist() == np.clip(X.astype(np.int64) + 3 + 5, -128, 127).tolist()  # scale 1
    with pytest.raises(EngineError, match="TOSA_UNPREDICTABLE"):
        run_reference(rescale_text(70), [X])


@pytest.mark.engine
def test_validate_names_the_missing_extension() -> None:
    require_tosa_python()
    assert tosa_python() is not None
    assert validate(rescale_text(31)) == ""
    assert validate(rescale_text(31, "DOUBLE_ROUND"), extensions=("doubleround",)) == ""
    refused = validate(rescale_text(31, "DOUBLE_ROUND"))
    assert "doubleround" in refused


@pytest.mark.engine
def test_i48_tensors_go_through_the_command_line_runner() -> None:
    """The model's Python binding refuses i48 inputs and returns i48 outputs as empty float64 arrays; the
    worker runs such graphs on the model's command-line runner, so both come back as int64 values."""
    require_tosa_python()
    rng = np.random.default_rng(48)
    wide = rng.integers(-(2**40), 2**40, 64, dtype=np.int64)
    wide[:2] = [-(2**47), 2**47 - 1]
    rescale_i48 = """func.func @main(%x: tensor<64xi48>) -> tensor<64xi32> {
  %m = "tosa.const"() <{values = dense<12345> : tensor<1xi16>}> : () -> tensor<1xi16>
  %s = "tosa.const"() <{values = dense<45> : tensor<1xi8>}> : () -> tensor<1xi8>
  %iz = "tosa.const"() <{values = dense<0> : tensor<1xi48>}> : () -> tensor<1xi48>
  %oz = "tosa.const"() <{values = dense<0> : tensor<1xi32>}> : () -> tensor<1xi32>
  %y = "tosa.rescale"(%x, %m, %s, %iz, %oz) <{scale32 = false, \
rounding_mode = #tosa.rounding_mode<SINGLE_ROUND>, per_channel = false, input_unsigned = false, \
output_unsigned = false}> : (tensor<64xi48>, tensor<1xi16>, tensor<1xi8>, tensor<1xi48>, tensor<1xi32>) \
-> tensor<64xi32>
  return %y : tensor<64xi32>
}"""
    a = rng.integers(-(2**15), 2**15, (1, 3, 40), dtype=np.int64).astype(np.int16)
    b = rng.integers(-(2**15), 2**15, (1, 40, 5), dtype=np.int64).astype(np.int16)
    a[0, 0, :], b[0, :, 0] = -(2**15), -(2**15)  # the largest products: 40 * 2**30 needs 36 bits
    matmul_i48 = """func.func @main(%a: tensor<1x3x40xi16>, %b: tensor<1x40x5xi16>) -> tensor<1x3x5xi48> {
  %az = "tosa.const"() <{values = dense<0> : tensor<1xi16>}> : () -> tensor<1xi16>
  %bz = "tosa.const"() <{values = dense<0> : tensor<1xi16>}> : () -> tensor<1xi16>
  %y = "tosa.matmul"(%a, %b, %az, %bz) : (tensor<1x3x40xi16>, tensor<1x40x5xi16>, tensor<1xi16>, \
tensor<1xi16>) -> tensor<1x3x5xi48>
  return %y : tensor<1x3x5xi48>
}"""
    rescaled, product = run_reference_jobs(
        [ReferenceJob(inputs=(wide,), mlir=rescale_i48), ReferenceJob(inputs=(a, b), mlir=matmul_i48)]
    )
    assert rescaled.status == "TOSA_VALID", rescaled.messages
    expected = rescale(wide, 12345, 45, input_type="i48", output_type="i32", scale32=False)
    assert np.array_equal(rescaled.outputs[0], expected)
    assert product.status == "TOSA_VALID", product.messages
    assert product.outputs[0].dtype == np.int64
    assert np.array_equal(product.outputs[0], np.matmul(a.astype(np.int64), b.astype(np.int64)))
    assert int(product.outputs[0][0, 0, 0]) == 40 * 2**30
