"""Exact integer accumulation, as onnxruntime's integer kernels (MatMulInteger, ConvInteger, QLinearConv,
QLinearMatMul, QGemm) sum their products, computed fast.

NOTE: numpy in, numpy out. onnxruntime sums 8-bit products in int32 registers that wrap; addition modulo
2**32 is associative, so the exact sum wrapped to int32 is what every order of int32 additions gives, and
the interpreter may sum in any order in any exact type. numpy's integer matmul runs no BLAS (a 2048 x 384
by 384 x 384 int64 product takes seconds), so the sum is computed in float64 BLAS when that is exact:
every partial sum of `sum_k a[i, k] * b[k, j]` is an integer bounded by `sum_k |a[i, k]| |b[k, j]|
<= max|a| * max|b| * K`, and float64 adds and multiplies integers below 2**53 exactly, in any order.
Above that bound (never for 8-bit operands: 255 * 255 * K < 2**53 for K < 1.3e11) the int64 product is
used, which wraps modulo 2**64 and so still gives the right int32 wrap.
"""

from __future__ import annotations

import numpy as np

FLOAT64_EXACT_LIMIT = 2**53  # float64 represents every integer of magnitude up to 2**53


def max_magnitude(array: np.ndarray) -> int:
    """`max |array|` as a Python int (0 for an empty array), read without overflow for any integer dtype."""
    if array.size == 0:
        return 0
    return max(abs(int(array.min())), abs(int(array.max())))


def float64_is_exact(max_a: int, max_b: int, terms: int) -> bool:
    """Whether float64 sums of `terms` products of integers bounded by `max_a` and `max_b` are exact."""
    return max_a * max_b * max(terms, 1) < FLOAT64_EXACT_LIMIT


def exact_integer_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`np.matmul(a, b)` of integer arrays as exact int64 (numpy's broadcasting and 1-D rules)."""
    a64 = np.asarray(a, np.int64)
    b64 = np.asarray(b, np.int64)
    terms = a64.shape[-1] if a64.ndim else 1
    if float64_is_exact(max_magnitude(a64), max_magnitude(b64), terms):
        return np.matmul(a64.astype(np.float64), b64.astype(np.float64)).astype(np.int64)
    return np.matmul(a64, b64)


def wrap_int32(values: np.ndarray) -> np.ndarray:
    """Two's-complement wrap of exact int64 sums to int32, as onnxruntime's int32 accumulators wrap."""
    return np.asarray(values).astype(np.int64).astype(np.int32)


__all__ = ["FLOAT64_EXACT_LIMIT", "exact_integer_matmul", "float64_is_exact", "max_magnitude", "wrap_int32"]
