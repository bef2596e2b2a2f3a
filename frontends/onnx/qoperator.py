"""QOperator nodes (QLinear*, *Integer, dynamic quantization) -> quant-typed `qconvert.*` ops.

Design: each QOperator node becomes one op of the `qconvert` dialect (qconvert/ir/dialects/qconvert.py)
whose operands and result carry `!quant.uniform` types, so that the scale / zero-point inputs disappear into
the types (exactly as `quant.qcast` does for QuantizeLinear). The `qconvert.` name (not `onnx.QLinearMatMul`)
says that the op is *lifted*: its semantics are the integer kernels of onnxruntime's CPU EP, run by
qconvert/interpret.py on qconvert/numerics/ (`requantize_mlas`, `qlinear_add_mlas`, ...), not the
ONNX reference implementation that generic `onnx.*` ops run on. Each data operand is the ONNX storage
tensor seen through `quant.scast` (`quantized_view`: a Q -> QLinear chain needs no cast pair), each
quantized result is cast back to its storage tensor with `quant.scast`. ONNX attributes are kept as
they are (`pads`, `group`, `alpha`, `transB`, `channels_last`, ...) plus `onnx.node_name`. Which node input
is an operand's data, scale or zero point is each op class's `ONNX_INPUTS` (the ONNX writer reads the same).

| ONNX node (ms: com.microsoft) | IR op `qconvert.` | operands -> result               |
|-------------------------------|-------------------|----------------------------------|
| QLinearConv                   | qlinear_conv      | x, w (per-axis 0), [bias i32] -> q |
| QLinearMatMul                 | qlinear_matmul    | a, b (per-column, axis -1) -> q  |
| MatMulInteger                 | matmul_integer    | a, b -> i32                      |
| ConvInteger                   | conv_integer      | x, w (per-axis 0) -> i32         |
| QLinearAdd / QLinearMul (ms)  | qlinear_add / _mul | a, b -> q                       |
| QLinearConcat (ms)            | qlinear_concat    | x0, x1, ... -> q                 |
| QLinearSigmoid (ms)           | qlinear_sigmoid   | x -> q                           |
| QLinearLeakyRelu (ms)         | qlinear_leaky_relu | x -> q                          |
| QLinearSoftmax (ms)           | qlinear_softmax   | x -> q (attributes axis, opset)  |
| QLinearAveragePool (ms)       | qlinear_average_pool | x -> q                        |
| QLinearGlobalAveragePool (ms) | qlinear_global_average_pool | x -> q                 |
| QGemm (ms)                    | qgemm             | a, b (per-column), [c i32] -> q or f32 |
| DynamicQuantizeMatMul (ms)    | dynamic_quantize_matmul | a f32, b (per-column), [bias] -> f32 |
| DynamicQuantizeLinear         | dynamic_quantize_linear | x f32 -> y u8, scale f32, zp u8 |

Integer ops (MatMulInteger, ConvInteger) have zero points but no scales: their operands get scale 1.0
(`real = q - zp` exactly) and their int32 result stays a plain `i32` tensor. DynamicQuantizeLinear's
scale and zero point are computed at run time, so its results cannot carry a quant type: it keeps the
ONNX storage tensors (`y` as `i8` storage with `onnx.elem_type` uint8 semantics, scalar `f32` scale,
`i8` zero point). Optional operands are trailing and recognised by count (bias, QGemm's C).

com.microsoft DynamicQuantizeLSTM stays the generic op `onnx.com.microsoft.DynamicQuantizeLSTM`: its int8 /
uint8 W and R, their scales and zero points are plain operands as in the ONNX node (one scale per direction
or per direction and gate column has no MLIR quant type on W's layout); qconvert/recurrent.py says what it
computes, and only its outputs' shapes are declared here (`_recurrent_outputs`).

A node whose scales or zero points are not constants (initializers / Constant nodes), e.g. a
MatMulInteger fed by DynamicQuantizeLinear, cannot be typed: it stays a generic `onnx.<Op>` op (the
interpreter runs the default-domain ones on onnx's reference implementation).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import onnx
from onnx import NodeProto, helper

from qconvert.ir.attributes import Attribute, StringAttr
from qconvert.ir.core import GenericOp, Value
from qconvert.ir.dialects.onnx import NODE_NAME
from qconvert.ir.dialects.qconvert import (
    RESULT,
    SCALE_SUFFIX,
    ZERO_POINT_SUFFIX,
    ConvIntegerOp,
    DynamicQuantizeLinearOp,
    DynamicQuantizeMatMulOp,
    MatMulIntegerOp,
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
from qconvert.ir.dialects.quant import DequantizeCastOp
from qconvert.ir.quant_types import QuantizedType
from qconvert.ir.types import RankedTensorType, Type, with_element_type

from . import attributes as attrs
from .blockwise import needs_signs
from .dtypes import BY_NAME, ELEMENT_TYPES, INTEGER_STORAGE, UNKNOWN_ELEMENT
from .load import MICROSOFT_DOMAIN
from .quant import NodeRef, check_storage, quant_type_of

if TYPE_CHECKING:
    from .lift import Lifter

F32 = BY_NAME["float"].ir_type
PARAMETERS = (SCALE_SUFFIX, ZERO_POINT_SUFFIX)


def _present(node: NodeProto, index: int) -> str | None:
    return node.input[index] if index < len(node.input) and node.input[index] else None


class QOperatorLifter:
    """Lifts one QOperator node through a `Lifter` (values, constants, types live there)."""

    def __init__(self, lifter: Lifter, node: NodeProto, ref: NodeRef) -> None:
        self.lifter = lifter
        self.node = node
        self.ref = ref

    # Parameters ---------------------------------------------------------------------------------
    def is_constant(self, name: str | None) -> bool:
        return name is None or name in self.lifter.initializers or name in self.lifter.constant_arrays

    def storage_of(self, name: str):  # -> ElementType
        storage = ELEMENT_TYPES.get(self.lifter.onnx_type(name))
        if storage is None:
            raise self.ref.error(f"the element type of '{name}' is unknown")
        check_storage(self.ref, storage, quantize=False)
        if storage.name not in INTEGER_STORAGE:  # onnxruntime's QOperator kernels are integer only
            raise self.ref.error(f"'{name}' is {storage.name}; a QOperator op takes integer storage")
        return storage

    def quant_type(
        self, data: str, scale: str | None, zero_point: str | None, shape: tuple[int, ...] | None, axis: int
    ) -> QuantizedType:
        storage = self.storage_of(zero_point or data)
        data_type = ELEMENT_TYPES.get(self.lifter.onnx_type(data))
        if zero_point is not None and data_type is not None and data_type.name != storage.name:
            # onnxruntime refuses the model (one type parameter bound to two types): so do we, by name
            raise self.ref.error(
                f"zero point '{zero_point}' is {storage.name} but its data '{data}' is {data_type.name}"
            )
        zero = None if zero_point is None else self.lifter.constant_array(self.ref, zero_point, "zero point")
        if scale is None:  # *Integer ops: scale 1, real = q - zp
            scale_array = np.ones(() if zero is None else zero.shape, np.float32)
            scale_type = BY_NAME["float"]
        else:
            scale_array = self.lifter.constant_array(self.ref, scale, "scale")
            scale_type = ELEMENT_TYPES.get(self.lifter.onnx_type(scale)) or BY_NAME["float"]
        if zero is not None and zero.size == 1 and scale_array.size > 1:
            zero = np.full(scale_array.shape, zero.reshape(-1)[0], zero.dtype)
        if scale_array.ndim > 1 and scale_array.size > 1:
            # [D1, D2, M, 1] / [D1, D2, 1, N] per-row / per-column parameters of MatMul: keep the vector
            squeezed = [d for d in scale_array.shape if d != 1]
            if len(squeezed) != 1:
                raise self.ref.error(f"scale of shape {list(scale_array.shape)} is not supported")
            scale_array = scale_array.reshape(-1)
            zero = None if zero is None else zero.reshape(-1)
        return quant_type_of(
            self.ref,
            scale=scale_array,
            scale_type=scale_type,
            zero_point=zero,
            storage=storage,
            expressed=F32,  # type: ignore[arg-type]
            input_shape=shape,
            axis=axis,
            block_size=0,
        )

    def operand(self, index: int, scale: int | None, zero_point: int | None, axis: int = 1) -> Value:
        name = self.node.input[index]
        value = self.lifter.value(self.node, name)
        shape = value.type.shape if isinstance(value.type, RankedTensorType) else None
        scale_name = None if scale is None else _present(self.node, scale)
        zero_name = None if zero_point is None else _present(self.node, zero_point)
        quant = self.quant_type(name, scale_name, zero_name, shape, axis)
        return self.lifter.quantized_view(value, quant)

    def named(self, op_class: type[QOperatorOp], name: str, axis: int = 1) -> Value:
        """Operand `name` of `op_class`, read from the node inputs its ONNX layout gives (data, scale, zp)."""
        return self.operand(*op_class.onnx_positions(name), axis=axis)

    def optional(self, op_class: type[QOperatorOp], name: str) -> Value | None:
        """The plain optional operand `name` (a bias, QGemm's C), None when the node leaves it out."""
        position = op_class.ONNX_INPUTS.index(name)
        return self.plain(position) if _present(self.node, position) else None

    def result_type(self, scale: int, zero_point: int, storage_like: str) -> Type:
        output = self.node.output[0]
        shape_type = self.lifter.ir_type(output)
        zero_name = _present(self.node, zero_point)
        quant = self.quant_type(storage_like, _present(self.node, scale), zero_name, None, 0)
        return with_element_type(shape_type, quant)

    # Emission -----------------------------------------------------------------------------------
    def emit(
        self, op_class: type[QOperatorOp], operands: list[Value], result_types: list[Type]
    ) -> QOperatorOp:
        attributes: dict[str, Attribute] = {a.name: attrs.from_onnx_attribute(a) for a in self.node.attribute}
        attributes[NODE_NAME] = StringAttr(self.node.name)
        op = op_class(operands, result_types, attributes)
        self.lifter.insert(op)
        present = [o for o in self.node.output if o]
        for output, result in zip(present, op.results):
            element = getattr(result.type, "element_type", None)
            if isinstance(element, QuantizedType):
                storage_name = self.lifter.onnx_type(output) or self.storage_onnx_type(element)
                storage = ELEMENT_TYPES[storage_name]
                from .lift import storage_cast

                stored = self.lifter.insert(
                    storage_cast(result, with_element_type(result.type, storage.ir_type))
                ).results[0]
                self.lifter.values[output] = stored
                self.lifter.onnx_types[output] = storage.onnx_type
            else:
                self.lifter.values[output] = result
        return op

    def storage_onnx_type(self, element: QuantizedType) -> int:
        name = ("int" if element.is_signed else "uint") + str(element.storage_type_integral_width)
        return BY_NAME[name].onnx_type

    def float_result_type(self) -> Type:
        """The inferred output type, f32 where inference left the element unknown (contrib ops)."""
        inferred = self.lifter.ir_type(self.node.output[0])
        if getattr(inferred, "element_type", None) == UNKNOWN_ELEMENT:
            return with_element_type(inferred, F32)
        return inferred

    def plain(self, index: int) -> Value:
        return self.lifter.value(self.node, self.node.input[index])

    def quantized_output(self, op_class: type[QOperatorOp], operands: list[Value]) -> None:
        scale, zero_point = (op_class.ONNX_INPUTS.index(f"{RESULT}{suffix}") for suffix in PARAMETERS)
        storage_like = _present(self.node, zero_point) or self.node.input[0]
        self.emit(op_class, operands, [self.result_type(scale, zero_point, storage_like)])


def _with_optional(
    q: QOperatorLifter, op_class: type[QOperatorOp], operands: list[Value], name: str
) -> list[Value]:
    optional = q.optional(op_class, name)
    return operands if optional is None else [*operands, optional]


def _qlinear_conv(q: QOperatorLifter) -> None:
    operands = [q.named(QLinearConvOp, "x"), q.named(QLinearConvOp, "w", axis=0)]
    q.quantized_output(QLinearConvOp, _with_optional(q, QLinearConvOp, operands, "bias"))


def _qlinear_matmul(q: QOperatorLifter) -> None:
    operands = [q.named(QLinearMatMulOp, "a", axis=-2), q.named(QLinearMatMulOp, "b", axis=-1)]
    q.quantized_output(QLinearMatMulOp, operands)


def _integer(op_class: type[QOperatorOp], axes: tuple[int, int]) -> Callable[[QOperatorLifter], None]:
    """MatMulInteger (rows of a, columns of b) / ConvInteger (x per tensor, w per output channel)."""

    def lift(q: QOperatorLifter) -> None:
        names = [d.name for d in op_class.operand_defs()]
        operands = [q.named(op_class, name, axis=axis) for name, axis in zip(names, axes, strict=True)]
        q.emit(op_class, operands, [q.lifter.ir_type(q.node.output[0])])

    return lift


def _binary(op_class: type[QOperatorOp]) -> Callable[[QOperatorLifter], None]:
    def lift(q: QOperatorLifter) -> None:
        q.quantized_output(op_class, [q.named(op_class, "a"), q.named(op_class, "b")])

    return lift


def _unary(op_class: type[QOperatorOp]) -> Callable[[QOperatorLifter], None]:
    def lift(q: QOperatorLifter) -> None:
        q.quantized_output(op_class, [q.named(op_class, "x")])

    return lift


def _qlinear_concat(q: QOperatorLifter) -> None:
    first = len(QLinearConcatOp.ONNX_INPUTS)  # then data, scale, zero point per input
    count = (len(q.node.input) - first) // 3
    operands = [q.operand(first + 3 * i, first + 1 + 3 * i, first + 2 + 3 * i) for i in range(count)]
    q.quantized_output(QLinearConcatOp, operands)


def _qgemm(q: QOperatorLifter) -> None:
    trans_b = next((a.i for a in q.node.attribute if a.name == "transB"), 0)
    operands = [q.named(QGemmOp, "a"), q.named(QGemmOp, "b", axis=0 if trans_b else 1)]
    for name, operand in zip(("A", "B"), operands):  # Gemm's operands are matrices (a rank-4 A: fuzz, exit 3)
        shape = getattr(operand.type, "shape", None)
        if shape is not None and len(shape) != 2:
            raise q.ref.error(f"input {name} has rank {len(shape)}; QGemm takes matrices (rank 2)")
    operands = _with_optional(q, QGemmOp, operands, "c")
    if _present(q.node, QGemmOp.ONNX_INPUTS.index(f"{RESULT}{SCALE_SUFFIX}")):
        q.quantized_output(QGemmOp, operands)
    else:
        q.emit(QGemmOp, operands, [q.float_result_type()])


def _dynamic_quantize_matmul(q: QOperatorLifter) -> None:
    op_class = DynamicQuantizeMatMulOp
    operands = [q.plain(op_class.ONNX_INPUTS.index("a")), q.named(op_class, "b", axis=-1)]
    q.emit(op_class, _with_optional(q, op_class, operands, "bias"), [q.float_result_type()])


def _matmul_nbits(q: QOperatorLifter) -> None:
    """com.microsoft MatMulNBits -> the unpacked integer weight [K, N] (one value per byte) through a blocked
    `quant.dcast` (blocks along K), block signs where a scale is negative (frontends/onnx/blockwise.py), then
    a float `onnx.MatMul` and the optional bias `onnx.Add`. onnxruntime's kernel at accuracy_level 0 / 1
    dequantizes B and runs a float32 GEMM (MLAS, its own summation order), so the product agrees within the
    float32 bound of a K-term sum, not bit for bit; the dequantized weight itself is exact."""
    from .blockwise import split_scale_signs, unpack_matmul_nbits

    node, ref, lifter = q.node, q.ref, q.lifter
    k, n = int(_int_attr(node, "K", 0)), int(_int_attr(node, "N", 0))  # type: ignore[call-overload]
    bits = int(_int_attr(node, "bits", 4))  # type: ignore[call-overload]
    block_size = int(_int_attr(node, "block_size", 0))  # type: ignore[call-overload]
    accuracy_level = int(_int_attr(node, "accuracy_level", 0))  # type: ignore[call-overload]
    if bits not in (4, 8):
        raise ref.error(f"bits {bits} is not supported (4 and 8 are)")
    if k <= 0 or n <= 0 or block_size < 16 or block_size & (block_size - 1):
        raise ref.error(
            f"K {k}, N {n}, block_size {block_size}: K, N > 0 and a power-of-two block_size >= 16"
        )
    if accuracy_level == 4:
        raise ref.error(
            "accuracy_level 4 is not supported: onnxruntime then quantizes A to int8 per block and sums "
            "integer products (a different result from the float32 product qconvert computes)"
        )
    if _present(node, 4):
        raise ref.error("g_idx (act-order group indices) is not supported")
    zero_name = _present(node, 3)
    if zero_name is not None and q.lifter.onnx_type(zero_name) != onnx.TensorProto.UINT8:
        raise ref.error("zero points of a float type are not supported (packed uint8 zero points are)")
    packed = lifter.constant_array(ref, node.input[1], "B")
    scales = lifter.constant_array(ref, node.input[2], "scales")
    zeros = None if zero_name is None else lifter.constant_array(ref, zero_name, "zero points")
    blocks = -(-k // block_size)
    if packed.size != n * blocks * block_size * bits // 8 or scales.size != n * blocks:
        raise ref.error(
            f"B of shape {list(packed.shape)} and scales of shape {list(scales.shape)} do not fit K {k}, "
            f"N {n}, bits {bits}, block_size {block_size}"
        )
    weight, scale, zero = unpack_matmul_nbits(packed, scales, zeros, k, n, bits, block_size)
    padded = weight.shape[0]  # K rounded up to whole blocks: the blocked type needs them
    signs = None
    if needs_signs(scale):
        scale, signs = split_scale_signs(scale)
    scale_entry = ELEMENT_TYPES.get(lifter.onnx_type(node.input[2])) or BY_NAME["float"]
    storage = BY_NAME["uint8"]
    quant = quant_type_of(
        ref,
        scale=scale,
        scale_type=scale_entry,
        zero_point=zero,
        storage=storage,
        expressed=scale_entry.ir_type,  # type: ignore[arg-type]
        input_shape=(padded, n),
        axis=0,
        block_size=block_size,
    )
    stored = lifter.constant(weight, storage.onnx_type, f"{node.input[1]}_unpacked")
    dequantized = lifter.insert(
        DequantizeCastOp(
            lifter.quantized_view(stored, quant),
            RankedTensorType((padded, n), scale_entry.ir_type),
            attributes={NODE_NAME: StringAttr(node.name)},
        )
    ).results[0]
    if signs is not None:
        dequantized = lifter.apply_block_signs(
            dequantized, signs, 0, block_size, scale_entry.onnx_type, node.name
        )
    if padded != k:  # a ragged last block: its padding rows go
        bounds = [lifter.constant(np.array([v], np.int64), onnx.TensorProto.INT64) for v in (0, k, 0)]
        sliced = GenericOp(
            "onnx.Slice",
            [dequantized, *bounds],
            [RankedTensorType((k, n), scale_entry.ir_type)],
            {NODE_NAME: StringAttr(node.name)},
        )
        dequantized = lifter.insert(sliced).results[0]
    name = StringAttr(node.name)
    result_type = q.float_result_type()
    product = lifter.insert(
        GenericOp("onnx.MatMul", [q.plain(0), dequantized], [result_type], {NODE_NAME: name})
    )
    result = product.results[0]
    if _present(node, 5):
        added = GenericOp("onnx.Add", [result, q.plain(5)], [result_type], {NODE_NAME: name})
        result = lifter.insert(added).results[0]
    lifter.values[node.output[0]] = result


def _dynamic_quantize_linear(q: QOperatorLifter) -> None:
    types = [q.lifter.ir_type(o) for o in q.node.output if o]
    op = q.emit(DynamicQuantizeLinearOp, [q.plain(0)], types)
    for output in [o for o in q.node.output if o][0::2]:  # y and y_zero_point are uint8
        q.lifter.onnx_types[output] = BY_NAME["uint8"].onnx_type
    del op


QOPERATOR_LIFTERS: dict[type[QOperatorOp], Callable[[QOperatorLifter], None]] = {
    QLinearConvOp: _qlinear_conv,
    QLinearMatMulOp: _qlinear_matmul,
    MatMulIntegerOp: _integer(MatMulIntegerOp, (-2, -1)),
    ConvIntegerOp: _integer(ConvIntegerOp, (1, 0)),
    DynamicQuantizeLinearOp: _dynamic_quantize_linear,
    QLinearAddOp: _binary(QLinearAddOp),
    QLinearMulOp: _binary(QLinearMulOp),
    QLinearConcatOp: _qlinear_concat,
    QLinearSigmoidOp: _unary(QLinearSigmoidOp),
    QLinearLeakyReluOp: _unary(QLinearLeakyReluOp),
    QLinearSoftmaxOp: _unary(QLinearSoftmaxOp),
    QLinearAveragePoolOp: _unary(QLinearAveragePoolOp),
    QLinearGlobalAveragePoolOp: _unary(QLinearGlobalAveragePoolOp),
    QGemmOp: _qgemm,
    DynamicQuantizeMatMulOp: _dynamic_quantize_matmul,
}

LIFTERS: dict[tuple[str, str], tuple[Callable[[QOperatorLifter], None], tuple[int, ...]]] = {
    # (domain, op_type) -> (lift function, indices of scale / zero-point inputs that must be constant)
    **{
        (op_class.ONNX_DOMAIN, op_class.ONNX_OP_TYPE): (lift, op_class.onnx_parameter_positions())
        for op_class, lift in QOPERATOR_LIFTERS.items()
    },
    (MICROSOFT_DOMAIN, "MatMulNBits"): (_matmul_nbits, (1, 2, 3)),
}


def lift_qoperator(lifter: Lifter, node: NodeProto, domain: str, ref: NodeRef) -> bool:
    """Lift `node` if it is a QOperator node with constant parameters; False to keep it generic."""
    entry = LIFTERS.get((domain, node.op_type))
    if entry is None:
        return False
    lift, parameters = entry
    q = QOperatorLifter(lifter, node, ref)
    if (domain, node.op_type) == (MICROSOFT_DOMAIN, "QLinearConcat"):
        parameters = tuple(i for i in range(len(node.input)) if i < 2 or (i - 2) % 3 != 0)
    if not all(q.is_constant(_present(node, i)) for i in parameters):
        return False
    lift(q)
    return True


# Shape inference for com.microsoft QOperator outputs ---------------------------------------------------
def _known_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    graph = model.graph
    known = {t.name: helper.make_tensor_type_proto(t.data_type, list(t.dims)) for t in graph.initializer}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            known.setdefault(info.name, info.type)
    return known


def _dims(type_proto: onnx.TypeProto | None) -> list[int] | None:
    """Static dims of a tensor type, None when the rank or any dim is unknown."""
    if type_proto is None or not type_proto.tensor_type.HasField("shape"):
        return None
    dims = type_proto.tensor_type.shape.dim
    return [d.dim_value for d in dims] if all(d.HasField("dim_value") for d in dims) else None


def _int_attr(node: NodeProto, name: str, default: object) -> object:
    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


# contrib QOperator ops whose output has the element type of one input: (op type, that input's position)
SAME_TYPE_OUTPUTS = {
    "QLinearAdd": 0,
    "QLinearMul": 0,
    "QLinearSigmoid": 0,
    "QLinearLeakyRelu": 0,
    "QLinearSoftmax": 0,
    "QLinearGlobalAveragePool": 0,
    "QLinearAveragePool": 0,
    "QLinearConcat": 1,  # Y_zero_point
}


def _same_type_output(node: NodeProto, known: dict[str, onnx.TypeProto]) -> int:
    """The element type of a contrib QOperator node's output when its dims are not known, or 0."""
    position = SAME_TYPE_OUTPUTS.get(node.op_type)
    if position is None or len(node.input) <= position or node.input[position] not in known:
        return 0
    return known[node.input[position]].tensor_type.elem_type


def _contrib_output(node: NodeProto, known: dict[str, onnx.TypeProto]) -> tuple[int, list[int]] | None:
    """(element type, static shape) of a contrib QOperator node's output, None if not inferable."""
    inputs = [known.get(name) if name else None for name in node.input]
    shapes = [_dims(t) for t in inputs]
    first = inputs[0].tensor_type.elem_type if inputs and inputs[0] is not None else 0
    op = node.op_type
    if (
        op in ("QLinearAdd", "QLinearMul")
        and shapes[0] is not None
        and len(shapes) > 3
        and shapes[3] is not None
    ):
        return first, list(np.broadcast_shapes(tuple(shapes[0]), tuple(shapes[3])))
    if op in ("QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax") and shapes[0] is not None:
        return first, shapes[0]
    if op == "QLinearGlobalAveragePool" and shapes[0] is not None:
        x = shapes[0]
        if _int_attr(node, "channels_last", 0):
            return first, [x[0]] + [1] * (len(x) - 2) + [x[-1]]
        return first, x[:2] + [1] * (len(x) - 2)
    if (
        op == "QLinearAveragePool"
        and shapes[0] is not None
        and _int_attr(node, "auto_pad", b"NOTSET")
        in (
            b"NOTSET",
            "NOTSET",
        )
    ):
        x = shapes[0]
        channels_last = bool(_int_attr(node, "channels_last", 0))
        spatial = x[1:-1] if channels_last else x[2:]
        kernel = list(_int_attr(node, "kernel_shape", []))  # type: ignore[call-overload]
        strides = list(_int_attr(node, "strides", [1] * len(kernel)))  # type: ignore[call-overload]
        pads = list(_int_attr(node, "pads", [0] * 2 * len(kernel)))  # type: ignore[call-overload]
        ceil_mode = bool(_int_attr(node, "ceil_mode", 0))
        out = []
        for i, size in enumerate(spatial):
            span = size + pads[i] + pads[i + len(kernel)] - kernel[i]
            out.append((-(-span // strides[i]) if ceil_mode else span // strides[i]) + 1)
        return first, ([x[0], *out, x[-1]] if channels_last else [x[0], x[1], *out])
    if op == "QLinearConcat" and len(inputs) > 2 and all(s is not None for s in shapes[2::3]):
        parts = shapes[2::3]
        axis = int(_int_attr(node, "axis", 0)) % len(parts[0])  # type: ignore[arg-type, call-overload]
        shape = list(parts[0])  # type: ignore[arg-type]
        shape[axis] = sum(p[axis] for p in parts)  # type: ignore[index]
        elem = inputs[1].tensor_type.elem_type if inputs[1] is not None else 0
        return elem, shape
    if op == "QGemm" and shapes[0] is not None and len(shapes) > 3 and shapes[3] is not None:
        m = shapes[0][1] if _int_attr(node, "transA", 0) else shapes[0][0]
        n = shapes[3][0] if _int_attr(node, "transB", 0) else shapes[3][1]
        quantized = len(node.input) > 7 and node.input[7]
        return (first if quantized else onnx.TensorProto.FLOAT), [m, n]
    if op == "DynamicQuantizeMatMul" and shapes[0] is not None and len(shapes) > 1 and shapes[1] is not None:
        a, b = shapes[0], shapes[1]
        batch = list(np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))) if len(b) > 2 else a[:-1]
        rows = a[-2:-1] if len(b) > 2 else []
        return onnx.TensorProto.FLOAT, [*batch, *rows, b[-1]]
    return None


def _recurrent_outputs(node: NodeProto, known: dict[str, onnx.TypeProto]) -> list[tuple[str, list[int]]]:
    """(name, static shape) of the DynamicQuantizeLSTM outputs not statically typed yet, by the rule of
    qconvert/recurrent.py; none while X's shape is unknown or the attributes are bad (reported later)."""
    from qconvert.errors import InputError
    from qconvert.recurrent import decode_attributes, output_shapes

    x_shape = _dims(known.get(node.input[0])) if node.input else None
    if x_shape is None or len(x_shape) != 3:
        return []
    values = {}
    for attribute in node.attribute:
        value = helper.get_attribute_value(attribute)
        if isinstance(value, bytes):
            value = value.decode()
        elif isinstance(value, list):
            value = [v.decode() if isinstance(v, bytes) else v for v in value]
        values[attribute.name] = value
    try:
        attributes = decode_attributes(node.op_type, values, f"node '{node.name}'")
    except InputError:
        return []
    shapes = output_shapes(attributes, x_shape)
    return [
        (name, list(shape))
        for name, shape in zip(node.output, shapes)
        if name and _dims(known.get(name)) is None
    ]


def _matmul_like_output(node: NodeProto, known: dict[str, onnx.TypeProto]) -> onnx.ValueInfoProto | None:
    """Y of MatMulNBits (A's element type) or MatMulIntegerToFloat with a 2-D B (a_scale's element type):
    A's dims (symbolic ones kept) with the last one N (the attribute, or B's last dim)."""
    a = known.get(node.input[0]) if node.input else None
    if a is None or not a.tensor_type.HasField("shape") or not a.tensor_type.shape.dim:
        return None
    dims: list[int | str | None] = [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in a.tensor_type.shape.dim
    ]
    if node.op_type == "MatMulNBits":
        dims[-1] = int(_int_attr(node, "N", 0))  # type: ignore[call-overload]
        return helper.make_tensor_value_info(node.output[0], a.tensor_type.elem_type, dims)
    b = _dims(known.get(node.input[1]))
    scale = known.get(node.input[2]) if len(node.input) > 2 else None
    if b is None or len(b) != 2 or len(dims) < 2 or scale is None:
        return None
    dims[-1] = b[1]
    return helper.make_tensor_value_info(node.output[0], scale.tensor_type.elem_type, dims)


# Float ops of onnxruntime's transformer optimizer whose outputs a shape rule types (`_transformer_outputs`).
TRANSFORMER_OPS = frozenset(
    {
        "Gelu", "BiasGelu", "FastGelu", "QuickGelu", "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization", "EmbedLayerNormalization", "Attention", "QAttention",
        "QEmbedLayerNormalization",
    }
)  # fmt: skip


def _symbolic_dims(type_proto: onnx.TypeProto | None) -> list[int | str | None] | None:
    """A tensor type's dims, symbolic ones kept (None where unnamed); None when the rank is unknown."""
    if type_proto is None or not type_proto.tensor_type.HasField("shape"):
        return None
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
        for d in type_proto.tensor_type.shape.dim
    ]


def _transformer_outputs(node: NodeProto, known: dict[str, onnx.TypeProto]) -> list[onnx.ValueInfoProto]:
    """Typed outputs of a TRANSFORMER_OPS node from its inputs' dims (symbolic ones kept): the elementwise
    ops and Skip*LayerNormalization (outputs 0 and 3) are shaped like input 0; EmbedLayerNormalization is
    (batch, sequence, hidden of the word embedding), mask_index int32 (batch,); Attention is (batch,
    sequence, V's hidden size: qkv_hidden_sizes[2] or weights' columns / 3). QAttention and
    QEmbedLayerNormalization (quantize_dynamic of an optimized model) likewise, with float results."""
    inputs = [known.get(name) if name else None for name in node.input]
    first = inputs[0] if inputs else None
    dims = _symbolic_dims(first)
    if first is None or dims is None:
        return []
    element = first.tensor_type.elem_type
    outputs: list[tuple[int, int, list[int | str | None]]] = []  # (position, element type, dims)
    op = node.op_type
    if op in ("Gelu", "BiasGelu", "FastGelu", "QuickGelu"):
        outputs = [(0, element, dims)]
    elif op in ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization"):
        outputs = [(0, element, dims), (3, element, dims)]
    elif op in ("EmbedLayerNormalization", "QEmbedLayerNormalization") and len(dims) == 2 and len(inputs) > 2:
        word = _dims(inputs[2])
        quantized = op == "QEmbedLayerNormalization"  # the float result is typed like the word table's scale
        typed_by = (inputs[8] if len(inputs) > 8 else None) if quantized else inputs[2]
        if word is None or len(word) != 2 or typed_by is None:
            return []
        word_type = typed_by.tensor_type.elem_type
        outputs = [
            (0, word_type, [*dims, word[1]]),
            (1, onnx.TensorProto.INT32, dims[:1]),
            (2, word_type, [*dims, word[1]]),
        ]
    elif op in ("Attention", "QAttention") and len(dims) == 3 and len(inputs) > 1:
        bias = inputs[2] if len(inputs) > 2 else None
        if bias is not None:  # the result is typed like the bias (QAttention's input is quantized)
            element = bias.tensor_type.elem_type
        elif op == "QAttention":
            return []
        weights = _dims(inputs[1])
        sizes: list[int] | None = _int_attr(node, "qkv_hidden_sizes", None)  # type: ignore[assignment]
        if sizes:
            hidden = int(sizes[2])
        elif weights is not None and len(weights) == 2:
            hidden = weights[1] // 3
        else:
            return []
        outputs = [(0, element, [*dims[:2], hidden])]
    return [
        helper.make_tensor_value_info(node.output[position], element_type, shape)
        for position, element_type, shape in outputs
        if position < len(node.output) and node.output[position]
    ]


def infer_contrib_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX's shape inference stops at com.microsoft ops: declare their outputs' types and infer again.

    Each round types the contrib QOperator outputs whose inputs are typed, then reruns
    `onnx.shape_inference` so that the default-domain ops downstream get typed too.
    """
    contrib = [
        n
        for n in model.graph.node
        if n.domain == MICROSOFT_DOMAIN
        and (
            (MICROSOFT_DOMAIN, n.op_type) in LIFTERS
            or n.op_type in ("DynamicQuantizeLSTM", "MatMulIntegerToFloat")
            or n.op_type in TRANSFORMER_OPS
        )
    ]
    for _ in range(len(contrib)):
        known = _known_types(model)
        added = False
        for node in contrib:
            if node.op_type == "DynamicQuantizeLSTM":
                for name, shape in _recurrent_outputs(node, known):
                    typed = helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, shape)
                    graph_outputs = [v for v in model.graph.output if v.name == name]
                    for output in graph_outputs:  # a graph output keeps its entry, with static dims
                        output.type.CopyFrom(typed.type)
                    stale = [v for v in model.graph.value_info if v.name == name]  # symbolic dims
                    for info in stale:
                        model.graph.value_info.remove(info)
                    if not graph_outputs:
                        model.graph.value_info.append(typed)
                    added = True
                continue
            if node.op_type in ("MatMulNBits", "MatMulIntegerToFloat") and node.output:
                # Typed from A's dims, symbolic ones kept: retyped when a later round makes them static.
                typed_matmul = _matmul_like_output(node, known)
                if typed_matmul is not None and typed_matmul.type != known.get(node.output[0]):
                    for output in model.graph.output:
                        if output.name == typed_matmul.name:
                            output.type.CopyFrom(typed_matmul.type)
                    for info in [v for v in model.graph.value_info if v.name == typed_matmul.name]:
                        model.graph.value_info.remove(info)
                    model.graph.value_info.append(typed_matmul)
                    added = True
                continue
            if node.op_type in TRANSFORMER_OPS:
                # Typed from the inputs' dims (symbolic kept), retyped when a later round makes them static.
                for typed in _transformer_outputs(node, known):
                    if typed.type == known.get(typed.name):
                        continue
                    for output in model.graph.output:
                        if output.name == typed.name:
                            output.type.CopyFrom(typed.type)
                    for info in [v for v in model.graph.value_info if v.name == typed.name]:
                        model.graph.value_info.remove(info)
                    model.graph.value_info.append(typed)
                    added = True
                continue
            if not node.output or _dims(known.get(node.output[0])) is not None:
                continue
            found = _contrib_output(node, known)
            if found is None or not found[0]:
                # Dynamic dims: declare the element type alone, so that ops downstream (a Transpose, a
                # DequantizeLinear) are typed; the shape comes when the dims are pinned.
                elem_type = _same_type_output(node, known)
                if elem_type and node.output[0] not in known:
                    model.graph.value_info.append(
                        helper.make_tensor_value_info(node.output[0], elem_type, None)
                    )
                    added = True
                continue
            for info in [v for v in model.graph.value_info if v.name == node.output[0]]:
                model.graph.value_info.remove(info)  # an element type declared alone before
            model.graph.value_info.append(helper.make_tensor_value_info(node.output[0], found[0], found[1]))
            added = True
        if not added:
            break
        model = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
    return model
