"""QDQ -> QOperator: `dcast -> float op -> qcast` groups of the lifted IR become the `qconvert` dialect's
QOperator ops (QLinearConv, QLinearMatMul, QGemm, QLinearAdd, ...), which the ONNX writer writes as those
nodes; every other Q/DQ stays. `--form qoperator` of `--to onnx-storage` runs it.

    from qconvert.backends.onnx import qdq_to_qoperator
    result = qdq_to_qoperator(module)          # in place; result.rewritten == {"QLinearConv": 2, ...}

A group is what onnxruntime's QDQ selectors (`qdq_selectors.cc`, `qdq_selector_action_transformer.cc`)
fuse into the same kernels on its CPU EP: every input of the float op is a `quant.dcast`, its one result
has one use, a `quant.qcast` (or a Relu / Clip that the qcast makes redundant, then the qcast: erased with
the group; a Gemm none of whose uses is a qcast becomes QGemm with a float result), and

| float op                     | QOperator op                | beyond the group                            |
|------------------------------|-----------------------------|---------------------------------------------|
| Conv                         | QLinearConv                 | x, y one storage; s8 x needs s8 w; i32 bias |
| MatMul                       | QLinearMatMul               | a, y one storage; s8 a needs s8 b           |
| Gemm                         | QGemm (com.microsoft)       | a, y one storage; s8 a needs s8 b; beta 1   |
| Add, Mul                     | QLinearAdd, QLinearMul (ms) | a, b, y one storage                         |
| Concat                       | QLinearConcat (ms)          | every input and y one storage               |
| AveragePool, GlobalAveragePool, LeakyRelu, Sigmoid, Softmax | QLinear<op> (ms) | x, y one storage |

Storage: 8-bit integers (onnxruntime leaves 16-bit and 4-bit groups to Q/DQ). Beyond onnxruntime's
selectors, a group is rewritten only where the QOperator op computes what the group means: activations and
results per-tensor with f32 scales and full storage ranges, weights per-tensor or per output channel (Conv:
axis 0; MatMul: the last axis of a 2-D b; Gemm: N's axis), one zero point across a Conv's channels (the
kernel's rule), and a bias dequantized from i32 with zero point 0 and scale x_scale * w_scale (onnxruntime
fuses without checking: the bias's storage integers are what QLinearConv / QGemm add to the accumulator).

Which of these groups onnxruntime fuses itself depends on the machine: on x86 its CPU EP selects no int8
activation kernel for Conv / MatMul (`is_int8_allowed` is false), and `QDQS8ToU8Transformer` first turns
int8 Q -> DQ pairs into uint8 ones, so a group whose int8 weight then disagrees with its uint8 activation
stays float. QLinearAdd / QLinearMul round differently from the float path at ties (measured: MiniLM QDQ's
GELU `Erf + 1` adds, 5,918 of 18,432 outputs one step off), so a model meant to give bit for bit what
onnxruntime gives on the source passes `only=onnxruntime_fusions(source)`: the nodes the installed
onnxruntime fuses, read from the model it optimizes.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx

from qconvert import numerics
from qconvert.errors import InputError
from qconvert.ir.attributes import Attribute, DenseArrayAttr, FloatAttr, IntegerAttr
from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.onnx import (
    NODE_NAME,
    main_function,
    node_name,
    onnx_input,
    op_default_opset,
    op_label,
)
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
from qconvert.ir.types import F32, IntegerType, RankedTensorType, element_type_of, with_element_type
from qconvert.passes import ModulePass, PassResult, register_pass
from qconvert.passes.rewrite import PatternRewriter, Root, apply_patterns

__all__ = [
    "FLOAT_OPS",
    "QOperatorRewrite",
    "QdqToQOperatorPass",
    "onnxruntime_fusions",
    "qdq_to_qoperator",
]

BIAS_SCALE_TOLERANCE = 1e-6
"""Relative difference allowed between a bias's scale and x_scale * w_scale: the quantizer computes the
product in float32 or float64 and stores it in float32 (one rounding, ~6e-8 relative)."""

SOFTMAX_SINCE = (13, 11, 1)
"""The versions at which ONNX Softmax changed: QLinearSoftmax's `opset` attribute is the source node's."""


@dataclass
class QOperatorRewrite:
    """What `qdq_to_qoperator` did: QOperator op type -> how many groups became one, and for each group it
    left as Q/DQ (same shape, a condition failed), the float op's label -> why."""

    rewritten: Counter[str] = field(default_factory=Counter)
    kept: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.rewritten.values())


