"""Lowerings of ONNX LSTM, GRU, RNN and com.microsoft DynamicQuantizeLSTM: a `stablehlo.while` per direction.

The semantics are qconvert/recurrent.py's (`run_recurrent`), run here on StableHLO values: `HloMath`
builds each arithmetic step as ops (its `scan` is the while loop, whose body is one time step),
`FloatProjection` / `QuantizedProjection` the matrix products. The sequence length must be static.
`sequence_lens` may be a constant or a run-time input: each row then reads X and writes Y at its own
time index (a `gather`, one `dynamic_update_slice` per row) and holds its state once it has finished; at
run time X's steps past max(sequence_lens) are zeroed first (onnxruntime's quantized LSTM quantizes X
over the steps that run only).

Exactness against onnxruntime:
- LSTM / GRU (float): `stablehlo.logistic` / `tanh` and XLA's dot products: within float32 rounding of
  onnxruntime (which sums in MLAS's order and evaluates its own activation polynomials).
- DynamicQuantizeLSTM: onnxruntime's kernel, bit for bit where XLA computes what it is told: X is
  quantized once over the steps that run and H once per step (`integer_arithmetic.dynamic_quantize_linear`,
  the rule of numerics `dynamic_quantize_parameters_onnxruntime` / `quantize_linear_mlas`), the
  products are exact i32 `dot_general`s, then `f32(acc) * f32(s_a * s_w)` (+ the input product), and
  the activations are MLAS's FMA3 polynomials (numerics `logistic_mlas` / `tanh_mlas`) with each FMA
  emulated exactly in f64 (`float32_rounding.float32_fma`); every product that feeds an add is
  rounded on its own first (`float32_rounding.rounded_product`), since XLA:CPU would contract it into
  an FMA.
  onnxruntime splits the batch across threads (more than 4 rows, or 2-4 rows with hidden_size <= 256)
  and then quantizes H per chunk of rows: the lowering, like the interpreter, is its one-thread result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from qconvert.ir.core import Block, Builder, GenericOp, Operation, Region, Value
from qconvert.ir.dialects.onnx import absent_positions
from qconvert.ir.types import F32, I32, I64, RankedTensorType, element_type_of
from qconvert.numerics.onnxruntime_recurrent import LOGISTIC_MLAS, TANH_MLAS
from qconvert.recurrent import OP_TYPES, RecurrentInputs, op_attributes, run_recurrent

from . import ops as hlo
from .float32_rounding import float32_fma, rounded_product
from .integer_arithmetic import dynamic_quantize_linear
from .lowering import LoweringContext, lowers
from .onnx_fold import constant_input

NOTE_QUANTIZED_LSTM = (
    "DynamicQuantizeLSTM: X and each step's H quantized at run time (onnxruntime's dynamic uint8 rule), "
    "exact i32 products, MLAS activations"
)


class HloMath:
    """`RecurrentMath` on f32 StableHLO values; `mlas_activations` emits MLAS's logistic / tanh."""

    def __init__(self, ctx: LoweringContext, mlas_activations: bool) -> None:
        self.ctx = ctx
        self.b = ctx.builder
        self.mlas_activations = mlas_activations

    def _splat(self, value: float, like: Value) -> Value:
        return self.ctx.splat(value, F32, hlo.tensor_type(like).shape)

    def add(self, a: Value, b: Value) -> Value:
        return hlo.add(self.b, *self.ctx.broadcast_operands([a, b]))  # a bias row broadcasts over the batch

    def subtract(self, a: Value, b: Value) -> Value:
        return hlo.subtract(self.b, *self.ctx.broadcast_operands([a, b]))

    def multiply(self, a: Value, b: Value) -> Value:
        a, b = self.ctx.broadcast_operands([a, b])
        return rounded_product(self.ctx, a, b)  # one rounding, never fused into a following add

    def divide(self, a: Value, b: Value) -> Value:
        return hlo.exact_divide(self.b, a, b)

    def scale(self, a: Value, factor: float) -> Value:
        return self.multiply(a, self._splat(factor, a))

    def offset(self, a: Value, amount: float) -> Value:
        return hlo.add(self.b, a, self._splat(amount, a))

    def rsub(self, amount: float, a: Value) -> Value:
        return hlo.subtract(self.b, self._splat(amount, a), a)

    def maximum(self, a: Value, bound: float) -> Value:
        return hlo.maximum(self.b, a, self._splat(bound, a))

    def minimum(self, a: Value, bound: float) -> Value:
        return hlo.minimum(self.b, a, self._splat(bound, a))

    def where_greater(self, a: Value, bound: float, then: Value, otherwise: Value) -> Value:
        return hlo.select(self.b, hlo.compare(self.b, "GT", a, self._splat(bound, a)), then, otherwise)

    def _rational(
        self, x: Value, limit: float, numerator: Sequence[float], denominator: Sequence[float]
    ) -> Value:
        """MLAS's `x * p(x²) / q(x²)` on x clamped to ±limit, each Horner step one exact FMA."""
        clamped = hlo.clamp(self.b, self.ctx.scalar(-limit, F32), x, self.ctx.scalar(limit, F32))
        square = rounded_product(self.ctx, clamped, clamped)

        def horner(coefficients: Sequence[float]) -> Value:
            value = float32_fma(
                self.ctx, square, self._splat(coefficients[0], x), self._splat(coefficients[1], x)
            )
            for coefficient in coefficients[2:]:
                value = float32_fma(self.ctx, square, value, self._splat(coefficient, x))
            return value

        top = rounded_product(self.ctx, clamped, horner(numerator))
        return hlo.exact_divide(self.b, top, horner(denominator))

    def sigmoid(self, a: Value) -> Value:
        if not self.mlas_activations:
            return hlo.logistic(self.b, a)
        limit, numerator, denominator = LOGISTIC_MLAS
        ratio = self._rational(a, limit, numerator, denominator)
        return hlo.maximum(self.b, self.offset(ratio, 0.5), self._splat(0.0, a))

    def tanh(self, a: Value) -> Value:
        if not self.mlas_activations:
            return hlo.tanh(self.b, a)
        limit, numerator, denominator = TANH_MLAS
        return self._rational(a, limit, numerator, denominator)

    def exp(self, a: Value) -> Value:
        return hlo.exponential(self.b, a)

    def log(self, a: Value) -> Value:
        return hlo.log(self.b, a)

    def abs(self, a: Value) -> Value:
        return hlo.abs_(self.b, a)

    def columns(self, a: Value, start: int, size: int) -> Value:
        shape = hlo.tensor_type(a).shape
        begin = [0] * (len(shape) - 1) + [start]
        end = [*shape[:-1], start + size]
        return hlo.slice_(self.b, a, begin, end, [1] * len(shape))

    def row(self, a: Value, index: int) -> Value:
        shape = hlo.tensor_type(a).shape
        part = hlo.slice_(
            self.b, a, [index] + [0] * (len(shape) - 1), [index + 1, *shape[1:]], [1] * len(shape)
        )
        return hlo.reshape(self.b, part, shape[1:])

    def row_range(self, a: Value, rows: slice) -> Value:
        """a[rows] of a 2-D value (a gate's rows of R)."""
        shape = hlo.tensor_type(a).shape
        return hlo.slice_(self.b, a, [rows.start, 0], [rows.stop, shape[1]], [1, 1])

    def zeros(self, rows: int, columns: int) -> Value:
        return self.ctx.splat(0.0, F32, (rows, columns))

    def leading(self, sequence: Value, count: int) -> Value:
        shape = hlo.tensor_type(sequence).shape
        if count == shape[0]:
            return sequence
        return hlo.slice_(self.b, sequence, [0] * len(shape), [count, *shape[1:]], [1] * len(shape))

    def flat_rows(self, sequence: Value, apply: Callable[[Value], Value]) -> Value:
        """`apply` on [n, B, K] seen as [n * B, K] rows (time-major, as onnxruntime lays X out), back."""
        count, rows, width = hlo.tensor_type(sequence).shape
        result = apply(hlo.reshape(self.b, sequence, [count * rows, width]))
        return hlo.reshape(self.b, result, [count, rows, hlo.tensor_type(result).shape[1]])

    def select_rows(self, mask: Value, then: Value, otherwise: Value) -> Value:
        shape = hlo.tensor_type(then).shape
        return hlo.select(self.b, hlo.broadcast_in_dim(self.b, mask, shape, [0]), then, otherwise)

    def lengths(self, values: list[int]) -> Value:
        return self.ctx.constant(np.asarray(values, np.int64), I64)

    def length_mask(self, lengths: Value, step: int) -> Value:
        rows = hlo.tensor_type(lengths).shape
        return hlo.compare(self.b, "GT", lengths, self.ctx.splat(step, I64, rows))

    def zeros_like(self, a: Value) -> Value:
        return self._splat(0.0, a)

    def zero_steps_from(self, sequence: Value, lengths: Value) -> Value:
        shape = hlo.tensor_type(sequence).shape
        longest = hlo.reduce(self.b, lengths, self.ctx.scalar(0, I64), [0], hlo.maximum)
        steps = hlo.iota(self.b, RankedTensorType(tuple(shape), I64), 0)
        keep = hlo.compare(self.b, "LT", steps, hlo.broadcast_in_dim(self.b, longest, shape, []))
        return hlo.select(self.b, keep, sequence, self._splat(0.0, sequence))

    def stack(self, arrays: Sequence[Value], axis: int) -> Value:
        expanded = []
        for array in arrays:
            shape = list(hlo.tensor_type(array).shape)
            expanded.append(hlo.reshape(self.b, array, [*shape[:axis], 1, *shape[axis:]]))
        return expanded[0] if len(expanded) == 1 else hlo.concatenate(self.b, expanded, axis)

    def transpose(self, a: Value, permutation: Sequence[int]) -> Value:
        return hlo.transpose(self.b, a, permutation)

    def scan(
        self,
        inputs: Value,
        carried: list[Value],
        step: Callable[[Value, list[Value], Value | None], tuple[Value, list[Value]]],
        backwards: bool,
        lengths: Value | None,
        length: int,
    ) -> tuple[Value, list[Value]]:
        """A `stablehlo.while` over the steps: the body is one step, emitted once (unrolled steps would
        grow XLA's compile time with the sequence). With `lengths`, each row reads (`gather`) and writes
        (one `dynamic_update_slice` per row) at its own time index."""
        ctx, outer = self.ctx, self.b
        input_shape = hlo.tensor_type(inputs).shape
        count, rows, width = input_shape
        output_row = list(hlo.tensor_type(carried[0]).shape)  # a step's output is shaped like H
        buffer = ctx.splat(0.0, F32, [length, *output_row])
        index_type = RankedTensorType((), I64)
        types = [index_type, buffer.type, *[v.type for v in carried]]

        condition = Block(types)
        self._enter(Builder(condition))
        more = hlo.compare(self.b, "LT", condition.arguments[0], ctx.scalar(count, I64))
        self.b.insert(GenericOp("stablehlo.return", [more], []))

        body = Block(types)
        self._enter(Builder(body))
        index, acc, *current = body.arguments
        zero = ctx.scalar(0, I64)
        if lengths is None:
            time = hlo.subtract(self.b, ctx.scalar(count - 1, I64), index) if backwards else index
            row = _dynamic_slice(self.b, inputs, [time, zero, zero], [1, rows, width])
            output, new_carried = step(hlo.reshape(self.b, row, [rows, width]), list(current), None)
            update = hlo.reshape(self.b, output, [1, *output_row])
            acc = _dynamic_update_slice(self.b, acc, update, [time, zero, zero])
        else:
            steps = hlo.broadcast_in_dim(self.b, index, [rows], [])
            active = hlo.compare(self.b, "LT", steps, lengths)
            times = steps
            if backwards:
                own = hlo.subtract(self.b, hlo.subtract(self.b, lengths, ctx.splat(1, I64, [rows])), steps)
                times = hlo.select(self.b, active, own, steps)
            x = self._gather_rows(inputs, times)
            output, new_carried = step(x, list(current), active)
            for b in range(rows):  # Y[t_b, b] = output[b]
                time = hlo.reshape(self.b, hlo.slice_(self.b, times, [b], [b + 1], [1]), [])
                update = hlo.reshape(self.b, self.row_range(output, slice(b, b + 1)), [1, 1, output_row[1]])
                acc = _dynamic_update_slice(self.b, acc, update, [time, ctx.scalar(b, I64), zero])
        following = hlo.add(self.b, index, ctx.scalar(1, I64))
        self.b.insert(GenericOp("stablehlo.return", [following, acc, *new_carried], []))

        self._enter(outer)
        initial = [ctx.scalar(0, I64), buffer, *carried]
        loop = outer.insert(
            GenericOp("stablehlo.while", initial, types, {}, [Region([condition]), Region([body])])
        )
        results = list(loop.results)
        return results[1], results[2:]

    def _enter(self, builder: Builder) -> None:
        """Emit at `builder` from now on (this object's ops and the context's helpers)."""
        self.b = builder
        self.ctx.builder = builder

    def _gather_rows(self, inputs: Value, times: Value) -> Value:
        """`inputs[times[b], b]` for each row b: [T, B, G] and i64 [B] -> [B, G]."""
        _, rows, width = hlo.tensor_type(inputs).shape
        row_index = hlo.iota(self.b, RankedTensorType((rows,), I64), 0)
        pairs = hlo.concatenate(
            self.b,
            [hlo.reshape(self.b, times, [rows, 1]), hlo.reshape(self.b, row_index, [rows, 1])],
            1,
        )
        return hlo.gather(
            self.b,
            inputs,
            pairs,
            RankedTensorType((rows, width), F32),
            offset_dims=[1],
            collapsed_slice_dims=[0, 1],
            start_index_map=[0, 1],
            index_vector_dim=1,
            slice_sizes=[1, 1, width],
        )


