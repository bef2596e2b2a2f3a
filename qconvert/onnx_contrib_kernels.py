"""Interpreter kernels of the com.microsoft float ops onnxruntime's transformer optimizer writes
(`onnxruntime.transformers.optimizer.optimize_model`): Gelu, BiasGelu, FastGelu, QuickGelu,
SkipLayerNormalization, SkipSimplifiedLayerNormalization, EmbedLayerNormalization and Attention, and
their quantized forms QAttention and QEmbedLayerNormalization.

onnx's reference implementation knows no com.microsoft op, so without these the interpreter could not
run an optimized model at all (`check` said INCOMPLETE where `--backend stablehlo` passed). Each kernel
follows onnxruntime's CPU kernel's order of operations in float32, as the StableHLO lowerings of
backends/stablehlo/onnx_contrib.py do; the rules both read (attribute defaults, input positions,
Attention's mask layouts and scale) are in qconvert/onnx_semantics.py:

- FastGelu, QuickGelu: MLAS's tanh / logistic (`qconvert.numerics`), every other step one float32
  rounding in onnxruntime's order: bit-exact with onnxruntime.
- Gelu, BiasGelu: MLAS's erf (`erf_mlas`), `(0.5 v) (erf(v / sqrt 2) + 1)`: bit-exact with onnxruntime.
- Skip*LayerNormalization, EmbedLayerNormalization: sums over the hidden dim in numpy's (pairwise)
  order, not onnxruntime's sequential one: within a few ulp of the output's magnitude (check's
  normalization bound).
- Attention: QKV = x W + b, per head softmax(scale Q Kᵀ + mask) V with numpy's BLAS products: within
  check's normalization bound. Every mask_index layout onnxruntime's CPU kernel reads (right-padding
  end positions, end and start positions, a 2-D or 3-D 0/1 mask), unidirectional, qkv_hidden_sizes and
  an additive attention_bias are run; past state and present outputs are refused (InputError).
- QAttention, QEmbedLayerNormalization (what quantize_dynamic makes of an optimized model's Attention and
  EmbedLayerNormalization): the projection is the exact int32 product of the centered operands with
  MLAS's scale-bias output (`qconvert.numerics`), the tables dequantized as `f32(q - zp) * scale`; the
  rest is Attention's / EmbedLayerNormalization's kernel, within the same bound.

A kernel takes (op, inputs by ONNX position with None where absent, opset) and returns the outputs by
ONNX position (`interpret.ONNX_KERNELS`' signature), or None for a non-float32 input (onnxruntime's CPU
kernels of these ops are float32), which the interpreter then reports as having no reference.
"""

from __future__ import annotations

import numpy as np

from qconvert import onnx_semantics as semantics
from qconvert.errors import InputError
from qconvert.ir.core import Operation
from qconvert.ir.dialects.onnx import absent_positions, op_label
from qconvert.numerics.integer_accumulation import exact_integer_matmul, wrap_int32
from qconvert.numerics.onnxruntime_elementwise import erf_mlas
from qconvert.numerics.onnxruntime_kernels import scale_output_mlas
from qconvert.numerics.onnxruntime_recurrent import logistic_mlas, tanh_mlas
from qconvert.onnx_kernels import Inputs, OnnxKernel, attribute

F32 = np.float32


def _float32(array: np.ndarray | None) -> bool:
    return array is not None and array.dtype == np.float32


