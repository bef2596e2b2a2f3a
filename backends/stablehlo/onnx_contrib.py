"""Lowerings of the com.microsoft float ops onnxruntime's transformer optimizer writes into the models
people then quantize: Gelu, BiasGelu, FastGelu, QuickGelu, SkipLayerNormalization,
SkipSimplifiedLayerNormalization, EmbedLayerNormalization and Attention (its common form: no past state,
every mask_index layout onnxruntime's CPU kernel reads). The attribute defaults, input positions and
Attention's mask layouts are qconvert/onnx_semantics.py's, shared with the interpreter's kernels
(qconvert/onnx_contrib_kernels.py).
(onnxruntime's SimplifiedLayerNormalization sits in the onnx domain, where the frontend refuses ops ONNX
does not define.)

The formulas are onnxruntime's CPU kernels' (contrib_ops/cpu/bert/bias_gelu.cc, skip_layer_norm.cc,
activations): FastGelu's tanh and QuickGelu's logistic are MLAS's polynomials (bit for bit, as
onnx_elementwise's Tanh / Sigmoid), erf is the engine's (a few ulp from MLAS's). Normalizations sum
in another order than onnxruntime's, so they agree within a few ulp of the output's magnitude.
The training-only outputs (mean, inverse standard deviation) are refused.
"""

from __future__ import annotations

import numpy as np

from qconvert import onnx_semantics as semantics
from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.onnx import absent_positions
from qconvert.ir.types import F32, I32, I64, RankedTensorType, element_type_of

from . import ops as hlo
from .float32_rounding import rounded_product
from .lowering import LoweringContext
from .onnx_elementwise import chlo_unary
from .onnx_fold import lowers_folding, static_shape
from .onnx_recurrent import HloMath
from .onnx_reduce import reduce_sum

# FastGelu's constants as onnxruntime writes them (float32): sqrt(2 / pi) and 0.044715 * sqrt(2 / pi).
FAST_GELU_B = semantics.FAST_GELU_B
FAST_GELU_C = semantics.FAST_GELU_C


def _f32_input(ctx: LoweringContext, op: Operation, position: int = 0) -> Value:
    value = ctx.input(op, position)
    assert value is not None
    if element_type_of(value.type) != F32:
        ctx.unsupported(f"{op.name} of {element_type_of(value.type)} (onnxruntime's CPU kernel is float32)")
    return value


def _splat(ctx: LoweringContext, value: float, like: Value) -> Value:
    return ctx.splat(value, F32, hlo.tensor_type(like).shape)


def _with_bias(ctx: LoweringContext, op: Operation, x: Value, position: int) -> Value:
    bias = ctx.input(op, position)
    if bias is None:
        return x
    return hlo.add(ctx.builder, x, ctx.broadcast_to(bias, hlo.tensor_type(x).shape))


@lowers_folding("onnx.com.microsoft.FastGelu")
def lower_fast_gelu(ctx: LoweringContext, op: Operation) -> list[Value]:
    """v = x (+ bias); t = tanh(v * (C * v * v + B)) (MLAS); y = (0.5 * v) * (t + 1)."""
    value = _with_bias(ctx, op, _f32_input(ctx, op), 1)
    b = ctx.builder
    square_term = rounded_product(ctx, hlo.multiply(b, _splat(ctx, FAST_GELU_C, value), value), value)
    cubic = hlo.add(b, square_term, _splat(ctx, FAST_GELU_B, value))
    inner = HloMath(ctx, mlas_activations=True).tanh(hlo.multiply(b, value, cubic))
    half = hlo.multiply(b, value, _splat(ctx, 0.5, value))
    return [hlo.multiply(b, half, hlo.add(b, inner, _splat(ctx, 1.0, value)))]


@lowers_folding("onnx.com.microsoft.Gelu", "onnx.com.microsoft.BiasGelu")
def lower_bias_gelu(ctx: LoweringContext, op: Operation) -> list[Value]:
    """v = x (+ bias); y = (0.5 * v) * (erf(v * f32(1 / sqrt 2)) + 1)."""
    value = _with_bias(ctx, op, _f32_input(ctx, op), 1)
    b = ctx.builder
    scaled = hlo.multiply(b, value, _splat(ctx, float(np.float32(1.0) / np.sqrt(np.float32(2.0))), value))
    error_function = chlo_unary(ctx, "chlo.erf", scaled)
    half = hlo.multiply(b, value, _splat(ctx, 0.5, value))
    return [hlo.multiply(b, half, hlo.add(b, error_function, _splat(ctx, 1.0, value)))]


