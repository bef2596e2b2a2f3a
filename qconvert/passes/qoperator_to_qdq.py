"""`--qoperator-to-qdq`: the lifted QOperator ops as the QDQ form their ONNX definitions spell,
`quant.dcast -> onnx.<Op> -> quant.qcast`.

A QLinearConv is by its ONNX definition `QuantizeLinear(Conv(DequantizeLinear(x), DequantizeLinear(w),
DequantizeLinear(bias at s_x * s_w)))`; a backend that reads the QDQ form (the TOSA route, which lowers
StableHLO's fused quantized form and cannot read QLinear ops written out as onnxruntime's kernels) reads
QOperator models through this pass. What the result computes is then the backend's rounding of the QDQ
form (TOSA's fixed-point rescale), not onnxruntime's QLinear kernels; `check` compares both.

    %y = "qconvert.qlinear_conv"(%x, %w, %bias) {pads = ...} : (!qx, !qw, tensor<16xi32>) -> !qy

becomes

    %b = quant.scast %bias : tensor<16xi32> to tensor<16x!quant.uniform<i32:f32:0, {s_x*s_w...}>>
    %0 = quant.dcast %x ... %1 = quant.dcast %w ... %2 = quant.dcast %b
    %3 = "onnx.Conv"(%0, %1, %2) {pads = ...} : (...) -> tensor<...xf32>
    %y = quant.qcast %3 : tensor<...xf32> to !qy

Storage ops between QOperator ops (the frontend's `quant.scast -> onnx.MaxPool on i8 -> quant.scast` back
to the same quantized type) become `dcast -> onnx.MaxPool on f32 -> qcast` when the op only moves or
selects values (`VALUE_PRESERVING`): for one scale and zero point, quantizing the dequantized values gives
the same integers back, so both forms are equal.

Left as they are (the backend refuses them by name): integer ops without scales (MatMulInteger,
ConvInteger), dynamic quantization, channels-last pools, QGemm with a C input and alpha <= 0, QLinearSoftmax
of opset < 13.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from qconvert.ir.attributes import IntegerAttr, StringAttr
from qconvert.ir.core import Builder, GenericOp, Operation, Value
from qconvert.ir.dialects.onnx import NODE_NAME
from qconvert.ir.dialects.qconvert import (
    QGemmOp,
    QLinearAddOp,
    QLinearAveragePoolOp,
    QLinearConcatOp,
    QLinearConvOp,
    QLinearGlobalAveragePoolOp,
    QLinearLeakyReluOp,
    QLinearMatMulOp,
    QLinearMulOp,
    QLinearSigmoidOp,
    QLinearSoftmaxOp,
    QOperatorOp,
)
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp, StorageCastOp
from qconvert.ir.quant_types import (
    QuantizedType,
    UniformQuantizedPerAxisType,
    UniformQuantizedType,
    uniform_params,
)
from qconvert.ir.types import I32, Type, element_type_of, with_element_type
from qconvert.passes import ModulePass, PassResult, register_pass

__all__ = ["QOperatorToQdqPass", "VALUE_PRESERVING", "qoperator_to_qdq"]

# QOperator op -> the default-domain ONNX op its definition quantizes around.
FLOAT_OPS: dict[type[QOperatorOp], str] = {
    QLinearConvOp: "onnx.Conv",
    QLinearMatMulOp: "onnx.MatMul",
    QGemmOp: "onnx.Gemm",
    QLinearAddOp: "onnx.Add",
    QLinearMulOp: "onnx.Mul",
    QLinearSigmoidOp: "onnx.Sigmoid",
    QLinearLeakyReluOp: "onnx.LeakyRelu",
    QLinearAveragePoolOp: "onnx.AveragePool",
    QLinearGlobalAveragePoolOp: "onnx.GlobalAveragePool",
    QLinearConcatOp: "onnx.Concat",
    QLinearSoftmaxOp: "onnx.Softmax",
}

# ONNX ops that only move, select or compare values: on the storage of one quantized type they equal the
# same op on the dequantized values, quantized back (the first operand is the data; others are shapes).
VALUE_PRESERVING = frozenset(
    {
        "onnx.MaxPool",
        "onnx.Reshape",
        "onnx.Flatten",
        "onnx.Transpose",
        "onnx.Squeeze",
        "onnx.Unsqueeze",
        "onnx.Identity",
        "onnx.Slice",
        "onnx.DepthToSpace",
        "onnx.SpaceToDepth",
        "onnx.Tile",
        "onnx.Expand",
    }
)

# Attributes that say how onnxruntime's kernel was asked to run, not what the float op computes.
_KERNEL_ATTRIBUTES = ("channels_last", "opset")


def _float_type(type_: Type) -> Type:
    quantized = element_type_of(type_)
    assert isinstance(quantized, QuantizedType) and quantized.expressed_type is not None
    return with_element_type(type_, quantized.expressed_type)


def _bias_type(op: QOperatorOp, bias: Value, x: Value, w: Value, alpha: float = 1.0) -> Type:
    """The i32 quantized type of a QLinearConv bias / QGemm C: scale `alpha * s_x * s_w`, per output
    channel when the weight is per axis, zero point 0 (the ONNX definition of both ops)."""
    x_type, w_type = element_type_of(x.type), element_type_of(w.type)
    assert isinstance(x_type, QuantizedType) and isinstance(w_type, QuantizedType)
    x_scale = float(uniform_params(x_type).scale.reshape(-1)[0])
    w_scales = [alpha * x_scale * float(s) for s in uniform_params(w_type).scale.reshape(-1)]
    bias_type = bias.type
    expressed = x_type.expressed_type
    if len(w_scales) == 1:
        element: QuantizedType = UniformQuantizedType(
            storage_type=I32, expressed_type=expressed, scale=w_scales[0]
        )
    else:
        element = UniformQuantizedPerAxisType(
            storage_type=I32,
            expressed_type=expressed,
            scales=tuple(w_scales),
            zero_points=(0,) * len(w_scales),
            quantized_dimension=0,  # a bias / C is one value per output channel / column
        )
    return with_element_type(bias_type, element)


def _int_attribute(op: Operation, name: str, default: int) -> int:
    attribute = op.attributes.get(name)
    return int(attribute.value) if isinstance(attribute, IntegerAttr) else default  # type: ignore[arg-type]


def _float_attribute(op: Operation, name: str, default: float) -> float:
    attribute = op.attributes.get(name)
    value = getattr(attribute, "value", None)
    return float(value) if value is not None else default  # type: ignore[arg-type]


def why_not_rewritten(op: QOperatorOp) -> str | None:
    """Why this pass leaves `op` as it is (None when it rewrites it)."""
    if type(op) not in FLOAT_OPS:
        return "an integer or dynamic-quantization op without static scales on every side"
    if _int_attribute(op, "channels_last", 0):
        return "a channels-last pool (channels_last = 1)"
    if isinstance(op, QGemmOp) and op.c is not None and _float_attribute(op, "alpha", 1.0) <= 0:
        return "a QGemm with a C input and a non-positive alpha (C's scale is alpha * s_a * s_b)"
    if isinstance(op, QLinearSoftmaxOp) and _int_attribute(op, "opset", 13) < 13:
        return "a QLinearSoftmax of opset < 13 (softmax over the flattened trailing dims)"
    return None


def _rewrite_qoperator(op: QOperatorOp) -> None:
    b = Builder.before(op)
    named = op.named_operands()
    label = op.attributes.get(NODE_NAME)
    quantize_attributes = {NODE_NAME: StringAttr(f"{label.value}_QuantizeLinear")} if label else {}
    floats: list[Value] = []
    for name, value in named.items():
        if name in ("bias", "c"):
            x, w = (named["x"], named["w"]) if name == "bias" else (named["a"], named["b"])
            alpha = _float_attribute(op, "alpha", 1.0) if name == "c" else 1.0
            value = b.insert(StorageCastOp(value, _bias_type(op, value, x, w, alpha))).result
        floats.append(b.insert(DequantizeCastOp(value, _float_type(value.type))).result)
    attributes = {k: v for k, v in op.attributes.items() if k not in _KERNEL_ATTRIBUTES}
    result_type = op.results[0].type
    is_quantized = isinstance(element_type_of(result_type), QuantizedType)
    float_result_type = _float_type(result_type) if is_quantized else result_type
    float_op = b.insert(GenericOp(FLOAT_OPS[type(op)], floats, [float_result_type], attributes))
    result = float_op.results[0]
    if is_quantized:
        result = b.insert(QuantizeCastOp(result, result_type, attributes=quantize_attributes)).result
    op.results[0].replace_all_uses_with(result)
    op.erase()


def _storage_source(value: Value) -> Value | None:
    """The quantized value a `quant.scast` (quantized -> storage) reads, else None."""
    producer = value.owner_op()
    is_view = isinstance(producer, StorageCastOp) and isinstance(
        element_type_of(producer.input.type), QuantizedType
    )
    return producer.input if is_view else None  # type: ignore[union-attr]


def _rewrite_storage_op(op: Operation) -> bool:
    """`scast(q) -> op on storage -> scast back to q's type` as `dcast(q) -> op on floats -> qcast`."""
    if op.name not in VALUE_PRESERVING or len(op.results) != 1 or not op.operands:
        return False
    source = _storage_source(op.operands[0])
    result = op.results[0]
    users = [user for user, _ in result.uses]
    if source is None or not users or not all(isinstance(user, StorageCastOp) for user in users):
        return False
    quantized = element_type_of(source.type)
    if any(element_type_of(user.results[0].type) != quantized for user in users):
        return False  # a change of parameters: not a plain data movement
    b = Builder.before(op)
    data = b.insert(DequantizeCastOp(source, _float_type(source.type))).result
    float_type = with_element_type(result.type, quantized.expressed_type)  # type: ignore[union-attr]
    float_op = b.insert(GenericOp(op.name, [data, *op.operands[1:]], [float_type], dict(op.attributes)))
    requantized = b.insert(QuantizeCastOp(float_op.results[0], users[0].results[0].type)).result
    for user in users:
        user.results[0].replace_all_uses_with(requantized)
        user.erase()
    view = op.operands[0].owner_op()
    op.erase()
    if view is not None and not view.results[0].uses:
        view.erase()  # the storage view only this op read
    return True


def qoperator_to_qdq(module: Operation) -> list[tuple[Operation, str]]:
    """Rewrite every QOperator op this pass can (and the storage ops between them) in place; returns the
    QOperator ops left, each with why."""
    left: list[tuple[Operation, str]] = []
    for op in list(module.walk()):
        if isinstance(op, QOperatorOp):
            reason = why_not_rewritten(op)
            if reason is None:
                _rewrite_qoperator(op)
            else:
                left.append((op, reason))
    for op in list(module.walk()):
        if op.parent is not None:
            _rewrite_storage_op(op)
    return left


@register_pass
@dataclass(frozen=True, kw_only=True)
class QOperatorToQdqPass(ModulePass):
    name: ClassVar[str] = "qoperator-to-qdq"

    def run(self, module: Operation) -> PassResult:
        before = sum(1 for op in module.walk() if isinstance(op, QOperatorOp))
        left = qoperator_to_qdq(module)
        return PassResult(changed=len(left) != before)
