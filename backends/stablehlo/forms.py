"""The StableHLO backend's vocabulary, as its options and reports name it: the form it emits, the quantize
semantics, the engines that run it.

Its own module so that reading the backend's options (the CLI's help) does not import the lowering, and
the check runner names engines without importing the backend object.
"""

from __future__ import annotations

from enum import StrEnum


class Form(StrEnum):
    """Which StableHLO the backend emits (`--form`)."""

    QUANTIZED = "quantized"  # uniform_quantize/dequantize + fused quantized ops where exact
    INTEGER = "integer"  # no quant types: quantization written out in integer/float ops
    QDQ = "qdq"  # float ops between uniform_quantize and uniform_dequantize, as the model was


class Semantics(StrEnum):
    """Whose quantize rounding the emitted module computes (`--semantics`)."""

    ONNX = "onnx"  # clamp(rne(x / s) + zp): every quantize that could differ is written out exactly
    STABLEHLO = "stablehlo"  # uniform_quantize everywhere: rne(clamp(x / s + zp))


# Engine -> how reports name it.
ENGINE_NAMES = {"interpreter": "the StableHLO interpreter", "xla": "XLA:CPU"}
DEFAULT_ENGINE = "xla"