class NotRewritten(Exception):
    """A group that stays Q/DQ; the message says which condition failed."""


# Reading a group ------------------------------------------------------------------------------------
def dequantized_source(value: Value) -> Value | None:
    """The quant-typed value `value` was dequantized from by a `quant.dcast`, else None."""
    producer = value.owner_op()
    return producer.input if isinstance(producer, DequantizeCastOp) else None


def sole_quantize(op: Operation) -> QuantizeCastOp | None:
    """The `quant.qcast` that is the only use of `op`'s only result, else None."""
    if len(op.results) != 1 or len(op.result.uses) != 1:
        return None
    (user, _), *_ = op.result.uses
    return user if isinstance(user, QuantizeCastOp) else None


def quant_type_of(value: Value) -> QuantizedType:
    element = element_type_of(value.type)
    assert isinstance(element, QuantizedType), f"{value.type} is not quantized"
    return element


def storage_of(value: Value) -> str:
    """`i8` / `u8` / ... of a quant-typed value."""
    return quant_type_of(value).storage_type_spelling


def rank_of(value: Value) -> int | None:
    return len(value.type.shape) if isinstance(value.type, RankedTensorType) else None


def check_8bit(value: Value, label: str) -> None:
    quant_type = quant_type_of(value)
    if quant_type.storage_type_spelling not in ("i8", "u8"):
        raise NotRewritten(f"{label} storage {quant_type.storage_type_spelling} is not 8-bit")
    if quant_type.has_storage_type_bounds:
        raise NotRewritten(f"{label} has narrowed storage bounds ({quant_type})")
    if quant_type.expressed_type != F32:
        raise NotRewritten(f"{label} expresses {quant_type.expressed_type}, not f32")


def check_per_tensor(value: Value, label: str) -> None:
    check_8bit(value, label)
    if not isinstance(quant_type_of(value), UniformQuantizedType):
        raise NotRewritten(f"{label} is not quantized per tensor")


def check_weight(value: Value, label: str, channel_axis: int | None) -> None:
    """Per-tensor, or per-axis along `channel_axis` (None: per-tensor only)."""
    check_8bit(value, label)
    quant_type = quant_type_of(value)
    if isinstance(quant_type, UniformQuantizedType):
        return
    per_axis = isinstance(quant_type, UniformQuantizedPerAxisType)
    if not per_axis or quant_type.quantized_dimension != channel_axis:
        raise NotRewritten(f"{label} is quantized as {quant_type}, not per tensor or per axis {channel_axis}")


def scales_and_zero_points(quant_type: QuantizedType) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(quant_type, UniformQuantizedType):
        return np.array([quant_type.scale]), np.array([quant_type.zero_point])
    assert isinstance(quant_type, UniformQuantizedPerAxisType)
    return np.array(quant_type.scales), np.array(quant_type.zero_points)


def check_bias(bias: Value, x: Value, w: Value) -> None:
    """An i32 bias, zero point 0, scale x_scale * w_scale (per channel where w is): what the kernel adds."""
    quant_type = quant_type_of(bias)
    storage = quant_type.storage_type
    if not (isinstance(storage, IntegerType) and storage.width == 32 and quant_type.is_signed):
        raise NotRewritten(f"bias storage {quant_type.storage_type_spelling} is not i32")
    if not isinstance(quant_type, UniformQuantizedType | UniformQuantizedPerAxisType):
        raise NotRewritten(f"bias is quantized as {quant_type}")
    bias_scales, bias_zero_points = scales_and_zero_points(quant_type)
    if np.any(bias_zero_points != 0):
        raise NotRewritten("bias zero point is not 0")
    x_scale = quant_type_of(x)
    assert isinstance(x_scale, UniformQuantizedType)
    w_scales, _ = scales_and_zero_points(quant_type_of(w))
    expected = np.float32(x_scale.scale) * w_scales.astype(np.float32)
    if bias_scales.size not in (1, expected.size) or not np.allclose(
        np.broadcast_to(bias_scales, expected.shape), expected, rtol=BIAS_SCALE_TOLERANCE, atol=0
    ):
        raise NotRewritten("bias scale is not x_scale * w_scale")