@lowers_folding("onnx.com.microsoft.QuickGelu")
def lower_quick_gelu(ctx: LoweringContext, op: Operation) -> list[Value]:
    """y = x * logistic(alpha * x) (MLAS logistic)."""
    x = _f32_input(ctx, op)
    alpha = float(ctx.attribute(op, "alpha", semantics.QUICK_GELU_ALPHA))  # type: ignore[arg-type]
    scaled = hlo.multiply(ctx.builder, x, _splat(ctx, alpha, x))
    return [hlo.multiply(ctx.builder, x, HloMath(ctx, mlas_activations=True).sigmoid(scaled))]


def _normalize_last(ctx: LoweringContext, value: Value, epsilon: float, simplified: bool) -> Value:
    """onnxruntime's layer norm over the last dim: mean = Σv/N,
    d = sqrt(Σv²/N - mean² + eps) (simplified: sqrt(Σv²/N + eps)), y = (v - mean) / d (simplified: v / d)."""
    b = ctx.builder
    shape = hlo.tensor_type(value).shape
    first = len(shape) - 1
    axes = list(range(first, len(shape)))
    outer = list(range(first))
    reduced_shape = shape[:first]
    count = ctx.splat(float(np.prod(shape[first:])), F32, reduced_shape)
    mean_square = hlo.exact_divide(b, reduce_sum(ctx, hlo.multiply(b, value, value), axes), count)
    if simplified:
        variance = mean_square
    else:
        mean = hlo.exact_divide(b, reduce_sum(ctx, value, axes), count)
        variance = hlo.subtract(b, mean_square, rounded_product(ctx, mean, mean))
        value = hlo.subtract(b, value, hlo.broadcast_in_dim(b, mean, shape, outer))
    deviation = hlo.sqrt(b, hlo.add(b, variance, ctx.splat(epsilon, F32, reduced_shape)))
    return hlo.exact_divide(b, value, hlo.broadcast_in_dim(b, deviation, shape, outer))


def _scale_and_shift(ctx: LoweringContext, y: Value, gamma: Value, beta: Value | None) -> Value:
    shape = hlo.tensor_type(y).shape
    if beta is None:
        return hlo.multiply(ctx.builder, y, ctx.broadcast_to(gamma, shape))
    product = rounded_product(ctx, y, ctx.broadcast_to(gamma, shape))
    return hlo.add(ctx.builder, product, ctx.broadcast_to(beta, shape))


@lowers_folding(
    "onnx.com.microsoft.SkipLayerNormalization", "onnx.com.microsoft.SkipSimplifiedLayerNormalization"
)
def lower_skip_layer_norm(ctx: LoweringContext, op: Operation) -> list[Value]:
    """v = input + skip (+ bias); y = norm(v) * gamma (+ beta); optional 4th output v."""
    x, skip = _f32_input(ctx, op, 0), _f32_input(ctx, op, 1)
    simplified = op.name.endswith("SkipSimplifiedLayerNormalization")
    gamma = ctx.input(op, 2)
    assert gamma is not None
    beta_position, bias_position = semantics.skip_layer_norm_positions(simplified)
    beta = None if beta_position is None else ctx.input(op, beta_position)
    shape = static_shape(ctx, x, f"{op.name}'s input")
    value = hlo.add(ctx.builder, x, ctx.broadcast_to(skip, shape))
    value = _with_bias(ctx, op, value, bias_position)
    epsilon = float(ctx.attribute(op, "epsilon", semantics.LAYER_NORM_EPSILON))  # type: ignore[arg-type]
    y = _scale_and_shift(ctx, _normalize_last(ctx, value, epsilon, simplified), gamma, beta)
    return _with_sum_output(ctx, op, [y], value)


def _with_sum_output(ctx: LoweringContext, op: Operation, results: list[Value], value: Value) -> list[Value]:
    """Skip*LayerNormalization's outputs: 0 the normalized value, 3 input + skip + bias; 1 and 2 (mean,
    inverse deviation) are training outputs, refused."""
    absent = absent_positions(op, "outputs")
    positions = [p for p in range(len(op.results) + len(absent)) if p not in absent]
    if any(p in (1, 2) for p in positions):
        ctx.unsupported(f"{op.name}'s mean / inverse standard deviation outputs (training only)")
    return results + [value for p in positions if p == 3]


