"""Interpreter kernels for `onnx.LSTM`, `onnx.GRU`, `onnx.RNN` and `onnx.com.microsoft.DynamicQuantizeLSTM`.

The semantics are qconvert/recurrent.py's; this module gives them numpy arithmetic in float32. The
activations are onnxruntime's (`logistic_mlas`, `tanh_mlas` of qconvert/numerics), and the order of
float operations is that of onnxruntime's deep CPU LSTM kernel, so that:

- DynamicQuantizeLSTM equals onnxruntime bit for bit: its products are onnxruntime's quantized GEMM
  (`dynamic_quantized_gemm_mlas`: X quantized once over the steps that run, H_{t-1} once per step,
  exact int32 products, `f32(acc) * f32(s_a * s_w)`, the recurrent product added after the input one).
  onnxruntime splits the batch across threads when it has more than 4 rows (or 2 to 4 rows and
  hidden_size <= 256), and then quantizes H per chunk of rows: equal only with one intra-op thread
  (or one row), which is what this kernel computes.
- LSTM, GRU and RNN (float products) agree with onnxruntime within float32 rounding: the products sum
  in another order than MLAS's SGEMM, and onnxruntime's GRU uses its own tanh polynomial for the
  candidate. Registered in qconvert/interpret.py's `ONNX_KERNELS`: onnx's reference has no
  DynamicQuantizeLSTM, and a one-node onnxruntime session would make `check` compare onnxruntime with
  itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from qconvert.errors import InputError
from qconvert.ir.core import Operation
from qconvert.ir.dialects.onnx import absent_positions
from qconvert.numerics.onnxruntime_recurrent import dynamic_quantized_gemm_mlas, logistic_mlas, tanh_mlas
from qconvert.recurrent import OP_TYPES, RecurrentInputs, op_attributes, run_recurrent

F32 = np.float32


class NumpyMath:
    """`RecurrentMath` on float32 numpy arrays."""

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a + b).astype(F32)

    def subtract(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a - b).astype(F32)

    def multiply(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a * b).astype(F32)

    def divide(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (a / b).astype(F32)

    def scale(self, a: np.ndarray, factor: float) -> np.ndarray:
        return (a * F32(factor)).astype(F32)

    def offset(self, a: np.ndarray, amount: float) -> np.ndarray:
        return (a + F32(amount)).astype(F32)

    def rsub(self, amount: float, a: np.ndarray) -> np.ndarray:
        return (F32(amount) - a).astype(F32)

    def maximum(self, a: np.ndarray, bound: float) -> np.ndarray:
        return np.maximum(a, F32(bound)).astype(F32)

    def minimum(self, a: np.ndarray, bound: float) -> np.ndarray:
        return np.minimum(a, F32(bound)).astype(F32)

    def where_greater(
        self, a: np.ndarray, bound: float, then: np.ndarray, otherwise: np.ndarray
    ) -> np.ndarray:
        return np.where(a > F32(bound), then, otherwise).astype(F32)

    def sigmoid(self, a: np.ndarray) -> np.ndarray:
        return logistic_mlas(a)

    def tanh(self, a: np.ndarray) -> np.ndarray:
        return tanh_mlas(a)

    def exp(self, a: np.ndarray) -> np.ndarray:
        return np.exp(a).astype(F32)

    def log(self, a: np.ndarray) -> np.ndarray:
        return np.log(a).astype(F32)

    def abs(self, a: np.ndarray) -> np.ndarray:
        return np.abs(a).astype(F32)

    def columns(self, a: np.ndarray, start: int, size: int) -> np.ndarray:
        return a[..., start : start + size]

    def row(self, a: np.ndarray, index: int) -> np.ndarray:
        return a[index]

    def zeros(self, rows: int, columns: int) -> np.ndarray:
        return np.zeros((rows, columns), F32)

    def leading(self, sequence: np.ndarray, count: int) -> np.ndarray:
        return sequence[:count]

    def select_rows(self, mask: np.ndarray, then: np.ndarray, otherwise: np.ndarray) -> np.ndarray:
        return np.where(np.asarray(mask)[:, None], then, otherwise)

    def lengths(self, values: list[int]) -> np.ndarray:
        return np.asarray(values, np.int64)

    def length_mask(self, lengths: np.ndarray, step: int) -> np.ndarray:
        return lengths > step

    def zeros_like(self, a: np.ndarray) -> np.ndarray:
        return np.zeros_like(a, F32)

    def zero_steps_from(self, sequence: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        steps = np.arange(sequence.shape[0])[:, None, None]
        return np.where(steps < np.max(lengths, initial=0), sequence, F32(0)).astype(F32)

    def stack(self, arrays: Sequence[np.ndarray], axis: int) -> np.ndarray:
        return np.stack(arrays, axis)

    def transpose(self, a: np.ndarray, permutation: Sequence[int]) -> np.ndarray:
        return np.transpose(a, permutation)

    def scan(
        self,
        inputs: np.ndarray,
        carried: list[np.ndarray],
        step: Callable[
            [np.ndarray, list[np.ndarray], np.ndarray | None], tuple[np.ndarray, list[np.ndarray]]
        ],
        backwards: bool,
        lengths: np.ndarray | None,
        length: int,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        count, rows = inputs.shape[0], inputs.shape[1]
        outputs: np.ndarray | None = None
        every_row = np.arange(rows)
        for k in range(count):
            if lengths is None:
                time = np.full(rows, count - 1 - k if backwards else k)
                active = None
            else:
                active = k < lengths
                time = np.where(active, lengths - 1 - k, k) if backwards else np.full(rows, k)
            output, carried = step(inputs[time, every_row], carried, active)
            if outputs is None:
                outputs = np.zeros((length, *output.shape), F32)
            outputs[time, every_row] = output
        assert outputs is not None, "scan over no steps"
        return outputs, carried


class FloatProjection:
    """`X W^T` and `H R^T` of one direction, float32 (W [gates*H, I], R [gates*H, H])."""

    def __init__(self, w: np.ndarray, r: np.ndarray) -> None:
        self.w = np.asarray(w, F32)
        self.r = np.asarray(r, F32)

    def inputs(self, sequence: np.ndarray) -> np.ndarray:
        return (sequence.astype(F32) @ self.w.T).astype(F32)

    def hidden(self, h: np.ndarray, onto: np.ndarray | None, gate: slice | None = None) -> np.ndarray:
        r = self.r if gate is None else self.r[gate]
        product = (h @ r.T).astype(F32)
        return product if onto is None else (onto + product).astype(F32)


class QuantizedProjection:
    """onnxruntime's dynamically quantized products of one DynamicQuantizeLSTM direction.

    W [I, 4H] and R [H, 4H] int8 / uint8; scales of one entry or one per column; onnxruntime reads the
    first zero point only (it checks the others are equal, and zero for int8).
    """

    def __init__(
        self, w: np.ndarray, w_scale: np.ndarray, w_zero: np.ndarray, r: np.ndarray, r_scale: np.ndarray,
        r_zero: np.ndarray,
    ) -> None:  # fmt: skip
        self.w, self.w_scale, self.w_zero = w, np.asarray(w_scale, F32), _first_zero_point(w_zero)
        self.r, self.r_scale, self.r_zero = r, np.asarray(r_scale, F32), _first_zero_point(r_zero)

    def inputs(self, sequence: np.ndarray) -> np.ndarray:
        count, rows, width = sequence.shape  # all steps' rows quantized as one tensor, as onnxruntime does
        rows_first = sequence.reshape(count * rows, width)
        products = dynamic_quantized_gemm_mlas(rows_first, self.w, self.w_zero, self.w_scale)
        return products.reshape(count, rows, -1)

    def hidden(self, h: np.ndarray, onto: np.ndarray | None, gate: slice | None = None) -> np.ndarray:
        assert gate is None, "DynamicQuantizeLSTM has no per-gate products"
        return dynamic_quantized_gemm_mlas(h, self.r, self.r_zero, self.r_scale, onto)


def _first_zero_point(zero_point: np.ndarray) -> int:
    values = np.asarray(zero_point).reshape(-1)
    if values.size and np.any(values != values[0]):
        raise InputError("DynamicQuantizeLSTM: onnxruntime requires one zero point per weight tensor")
    return int(values[0]) if values.size else 0


def _per_direction(values: np.ndarray, directions: int) -> list[np.ndarray]:
    """Scales / zero points of shape [D] or [D, 4H] -> one array per direction."""
    array = np.asarray(values)
    if array.ndim == 0 or array.shape[0] != directions:
        raise InputError(
            f"DynamicQuantizeLSTM: scale / zero point of shape {list(array.shape)}, "
            f"expected [{directions}, ...]"
        )
    return [array[d] for d in range(directions)]


def run_recurrent_op(
    op: Operation, inputs: Sequence[np.ndarray | None], opset: int = 0
) -> list[np.ndarray | None]:
    """The interpreter kernel of a lifted LSTM / GRU / DynamicQuantizeLSTM op (the `ONNX_KERNELS`
    signature of qconvert/interpret.py): inputs and outputs by ONNX position, None where absent."""
    del opset  # the three ops mean the same at every opset that has them (layout is read as given)
    op_type, attributes = op_attributes(op)
    names = OP_TYPES[op_type]
    by_name = {names[p]: a for p, a in enumerate(inputs) if p < len(names) and a is not None}
    for required in ("X", "W", "R") + (names[8:] if op_type == "DynamicQuantizeLSTM" else ()):
        if required not in by_name:
            raise InputError(f"{op_type}: input {required} is required")
    x = np.asarray(by_name["X"], F32)
    if x.ndim != 3:
        raise InputError(f"{op_type}: X must be 3-D, got shape {list(x.shape)}")
    length, batch = (x.shape[0], x.shape[1]) if attributes.layout == 0 else (x.shape[1], x.shape[0])
    directions = attributes.num_directions
    if op_type == "DynamicQuantizeLSTM":
        w_scales = _per_direction(by_name["W_scale"], directions)
        w_zeros = _per_direction(by_name["W_zero_point"], directions)
        r_scales = _per_direction(by_name["R_scale"], directions)
        r_zeros = _per_direction(by_name["R_zero_point"], directions)
        projections: list = [
            QuantizedProjection(
                by_name["W"][d], w_scales[d], w_zeros[d], by_name["R"][d], r_scales[d], r_zeros[d]
            )
            for d in range(directions)
        ]
    else:
        projections = [FloatProjection(by_name["W"][d], by_name["R"][d]) for d in range(directions)]

    def optional(name: str) -> np.ndarray | None:
        value = by_name.get(name)
        return None if value is None else np.asarray(value, F32)

    lens = by_name.get("sequence_lens")
    known_lens = None if lens is None else np.asarray(lens).reshape(-1)
    recurrent_inputs = RecurrentInputs.by_name(x, optional, known_lens, length, batch)
    sequence_output = 0 not in absent_positions(op, "outputs")
    outputs = run_recurrent(
        NumpyMath(), attributes, recurrent_inputs, projections, sequence_output=sequence_output
    )
    produced = [outputs.y, outputs.y_h, outputs.y_c]
    return [None if value is None else np.ascontiguousarray(value, F32) for value in produced]


RECURRENT_KERNELS = {
    "onnx.LSTM": run_recurrent_op,
    "onnx.GRU": run_recurrent_op,
    "onnx.RNN": run_recurrent_op,
    "onnx.com.microsoft.DynamicQuantizeLSTM": run_recurrent_op,
}
