"""onnxruntime's float32 elementwise kernels that numpy does not reproduce bit for bit: MLAS's erf.

NOTE: numpy in, numpy out, float32 throughout; every `vfmadd` step is one fused multiply-add with one
rounding (`_fma`: float64 where that is exact, `float32_fma` on the rare midpoints).
Pinned against onnxruntime 1.32 on an AVX2 + FMA x86-64 CPU, where MLAS dispatches its FMA3 erf kernel
(ErfKernelFma3): its Erf op equals `erf_mlas` bit for bit (tests/interpret/test_onnx_kernels.py).
Why bit for bit and not merely close: in a dynamically quantized model an ulp of difference before a
DynamicQuantizeLinear flips a rounding, and the flips cascade.
"""

from __future__ import annotations

import numpy as np

from .onnxruntime_kernels import float32_fma

F32 = np.float32
# MlasErfConstants (erf.cpp): below |x| = 0.921875 an odd polynomial in x², above `1 - exp(-(x + x p(x)))`
# with MLAS's own exp (a 2^r split and a degree-6 polynomial). The kernel onnxruntime runs on Linux does
# not clamp |x| to ErfUpperAbsRange (3.725): measured, erf(3.9) is 1.0 there, 0.9999999 with the clamp.
_SPLIT = F32(0.921875)
_SMALL = tuple(
    F32(c)
    for c in (-5.99104969e-4, 4.99339588e-3, -2.67667342e-2, 1.12818025e-1, -3.76124859e-1, 1.28379151e-1)
)
_BIG = tuple(
    F32(c)
    for c in (
        1.72948930e-5,
        -3.83208680e-4,
        3.88393435e-3,
        -2.42545605e-2,
        1.06777847e-1,
        6.34846687e-1,
        1.28717512e-1,
    )
)
_EXP_LOWER = F32(-88.3762626647949)
_EXP_LOG2_RECIPROCAL = F32(1.44269504088896341)
_EXP_LOG2_HI = F32(-6.93145752e-1)
_EXP_LOG2_LO = F32(-1.42860677e-6)
_EXP = tuple(
    F32(c) for c in (1.38319808e-3, 8.37550033e-3, 4.16689515e-2, 1.66664466e-1, 4.99999851e-1, 1.0, 1.0)
)
_EXP_ROUNDER = F32(1.25829120e7)  # 1.5 * 2**23: adding and subtracting it rounds to an integer


_MIDPOINT_BITS = (1 << 29) - 1  # float64 mantissa bits below float32's: a float32 midpoint has 1 << 28
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def _fma(a: np.ndarray | np.floating, b: np.ndarray | np.floating, c: np.ndarray | np.floating) -> np.ndarray:
    """float32 `fma(a, b, c)`, one rounding. `a * b` is exact in float64 and `+ c` rounds once there; the
    float32 rounding of that float64 sum is the correct one unless the sum sits exactly on a float32
    midpoint (rounding cannot cross one) or is float32-subnormal: those few take `float32_fma`."""
    total = np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float32).astype(
        np.float64
    )
    total = np.asarray(total)
    subnormal = (np.abs(total) < _FLOAT32_TINY) & (total != 0)
    suspicious = ((total.view(np.int64) & _MIDPOINT_BITS) == 1 << 28) | subnormal
    result = total.astype(F32)
    if suspicious.any():
        a_, b_, c_ = (np.broadcast_to(np.asarray(v, F32), total.shape) for v in (a, b, c))
        result[suspicious] = float32_fma(a_[suspicious], b_[suspicious], c_[suspicious])
    return result


def _horner(values: np.ndarray, coefficients: tuple[np.float32, ...]) -> np.ndarray:
    result = np.full(values.shape, coefficients[0], F32)
    for coefficient in coefficients[1:]:
        result = _fma(result, values, coefficient)
    return result


def erf_mlas(x: np.ndarray) -> np.ndarray:
    """MLAS `MlasErfKernelFma3`: sign(x) * (small(|x|) if |x| < 0.921875 else big(|x|)).

    small(a) = fma(p(a²), a, a); big(a) = 1 - 2^r * e(f), with t = fma(q(a), a, a), r = rne(-t / ln 2)
    (by the 1.5 * 2^23 rounder), f = -t - r ln 2 in two fma steps (hi, lo), e MLAS's exp polynomial.
    NaN stays NaN (onnxruntime's Erf returns NaN for it).
    """
    with np.errstate(over="ignore", invalid="ignore"):  # huge |x|: the polynomial overflows to inf, as MLAS's
        return _erf(np.asarray(x, F32))


def _erf(value: np.ndarray) -> np.ndarray:
    magnitude = np.abs(value).astype(F32)
    big_lane = magnitude >= _SPLIT
    small_magnitude = magnitude[~big_lane]
    square = (small_magnitude * small_magnitude).astype(F32)
    result = np.empty(value.shape, F32)
    result[~big_lane] = _fma(_horner(square, _SMALL), small_magnitude, small_magnitude)
    big_magnitude = magnitude[big_lane]  # the kernel computes both branches; each lane keeps one
    t = _fma(_horner(big_magnitude, _BIG), big_magnitude, big_magnitude)
    exponent = np.maximum(-t, _EXP_LOWER).astype(F32)
    r = (_fma(_EXP_LOG2_RECIPROCAL, exponent, _EXP_ROUNDER) - _EXP_ROUNDER).astype(F32)
    f = _fma(r, _EXP_LOG2_HI, exponent)
    f = _fma(r, _EXP_LOG2_LO, f)
    power = np.ldexp(F32(1), r.astype(np.int32)).astype(F32)
    result[big_lane] = (F32(1) - (_horner(f, _EXP) * power).astype(F32)).astype(F32)
    result = np.copysign(result, value).astype(F32)
    return np.where(np.isnan(value), value, result).astype(F32)


__all__ = ["erf_mlas"]
