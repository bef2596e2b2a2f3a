"""The `qconvert` dialect: the ops the ONNX frontend creates that no upstream dialect has.

- `qconvert.storage_cast`: `quant.scast` for float storage (`tensor<4xf8E4M3FN>` <-> its quant type), which
  upstream's scast refuses (its storage must be a signless integer);
- one op per QOperator node the frontend lifts (frontends/onnx/qoperator.py): `qconvert.qlinear_conv`,
  `qconvert.qgemm`, `qconvert.dynamic_quantize_linear`, ... Their scale and zero-point inputs live in the
  `!quant.uniform` types of their operands and result; their semantics are onnxruntime's CPU kernels
  (qconvert/interpret.py, qconvert/numerics), not the ONNX reference implementation.

Every op prints and parses in MLIR's generic form (`"qconvert.qlinear_conv"(%x, %w) {...} : (...) -> ...`):
there is no custom assembly, so lifted text reads as it did when these ops were unregistered.

Each QOperator op class names its operands (`x`, `w`, `bias`, ... as accessors) and carries its ONNX node
layout, `ONNX_INPUTS`: the node's inputs in schema order, spelled with the IR names: an operand name is its
storage tensor, `<operand>_scale` / `<operand>_zero_point` are the parameters in that operand's quant type,
`y_scale` / `y_zero_point` those of the result. The frontend reads the node through that table and the ONNX
writer writes the node back through it, so the layout is written once.
"""

from __future__ import annotations

import functools
from typing import ClassVar, overload

from qconvert.ir.core import Operation, Value, register_op
from qconvert.ir.dialects.quant import StorageCastOp, check_quantization, check_same_scalar_or_tensor_shape
from qconvert.ir.quant_types import QuantizedType
from qconvert.ir.types import FloatType, Type, element_type_of

SCALE_SUFFIX = "_scale"
ZERO_POINT_SUFFIX = "_zero_point"
RESULT = "y"  # the name of a quantized result's parameters in ONNX_INPUTS (`y_scale`, `y_zero_point`)


class OperandDef:
    """A named operand of a `QOperatorOp` (xDSL's `operand_def`): `op.x` is `op.operands[index]`."""

    __slots__ = ("index", "name")

    def __init__(self, index: int) -> None:
        self.index = index
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, op: None, owner: type) -> OperandDef: ...
    @overload
    def __get__(self, op: Operation, owner: type) -> Value: ...
    def __get__(self, op: Operation | None, owner: type) -> Value | OperandDef:
        return self if op is None else op.operands[self.index]


class OptionalOperandDef(OperandDef):
    """A trailing optional operand (a bias, QGemm's C): None when the ONNX node had none."""

    __slots__ = ()

    @overload  # type: ignore[override]
    def __get__(self, op: None, owner: type) -> OptionalOperandDef: ...
    @overload
    def __get__(self, op: Operation, owner: type) -> Value | None: ...
    def __get__(self, op: Operation | None, owner: type) -> Value | OptionalOperandDef | None:
        if op is None:
            return self
        return op.operands[self.index] if self.index < len(op.operands) else None


def _is_quantized(type_: Type) -> bool:
    return isinstance(element_type_of(type_), QuantizedType)


def _is_float(type_: Type) -> bool:
    return isinstance(element_type_of(type_), FloatType)


# Storage cast -----------------------------------------------------------------------------------------------
@register_op
class FloatStorageCastOp(Operation):
    """`qconvert.storage_cast`: float storage (f8E4M3FN, f4E2M1FN, ...) <-> quantized values, same shape.

    What `quant.scast` is for integer storage: a reinterpretation, no arithmetic (upstream's scast accepts
    only signless integer storage).
    """

    __slots__ = ()
    name: ClassVar[str] = "qconvert.storage_cast"

    def __init__(self, input: Value, result_type: Type, **kwargs: object) -> None:
        Operation.__init__(self, [input], [result_type], **kwargs)  # type: ignore[arg-type]

    @property
    def input(self) -> Value:
        return self.operands[0]

    def verify(self) -> None:
        if len(self.operands) != 1 or len(self.results) != 1:
            raise self.error(
                f"expects 1 operand and 1 result, but got {len(self.operands)} and {len(self.results)}"
            )
        input_type, result_type = self.operands[0].type, self.results[0].type
        if _is_quantized(input_type) == _is_quantized(result_type):
            raise self.error("input must be float storage and result quantized, or vice versa")
        quantized_container, storage_container = (
            (input_type, result_type) if _is_quantized(input_type) else (result_type, input_type)
        )
        quantized_type = element_type_of(quantized_container)
        assert isinstance(quantized_type, QuantizedType)
        if not isinstance(quantized_type.storage_type, FloatType):
            raise self.error(f"storage type of '{quantized_type}' is an integer: use quant.scast")
        if quantized_type.storage_type != element_type_of(storage_container):
            raise self.emit_error("storage type in quantized type expected to match float storage type")
        check_same_scalar_or_tensor_shape(self, input_type, result_type)
        check_quantization(self, quantized_type, quantized_container)


