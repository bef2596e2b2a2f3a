"""Interpreter kernel of `onnx.com.microsoft.MatMulIntegerToFloat`, bit for bit onnxruntime's CPU kernel.

onnxruntime's graph optimizer (level EXTENDED and above) fuses `DynamicQuantizeLinear -> MatMulInteger ->
Cast -> Mul(scales) [-> Add(bias)]` of quantize_dynamic models into MatMulIntegerToFloat, and a user who
saves the optimized model (`SessionOptions.optimized_model_filepath`) ships it. The kernel
(contrib_ops/cpu/quantization/matmul_integer_to_float.cc, shared with DynamicQuantizeMatMul) is the exact
int32 product of `a - a_zero_point` and `b - b_zero_point` (scalar, or per column of B), then MLAS's
scale-bias output processor: `f32(acc) * (a_scale * b_scale)` with the multiplier rounded to float32 first
(`scale_output_mlas`), then the float bias added on its own. The scales and zero points are run-time
inputs here (they come from DynamicQuantizeLinear), so the op stays generic, with no quant type.
"""

from __future__ import annotations

import numpy as np

from qconvert.errors import InputError
from qconvert.ir.core import Operation
from qconvert.numerics.integer_accumulation import exact_integer_matmul
from qconvert.numerics.onnxruntime_kernels import scale_output_mlas


def _column_vector(values: np.ndarray | None, columns: int, what: str, op: Operation) -> np.ndarray | None:
    """A scalar / one-element value, or one value per column of B (its last dimension), flattened."""
    if values is None:
        return None
    flat = np.asarray(values).reshape(-1)
    if flat.size not in (1, columns):
        raise InputError(
            f"MatMulIntegerToFloat: {what} has {flat.size} values, not 1 or N = {columns} ({op.name})"
        )
    return flat


def matmul_integer_to_float(
    op: Operation, inputs: list[np.ndarray | None], opset: int
) -> list[np.ndarray] | None:
    """(op, inputs by ONNX position, opset) -> [Y], the `ONNX_KERNELS` signature of qconvert/interpret.py."""
    del opset
    a, b, a_scale, b_scale, a_zero, b_zero, bias = (list(inputs) + [None] * 7)[:7]
    assert a is not None and b is not None and a_scale is not None and b_scale is not None
    columns = int(b.shape[-1])
    if np.asarray(a_scale).size != 1 or (a_zero is not None and np.asarray(a_zero).size != 1):
        raise InputError(
            "MatMulIntegerToFloat: a_scale and a_zero_point must be scalars (onnxruntime's kernel)"
        )
    b_zero_vector = _column_vector(b_zero, columns, "b_zero_point", op)
    b_scale_vector = _column_vector(b_scale, columns, "b_scale", op)
    assert b_scale_vector is not None
    lhs = a.astype(np.int64) - (0 if a_zero is None else int(np.asarray(a_zero).reshape(-1)[0]))
    rhs = b.astype(np.int64) - (0 if b_zero_vector is None else b_zero_vector.astype(np.int64))
    accumulator = exact_integer_matmul(lhs, rhs)
    wrapped = ((accumulator + 2**31) % 2**32 - 2**31).astype(np.int32)  # int32 accumulation wraps
    multiplier = (np.float32(np.asarray(a_scale).reshape(-1)[0]) * b_scale_vector.astype(np.float32)).astype(
        np.float32
    )
    y = scale_output_mlas(wrapped, multiplier)
    if bias is not None:
        y = (y + np.asarray(bias).astype(np.float32)).astype(np.float32)
    return [y]


INTEGER_TO_FLOAT_KERNELS = {"onnx.com.microsoft.MatMulIntegerToFloat": matmul_integer_to_float}
