"""The per-node bound of `qconvert check` for float nodes: how far a float output may be from onnxruntime's.

Quantization nodes are bit-exact (nodes.py). Every other node is judged against onnxruntime's own output
for it (optimizations off) within a bound derived from float32 arithmetic (`eps` is the machine epsilon of
the output's dtype: 2**-23 for float32; `ulp(v)` the spacing of floats at |v|). Both sides carry rounding
error, so each bound covers twice what one correct implementation may be off by. By op family:

- **exact**: data movement, selection, comparisons, integer / bool / shape outputs, Relu, Max/Min, Floor:
  bit-exact (NaN equals NaN).
- **multiplicative** (Mul, Div, Sqrt, Reciprocal, Neg, Abs ...): one rounding each side, <= 4 ulp(ref).
- **additive** (Add, Sub, Sum, Mean ...): |diff| <= 4 eps max(|ref|, |inputs|): a correctly rounded sum is
  exact relative to its inputs, and its result can cancel to far below them.
- **transcendental** (Exp, Log, Tanh, Sigmoid, Erf, Pow, Gelu ...): onnxruntime's vectorised kernels
  (MLAS, Eigen) are accurate to a few ulps: |diff| <= 16 eps (|ref| + A), with A = 1 for the bounded
  functions (Tanh, Sigmoid, Erf, Log, Sin ...: MLAS clamps Sigmoid's input, so its tiny outputs are only
  absolutely accurate), A = |x| for x-times-something functions (Gelu, Softplus, HardSwish, Elu ...), and
  A = 0 for Exp and Pow (relative only).
- **reduction** (MatMul, Gemm, Conv, ReduceSum/Mean/L1/L2, AveragePool ...): a sum of n products in any
  order is within gamma_n = n eps of the exact value relative to M = sum |a_i b_i|, so two implementations
  are within 2 (n + 2) eps M. M is the op run by onnxruntime on |inputs| (|alpha|, |beta| for Gemm); n is
  the reduction length (K of a MatMul, C_in/group * kernel area of a Conv, the reduced elements).
- **normalization** (Softmax, LayerNormalization, BatchNormalization, InstanceNormalization, LSTM ...):
  a reduction followed by transcendental / division steps: 2 (n + 16) eps max|ref| with n the normalized
  length (BatchNormalization in inference mode: n = 1, so a BatchNormalization that runs in training mode,
  as onnx's reference does with a legacy `momentum` attribute, fails at that node).
- **unclassified** float ops: the normalization bound with n = input elements / output elements, so the
  report says which nodes only had that loose bound.

Every non-exact bound also allows the smallest normal float (2**-126 for float32), so a kernel that flushes
subnormal results to zero is not a failure. NaN must be NaN on both sides, infinities equal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from onnx import NodeProto, helper

EXACT, MULTIPLICATIVE, ADDITIVE, TRANSCENDENTAL, REDUCTION, NORMALIZATION, UNCLASSIFIED = (
    "exact",
    "multiplicative",
    "additive",
    "transcendental",
    "reduction",
    "normalization",
    "unclassified",
)

EXACT_OPS = frozenset(
    {
        "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Tile", "Concat",
        "Split", "Slice", "Gather", "GatherElements", "GatherND", "ScatterND", "ScatterElements", "Pad",
        "Where", "Shape", "Size", "Constant", "ConstantOfShape", "Cast", "CastLike", "Relu", "Max", "Min",
        "MaxPool", "GlobalMaxPool", "ReduceMax", "ReduceMin", "ArgMax", "ArgMin", "TopK", "Floor", "Ceil",
        "Round", "Sign", "Clip", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And",
        "Or", "Xor", "IsNaN", "IsInf", "NonZero", "DepthToSpace", "SpaceToDepth", "Dropout", "OneHot",
        "Trilu", "EyeLike", "Compress", "Unique", "ReverseSequence", "Mod", "BitShift",
        "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "Optional", "OptionalGetElement",
    }
)  # fmt: skip
MULTIPLICATIVE_OPS = frozenset(
    {
        "Mul",
        "Div",
        "Sqrt",
        "Reciprocal",
        "Neg",
        "Abs",
        "HardSigmoid",
        "Scale",
        "Affine",
        "LeakyRelu",
        "PRelu",
        "ThresholdedRelu",
    }
)
ADDITIVE_OPS = frozenset({"Add", "Sub", "Sum", "Mean", "CumSum", "BiasAdd", "Range", "Shrink"})
BOUNDED_TRANSCENDENTAL_OPS = frozenset(
    {"Tanh", "Sigmoid", "Erf", "Log", "Sin", "Cos", "Softsign", "Atan", "Asin", "Acos", "Asinh", "Atanh"}
)
SCALED_TRANSCENDENTAL_OPS = frozenset(
    {
        "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Softplus", "Elu", "Selu", "Celu", "Mish",
        "HardSwish", "Swish",
    }
)  # fmt: skip
RELATIVE_TRANSCENDENTAL_OPS = frozenset({"Exp", "Pow", "Sinh", "Cosh", "Tan", "Acosh"})
REDUCTION_OPS = frozenset(
    {
        "MatMul", "Gemm", "Conv", "ConvTranspose", "ReduceSum", "ReduceMean", "ReduceL1", "ReduceL2",
        "ReduceSumSquare", "GlobalAveragePool", "AveragePool", "Einsum", "FusedMatMul", "LpPool",
        "GlobalLpPool",
    }
)  # fmt: skip
NORMALIZATION_OPS = frozenset(
    {
        "Softmax", "LogSoftmax", "LayerNormalization", "BatchNormalization", "InstanceNormalization",
        "GroupNormalization", "LpNormalization", "MeanVarianceNormalization", "SkipLayerNormalization",
        "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "ReduceLogSumExp",
        "ReduceLogSum", "ReduceProd", "Resize", "Upsample", "LSTM", "GRU", "RNN", "Attention",
        "MultiHeadAttention", "Hardmax",
    }
)  # fmt: skip
TRANSCENDENTAL_ULPS = 16
ELEMENTWISE_ULPS = 4

# Ops whose magnitude M = op(|inputs|) is computed by onnxruntime (`magnitude_node`).
MAGNITUDE_OPS = REDUCTION_OPS


def family(node: NodeProto) -> str:
    """The op family that decides `node`'s bound (see the module docstring)."""
    op = node.op_type
    if op in EXACT_OPS:
        return EXACT
    if op in MULTIPLICATIVE_OPS:
        return MULTIPLICATIVE
    if op in ADDITIVE_OPS:
        return ADDITIVE
    if op in BOUNDED_TRANSCENDENTAL_OPS | SCALED_TRANSCENDENTAL_OPS | RELATIVE_TRANSCENDENTAL_OPS:
        return TRANSCENDENTAL
    if op in REDUCTION_OPS:
        return REDUCTION
    if op in NORMALIZATION_OPS:
        return NORMALIZATION
    return UNCLASSIFIED


