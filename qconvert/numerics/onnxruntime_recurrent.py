"""onnxruntime's recurrent kernels (LSTM, GRU, com.microsoft DynamicQuantizeLSTM) as its x86-64 CPU EP
computes them: MLAS's logistic and tanh, and the dynamically quantized GEMM of the quantized LSTM.

NOTE: numpy in, numpy out, float32 throughout. Pinned against onnxruntime 1.32 on an AVX2 + FMA
(+ AVX-512 VNNI) x86-64 CPU: `logistic_mlas` and `tanh_mlas` equal its Sigmoid / Tanh ops bit for bit
(MLAS dispatches `MlasComputeLogisticF32KernelFma3` / `MlasComputeTanhF32KernelFma3` there), and
`dynamic_quantized_gemm_mlas` is `rnn::detail::ComputeGemm` for `GemmWeights<uint8_t>`
(rnn_helpers.cc). CPUs without VNNI run the u8 x s8 product through `vpmaddubsw`, whose int16 pair
sums saturate: there onnxruntime's result is not the exact int32 sum this file computes.
"""

from __future__ import annotations

import numpy as np

from .integer_accumulation import exact_integer_matmul, wrap_int32
from .onnxruntime_kernels import (
    dynamic_quantize_parameters_onnxruntime,
    float32_fma,
    quantize_linear_mlas,
)

# MlasLogisticConstants (logistic.cpp): clamp range, then an odd rational polynomial (Eigen's).
_LOGISTIC_RANGE = np.float32(18.0)
_LOGISTIC_P = tuple(
    np.float32(c)
    for c in (4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03,
              2.48287947061529e-01)
)  # fmt: skip
_LOGISTIC_Q = tuple(
    np.float32(c)
    for c in (6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06, 1.70198817374094e-03,
              1.16817656904453e-01, 9.93151921023180e-01)
)  # fmt: skip
# MlasTanhConstants as TanhKernelFma3.S reads them (clamp ±9, then p / q).
_TANH_RANGE = np.float32(9.0)
_TANH_P = tuple(
    np.float32(c)
    for c in (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
              1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)
)  # fmt: skip
_TANH_Q = tuple(np.float32(c) for c in (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
                                        4.89352518554385e-03))  # fmt: skip


# The same constants as plain numbers, for emitters of the polynomials (the StableHLO lowering):
# (clamp limit, numerator coefficients, denominator coefficients), highest degree first.
LOGISTIC_MLAS = (
    float(_LOGISTIC_RANGE),
    tuple(float(c) for c in _LOGISTIC_P),
    tuple(float(c) for c in _LOGISTIC_Q),
)
TANH_MLAS = (float(_TANH_RANGE), tuple(float(c) for c in _TANH_P), tuple(float(c) for c in _TANH_Q))


def _horner_fma(x2: np.ndarray, coefficients: tuple[np.float32, ...]) -> np.ndarray:
    """`((c0 * x2 + c1) * x2 + c2) ...` with one `vfmadd` (one rounding) per step, as the kernels do."""
    value = float32_fma(x2, coefficients[0], coefficients[1])
    for coefficient in coefficients[2:]:
        value = float32_fma(x2, value, coefficient)
    return value


def logistic_mlas(x: np.ndarray) -> np.ndarray:
    """MLAS `MlasComputeLogisticF32KernelFma3`: `max(0, x * p(x²) / q(x²) + 0.5)` on x clamped to ±18.

    Each polynomial step is an FMA; `x²`, `x * p`, the division and the `+ 0.5` round separately.
    NaN propagates (vmaxps / vminps keep the second operand, the input).
    """
    value = np.asarray(x, np.float32)
    clamped = np.where(np.isnan(value), value, np.clip(value, -_LOGISTIC_RANGE, _LOGISTIC_RANGE))
    clamped = clamped.astype(np.float32)
    square = (clamped * clamped).astype(np.float32)
    numerator = (clamped * _horner_fma(square, _LOGISTIC_P)).astype(np.float32)
    ratio = (numerator / _horner_fma(square, _LOGISTIC_Q)).astype(np.float32)
    result = (ratio + np.float32(0.5)).astype(np.float32)
    return np.where(np.isnan(result), result, np.maximum(result, np.float32(0))).astype(np.float32)


def tanh_mlas(x: np.ndarray) -> np.ndarray:
    """MLAS `MlasComputeTanhF32KernelFma3`: `x * p(x²) / q(x²)` on x clamped to ±9, FMA Horner steps."""
    value = np.asarray(x, np.float32)
    clamped = np.where(np.isnan(value), value, np.clip(value, -_TANH_RANGE, _TANH_RANGE))
    clamped = clamped.astype(np.float32)
    square = (clamped * clamped).astype(np.float32)
    numerator = (clamped * _horner_fma(square, _TANH_P)).astype(np.float32)
    return (numerator / _horner_fma(square, _TANH_Q)).astype(np.float32)


def dynamic_quantized_gemm_mlas(
    a: np.ndarray,
    weights: np.ndarray,
    weight_zero_point: int,
    weight_scale: np.ndarray,
    accumulate: np.ndarray | None = None,
) -> np.ndarray:
    """onnxruntime's quantized RNN GEMM (`rnn::detail::ComputeGemm`, uint8 weights path): `a @ weights`.

    `a` (M, K) float32 is quantized as one tensor (`GetQuantizationParameter`: uint8, range widened to
    hold 0; `MlasQuantizeLinear`: `clamp(rne(a / s) + zp)`), multiplied exactly with `weights` (K, N)
    int8 / uint8 minus `weight_zero_point` in int32, and scaled by `f32(s_a * weight_scale)` (one
    entry, or one per column). `accumulate` None: `f32(acc) * m` (MLAS ZeroMode); else
    `f32(acc) * m + accumulate`, a multiply then an add (AccumulateMode of
    `MLAS_QGEMM_SCALE_BIAS_OUTPUT_PROCESSOR`, two roundings, no FMA).
    """
    values = np.asarray(a, np.float32)
    a_scale, a_zero_point = dynamic_quantize_parameters_onnxruntime(values)
    quantized = quantize_linear_mlas(values, float(a_scale), a_zero_point, np.dtype(np.uint8))
    centered_a = quantized.astype(np.int64) - a_zero_point
    centered_w = np.asarray(weights).astype(np.int64) - int(weight_zero_point)
    accumulator = wrap_int32(exact_integer_matmul(centered_a, centered_w))  # vpdpbusd's exact int32 sums
    multiplier = (np.float32(a_scale) * np.asarray(weight_scale, np.float32).reshape(-1)).astype(np.float32)
    product = (accumulator.astype(np.float32) * multiplier).astype(np.float32)
    if accumulate is None:
        return product
    return (product + np.asarray(accumulate, np.float32)).astype(np.float32)


__all__ = ["LOGISTIC_MLAS", "TANH_MLAS", "dynamic_quantized_gemm_mlas", "logistic_mlas", "tanh_mlas"]