STORAGE_CASTS = (StorageCastOp, FloatStorageCastOp)

NOTE = "qconvert.note"
"""The attribute on any op where qconvert says, in a sentence, what it chose there (a quantize written out,
a fusion not done) and why; printed with the op, read by reports."""
"""Both storage casts (integer and float storage), for `isinstance`: a reinterpretation of the same bytes."""


# QOperator ops ----------------------------------------------------------------------------------------------
class QOperatorOp(Operation):
    """A lifted QOperator node: named operands, its ONNX node's layout, and a verifier of both.

    `quantized` names the operands whose element type must be a quant type, `floats` those that must be
    floating-point; the result is quantized unless `plain_result` (i32, storage tensors) or the class says
    otherwise (`verify_result`); `same_storage` names operands (and `y`, the result) whose ONNX type
    constraint is one type variable. Every quantized operand and result expresses the same float type (the
    frontend's f32).
    """

    __slots__ = ()
    ONNX_DOMAIN: ClassVar[str] = ""
    ONNX_OP_TYPE: ClassVar[str]
    ONNX_INPUTS: ClassVar[tuple[str, ...]]
    # The label of an operand's parameter initializers in the written model (`<node>_<label>_scale`), where
    # it is not the operand's name: the names the ONNX writer has always given them.
    PARAMETER_LABELS: ClassVar[dict[str, str]] = {}
    quantized: ClassVar[tuple[str, ...]] = ()
    floats: ClassVar[tuple[str, ...]] = ()
    same_storage: ClassVar[tuple[str, ...]] = ()
    plain_result: ClassVar[bool] = False
    result_counts: ClassVar[tuple[int, int]] = (1, 1)

    @classmethod
    def operand_defs(cls) -> tuple[OperandDef, ...]:
        """The named operands, by position."""
        return _operand_defs(cls)

    @classmethod
    def operand_counts(cls) -> tuple[int, int]:
        defs = cls.operand_defs()
        required = sum(1 for d in defs if not isinstance(d, OptionalOperandDef))
        return required, len(defs)

    @classmethod
    def onnx_positions(cls, name: str) -> tuple[int, int | None, int | None]:
        """ONNX input positions of operand `name`: (data, scale, zero point), None where the node has none."""
        layout = cls.ONNX_INPUTS

        def find(entry: str) -> int | None:
            return layout.index(entry) if entry in layout else None

        data = find(name)
        assert data is not None, f"{cls.name} has no operand {name} in its ONNX layout"
        return data, find(name + SCALE_SUFFIX), find(name + ZERO_POINT_SUFFIX)

    @classmethod
    def onnx_parameter_positions(cls) -> tuple[int, ...]:
        """Positions of the node's scale and zero-point inputs: the frontend lifts the node only when they
        are constants (they become quant types)."""
        return tuple(
            i for i, entry in enumerate(cls.ONNX_INPUTS) if entry.endswith((SCALE_SUFFIX, ZERO_POINT_SUFFIX))
        )

    def named_operands(self) -> dict[str, Value]:
        """Operand name -> value, for the operands present."""
        return {d.name: self.operands[d.index] for d in self.operand_defs() if d.index < len(self.operands)}

    def onnx_inputs(self) -> tuple[str, ...]:
        """This op's node inputs in schema order (ONNX_INPUTS; variadic ops spell out their operands)."""
        return self.ONNX_INPUTS

    def verify(self) -> None:
        self.verify_counts()
        named = self.named_operands()
        for index, (label, value) in enumerate(named.items()):  # present operands are a prefix
            self.verify_operand(index, label, value)
        expressed: set[Type] = set()
        storages: dict[str, str] = {}
        checked = [(label, value.type) for label, value in named.items()]
        checked += [(RESULT, result.type) for result in self.results]
        for label, type_ in checked:
            element = element_type_of(type_)
            if isinstance(element, QuantizedType):
                expressed.add(element.expressed_type)
                if label in self.same_storage:
                    storages[label] = element.storage_type_spelling
        if len(expressed) > 1:
            raise self.error("quantized operands and result must express the same float type")
        if len(set(storages.values())) > 1:
            listed = ", ".join(f"{label} {storage}" for label, storage in storages.items())
            raise self.error(
                f"operands {' and '.join(self.same_storage)} must share one storage type ({listed})"
            )
        for result in self.results:
            if self.plain_result and _is_quantized(result.type):
                raise self.error(f"result must not be quantized, but got '{result.type}'")
            if not self.plain_result:
                self.verify_result(result)

    def verify_counts(self) -> None:
        least, most = self.operand_counts()
        count = len(self.operands)
        if not least <= count <= most:
            expected = str(least) if least == most else f"{least} to {most}"
            names = ", ".join(d.name for d in self.operand_defs())
            raise self.error(f"expects {expected} operands ({names}), but got {count}")
        least, most = self.result_counts
        if not least <= len(self.results) <= most:
            expected = str(least) if least == most else f"{least} to {most}"
            raise self.error(f"expects {expected} results, but got {len(self.results)}")

    def verify_operand(self, index: int, label: str, value: Value) -> None:
        if label in self.quantized and not _is_quantized(value.type):
            raise self.error(
                f"operand #{index} ({label}) must be a tensor of quantized type, but got '{value.type}'"
            )
        if label in self.floats and not _is_float(value.type):
            raise self.error(
                f"operand #{index} ({label}) must be a tensor of floating-point, but got '{value.type}'"
            )
        element = element_type_of(value.type)
        if isinstance(element, QuantizedType):
            check_quantization(self, element, value.type)

    def verify_result(self, result: Value) -> None:
        if not _is_quantized(result.type):
            raise self.error(f"result must be a tensor of quantized type, but got '{result.type}'")


