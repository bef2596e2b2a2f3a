"""int16 activations from `calibrate` on every backend that takes them: a model calibrated with some
activations int16 symmetric (zero point 0, `--overrides` with "symmetric": true) passes `check` on
StableHLO (i16 quant types) and TOSA (int16 profile: i16 x i8 products into i48), node by node and end to
end against onnxruntime; asymmetric int16 is refused by the TOSA backend naming each tensor and the fix."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from conftest import require_module

from qconvert.check import check
from qconvert.check.report import PASSED

MODELS = Path(__file__).resolve().parents[2] / "models"
# tiny_encoder: the first layer's residual sum (LayerNormalization input), its attention LayerNorm output
# (read by the FFN's first MatMul: i16 x i8) and the GELU output (read by the second MatMul)
ENCODER_INT16 = (
    "/layers.0/Add_output_0",
    "/layers.0/ln1/LayerNormalization_output_0",
    "/layers.0/gelu/Mul_1_output_0",
)
# digits: the input image, the first Relu (MaxPool and the second Conv read it: an int8 Conv output ->
# Relu -> int16, a requantize and a clamp on TOSA), the pooled features (the Gemm: i16 x i8 + int32 bias ->
# int8 logits)
DIGITS_INT16 = ("image", "/Relu_output_0", "/gap/GlobalAveragePool_output_0")


def _calibrated(model: str, tensors: tuple[str, ...], out: Path, symmetric: bool = True) -> Path:
    from qconvert.calibrate.api import calibrate

    overrides = {name: [{"quant_type": "QInt16", "symmetric": symmetric}] for name in tensors}
    calibrate(
        str(MODELS / f"{model}.onnx"),
        str(MODELS / f"{model}.inputs.npz"),
        out=str(out),
        scheme={"tensor_overrides": overrides},
    )
    written = onnx.load(out)
    int16 = {t.name.removesuffix("_zero_point") for t in written.graph.initializer if t.data_type == 5}
    assert set(tensors) <= int16  # TensorProto.INT16 zero points (and those sharing them: Flatten's)
    return out


@pytest.fixture(scope="module")
def encoder_int16(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_module("onnxruntime")
    return _calibrated("tiny_encoder", ENCODER_INT16, tmp_path_factory.mktemp("i16") / "encoder.onnx")


@pytest.mark.parametrize(("backend", "options"), [("stablehlo", {}), ("tosa", {"allow_float": True})])
def test_encoder_with_int16_activations_checks_on_each_backend(
    encoder_int16: Path, backend: str, options: dict[str, object]
) -> None:
    """tiny_encoder (LayerNorms float on TOSA: --allow-float) with three int16 activations: PASSED."""
    require_module("jax" if backend == "stablehlo" else "onnxruntime")
    report = check(encoder_int16, str(MODELS / "tiny_encoder.inputs.npz"), backend=backend, **options)
    assert report.verdict == PASSED, report.verdict_line


@pytest.mark.parametrize("backend", ["stablehlo", "tosa"])
def test_digits_with_int16_activations_checks_on_each_backend(tmp_path: Path, backend: str) -> None:
    """Integer-only on TOSA (no --allow-float): every node a TOSA integer op, bit-exact or predicted."""
    require_module("onnxruntime")
    require_module("jax" if backend == "stablehlo" else "onnxruntime")
    path = _calibrated("digits_cnn", DIGITS_INT16, tmp_path / "digits.onnx")
    report = check(path, str(MODELS / "digits_cnn.inputs.npz"), backend=backend)
    assert report.verdict == PASSED, report.verdict_line


def test_asymmetric_int16_into_tosa_names_each_tensor_and_the_fix(tmp_path: Path) -> None:
    require_module("onnxruntime")
    from qconvert.backends.tosa import TosaOptions, convert_to_tosa
    from qconvert.errors import InputError
    from qconvert.frontends.onnx import import_onnx

    path = _calibrated("tiny_encoder", ENCODER_INT16, tmp_path / "asymmetric.onnx", symmetric=False)
    with pytest.raises(InputError) as refused:
        convert_to_tosa(import_onnx(str(path)), TosaOptions(allow_float=True))
    message = str(refused.value)
    assert "16-bit activations with a non-zero zero point" in message
    assert all(f"'{name}' (zero point " in message for name in ENCODER_INT16)
    assert '"symmetric": true' in message and "zero point 0" in message