def _dynamic_slice(builder: Builder, operand: Value, starts: Sequence[Value], sizes: Sequence[int]) -> Value:
    """`stablehlo.dynamic_slice` with scalar i64 start indices."""
    result = RankedTensorType(tuple(sizes), element_type_of(operand.type))
    attributes = {"slice_sizes": hlo.i64_array(sizes)}
    return builder.insert(
        GenericOp("stablehlo.dynamic_slice", [operand, *starts], [result], attributes)
    ).result


def _dynamic_update_slice(builder: Builder, operand: Value, update: Value, starts: Sequence[Value]) -> Value:
    """`stablehlo.dynamic_update_slice`: `update` written into `operand` at the scalar i64 `starts`."""
    op = GenericOp("stablehlo.dynamic_update_slice", [operand, update, *starts], [operand.type], {})
    return builder.insert(op).result


class FloatProjection:
    """`X W^T` / `H R^T` of one direction as f32 dot_generals (W [gates*H, I], R [gates*H, H])."""

    def __init__(self, math: HloMath, w: Value, r: Value) -> None:
        self.math, self.w, self.r = math, w, r

    def _times_transposed(self, a: Value, weights: Value) -> Value:
        return hlo.dot_general(self.math.b, a, weights, lhs_contracting=[1], rhs_contracting=[1])

    def inputs(self, sequence: Value) -> Value:
        return self.math.flat_rows(sequence, lambda rows: self._times_transposed(rows, self.w))

    def hidden(self, h: Value, onto: Value | None, gate: slice | None = None) -> Value:
        weights = self.r
        if gate is not None:
            weights = self.math.row_range(weights, gate)
        product = self._times_transposed(h, weights)
        return product if onto is None else hlo.add(self.math.b, onto, product)