@functools.cache
def _operand_defs(op_class: type[QOperatorOp]) -> tuple[OperandDef, ...]:
    """The class's `OperandDef`s (its own and inherited) by index: computed once per class, read per op."""
    found = {
        d.index: d for k in reversed(op_class.__mro__) for d in vars(k).values() if isinstance(d, OperandDef)
    }
    return tuple(found[index] for index in sorted(found))


class QLinearUnaryOp(QOperatorOp):
    """x -> y, both quantized with one storage type (the com.microsoft QLinear* ops' T)."""

    __slots__ = ()
    ONNX_DOMAIN = "com.microsoft"
    ONNX_INPUTS = ("x", "x_scale", "x_zero_point", "y_scale", "y_zero_point")
    x = OperandDef(0)
    quantized = ("x",)
    same_storage = ("x", RESULT)


class QLinearBinaryOp(QOperatorOp):
    """a, b -> y (com.microsoft QLinearAdd / QLinearMul: A, B and C share one type T)."""

    __slots__ = ()
    ONNX_DOMAIN = "com.microsoft"
    ONNX_INPUTS = ("a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point")
    a = OperandDef(0)
    b = OperandDef(1)
    quantized = ("a", "b")
    same_storage = ("a", "b", RESULT)


@register_op
class QLinearConvOp(QOperatorOp):
    """ONNX QLinearConv: x, w (per-tensor or per output channel, axis 0), [bias i32] -> y."""

    __slots__ = ()
    name: ClassVar[str] = "qconvert.qlinear_conv"
    ONNX_OP_TYPE = "QLinearConv"
    ONNX_INPUTS = (
        "x",
        "x_scale",
        "x_zero_point",
        "w",
        "w_scale",
        "w_zero_point",
        "y_scale",
        "y_zero_point",
        "bias",
    )
    x = OperandDef(0)
    w = OperandDef(1)
    bias = OptionalOperandDef(2)
    quantized = ("x", "w")


@register_op
class QLinearMatMulOp(QOperatorOp):
    """ONNX QLinearMatMul: a (per row), b (per column) -> y."""

    __slots__ = ()
    name: ClassVar[str] = "qconvert.qlinear_matmul"
    ONNX_OP_TYPE = "QLinearMatMul"
    ONNX_INPUTS = ("a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale", "y_zero_point")
    a = OperandDef(0)
    b = OperandDef(1)
    quantized = ("a", "b")