@lowers_folding("onnx.com.microsoft.Attention")
def lower_attention(ctx: LoweringContext, op: Operation) -> list[Value]:
    """onnxruntime's fused self-attention (what its transformer optimizer writes for BERT): QKV = input @
    weights + bias, per head softmax(Q Kᵀ * scale + mask) V, heads concatenated. The common form is
    lowered: equal Q/K/V sizes, no past state, any mask_index layout onnxruntime's CPU kernel reads
    (`_attention_keep`), a masked key adding mask_filter_value (default -10000); unidirectional adds the
    causal mask the same way."""
    x, weights, bias = _f32_input(ctx, op, 0), ctx.input(op, 1), ctx.input(op, 2)
    assert weights is not None
    b = ctx.builder
    if any(ctx.source_input(op, p) is not None for p in range(4, 8)) or len(op.results) > 1:
        ctx.unsupported("Attention with past state, attention_bias or present outputs")
    if ctx.attribute(op, "qkv_hidden_sizes") is not None:
        ctx.unsupported("Attention with qkv_hidden_sizes")
    batch, sequence, _ = static_shape(ctx, x, "Attention's input")
    hidden = hlo.tensor_type(weights).shape[1] // 3
    qkv = hlo.dot_general(b, x, weights, lhs_contracting=[2], rhs_contracting=[0])  # (B, S, 3H)
    if bias is not None:
        qkv = hlo.add(b, qkv, ctx.broadcast_to(bias, (batch, sequence, 3 * hidden)))
    return [attention_of_qkv(ctx, op, qkv)]


def attention_of_qkv(ctx: LoweringContext, op: Operation, qkv: Value, mask_position: int = 3) -> Value:
    """Attention after its QKV projection (batch, sequence, 3 hidden), shared with QAttention's lowering:
    per head softmax(Q Kᵀ * scale + mask) V, heads concatenated; mask_index is the op's input
    `mask_position` (Attention's 3, QAttention's 5)."""
    b = ctx.builder
    batch, sequence, three_hidden = hlo.tensor_type(qkv).shape
    hidden = three_hidden // 3
    heads = int(ctx.attribute(op, "num_heads"))  # type: ignore[arg-type]
    head_size = hidden // heads
    scale = semantics.attention_scale(float(ctx.attribute(op, "scale", 0.0)), head_size)  # type: ignore[arg-type]
    filter_value = float(ctx.attribute(op, "mask_filter_value", semantics.ATTENTION_MASK_FILTER_VALUE))  # type: ignore[arg-type]

    def head_view(index: int) -> Value:
        part = hlo.slice_(b, qkv, [0, 0, index * hidden], [batch, sequence, (index + 1) * hidden], [1, 1, 1])
        return hlo.transpose(b, hlo.reshape(b, part, [batch, sequence, heads, head_size]), [0, 2, 1, 3])

    query, key, value = head_view(0), head_view(1), head_view(2)  # (B, N, S, h)
    scores = hlo.dot_general(
        b, query, key, lhs_batching=[0, 1], rhs_batching=[0, 1], lhs_contracting=[3], rhs_contracting=[3]
    )  # (B, N, S, S)
    score_shape = (batch, heads, sequence, sequence)
    scores = hlo.multiply(b, scores, ctx.splat(scale, F32, score_shape))
    mask = ctx.input(op, mask_position)
    if mask is not None:
        keep = _attention_keep(ctx, mask, batch, sequence)  # (B, S, S)
        keep_shape = (batch, sequence, sequence)
        additive = hlo.select(
            b, keep, ctx.splat(0.0, F32, keep_shape), ctx.splat(filter_value, F32, keep_shape)
        )
        scores = hlo.add(b, scores, hlo.broadcast_in_dim(b, additive, score_shape, [0, 2, 3]))
    if int(ctx.attribute(op, "unidirectional", 0)):  # type: ignore[arg-type]
        later = np.triu(np.ones((sequence, sequence), dtype=bool), k=1)
        causal = np.where(later, np.float32(filter_value), np.float32(0.0)).astype(np.float32)
        scores = hlo.add(b, scores, hlo.broadcast_in_dim(b, ctx.constant(causal, F32), score_shape, [2, 3]))
    from .onnx_nn import softmax_last

    probabilities = softmax_last(ctx, scores, 3)
    context = hlo.dot_general(
        b,
        probabilities,
        value,
        lhs_batching=[0, 1],
        rhs_batching=[0, 1],
        lhs_contracting=[3],
        rhs_contracting=[2],
    )  # (B, N, S, h)
    merged = hlo.transpose(b, context, [0, 2, 1, 3])
    return hlo.reshape(b, merged, [batch, sequence, hidden])