class QuantizedProjection:
    """onnxruntime's quantized RNN GEMM of one direction (numerics `dynamic_quantized_gemm_mlas`):
    W [I, 4H] / R [H, 4H] as centered i32 constants, scales per direction or per column."""

    def __init__(
        self, math: HloMath, w: Value, w_scale: np.ndarray, r: Value, r_scale: np.ndarray
    ) -> None:  # fmt: skip
        self.math, self.w, self.w_scale, self.r, self.r_scale = math, w, w_scale, r, r_scale

    def _product(self, a: Value, weights: Value, scales: np.ndarray, onto: Value | None) -> Value:
        ctx, b = self.math.ctx, self.math.b
        stored, a_scale, a_zero = dynamic_quantize_linear(ctx, a)
        shape = hlo.tensor_type(stored).shape
        centered = hlo.subtract(
            b, ctx.convert(stored, I32), hlo.broadcast_in_dim(b, ctx.convert(a_zero, I32), shape, [])
        )
        accumulator = hlo.dot_general(
            b, centered, weights, lhs_contracting=[1], rhs_contracting=[0], result_element_type=I32
        )
        out_shape = hlo.tensor_type(accumulator).shape
        column_scales = (
            ctx.splat(float(scales.reshape(-1)[0]), F32, out_shape)
            if scales.size == 1
            else hlo.broadcast_in_dim(b, ctx.constant(scales.reshape(-1), F32), out_shape, [1])
        )
        multiplier = hlo.multiply(b, hlo.broadcast_in_dim(b, a_scale, out_shape, []), column_scales)
        product = rounded_product(ctx, ctx.convert(accumulator, F32), multiplier)
        ctx.note(product, NOTE_QUANTIZED_LSTM)
        return product if onto is None else hlo.add(b, product, onto)

    def inputs(self, sequence: Value) -> Value:  # every step's rows quantized as one tensor
        return self.math.flat_rows(sequence, lambda rows: self._product(rows, self.w, self.w_scale, None))

    def hidden(self, h: Value, onto: Value | None, gate: slice | None = None) -> Value:
        assert gate is None, "DynamicQuantizeLSTM has no per-gate products"
        return self._product(h, self.r, self.r_scale, onto)