@register_op
class MatMulIntegerOp(QOperatorOp):
    """ONNX MatMulInteger: a, b with their zero points in quant types of scale 1 -> i32 (`real = q - zp`)."""

    __slots__ = ()
    name: ClassVar[str] = "qconvert.matmul_integer"
    ONNX_OP_TYPE = "MatMulInteger"
    ONNX_INPUTS = ("a", "b", "a_zero_point", "b_zero_point")
    a = OperandDef(0)
    b = OperandDef(1)
    quantized = ("a", "b")
    plain_result = True


@register_op
class ConvIntegerOp(QOperatorOp):
    """ONNX ConvInteger: x, w (zero point per output channel, axis 0) in quant types of scale 1 -> i32."""

    __slots__ = ()
    name: ClassVar[str] = "qconvert.conv_integer"
    ONNX_OP_TYPE = "ConvInteger"
    ONNX_INPUTS = ("x", "w", "x_zero_point", "w_zero_point")
    PARAMETER_LABELS: ClassVar[dict[str, str]] = {"x": "a", "w": "b"}
    x = OperandDef(0)
    w = OperandDef(1)
    quantized = ("x", "w")
    plain_result = True


@register_op
class QLinearAddOp(QLinearBinaryOp):
    """com.microsoft QLinearAdd."""

    __slots__ = ()
    name: ClassVar[str] = "qconvert.qlinear_add"
    ONNX_OP_TYPE = "QLinearAdd"


@register_op
class QLinearMulOp(QLinearBinaryOp):
    """com.microsoft QLinearMul."""

    __slots__ = ()
    name: ClassVar[str] = "qconvert.qlinear_mul"
    ONNX_OP_TYPE = "QLinearMul"


@register_op
class QLinearSigmoidOp(QLinearUnaryOp):
    """com.microsoft QLinearSigmoid."""

    __slots__ = ()
    name: ClassVar[str] = "qconvert.qlinear_sigmoid"
    ONNX_OP_TYPE = "QLinearSigmoid"


@register_op
class QLinearLeakyReluOp(QLinearUnaryOp):
    """com.microsoft QLinearLeakyRelu (attribute alpha)."""

    __slots__ = ()
    name: ClassVar[str] = "qconvert.qlinear_leaky_relu"
    ONNX_OP_TYPE = "QLinearLeakyRelu"


@register_op
class QLinearSoftmaxOp(QLinearUnaryOp):
    """com.microsoft QLinearSoftmax (attributes axis, opset)."""

    __slots__ = ()
    name: ClassVar[str] = "qconvert.qlinear_softmax"
    ONNX_OP_TYPE = "QLinearSoftmax"


@register_op
class QLinearAveragePoolOp(QLinearUnaryOp):
    """com.microsoft QLinearAveragePool."""

    __slots__ = ()
    name: ClassVar[str] = "qconvert.qlinear_average_pool"
    ONNX_OP_TYPE = "QLinearAveragePool"


@register_op
class QLinearGlobalAveragePoolOp(QLinearUnaryOp):
    """com.microsoft QLinearGlobalAveragePool."""

    __slots__ = ()
    name: ClassVar[str] = "qconvert.qlinear_global_average_pool"
    ONNX_OP_TYPE = "QLinearGlobalAveragePool"


@register_op
class QLinearConcatOp(QOperatorOp):
    """com.microsoft QLinearConcat: x0, x1, ... -> y (attribute axis).

    Variadic: operand i is `x<i>` in the layout, and the node lists Y's parameters first."""

    __slots__ = ()
    name: ClassVar[str] = "qconvert.qlinear_concat"
    ONNX_DOMAIN = "com.microsoft"
    ONNX_OP_TYPE = "QLinearConcat"
    ONNX_INPUTS = ("y_scale", "y_zero_point")  # then x<i>, x<i>_scale, x<i>_zero_point per operand

    @property
    def inputs(self) -> list[Value]:
        return list(self.operands)

    @classmethod
    def operand_counts(cls) -> tuple[int, int]:
        return 1, 2**31

    @staticmethod
    def operand_name(index: int) -> str:
        return f"x{index}"

    def named_operands(self) -> dict[str, Value]:
        return {self.operand_name(i): value for i, value in enumerate(self.operands)}

    def onnx_inputs(self) -> tuple[str, ...]:
        entries = list(self.ONNX_INPUTS)
        for index in range(len(self.operands)):
            name = self.operand_name(index)
            entries += [name, name + SCALE_SUFFIX, name + ZERO_POINT_SUFFIX]
        return tuple(entries)

    def verify_counts(self) -> None:
        if not self.operands:
            raise self.error("expects at least 1 operand, but got 0")
        QOperatorOp.verify_counts(self)

    def verify_operand(self, index: int, label: str, value: Value) -> None:
        if not _is_quantized(value.type):
            raise self.error(
                f"operand #{index} ({label}) must be a tensor of quantized type, but got '{value.type}'"
            )
        QOperatorOp.verify_operand(self, index, label, value)