def check_uniform_weight_zero_point(w: Value) -> None:
    _, zero_points = scales_and_zero_points(quant_type_of(w))
    if np.unique(zero_points).size > 1:
        raise NotRewritten("w's zero points differ across channels (QLinearConv takes one)")


def check_one_storage(values: dict[str, Value]) -> None:
    storages = {label: storage_of(value) for label, value in values.items()}
    if len(set(storages.values())) > 1:
        listed = ", ".join(f"{label} {storage}" for label, storage in storages.items())
        raise NotRewritten(f"storages differ ({listed})")


def check_signed_pair(activation: Value, weight: Value, names: tuple[str, str]) -> None:
    """onnxruntime's rule: an int8 activation pairs with int8 weights only (u8 activations take either)."""
    if storage_of(activation) == "i8" and storage_of(weight) != "i8":
        raise NotRewritten(f"{names[0]} is i8 but {names[1]} is {storage_of(weight)}")


def integer_attribute(op: Operation, name: str, default: int) -> int:
    attribute = op.attributes.get(name)
    return int(attribute.value) if isinstance(attribute, IntegerAttr) else default


def float_attribute(op: Operation, name: str, default: float) -> float:
    attribute = op.attributes.get(name)
    return float(attribute.value) if isinstance(attribute, FloatAttr) else default


# onnxruntime's own selection ----------------------------------------------------------------------------
def onnxruntime_fusions(model: str | os.PathLike[str] | onnx.ModelProto) -> frozenset[str]:
    """Names of the nodes of `model` (a QDQ model) that the installed onnxruntime's CPU EP fuses with their
    Q/DQ into the QOperator kernels of FLOAT_OPS, read from the graph it optimizes (level EXTENDED, where
    its QDQ selector actions run; the fused node keeps the float node's name)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.log_severity_level = 4  # fatal only: its errors reach us as exceptions, named once by us
    # Weights go beside the optimized graph: only its nodes are read, and a large model passes 2 GB.
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", "optimized.onnx.data"
    )
    options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "64")
    with tempfile.TemporaryDirectory(prefix="qconvert-ort-") as folder:
        options.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
        source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
        try:
            ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        except Exception as error:  # onnxruntime's own exception classes: a model it cannot load
            label = "the model" if isinstance(model, onnx.ModelProto) else f"'{model}'"
            raise InputError(f"onnxruntime cannot load {label} to see what it fuses: {error}") from None
        optimized = onnx.load(options.optimized_model_filepath, load_external_data=False)
    return frozenset(
        node.name for node in optimized.graph.node if node.op_type in QOPERATOR_TYPES and node.name
    )


# Patterns ----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Group:
    """A `dcast -> op -> qcast` group: the float op, the quant-typed values its inputs were dequantized from,
    the qcast's result, and the rewriter (a builder inserts only after every check passed)."""

    op: Operation
    sources: list[Value]
    result: Value
    rewriter: PatternRewriter


Built = tuple[type[QOperatorOp], list[Value], dict[str, Attribute]]
Builder = Callable[[Group], Built]