def _with_bias(x: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    return x if bias is None else (x + bias).astype(F32)


def fast_gelu(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """v = x (+ bias); t = tanh_mlas(v (C v v + B)); y = (0.5 v) (t + 1), each step rounded to float32."""
    del op, opset
    if not _float32(inputs[0]):
        return None
    value = _with_bias(inputs[0], inputs[1] if len(inputs) > 1 else None)  # type: ignore[arg-type]
    cubic = ((F32(semantics.FAST_GELU_C) * value * value).astype(F32) + F32(semantics.FAST_GELU_B)).astype(
        F32
    )
    inner = tanh_mlas((value * cubic).astype(F32))
    return [((F32(0.5) * value).astype(F32) * (inner + F32(1.0))).astype(F32)]


def bias_gelu(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """Gelu / BiasGelu: v = x (+ bias); y = (0.5 v) (erf_mlas(v * f32(1 / sqrt 2)) + 1)."""
    del op, opset
    if not _float32(inputs[0]):
        return None
    value = _with_bias(inputs[0], inputs[1] if len(inputs) > 1 else None)  # type: ignore[arg-type]
    error_function = erf_mlas((value * (F32(1.0) / np.sqrt(F32(2.0)))).astype(F32))
    return [((F32(0.5) * value).astype(F32) * (error_function + F32(1.0))).astype(F32)]


def quick_gelu(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """y = x * logistic_mlas(alpha x)."""
    del opset
    x = inputs[0]
    if x is None or not _float32(x):
        return None
    alpha = F32(attribute(op, "alpha", semantics.QUICK_GELU_ALPHA))  # type: ignore[arg-type]
    return [(x * logistic_mlas((x * alpha).astype(F32))).astype(F32)]


def _normalize_last(value: np.ndarray, epsilon: float, simplified: bool) -> np.ndarray:
    """onnxruntime's layer norm over the last dim (the lowering's order): mean = Σv/N, d = sqrt(Σv²/N -
    mean² + eps) (simplified: sqrt(Σv²/N + eps)), y = (v - mean) / d (simplified: v / d)."""
    count = F32(value.shape[-1])
    mean_square = (np.sum(value * value, axis=-1, dtype=F32, keepdims=True) / count).astype(F32)
    if simplified:
        variance = mean_square
    else:
        mean = (np.sum(value, axis=-1, dtype=F32, keepdims=True) / count).astype(F32)
        variance = (mean_square - (mean * mean).astype(F32)).astype(F32)
        value = (value - mean).astype(F32)
    deviation = np.sqrt((variance + F32(epsilon)).astype(F32)).astype(F32)
    return (value / deviation).astype(F32)


def _scale_and_shift(y: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None) -> np.ndarray:
    product = (y * gamma).astype(F32)
    return product if beta is None else (product + beta).astype(F32)


def skip_layer_norm(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """Skip(Simplified)LayerNormalization: v = input + skip (+ bias); y = norm(v) * gamma (+ beta);
    outputs (y, -, -, v). The training outputs 1 and 2 (mean, inverse deviation) are refused, as the
    lowering refuses them."""
    del opset
    x, skip, gamma = inputs[0], inputs[1], inputs[2]
    if x is None or skip is None or gamma is None or not _float32(x):
        return None
    present = len(op.results) + len(absent_positions(op, "outputs"))
    if any(p in (1, 2) and p not in absent_positions(op, "outputs") for p in range(present)):
        raise InputError(f"{op_label(op)}: the mean / inverse standard deviation outputs (training only)")
    simplified = op.name.endswith("SkipSimplifiedLayerNormalization")
    beta_position, bias_position = semantics.skip_layer_norm_positions(simplified)
    beta = inputs[beta_position] if beta_position is not None and beta_position < len(inputs) else None
    bias = inputs[bias_position] if bias_position < len(inputs) else None
    value = _with_bias((x + skip).astype(F32), bias)
    epsilon = float(attribute(op, "epsilon", semantics.LAYER_NORM_EPSILON))  # type: ignore[arg-type]
    y = _scale_and_shift(_normalize_last(value, epsilon, simplified), gamma, beta)
    return [y, None, None, value]


def embed_layer_norm(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """EmbedLayerNormalization: v = word[ids] + position[position_ids or s] (+ segment[segment_ids]);
    y = norm(v) * gamma + beta; mask_index[b] = the count of 1s in mask row b (0 without a mask);
    optional embedding_sum output v. Ids out of range: InputError, as onnxruntime refuses them."""
    del opset
    ids, segment_ids, word, position, segment, gamma, beta = (list(inputs) + [None] * 7)[:7]
    mask = inputs[7] if len(inputs) > 7 else None
    position_ids = inputs[8] if len(inputs) > 8 else None
    if ids is None or word is None or position is None or gamma is None or beta is None:
        return None
    if not _float32(word):
        return None
    batch, sequence = ids.shape

    def lookup(table: np.ndarray, indices: np.ndarray, what: str) -> np.ndarray:
        if indices.size and (indices.min() < 0 or indices.max() >= table.shape[0]):
            raise InputError(f"{op_label(op)}: {what} out of range [0, {table.shape[0]})")
        return table[indices.astype(np.int64)]

    if position_ids is None:
        positions = np.broadcast_to(np.arange(sequence), (batch, sequence))
    else:
        positions = np.broadcast_to(position_ids.reshape(-1, sequence), (batch, sequence))
    value = (lookup(word, ids, "input_ids") + lookup(position, positions, "position ids")).astype(F32)
    if segment is not None and segment_ids is not None:
        value = (value + lookup(segment, segment_ids, "segment_ids")).astype(F32)
    epsilon = float(attribute(op, "epsilon", semantics.LAYER_NORM_EPSILON))  # type: ignore[arg-type]
    y = _scale_and_shift(_normalize_last(value, epsilon, simplified=False), gamma, beta)
    if mask is None:
        mask_index = np.zeros(batch, np.int32)
    else:
        mask_index = np.count_nonzero(mask.reshape(batch, -1) == 1, axis=1).astype(np.int32)
    return [y, mask_index, value]


def _attention_of_qkv(
    op: Operation, qkv: np.ndarray, mask_index: np.ndarray | None, attention_bias: np.ndarray | None
) -> np.ndarray:
    """Attention after the QKV projection (B, S, q + k + v hidden): per head softmax(scale Q Kᵀ + mask) V,
    heads concatenated. The additive mask is mask_filter_value where mask_index masks a key (every CPU
    layout, `semantics.attention_keep_mask`), plus mask_filter_value again above the diagonal when
    unidirectional, plus attention_bias when given."""
    heads = int(attribute(op, "num_heads", 0))  # type: ignore[arg-type]
    sizes = attribute(op, "qkv_hidden_sizes", None)
    q_size, k_size, v_size = [int(s) for s in sizes] if sizes else [int(qkv.shape[-1]) // 3] * 3  # type: ignore[union-attr]
    if heads <= 0 or q_size != k_size or q_size % heads or v_size % heads:
        raise InputError(f"{op_label(op)}: num_heads {heads} does not divide the Q/K/V sizes")
    batch, sequence, _ = qkv.shape

    def head_view(start: int, size: int) -> np.ndarray:
        part = qkv[..., start : start + size]
        return part.reshape(batch, sequence, heads, size // heads).transpose(0, 2, 1, 3)  # (B, N, S, h)

    query, key, value = head_view(0, q_size), head_view(q_size, k_size), head_view(q_size + k_size, v_size)
    scale = F32(semantics.attention_scale(float(attribute(op, "scale", 0.0)), q_size // heads))  # type: ignore[arg-type]
    scores = ((query @ key.transpose(0, 1, 3, 2)).astype(F32) * scale).astype(F32)  # (B, N, S, S)
    filter_value = F32(attribute(op, "mask_filter_value", semantics.ATTENTION_MASK_FILTER_VALUE))  # type: ignore[arg-type]
    additive = np.zeros((batch, sequence, sequence), F32)
    if mask_index is not None:
        try:
            keep = semantics.attention_keep_mask(mask_index, batch, sequence, sequence)
        except ValueError as error:
            raise InputError(f"{op_label(op)}: {error}") from None
        additive = np.where(keep, F32(0.0), filter_value).astype(F32)
    if int(attribute(op, "unidirectional", 0)):  # type: ignore[arg-type]
        later = np.triu(np.ones((sequence, sequence), dtype=bool), k=1)
        additive = (additive + np.where(later, filter_value, F32(0.0))).astype(F32)
    scores = (scores + additive[:, None, :, :]).astype(F32)
    if attention_bias is not None:
        scores = (scores + attention_bias).astype(F32)
    shifted = (scores - scores.max(axis=-1, keepdims=True)).astype(F32)
    exponentials = np.exp(shifted).astype(F32)
    probabilities = (exponentials / np.sum(exponentials, axis=-1, dtype=F32, keepdims=True)).astype(F32)
    context = (probabilities @ value).astype(F32)  # (B, N, S, h_v)
    return context.transpose(0, 2, 1, 3).reshape(batch, sequence, v_size)


def attention(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """onnxruntime's fused self-attention: QKV = x W + b, then `_attention_of_qkv`."""
    del opset
    x, weights, bias, mask_index = (list(inputs) + [None] * 4)[:4]
    extra = list(inputs[4:]) + [None] * 4
    past, attention_bias = extra[0], extra[1]
    if x is None or weights is None or not _float32(x):
        return None
    if past is not None or len(op.results) > 1:
        raise InputError(f"{op_label(op)}: Attention with past state or present outputs is not run")
    qkv = (x @ weights).astype(F32)
    if bias is not None:
        qkv = (qkv + bias).astype(F32)
    return [_attention_of_qkv(op, qkv, mask_index, attention_bias)]


def _scalar_or_columns(values: np.ndarray | None, columns: int, what: str, op: Operation) -> np.ndarray:
    """A scalar or one value per column, as a flat array (0 when absent)."""
    flat = np.zeros(1) if values is None else np.asarray(values).reshape(-1)
    if flat.size not in (1, columns):
        raise InputError(f"{op_label(op)}: {what} has {flat.size} values, not 1 or {columns}")
    return flat


def quantized_attention(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """QAttention (what quantize_dynamic makes of an optimized model's Attention): the exact int32 product
    of `input - input_zero_point` and `weight - weight_zero_point` (scalar or per column), MLAS's
    scale-bias output `f32(acc) * f32(input_scale * weight_scale) + bias`, then `_attention_of_qkv`."""
    del opset
    x, weights, bias, x_scale, w_scale, mask_index, x_zero, w_zero = (list(inputs) + [None] * 8)[:8]
    past = inputs[8] if len(inputs) > 8 else None
    if x is None or weights is None or bias is None or x_scale is None or w_scale is None:
        return None
    if past is not None or len(op.results) > 1:
        raise InputError(f"{op_label(op)}: QAttention with past state or present outputs is not run")
    columns = int(weights.shape[-1])
    lhs = x.astype(np.int64) - int(_scalar_or_columns(x_zero, 1, "input_zero_point", op)[0])
    rhs = weights.astype(np.int64) - _scalar_or_columns(w_zero, columns, "weight_zero_point", op).astype(
        np.int64
    )
    accumulator = wrap_int32(exact_integer_matmul(lhs, rhs))
    multiplier = (
        F32(np.asarray(x_scale).reshape(-1)[0])
        * _scalar_or_columns(w_scale, columns, "weight_scale", op).astype(F32)
    ).astype(F32)
    qkv = (scale_output_mlas(accumulator, multiplier) + bias).astype(F32)
    return [_attention_of_qkv(op, qkv, mask_index, None)]


def quantized_embed_layer_norm(op: Operation, inputs: Inputs, opset: int) -> list[np.ndarray | None] | None:
    """QEmbedLayerNormalization: the uint8 tables and gamma / beta dequantized as onnxruntime's kernel does,
    `f32(q - zero_point) * scale`, then `embed_layer_norm` (no embedding_sum output)."""
    padded = list(inputs) + [None] * 18
    ids, segment_ids, mask = padded[0], padded[1], padded[7]
    tables = padded[2:7]  # word, position, segment, gamma, beta
    scales, zero_points = padded[8:13], padded[13:18]
    if ids is None or any(tables[i] is None or scales[i] is None for i in (0, 1, 3, 4)):
        return None
    dequantized = [
        None
        if table is None
        else (
            (table.astype(np.int32) - (0 if zero is None else np.asarray(zero).astype(np.int32))).astype(F32)
            * F32(np.asarray(scale).reshape(-1)[0])
        ).astype(F32)
        for table, scale, zero in zip(tables, scales, zero_points)
    ]
    results = embed_layer_norm(op, [ids, segment_ids, *dequantized, mask], opset)
    return None if results is None else results[:2]


CONTRIB_KERNELS: dict[str, OnnxKernel] = {
    "onnx.com.microsoft.FastGelu": fast_gelu,
    "onnx.com.microsoft.Gelu": bias_gelu,
    "onnx.com.microsoft.BiasGelu": bias_gelu,
    "onnx.com.microsoft.QuickGelu": quick_gelu,
    "onnx.com.microsoft.SkipLayerNormalization": skip_layer_norm,
    "onnx.com.microsoft.SkipSimplifiedLayerNormalization": skip_layer_norm,
    "onnx.com.microsoft.EmbedLayerNormalization": embed_layer_norm,
    "onnx.com.microsoft.Attention": attention,
    "onnx.com.microsoft.QAttention": quantized_attention,
    "onnx.com.microsoft.QEmbedLayerNormalization": quantized_embed_layer_norm,
}