def _attribute(node: NodeProto, name: str, default: object) -> object:
    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


def magnitude_node(node: NodeProto) -> NodeProto:
    """`node` with |alpha| and |beta| (Gemm): run on |inputs| it gives M = sum |a_i b_i| per output."""
    copy = NodeProto()
    copy.CopyFrom(node)
    for attribute in copy.attribute:
        if attribute.name in ("alpha", "beta") and attribute.type == attribute.FLOAT:
            attribute.f = abs(attribute.f)
    return copy


def _size(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1


def reduction_length(node: NodeProto, inputs: Sequence[np.ndarray | None], output: np.ndarray) -> int:
    """n: how many terms one output element sums (upper bound), per op."""
    op = node.op_type
    first = inputs[0] if inputs and inputs[0] is not None else None
    second = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
    if op in ("MatMul", "FusedMatMul") and first is not None:
        return int(first.shape[-1]) if first.ndim else 1
    if op == "Gemm" and first is not None and first.ndim == 2:
        return int(first.shape[0] if _attribute(node, "transA", 0) else first.shape[1]) + 1
    if op in ("Conv", "ConvTranspose") and second is not None and second.ndim >= 2:
        channels = second.shape[1] if op == "Conv" else second.shape[0]
        return int(channels) * _size(second.shape[2:]) + 1
    if op in ("AveragePool", "LpPool"):
        kernel = _attribute(node, "kernel_shape", [])
        return max(1, _size(list(kernel)))  # type: ignore[arg-type]
    if op == "Einsum":  # whatever the equation contracts, no more terms than the largest operand has
        return max(1, max((a.size for a in inputs if a is not None), default=1))
    if first is not None and output.size:  # Reduce*, GlobalAveragePool: elements per output element
        return max(1, first.size // output.size)
    return 1


def normalized_length(node: NodeProto, inputs: Sequence[np.ndarray | None], output: np.ndarray) -> int:
    """n: how many elements one normalization (softmax row, layer-norm row, recurrence) combines."""
    op = node.op_type
    first = inputs[0] if inputs and inputs[0] is not None else None
    if first is None or first.ndim == 0:
        return 1
    if op == "BatchNormalization":
        return 1
    if op in ("Softmax", "LogSoftmax", "Hardmax", "LpNormalization"):
        axis = int(_attribute(node, "axis", -1))  # type: ignore[arg-type]
        return int(first.shape[axis % first.ndim])
    if op in ("LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization"):
        axis = int(_attribute(node, "axis", -1)) % first.ndim  # type: ignore[arg-type]
        return _size(first.shape[axis:])
    if op in ("InstanceNormalization", "GroupNormalization") and first.ndim > 2:
        return _size(first.shape[2:]) * (int(first.shape[1]) if op == "GroupNormalization" else 1)
    if op in ("LSTM", "GRU", "RNN"):
        hidden = int(_attribute(node, "hidden_size", 1))  # type: ignore[arg-type]
        return _size(first.shape[:1]) * (hidden + int(first.shape[-1]))
    if output.size:
        return max(1, max(first.size // output.size, int(max(first.shape))))
    return 1


@dataclass(frozen=True, slots=True)
class FloatJudgement:
    """One output judged within its bound: elements over it, the largest |diff| / bound, and the rule."""

    elements: int
    outside: int
    max_abs_diff: float
    max_ratio: float  # max |diff| / bound over the elements (0 when all are equal); inf where bound is 0
    rule: str


def _broadcast_abs_max(arrays: Sequence[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
    result = np.zeros(shape, np.float64)
    for array in arrays:
        if array.dtype.kind != "f":
            continue
        try:
            result = np.maximum(result, np.broadcast_to(np.abs(array.astype(np.float64)), shape))
        except ValueError:  # an operand that does not broadcast to the output (a shape or axes input)
            continue
    return result


def float_bound(
    node: NodeProto,
    kind: str,
    inputs: Sequence[np.ndarray | None],
    reference: np.ndarray,
    magnitude: np.ndarray | None,
) -> tuple[np.ndarray, str]:
    """The per-element bound on |ours - onnxruntime| for a float output of `node`, and the rule in words."""
    eps = float(np.finfo(reference.dtype).eps)
    tiny = float(np.finfo(reference.dtype).tiny)
    ref = np.abs(reference.astype(np.float64))
    ref = np.where(np.isfinite(ref), ref, 0.0)
    op = node.op_type
    if kind == MULTIPLICATIVE:
        return ELEMENTWISE_ULPS * eps * ref + tiny, f"{ELEMENTWISE_ULPS} ulp"
    if kind == ADDITIVE:
        scale = np.maximum(ref, _broadcast_abs_max([a for a in inputs if a is not None], reference.shape))
        return ELEMENTWISE_ULPS * eps * scale + tiny, f"{ELEMENTWISE_ULPS} eps max(|ref|, |inputs|)"
    if kind == TRANSCENDENTAL:
        if op in BOUNDED_TRANSCENDENTAL_OPS:
            extra, words = np.ones_like(ref), "|ref| + 1"
        elif op in SCALED_TRANSCENDENTAL_OPS and inputs and inputs[0] is not None:
            extra, words = _broadcast_abs_max([inputs[0]], reference.shape), "|ref| + |x|"
        else:
            extra, words = np.zeros_like(ref), "|ref|"
        return TRANSCENDENTAL_ULPS * eps * (ref + extra) + tiny, f"{TRANSCENDENTAL_ULPS} eps ({words})"
    if kind == REDUCTION and magnitude is not None and magnitude.shape == reference.shape:
        n = reduction_length(node, inputs, reference)
        mag = np.abs(magnitude.astype(np.float64))
        mag = np.where(np.isfinite(mag), mag, np.inf)
        return 2 * (n + 2) * eps * np.maximum(mag, ref) + tiny, f"2 (n + 2) eps sum|a b|, n = {n}"
    if kind in (REDUCTION, NORMALIZATION, UNCLASSIFIED):
        n = normalized_length(node, inputs, reference)
        top = float(ref.max()) if ref.size else 0.0
        rule = f"2 (n + {TRANSCENDENTAL_ULPS}) eps max|ref|, n = {n}"
        if kind == REDUCTION:
            rule += " (no magnitude from onnxruntime)"
        return np.full(ref.shape, 2 * (n + TRANSCENDENTAL_ULPS) * eps * top + tiny), rule
    return np.zeros(ref.shape), "bit-exact"


def judge_output(
    node: NodeProto,
    kind: str,
    inputs: Sequence[np.ndarray | None],
    reference: np.ndarray,
    ours: np.ndarray,
    magnitude: np.ndarray | None = None,
) -> FloatJudgement:
    """`ours` against onnxruntime's `reference` for one output of a non-quantization node."""
    reference, ours = np.asarray(reference), np.asarray(ours)
    elements = int(reference.size)
    if reference.shape != ours.shape or reference.dtype != ours.dtype:
        rule = (
            f"shape/dtype {list(ours.shape)} {ours.dtype} vs onnxruntime's "
            f"{list(reference.shape)} {reference.dtype}"
        )
        return FloatJudgement(elements, elements, float("inf"), float("inf"), rule)
    if reference.dtype.kind != "f" or kind == EXACT:
        bits = np.dtype(f"u{reference.dtype.itemsize}") if reference.dtype.kind == "f" else None
        if bits is not None:
            equal = (reference.view(bits) == ours.view(bits)) | (np.isnan(reference) & np.isnan(ours))
        else:
            equal = reference == ours
        outside = elements - int(np.count_nonzero(equal))
        diff = 0.0
        if outside:
            with np.errstate(invalid="ignore", over="ignore"):
                delta = np.abs(reference.astype(np.float64) - ours.astype(np.float64))[~equal]
            diff = float(np.nan_to_num(delta, nan=np.inf).max())
        return FloatJudgement(elements, outside, diff, float("inf") if outside else 0.0, "bit-exact")
    bound, rule = float_bound(node, kind, inputs, reference, magnitude)
    ref64, ours64 = reference.astype(np.float64), ours.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(ref64 - ours64)
    same_special = (np.isnan(ref64) & np.isnan(ours64)) | (np.isinf(ref64) & (ref64 == ours64))
    diff = np.where(same_special, 0.0, np.where(np.isnan(diff), np.inf, diff))
    outside = int(np.count_nonzero(diff > bound))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(diff > 0, diff / bound, 0.0)
    return FloatJudgement(
        elements,
        outside,
        float(diff.max()) if elements else 0.0,
        float(ratio.max()) if elements else 0.0,
        rule,
    )


def node_inputs(node: NodeProto, values: Mapping[str, np.ndarray]) -> list[np.ndarray | None]:
    return [values.get(name) if name else None for name in node.input]