@dataclass(frozen=True, slots=True)
class QdqToQOperator:
    """One float op class (`onnx.Conv`, ...) -> its QOperator op, when the group qualifies."""

    roots: tuple[Root, ...]
    build: Builder
    only: Collection[str] | None
    record: QOperatorRewrite

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        sources = [dequantized_source(operand) for operand in op.operands]
        if not sources or any(source is None for source in sources):
            return False
        tail = group_tail(op)
        if tail is not None:
            quantize, clamp = tail
            result = quantize.result
        elif op.name == "onnx.Gemm" and len(op.results) == 1 and not quantized_uses(op.result):
            quantize, clamp, result = None, None, op.result  # QGemm with a float result
        else:
            return False
        group = Group(op, sources, result, rewriter)  # type: ignore[arg-type]
        try:
            if self.only is not None and node_name(op) not in self.only:
                raise NotRewritten("onnxruntime does not fuse it (its QDQ selectors, or its s8 -> u8 pass)")
            op_class, operands, attributes = self.build(group)
        except NotRewritten as reason:
            self.record.kept[op_label(op)] = str(reason)
            return False
        new_op = rewriter.insert(op_class(operands, [result.type], attributes))
        new_op.verify()
        dequantizes = list(dict.fromkeys(operand.owner_op() for operand in op.operands))
        if quantize is None:
            rewriter.replace_op(op, [new_op.result])
        else:
            rewriter.replace_op(quantize, [new_op.result])
            if clamp is not None:
                bounds = [value.owner_op() for value in clamp.operands[1:]]
                rewriter.erase_op(clamp)
                for bound in dict.fromkeys(bounds):  # a Clip's constant min / max, now unused
                    if isinstance(bound, ConstantOp) and not bound.result.uses:
                        rewriter.erase_op(bound)
            rewriter.erase_op(op)
        for dequantize in dequantizes:
            erase_if_unused(dequantize, rewriter)
        self.record.rewritten[op_class.ONNX_OP_TYPE] += 1
        self.record.kept.pop(op_label(op), None)
        return True


def quantized_uses(value: Value) -> bool:
    return any(isinstance(user, QuantizeCastOp) for user, _ in value.uses)


def group_tail(op: Operation) -> tuple[QuantizeCastOp, Operation | None] | None:
    """The group's qcast, and the Relu / Clip between op and qcast that the qcast makes redundant (as
    onnxruntime's selectors and ClipQuantFusion take it), else None."""
    quantize = sole_quantize(op)
    if quantize is not None:
        return quantize, None
    if len(op.results) != 1 or len(op.result.uses) != 1:
        return None
    (clamp, position), *_ = op.result.uses
    if clamp.name not in ("onnx.Relu", "onnx.Clip") or position != 0:
        return None
    quantize = sole_quantize(clamp)
    if quantize is None or not clamp_is_redundant(clamp, quantize.result):
        return None
    return quantize, clamp


def clamp_bounds(clamp: Operation) -> tuple[float, float] | None:
    """(min, max) of a Relu / Clip with constant bounds (absent: unbounded), None when one is not constant."""
    if clamp.name == "onnx.Relu":
        return 0.0, np.inf
    if op_default_opset(clamp) < 11:
        return float_attribute(clamp, "min", -np.inf), float_attribute(clamp, "max", np.inf)
    from qconvert.interpret import constant_array  # the interpreter owns reading constants

    bounds = []
    for position, unbounded in ((1, -np.inf), (2, np.inf)):
        value = onnx_input(clamp, position)
        producer = None if value is None else value.owner_op()
        if value is None:
            bounds.append(unbounded)
        elif isinstance(producer, ConstantOp):
            bounds.append(float(constant_array(producer).reshape(-1)[0]))
        else:
            return None
    return bounds[0], bounds[1]


def clamp_is_redundant(clamp: Operation, quantized: Value) -> bool:
    """Whether quantize(clamp(v)) == quantize(v) for every v: QuantizeLinear is monotone, so exactly when
    the bounds quantize to the storage's ends (Relu: the zero point is qmin)."""
    bounds = clamp_bounds(clamp)
    quant_type = element_type_of(quantized.type)
    if bounds is None or not isinstance(quant_type, UniformQuantizedType):
        return False
    ends = numerics.quantize(np.array(bounds, np.float32), uniform_params(quant_type), numerics.Rounding.ONNX)
    return int(ends[0]) == quant_type.storage_type_min and int(ends[1]) == quant_type.storage_type_max


