"""The QOperator ops the frontend lifts to `qconvert.*` (frontends/onnx/qoperator.py), written back as
the ONNX / com.microsoft nodes they came from.

Each quant-typed operand becomes three node inputs (storage tensor, scale, zero point), a quant-typed
result adds the output's scale and zero point, in the order of the node's schema:

| IR op `qconvert.`            | node (ms: com.microsoft) | inputs                                        |
|------------------------------|--------------------------|-----------------------------------------------|
| qlinear_conv                 | QLinearConv              | x s z, w s z, y_s y_z, [B]                    |
| qlinear_matmul               | QLinearMatMul            | a s z, b s z, y_s y_z                         |
| matmul_integer / conv_integer| MatMulInteger / ConvInteger | a, b, a_z, b_z (the IR's scale is 1)       |
| qlinear_add / qlinear_mul    | QLinearAdd / QLinearMul (ms) | a s z, b s z, c_s c_z                     |
| qlinear_concat               | QLinearConcat (ms)       | y_s y_z, then x s z per operand               |
| qlinear_sigmoid, _leaky_relu, _average_pool, _global_average_pool | QLinear* (ms) | x s z, y_s y_z |
| qgemm                        | QGemm (ms)               | a s z, b s z, [C], [y_s y_z]                  |
| dynamic_quantize_matmul      | DynamicQuantizeMatMul (ms) | a, b s z, [bias]                            |
| dynamic_quantize_linear      | DynamicQuantizeLinear    | x (three outputs)                             |

Zero points are always written (zeros where the original node had none: the same computation), and a
one-element scale is written 0-d.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import onnx_ir as ir

from qconvert.errors import InputError
from qconvert.ir.core import Operation, Value
from qconvert.ir.quant_types import QuantizedType
from qconvert.ir.types import element_type_of

from .qdq import qdq_parameters
from .types import UnwritableType

if TYPE_CHECKING:
    from .write import Writer

MS = "com.microsoft"
Inputs = list[ir.Value | None]


class Layout:
    """Builds one node's inputs from a `qconvert.*` op, through the writer's values and initializers."""

    def __init__(self, writer: Writer, op: Operation, name: str) -> None:
        self.writer = writer
        self.op = op
        self.name = name

    def parameters(self, value: Value, label: str, *, scale: bool = True) -> Inputs:
        quant_type = element_type_of(value.type)
        if not isinstance(quant_type, QuantizedType):
            raise InputError(f"'{self.op.name}' ({self.name}): {label} of type {value.type} is not quantized")
        try:
            params = qdq_parameters(quant_type, value.type, quantize=False)
        except UnwritableType as error:
            raise InputError(f"'{self.op.name}' ({self.name}): {label}: {error}") from None
        zero_point = self.writer.parameter(
            params.zero_point, params.storage, f"{self.name}_{label}_zero_point"
        )
        if not scale:
            return [zero_point]
        return [
            self.writer.parameter(params.scale, params.scale_type, f"{self.name}_{label}_scale"),
            zero_point,
        ]

    def quantized(self, index: int, label: str) -> Inputs:
        operand = self.op.operands[index]
        return [self.writer.values[operand], *self.parameters(operand, label)]

    def plain(self, index: int) -> Inputs:
        return [self.writer.values[self.op.operands[index]]] if index < len(self.op.operands) else []

    def output(self) -> Inputs:
        return self.parameters(self.op.results[0], "y")


def _qlinear_conv(layout: Layout) -> Inputs:
    return [*layout.quantized(0, "x"), *layout.quantized(1, "w"), *layout.output(), *layout.plain(2)]


def _qlinear_matmul(layout: Layout) -> Inputs:
    return [*layout.quantized(0, "a"), *layout.quantized(1, "b"), *layout.output()]


def _integer(layout: Layout) -> Inputs:
    a, b = layout.op.operands[:2]
    return [
        *layout.plain(0),
        *layout.plain(1),
        *layout.parameters(a, "a", scale=False),
        *layout.parameters(b, "b", scale=False),
    ]


def _binary(layout: Layout) -> Inputs:
    return [*layout.quantized(0, "a"), *layout.quantized(1, "b"), *layout.output()]


def _unary(layout: Layout) -> Inputs:
    return [*layout.quantized(0, "x"), *layout.output()]


def _qlinear_concat(layout: Layout) -> Inputs:
    inputs = layout.output()
    for index in range(len(layout.op.operands)):
        inputs += layout.quantized(index, f"x{index}")
    return inputs


def _qgemm(layout: Layout) -> Inputs:
    inputs = [*layout.quantized(0, "a"), *layout.quantized(1, "b")]
    quantized_output = isinstance(element_type_of(layout.op.results[0].type), QuantizedType)
    bias = layout.plain(2)
    if quantized_output:
        return [*inputs, *(bias or [None]), *layout.output()]
    return inputs + bias


def _dynamic_quantize_matmul(layout: Layout) -> Inputs:
    return [*layout.plain(0), *layout.quantized(1, "b"), *layout.plain(2)]


def _dynamic_quantize_linear(layout: Layout) -> Inputs:
    return layout.plain(0)


WRITERS: dict[str, tuple[str, str, Callable[[Layout], Inputs]]] = {
    "qconvert.qlinear_conv": ("", "QLinearConv", _qlinear_conv),
    "qconvert.qlinear_matmul": ("", "QLinearMatMul", _qlinear_matmul),
    "qconvert.matmul_integer": ("", "MatMulInteger", _integer),
    "qconvert.conv_integer": ("", "ConvInteger", _integer),
    "qconvert.dynamic_quantize_linear": ("", "DynamicQuantizeLinear", _dynamic_quantize_linear),
    "qconvert.qlinear_add": (MS, "QLinearAdd", _binary),
    "qconvert.qlinear_mul": (MS, "QLinearMul", _binary),
    "qconvert.qlinear_concat": (MS, "QLinearConcat", _qlinear_concat),
    "qconvert.qlinear_sigmoid": (MS, "QLinearSigmoid", _unary),
    "qconvert.qlinear_leaky_relu": (MS, "QLinearLeakyRelu", _unary),
    "qconvert.qlinear_softmax": (MS, "QLinearSoftmax", _unary),
    "qconvert.qlinear_average_pool": (MS, "QLinearAveragePool", _unary),
    "qconvert.qlinear_global_average_pool": (MS, "QLinearGlobalAveragePool", _unary),
    "qconvert.qgemm": (MS, "QGemm", _qgemm),
    "qconvert.dynamic_quantize_matmul": (MS, "DynamicQuantizeMatMul", _dynamic_quantize_matmul),
}


def qoperator_node(writer: Writer, op: Operation) -> tuple[str, str, Inputs, str] | None:
    """(domain, op type, inputs, node name) of a lifted QOperator op; None for another op."""
    entry = WRITERS.get(op.name)
    if entry is None:
        return None
    domain, op_type, layout_inputs = entry
    name = writer.node_name(op, op_type)
    return domain, op_type, layout_inputs(Layout(writer, op, name)), name