def _centered_weights(ctx: LoweringContext, op: Operation, position: int, zero_position: int) -> np.ndarray:
    """A DynamicQuantizeLSTM weight (constant) minus its zero point, as i32 [D, K, 4H]."""
    weights = constant_input(ctx, op, position)
    zero_point = constant_input(ctx, op, zero_position)
    if weights is None or zero_point is None:
        ctx.unsupported("DynamicQuantizeLSTM weights and zero points must be constants")
    zeros = np.asarray(zero_point).reshape(weights.shape[0], -1)
    if np.any(zeros != zeros[:, :1]):
        ctx.unsupported(
            "DynamicQuantizeLSTM with more than one zero point per direction (onnxruntime refuses it)"
        )
    return weights.astype(np.int32) - zeros[:, :1, None].astype(np.int32)


@lowers("onnx.LSTM", "onnx.GRU", "onnx.RNN", "onnx.com.microsoft.DynamicQuantizeLSTM")
def lower_recurrent(ctx: LoweringContext, op: Operation) -> list[Value]:
    try:
        op_type, attributes = op_attributes(op)
    except Exception as error:  # an InputError naming the attribute: this op cannot be lowered
        ctx.unsupported(str(error))
    names = OP_TYPES[op_type]
    positions = {name: p for p, name in enumerate(names)}
    x = ctx.input(op, 0)
    assert x is not None
    if element_type_of(x.type) != F32:
        ctx.unsupported(f"{op_type} on {element_type_of(x.type)} (float32 only)")
    x_shape = hlo.tensor_type(x).shape
    length, batch = (x_shape[0], x_shape[1]) if attributes.layout == 0 else (x_shape[1], x_shape[0])
    lens: np.ndarray | Value | None = None
    if ctx.source_input(op, positions["sequence_lens"]) is not None:
        lens = constant_input(ctx, op, positions["sequence_lens"])
        if lens is None:
            lens = ctx.convert(ctx.input(op, positions["sequence_lens"]), I64)  # type: ignore[arg-type]
    math = HloMath(ctx, mlas_activations=op_type == "DynamicQuantizeLSTM")
    directions = attributes.num_directions
    projections: list = []
    if op_type == "DynamicQuantizeLSTM":
        w_scale = constant_input(ctx, op, positions["W_scale"])
        r_scale = constant_input(ctx, op, positions["R_scale"])
        if w_scale is None or r_scale is None:
            ctx.unsupported("DynamicQuantizeLSTM scales must be constants")
        w = _centered_weights(ctx, op, 1, positions["W_zero_point"])
        r = _centered_weights(ctx, op, 2, positions["R_zero_point"])
        for d in range(directions):
            projections.append(
                QuantizedProjection(
                    math,
                    ctx.constant(w[d], I32),
                    np.asarray(w_scale, np.float32).reshape(directions, -1)[d],
                    ctx.constant(r[d], I32),
                    np.asarray(r_scale, np.float32).reshape(directions, -1)[d],
                )
            )
    else:
        w, r = ctx.input(op, 1), ctx.input(op, 2)
        assert w is not None and r is not None
        projections = [FloatProjection(math, math.row(w, d), math.row(r, d)) for d in range(directions)]

    def optional(name: str) -> Value | None:
        position = positions.get(name)
        return None if position is None else ctx.input(op, position)

    known_or_runtime_lens = lens.reshape(-1) if isinstance(lens, np.ndarray) else lens
    inputs = RecurrentInputs.by_name(x, optional, known_or_runtime_lens, length, batch)
    absent = absent_positions(op, "outputs")
    outputs = run_recurrent(math, attributes, inputs, projections, sequence_output=0 not in absent)
    produced = [outputs.y, outputs.y_h, outputs.y_c]
    present = [p for p in range(len(op.results) + len(absent)) if p not in absent]
    results = [produced[p] for p in present]
    for index, value in enumerate(results):
        expected = ctx.result_type(op, index)
        assert isinstance(value.type, RankedTensorType) and value.type.shape == expected.shape
    return results  # type: ignore[return-value]