def erase_if_unused(op: Operation | None, rewriter: PatternRewriter) -> None:
    """Erase a dcast / scast / qcast the rewrite left unused, then its producer the same way (the writer
    would otherwise write dead Q/DQ nodes)."""
    while isinstance(op, DequantizeCastOp | StorageCastOp | QuantizeCastOp) and not op.result.uses:
        producer = op.input.owner_op()
        rewriter.erase_op(op)
        op = producer


def kept_attributes(op: Operation, dropped: tuple[str, ...] = ()) -> dict[str, Attribute]:
    """The float op's ONNX attributes and node name (other `onnx.*` bookkeeping describes its float form)."""
    return {
        key: value
        for key, value in op.attributes.items()
        if key not in dropped and (key == NODE_NAME or not key.startswith("onnx."))
    }


def storage_tensor(value: Value, rewriter: PatternRewriter) -> Value:
    """The i32 storage tensor of a quant-typed bias: the scast's input, else a new scast."""
    producer = value.owner_op()
    if isinstance(producer, StorageCastOp):
        return producer.input
    storage = quant_type_of(value).storage_type
    return rewriter.insert(StorageCastOp(value, with_element_type(value.type, storage))).result


def build_conv(group: Group) -> Built:
    op, result = group.op, group.result
    x, w, *bias = group.sources
    check_per_tensor(x, "x")
    check_per_tensor(result, "y")
    check_weight(w, "w", 0)
    check_uniform_weight_zero_point(w)
    check_one_storage({"x": x, "y": result})
    check_signed_pair(x, w, ("x", "w"))
    operands = [x, w]
    if bias:
        check_bias(bias[0], x, w)
    if bias:
        operands.append(storage_tensor(bias[0], group.rewriter))
    return QLinearConvOp, operands, kept_attributes(op)


def build_matmul(group: Group) -> Built:
    op, result = group.op, group.result
    a, b = group.sources
    check_per_tensor(a, "a")
    check_per_tensor(result, "y")
    check_weight(b, "b", 1 if rank_of(b) == 2 else None)
    check_one_storage({"a": a, "y": result})
    check_signed_pair(a, b, ("a", "b"))
    return QLinearMatMulOp, [a, b], kept_attributes(op)


def build_gemm(group: Group) -> Built:
    op, result = group.op, group.result
    a, b, *c = group.sources
    check_per_tensor(a, "a")
    check_weight(b, "b", 0 if integer_attribute(op, "transB", 0) else 1)
    check_signed_pair(a, b, ("a", "b"))
    if isinstance(element_type_of(result.type), QuantizedType):
        check_per_tensor(result, "y")
        check_one_storage({"a": a, "y": result})
    elif element_type_of(result.type) != F32:
        raise NotRewritten(f"the float result is {result.type}, not f32")
    operands = [a, b]
    if c:
        if float_attribute(op, "beta", 1.0) != 1.0:
            raise NotRewritten("beta is not 1 (QGemm adds C as it is)")
        if rank_of(c[0]) != 1:
            raise NotRewritten("C is not a vector of N")
        check_bias(c[0], a, b)
        operands.append(storage_tensor(c[0], group.rewriter))
    return QGemmOp, operands, kept_attributes(op, ("beta",))


def build_binary(op_class: type[QOperatorOp]) -> Builder:
    def build(group: Group) -> Built:
        op, result = group.op, group.result
        a, b = group.sources
        for label, value in (("a", a), ("b", b), ("y", result)):
            check_per_tensor(value, label)
        check_one_storage({"a": a, "b": b, "y": result})
        return op_class, [a, b], kept_attributes(op)

    return build


def build_concat(group: Group) -> Built:
    op, result, sources = group.op, group.result, group.sources
    labeled = {f"x{index}": source for index, source in enumerate(sources)}
    for label, value in (*labeled.items(), ("y", result)):
        check_per_tensor(value, label)
    check_one_storage({**labeled, "y": result})
    return QLinearConcatOp, list(sources), kept_attributes(op)