def _attention_keep(ctx: LoweringContext, mask: Value, batch: int, sequence: int) -> Value:
    """The (batch, sequence, keys) i1 of keys each query attends to, for each mask_index layout
    onnxruntime's CPU kernel reads (`semantics.attention_mask_format`): end positions (right padding), end
    and start positions, a 2-D or 3-D mask kept where positive."""
    b = ctx.builder
    shape = hlo.tensor_type(mask).shape
    full = (batch, sequence, sequence)
    layout = semantics.attention_mask_format(shape, batch, sequence, sequence)
    if layout is None or element_type_of(mask.type) != I32:
        ctx.unsupported(f"Attention mask_index of shape {list(shape)} and {element_type_of(mask.type)}")
    if layout in ("raw2d", "raw3d"):
        positive = hlo.compare(b, "GT", mask, ctx.splat(0, I32, shape), "SIGNED")
        return positive if layout == "raw3d" else hlo.broadcast_in_dim(b, positive, full, [0, 2])
    keys = hlo.iota(b, RankedTensorType(full, I32), 2)
    ends = hlo.slice_(b, mask, [0], [batch], [1])
    keep = hlo.compare(b, "LT", keys, hlo.broadcast_in_dim(b, ends, full, [0]), "SIGNED")
    if layout == "end_start":
        starts = hlo.broadcast_in_dim(b, hlo.slice_(b, mask, [batch], [2 * batch], [1]), full, [0])
        keep = hlo.and_(b, keep, hlo.compare(b, "GE", keys, starts, "SIGNED"))
    return keep


def _rows(ctx: LoweringContext, table: Value, indices: Value) -> Value:
    """table[indices] for a (rows, hidden) table and (batch, sequence) indices: (batch, sequence, hidden).
    An index out of range is clamped (stablehlo.gather) where onnxruntime's kernel refuses it."""
    batch, sequence = hlo.tensor_type(indices).shape
    hidden = hlo.tensor_type(table).shape[1]
    coordinates = hlo.reshape(ctx.builder, ctx.convert(indices, I64), [batch, sequence, 1])
    result_type = RankedTensorType((batch, sequence, hidden), element_type_of(table.type))
    return hlo.gather(
        ctx.builder,
        table,
        coordinates,
        result_type,
        offset_dims=[2],
        collapsed_slice_dims=[0],
        start_index_map=[0],
        index_vector_dim=2,
        slice_sizes=[1, hidden],
    )


@lowers_folding("onnx.com.microsoft.EmbedLayerNormalization")
def lower_embed_layer_norm(ctx: LoweringContext, op: Operation) -> list[Value]:
    """v = word[ids] + position[position_ids or s] (+ segment[segment_ids]); y = norm(v) * gamma + beta;
    mask_index[b] = the count of 1s in mask row b (0 without a mask); optional embedding_sum output v."""
    _f32_input(ctx, op, 2)
    tables = [ctx.input(op, p) for p in range(2, 7)]  # word, position, segment, gamma, beta
    return embed_layer_norm(ctx, op, tables, mask_position=7, position_ids_position=8)


def embed_layer_norm(
    ctx: LoweringContext,
    op: Operation,
    tables: list[Value | None],
    mask_position: int,
    position_ids_position: int | None,
) -> list[Value]:
    """EmbedLayerNormalization's outputs from its float tables (word, position, segment, gamma, beta),
    shared with QEmbedLayerNormalization's lowering (which dequantizes them first)."""
    ids = ctx.input(op, 0)
    word, position, segment, gamma, beta = tables
    assert ids is not None and word is not None and position is not None
    assert gamma is not None and beta is not None
    b = ctx.builder
    batch, sequence = static_shape(ctx, ids, "EmbedLayerNormalization's input_ids")
    position_ids = None if position_ids_position is None else ctx.input(op, position_ids_position)
    if position_ids is None:
        positions = ctx.constant(
            np.broadcast_to(np.arange(sequence), (batch, sequence)).astype(np.int64), I64
        )
    else:
        position_shape = static_shape(ctx, position_ids, "EmbedLayerNormalization's position_ids")
        flat = hlo.reshape(b, position_ids, [int(np.prod(position_shape)) // sequence, sequence])
        positions = (
            flat if position_shape[0] == batch else hlo.broadcast_in_dim(b, flat, (batch, sequence), [0, 1])
        )
    value = hlo.add(b, _rows(ctx, word, ids), _rows(ctx, position, positions))
    segment_ids = ctx.input(op, 1)
    if segment_ids is not None and segment is not None:
        value = hlo.add(b, value, _rows(ctx, segment, segment_ids))
    epsilon = float(ctx.attribute(op, "epsilon", semantics.LAYER_NORM_EPSILON))  # type: ignore[arg-type]
    y = _scale_and_shift(ctx, _normalize_last(ctx, value, epsilon, simplified=False), gamma, beta)
    mask = ctx.input(op, mask_position)
    if mask is None:
        mask_index = ctx.splat(0, I32, (batch,))
    else:
        ones = hlo.compare(b, "EQ", mask, ctx.splat(1, element_type_of(mask.type), (batch, sequence)))
        mask_index = reduce_sum(ctx, ctx.convert(ones, I32), [1])
    absent = absent_positions(op, "outputs")
    outputs = {0: y, 1: mask_index, 2: value}
    return [outputs[p] for p in range(len(op.results) + len(absent)) if p not in absent]