@register_op
class QGemmOp(QOperatorOp):
    """com.microsoft QGemm: a, b (per column), [c i32] -> y quantized (with y_scale) or float (without)."""

    __slots__ = ()
    name: ClassVar[str] = "qconvert.qgemm"
    ONNX_DOMAIN = "com.microsoft"
    ONNX_OP_TYPE = "QGemm"
    ONNX_INPUTS = (
        "a",
        "a_scale",
        "a_zero_point",
        "b",
        "b_scale",
        "b_zero_point",
        "c",
        "y_scale",
        "y_zero_point",
    )
    a = OperandDef(0)
    b = OperandDef(1)
    c = OptionalOperandDef(2)
    quantized = ("a", "b")

    def verify_result(self, result: Value) -> None:
        if not (_is_quantized(result.type) or _is_float(result.type)):
            raise self.error(f"result must be a tensor of quantized type or float, but got '{result.type}'")


@register_op
class DynamicQuantizeMatMulOp(QOperatorOp):
    """com.microsoft DynamicQuantizeMatMul: a f32 (quantized at run time), b (per column), [bias] -> f32."""

    __slots__ = ()
    name: ClassVar[str] = "qconvert.dynamic_quantize_matmul"
    ONNX_DOMAIN = "com.microsoft"
    ONNX_OP_TYPE = "DynamicQuantizeMatMul"
    ONNX_INPUTS = ("a", "b", "b_scale", "b_zero_point", "bias")
    a = OperandDef(0)
    b = OperandDef(1)
    bias = OptionalOperandDef(2)
    quantized = ("b",)
    floats = ("a",)

    def verify_result(self, result: Value) -> None:
        if not _is_float(result.type):
            raise self.error(f"result must be a tensor of floating-point, but got '{result.type}'")


@register_op
class DynamicQuantizeLinearOp(QOperatorOp):
    """ONNX DynamicQuantizeLinear: x f32 -> y, y_scale, y_zero_point as the ONNX storage tensors (u8 data in
    `i8`, f32 scale): a scale computed at run time has no quant type. Absent outputs are left out."""

    __slots__ = ()
    name: ClassVar[str] = "qconvert.dynamic_quantize_linear"
    ONNX_OP_TYPE = "DynamicQuantizeLinear"
    ONNX_INPUTS = ("x",)
    x = OperandDef(0)
    floats = ("x",)
    plain_result = True
    result_counts = (1, 3)


QOPERATOR_OPS: tuple[type[QOperatorOp], ...] = (
    QLinearConvOp,
    QLinearMatMulOp,
    MatMulIntegerOp,
    ConvIntegerOp,
    DynamicQuantizeLinearOp,
    QLinearAddOp,
    QLinearMulOp,
    QLinearConcatOp,
    QLinearSigmoidOp,
    QLinearLeakyReluOp,
    QLinearSoftmaxOp,
    QLinearAveragePoolOp,
    QLinearGlobalAveragePoolOp,
    QGemmOp,
    DynamicQuantizeMatMulOp,
)
"""Every lifted QOperator op, in the order of the frontend's table."""

__all__ = [
    "NOTE",
    "QOPERATOR_OPS",
    "STORAGE_CASTS",
    "ConvIntegerOp",
    "DynamicQuantizeLinearOp",
    "DynamicQuantizeMatMulOp",
    "FloatStorageCastOp",
    "MatMulIntegerOp",
    "OperandDef",
    "OptionalOperandDef",
    "QGemmOp",
    "QLinearAddOp",
    "QLinearAveragePoolOp",
    "QLinearBinaryOp",
    "QLinearConcatOp",
    "QLinearConvOp",
    "QLinearGlobalAveragePoolOp",
    "QLinearLeakyReluOp",
    "QLinearMatMulOp",
    "QLinearMulOp",
    "QLinearSigmoidOp",
    "QLinearSoftmaxOp",
    "QLinearUnaryOp",
    "QOperatorOp",
]