def build_unary(op_class: type[QOperatorOp]) -> Builder:
    def build(group: Group) -> Built:
        op, result = group.op, group.result
        (x,) = group.sources
        check_per_tensor(x, "x")
        check_per_tensor(result, "y")
        check_one_storage({"x": x, "y": result})
        attributes = kept_attributes(op)
        if op_class is QLinearAveragePoolOp:
            dilations = attributes.pop("dilations", None)
            if isinstance(dilations, DenseArrayAttr) and any(d != 1 for d in dilations.values):
                raise NotRewritten("dilations: QLinearAveragePool has none")
        if op_class is QLinearSoftmaxOp:
            opset = op_default_opset(op)
            since = next(version for version in SOFTMAX_SINCE if version <= opset)
            attributes["opset"] = IntegerAttr(since, IntegerType(64))
        return op_class, [x], attributes

    return build


FLOAT_OPS: dict[str, Builder] = {
    "onnx.Conv": build_conv,
    "onnx.MatMul": build_matmul,
    "onnx.Gemm": build_gemm,
    "onnx.Add": build_binary(QLinearAddOp),
    "onnx.Mul": build_binary(QLinearMulOp),
    "onnx.Concat": build_concat,
    "onnx.AveragePool": build_unary(QLinearAveragePoolOp),
    "onnx.GlobalAveragePool": build_unary(QLinearGlobalAveragePoolOp),
    "onnx.LeakyRelu": build_unary(QLinearLeakyReluOp),
    "onnx.Sigmoid": build_unary(QLinearSigmoidOp),
    "onnx.Softmax": build_unary(QLinearSoftmaxOp),
}
"""Float op (by its lifted name) -> the builder of its QOperator op."""

QOPERATOR_TYPES = frozenset(
    op_class.ONNX_OP_TYPE
    for op_class in (
        QLinearConvOp,
        QLinearMatMulOp,
        QGemmOp,
        QLinearAddOp,
        QLinearMulOp,
        QLinearConcatOp,
        QLinearAveragePoolOp,
        QLinearGlobalAveragePoolOp,
        QLinearLeakyReluOp,
        QLinearSigmoidOp,
        QLinearSoftmaxOp,
    )
)
"""The ONNX op types of the QOperator ops FLOAT_OPS builds (what onnxruntime's fusions are counted by)."""


def qdq_to_qoperator(
    module: ModuleOp, *, only: Collection[str] | None = None, match_onnxruntime: bool = False
) -> QOperatorRewrite:
    """Rewrite `module`'s @main in place (see the module docstring); returns what was rewritten and why the
    other groups were kept. `only`: the float ops' node names that may be rewritten (None: every group
    that qualifies), e.g. `onnxruntime_fusions(source)`; `match_onnxruntime`: those the installed
    onnxruntime fuses in the module as the ONNX writer writes it (the writer keeps node names)."""
    function = main_function(module, "to rewrite to QOperator ops")
    if match_onnxruntime:
        from .write import write_onnx

        fused = onnxruntime_fusions(write_onnx(module, check=False))
        only = fused if only is None else fused & set(only)
    record = QOperatorRewrite()
    patterns = [QdqToQOperator((name,), build, only, record) for name, build in FLOAT_OPS.items()]
    apply_patterns(function.body, patterns, nested=False)
    return record


@register_pass
@dataclass(frozen=True, kw_only=True)
class QdqToQOperatorPass(ModulePass):
    """`qconvert opt --onnx-qdq-to-qoperator` on a lifted module: `qdq_to_qoperator` on its @main
    (`=match-onnxruntime=true`: only what the installed onnxruntime fuses)."""

    name: ClassVar[str] = "onnx-qdq-to-qoperator"
    match_onnxruntime: bool = False

    def run(self, module: Operation) -> PassResult:
        assert isinstance(module, ModuleOp)
        return PassResult(qdq_to_qoperator(module, match_onnxruntime=self.match_onnxruntime).total > 0)
