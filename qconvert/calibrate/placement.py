"""Which values get Q/DQ: onnxruntime's QDQ placement rules (reference §2.6), decided on the IR.

NOTE: this follows `QDQQuantizer.quantize_model` step by step so that the set of quantized tensors is
onnxruntime's: ranges are adjusted first (`adjust_tensor_ranges`: a single-consumer Relu/Clip input
takes the output's range, Softmax outputs get [0, 1]), then nodes are visited in graph order and each
op type marks tensors the way its onnxruntime op quantizer does:

- Conv, ConvTranspose, Gemm: input 0 and output activations, the weight, an int32 bias;
- MatMul: constant inputs as weights, other inputs and the output as activations;
- Relu, Clip: only when the input is quantized; folded into the producer (asymmetric activations);
- Reshape, Transpose, Squeeze, Unsqueeze, Flatten, AveragePool, Slice, TopK, MaxPool, Resize: the
  output shares the input's parameters, when the input is quantized;
- Split, Gather, GatherElements, Pad, Where: onnxruntime's special cases (see each handler);
- Instance/Layer/BatchNormalization: input, scale as a weight, bias as int32, outputs;
- any other selected op: every float input and output (constant inputs: activation-typed).

Marking order matters (a later marking does not replace an earlier one, except parameter sharing and
per-channel weights, which do), exactly as in onnxruntime. A tensor is a value of the lifted IR seen
through its calibrated qcast/dcast pair; a constant without a range is an initializer.

Deliberate differences (each documented in tests/calibrate/test_minmax_parity.py): tensors in
`scheme.keep_float` are never marked (downstream parameter sharing and biases then stay float, where
onnxruntime would fail); a bias whose input or weight stays float stays float (onnxruntime raises);
blocked weights of rank != 2 fall back to per-channel / per-tensor (onnxruntime raises); with float8
activations Relu/Clip are kept (their Q/DQ does not clamp at zero; onnxruntime folds them); a Relu/Clip
whose output range would not make the Q/DQ clamp as the op does (a symmetric range, a Clip not at 0 or
with bounds that are not constants), or whose output gets no Q/DQ (kept in float, output quantization
excluded), is kept, not folded (MinMax ranges of a Relu always clamp as it does); a Relu/Clip input that
is also a graph output keeps its own range (onnxruntime gives it the op's output range, clipping its
negatives); a Relu/Clip output overridden to a symmetric range is not folded either; a per-channel axis
override on the summed-over axis of a Conv or Gemm weight is refused (onnxruntime's fused kernels read
it as per output channel and its model runs wrong; ConvTranspose runs unfused, any axis). finalize.py
departs on biases too: a Gemm's stores beta·C, a normalization's coarser than its output step stays
float, one without an entry per weight channel stays float.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from qconvert.calibrate.scheme import Scheme
from qconvert.calibrate.tensor_names import CONSTANT_NAME_ATTR, TENSOR_NAME_ATTR
from qconvert.errors import InputError
from qconvert.interpret import input_names
from qconvert.ir.attributes import FloatAttr, IntegerAttr, StringAttr
from qconvert.ir.core import BlockArgument, Operation, Value
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.func import ReturnOp
from qconvert.ir.dialects.onnx import default_opset, main_function, node_name, present_positions
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp
from qconvert.ir.quant_types import CalibratedQuantizedType
from qconvert.ir.types import F16, F32, element_type_of

DIRECT_8BIT = frozenset(
    {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "AveragePool", "Slice", "TopK"}
)
NORMALIZATION = frozenset({"InstanceNormalization", "LayerNormalization", "BatchNormalization"})
REMOVABLE = frozenset({"Relu", "Clip"})
# The end of a note saying onnxruntime's extended optimizations break the model (calibrate's comparison
# with the float model then runs at BASIC too).
ORT_BASIC_ADVICE = "run this model at ORT_ENABLE_BASIC"


@dataclass(eq=False)
class Node:
    """One ONNX node of the lifted module: its op, and its operands/results seen through calibrated pairs."""

    op: Operation
    op_type: str
    name: str
    inputs: list[Value]
    outputs: list[Value]


def _onnx_input(node: Node, position: int) -> Value | None:
    """The node's ONNX input at `position`, None when absent (the IR lists present inputs only)."""
    positions = present_positions(node.op)
    return node.inputs[positions.index(position)] if position in positions else None


@dataclass
class Mark:
    """A tensor chosen for Q/DQ: activation or weight, per-channel axis, or parameters of `provider`."""

    is_weight: bool = False
    axis: int | None = None
    provider: Value | None = None
    provider_node: Node | None = None


@dataclass(eq=False)
class Bias:
    """An int32 bias: operand `index` of `node`, scale = scale(input) * scale(weight) * beta."""

    node: Node
    index: int
    value: Value
    input: Value
    weight: Value
    beta: float = 1.0


@dataclass
class Plan:
    """What finalize must do: marked tensors, int32 biases, folded Relu/Clip nodes, adjusted ranges."""

    marks: dict[Value, Mark] = field(default_factory=dict)
    biases: list[Bias] = field(default_factory=list)
    removed: list[tuple[Node, Value, Value]] = field(default_factory=list)  # (node, upstream, output)
    ranges: dict[Value, tuple[np.float32, np.float32]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class Graph:
    """The lifted module as onnxruntime's quantizer sees the ONNX graph."""

    def __init__(self, module: ModuleOp, value_names: Mapping[Value, str] | None = None) -> None:
        function = main_function(module)
        self.value_names = dict(value_names or {})
        self.block = function.regions[0].entry
        self.argument_names = input_names(module)  # ONNX graph input names
        self.pairs: dict[Value, QuantizeCastOp] = {}
        for op in self.block.ops:
            if isinstance(op, QuantizeCastOp) and isinstance(
                element_type_of(op.result.type), CalibratedQuantizedType
            ):
                self.pairs[op.input] = op
        self.nodes = [self._node(op) for op in self.block.ops if _is_onnx_node(op)]
        self.consumers: dict[Value, list[Node]] = {}
        for node in self.nodes:
            for value in node.inputs:
                self.consumers.setdefault(value, []).append(node)
        terminator = self.block.ops[-1] if self.block.ops else None
        self.outputs = (
            {self.source(v) for v in terminator.operands} if isinstance(terminator, ReturnOp) else set()
        )

    def source(self, value: Value) -> Value:
        """The float value a calibrated dcast stands for (itself for any other value)."""
        producer = value.owner_op()
        if isinstance(producer, DequantizeCastOp):
            quantize = producer.input.owner_op()
            if isinstance(quantize, QuantizeCastOp) and self.pairs.get(quantize.input) is quantize:
                return quantize.input
        return value

    def _node(self, op: Operation) -> Node:
        return Node(
            op,
            op.name.removeprefix("onnx."),
            node_name(op) or "",
            [self.source(v) for v in op.operands],
            list(op.results),
        )

    def is_initializer(self, value: Value) -> bool:
        """A constant without a calibrated range: an initializer (onnxruntime observes Constant outputs)."""
        return isinstance(value.owner_op(), ConstantOp) and value not in self.pairs

    def is_float(self, value: Value) -> bool:
        return element_type_of(value.type) in (F32, F16)

    def is_pre_quantized(self, value: Value) -> bool:
        """Produced by a DequantizeLinear of the source model (already quantized by another tool)."""
        return isinstance(value.owner_op(), DequantizeCastOp) and value not in self.pairs

    def name(self, value: Value) -> str:
        """The ONNX tensor name, where the module records it."""
        quantize = self.pairs.get(value)
        if quantize is not None and isinstance(quantize.attributes.get(TENSOR_NAME_ATTR), StringAttr):
            return quantize.attributes[TENSOR_NAME_ATTR].value  # type: ignore[union-attr]
        producer = value.owner_op()
        if producer is not None and isinstance(producer.attributes.get(CONSTANT_NAME_ATTR), StringAttr):
            return producer.attributes[CONSTANT_NAME_ATTR].value  # type: ignore[union-attr]
        if value in self.value_names:
            return self.value_names[value]
        name = node_name(producer) if isinstance(producer, Operation) else None
        if name is not None:
            return f"{name}:{value.index}"  # type: ignore[attr-defined]
        return self.argument_names[value.index] if isinstance(value, BlockArgument) else "<unnamed>"

    def range_of(self, value: Value) -> tuple[np.float32, np.float32] | None:
        quantize = self.pairs.get(value)
        if quantize is None:
            return None
        calibrated = element_type_of(quantize.result.type)
        return np.float32(calibrated.min), np.float32(calibrated.max)  # type: ignore[attr-defined]


def _is_onnx_node(op: Operation) -> bool:
    return op.name.startswith("onnx.") and node_name(op) is not None


class Planner:
    """onnxruntime's QDQQuantizer marking pass, over a `Graph`."""

    def __init__(self, graph: Graph, scheme: Scheme, opset: int) -> None:
        self.graph = graph
        self.scheme = scheme
        self.opset = opset
        self.plan = Plan()
        self.keep_float = set(scheme.keep_float)
        self.op_types = scheme.quantized_op_types
        self.bias_keys: set[Value] = set()

    # Marking primitives (onnxruntime's quantize_*_tensor) ------------------------------------------
    def quantizable(self, value: Value) -> bool:
        if not self.graph.is_float(value) or self.graph.name(value) in self.keep_float:
            return False
        return not self.graph.is_pre_quantized(value)

    def is_quantized(self, value: Value) -> bool:
        return value in self.plan.marks or value in self.bias_keys

    def activation(self, value: Value) -> None:
        if self.quantizable(value) and value not in self.plan.marks:
            self.plan.marks[value] = Mark()

    def weight(self, value: Value) -> None:
        if self.quantizable(value) and value not in self.plan.marks:
            self.plan.marks[value] = Mark(is_weight=True)

    def weight_per_channel(self, value: Value, axis: int) -> None:
        if self.graph.is_initializer(value) and self.quantizable(value):
            self.plan.marks[value] = Mark(is_weight=True, axis=axis)

    def shared(self, output: Value, provider: Value, node: Node) -> None:
        if self.quantizable(output):
            self.plan.marks[output] = Mark(provider=provider, provider_node=node)

    def bias(self, node: Node, index: int, input_: Value, weight: Value, beta: float = 1.0) -> None:
        value = node.inputs[index]
        if not self.graph.is_initializer(value) or not self.quantizable(value):
            return
        self.bias_keys.add(value)
        self.plan.biases.append(Bias(node, index, value, input_, weight, beta))

    def per_channel_axis(
        self, value: Value, default_axis: int, op_type: str | None, fused_kernel: bool = False
    ) -> int | None:
        """onnxruntime's `is_tensor_per_channel`: the axis, or None (not per-channel, or out of range). An
        override with an axis makes the weight per-channel along it, one without makes it per-tensor."""
        override = self.scheme.tensor_overrides.get(self.graph.name(value))
        if not self.graph.is_initializer(value) or (override is None and not self.scheme.per_channel):
            return None
        if override is not None and override.axis is None:
            return None
        axis = self.scheme.per_channel_axis.get(op_type, default_axis) if op_type else default_axis
        axis = axis if override is None or override.axis is None else override.axis
        rank = len(getattr(value.type, "shape", ()))
        if fused_kernel and override is not None and -rank <= axis < rank and axis % rank != default_axis:
            # Conv/Gemm: onnxruntime's fused kernels take per-channel scales as per output channel; along
            # the summed-over axis its model runs wrong (Conv cosine 0.33 at ENABLE_ALL).
            raise InputError(
                f"tensor overrides: '{self.graph.name(value)}': axis {override.axis} is not the "
                f"output-channel axis ({default_axis}) of its weight; per-channel scales go along the "
                f"output channels"
            )
        if not -rank <= axis < rank:
            if override is None and rank <= 1:  # a vector (a LayerNorm scale) under the per-channel default
                return None  # one scale, as onnxruntime: not worth a note on every transformer
            self.plan.notes.append(
                f"weight '{self.graph.name(value)}': per-channel axis {axis} is out of range for rank "
                f"{rank}; quantized per tensor (as onnxruntime)"
            )
            return None
        return axis % rank

    # Graph questions ---------------------------------------------------------------------------
    def should_quantize(self, node: Node) -> bool:
        scheme = self.scheme
        if scheme.nodes_to_quantize and node.name not in scheme.nodes_to_quantize:
            return False
        if node.op_type not in self.op_types or node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            return False
        return node.name not in scheme.nodes_to_exclude

    def output_disabled(self, node: Node) -> bool:
        return node.op_type in self.scheme.op_types_to_exclude_output_quantization

    # The passes ---------------------------------------------------------------------------------
    def run(self) -> Plan:
        self.adjust_ranges()
        for node in self.graph.nodes:
            if self.should_quantize(node):
                handler = getattr(self, f"quantize_{node.op_type}", None)
                (handler or self.quantize_generic)(node)
        return self.plan

    def adjust_ranges(self) -> None:
        """onnxruntime's `adjust_tensor_ranges`, in graph order."""
        ranges = self.plan.ranges
        for value in self.graph.pairs:
            found = self.graph.range_of(value)
            assert found is not None
            ranges[value] = found
        for node in self.graph.nodes:
            if node.op_type in REMOVABLE and self.should_quantize(node):
                upstream, output = node.inputs[0], node.outputs[0]
                # onnxruntime also narrows an input that is a graph output (it counts node consumers
                # only), which clips that output's negatives: we leave graph outputs their own range.
                if (
                    len(self.graph.consumers.get(upstream, [])) == 1
                    and upstream not in self.graph.outputs
                    and upstream in ranges
                    and output in ranges
                ):
                    ranges[upstream] = ranges[output]
            elif node.op_type == "Softmax" and self.should_quantize(node):
                ranges[node.outputs[0]] = (np.float32(0.0), np.float32(1.0))

    def quantize_generic(self, node: Node) -> None:
        for value in node.inputs if self.output_disabled(node) else [*node.inputs, *node.outputs]:
            self.activation(value)

    # Handlers are named quantize_<ONNX op type>.
    def quantize_Conv(self, node: Node) -> None:
        self.activation(node.inputs[0])
        if not self.output_disabled(node):
            self.activation(node.outputs[0])
        # onnxruntime runs ConvTranspose unfused: a per-channel axis of its choice runs correctly.
        fused = node.op_type == "Conv"
        axis = self.per_channel_axis(node.inputs[1], 0 if fused else 1, None, fused_kernel=fused)
        if axis is not None:
            self.weight_per_channel(node.inputs[1], axis)
        else:
            self.weight(node.inputs[1])
        if len(node.inputs) == 3:
            self.bias(node, 2, node.inputs[0], node.inputs[1])

    quantize_ConvTranspose = quantize_Conv

    def quantize_Gemm(self, node: Node) -> None:
        self.activation(node.inputs[0])
        if not self.output_disabled(node):
            self.activation(node.outputs[0])
        trans_b = node.op.attributes.get("transB")
        transposed = isinstance(trans_b, IntegerAttr) and trans_b.value != 0
        axis = self.per_channel_axis(node.inputs[1], 0 if transposed else 1, None, fused_kernel=True)
        if axis is not None:
            self.weight_per_channel(node.inputs[1], axis)
        else:
            self.weight(node.inputs[1])
        if len(node.inputs) == 3 and self.graph.is_initializer(node.inputs[2]):
            beta = node.op.attributes.get("beta")
            self.bias(
                node, 2, node.inputs[0], node.inputs[1], beta.value if isinstance(beta, FloatAttr) else 1.0
            )

    def quantize_MatMul(self, node: Node) -> None:
        values = node.inputs if self.output_disabled(node) else [*node.inputs, *node.outputs]
        for value in values:
            if self.graph.is_initializer(value):
                axis = self.per_channel_axis(value, 1, node.op_type)
                if axis is not None:
                    self.weight_per_channel(value, axis)
                else:
                    self.weight(value)
            else:
                self.activation(value)

    def quantize_Relu(self, node: Node) -> None:
        upstream, output = node.inputs[0], node.outputs[0]
        if not self.is_quantized(upstream):
            return
        scheme = self.scheme
        # Folding hands the op's clamp to the output's Q/DQ: there must be one, and it must clamp where the
        # op does; float8 has no zero point to clamp at (onnxruntime folds in all these cases, and reads
        # only the scheme's symmetry, not an override's).
        foldable = (
            not scheme.activation_symmetric_of(self.graph.name(output))
            and scheme.activation_type != "float8e4m3fn"
            and not scheme.keep_removable_activations
            and not self.output_disabled(node)
            and self.graph.name(output) not in self.keep_float
        )
        if foldable and self.clamps_as(node) and self.fold(node):  # fold() last: it changes the marks
            self.plan.removed.append((node, upstream, output))
        else:
            self.activation(upstream)
            if scheme.activation_type == "float8e4m3fn":
                self.plan.notes.append(
                    f"{node.op_type} '{node.name}' kept between float8 Q/DQ: onnxruntime's extended graph "
                    f"optimizations remove it anyway (measured: digits logits cosine 0.05-0.42): "
                    f"{ORT_BASIC_ADVICE}"
                )
        if not self.output_disabled(node):
            self.activation(output)

    quantize_Clip = quantize_Relu

    def clamps_as(self, node: Node) -> bool:
        """Whether the output's Q/DQ, which the producer takes over when the op is folded, clamps as the op:
        its real range [min(low, 0), max(high, 0)] lies within the op's [lower, upper] bounds (None: not
        constant). MinMax ranges of a Relu, or of a Clip from at most 0, always do; symmetric ones
        (Distribution's), edited ones and a Clip's from above 0 may not, and onnxruntime folds those too,
        letting values through (measured: logits cosine 0.05 on digits)."""
        found = self.plan.ranges.get(node.outputs[0])
        bounds = self.clamp_bounds(node)
        if found is None or bounds is None:
            return False
        return bounds[0] <= min(float(found[0]), 0.0) and max(float(found[1]), 0.0) <= bounds[1]

    def clamp_bounds(self, node: Node) -> tuple[float, float] | None:
        """[lower, upper] of a Relu or Clip (unbounded where absent); None when a bound is not a constant."""
        if node.op_type == "Relu":
            return 0.0, math.inf
        if self.opset < 11:
            bounds = [node.op.attributes.get(name) for name in ("min", "max")]
            lower, upper = (b.value if isinstance(b, FloatAttr) else None for b in bounds)
            return (-math.inf if lower is None else lower), (math.inf if upper is None else upper)
        lower = -math.inf if _onnx_input(node, 1) is None else self.float_constant(node, 1)
        upper = math.inf if _onnx_input(node, 2) is None else self.float_constant(node, 2)
        return None if lower is None or upper is None else (lower, upper)

    def fold(self, node: Node) -> bool:
        """onnxruntime's `try_replacing_upstream_output`: the producer takes over the Relu/Clip output."""
        upstream, output = node.inputs[0], node.outputs[0]
        graph = self.graph
        if (
            output in self.plan.ranges
            and upstream in self.plan.ranges
            and len(graph.consumers.get(upstream, [])) == 1
            and upstream not in graph.outputs
            and not isinstance(upstream, BlockArgument)
            and not graph.is_initializer(upstream)
        ):
            self.plan.marks.pop(upstream, None)
            return True
        return False

    def quantize_direct(self, node: Node) -> None:
        if self.scheme.force_quantize_no_input_check:
            self.activation(node.inputs[0])
            if not self.output_disabled(node):
                self.shared(node.outputs[0], node.inputs[0], node)
        elif self.is_quantized(node.inputs[0]) and not self.output_disabled(node):
            self.shared(node.outputs[0], node.inputs[0], node)

    def quantize_MaxPool(self, node: Node) -> None:
        if self.opset >= 12 and self.scheme.activation_type != "float8e4m3fn":
            self.quantize_direct(node)
        storage = self.scheme.activation_type_of(self.graph.name(node.inputs[0]))
        if storage in ("int4", "uint4") and node.outputs[0] in self.plan.marks:
            self.plan.notes.append(
                f"MaxPool '{node.name}': onnxruntime's extended graph optimizations drop its Q/DQ pair, then "
                f"refuse a {storage} MaxPool: {ORT_BASIC_ADVICE} "
                f"(quantize_static's model fails the same way)"
            )

    def quantize_Resize(self, node: Node) -> None:
        if self.opset >= 11:
            self.quantize_direct(node)

    def quantize_Split(self, node: Node) -> None:
        if not self.is_quantized(node.inputs[0]):
            self.activation(node.inputs[0])
        if not self.output_disabled(node):
            for output in node.outputs:
                self.shared(output, node.inputs[0], node)

    def quantize_Gather(self, node: Node) -> None:
        table = node.inputs[0]
        if (self.graph.is_initializer(table) and self.graph.is_float(table)) or (
            self.scheme.force_quantize_no_input_check
        ):
            self.activation(table)
            self.shared(node.outputs[0], table, node)
        elif self.is_quantized(table):
            self.shared(node.outputs[0], table, node)

    quantize_GatherElements = quantize_Gather

    def quantize_Where(self, node: Node) -> None:
        if self.scheme.force_quantize_no_input_check:
            for value in node.inputs[1:3]:
                if not self.is_quantized(value):
                    self.activation(value)
            if not self.output_disabled(node):
                for output in node.outputs:
                    self.activation(output)
        elif (
            self.is_quantized(node.inputs[1])
            and self.is_quantized(node.inputs[2])
            and not self.output_disabled(node)
        ):
            for output in node.outputs:
                self.activation(output)

    def quantize_Pad(self, node: Node) -> None:
        for value in node.inputs:
            self.activation(value)
        if self.output_disabled(node):
            return
        if self.pad_keeps_values(node):
            self.shared(node.outputs[0], node.inputs[0], node)
        else:
            self.activation(node.outputs[0])

    def pad_keeps_values(self, node: Node) -> bool:
        """reflect/edge/wrap pads, or a constant pad of 0 (inside every range), add no new values."""
        mode = node.op.attributes.get("mode")
        mode_name = mode.value if isinstance(mode, StringAttr) else "constant"
        if mode_name in ("reflect", "edge", "wrap"):
            return True
        if mode_name != "constant":
            return False
        if self.opset < 11:
            value = node.op.attributes.get("value")
            return not isinstance(value, FloatAttr) or value.value == 0.0
        if _onnx_input(node, 2) is None:
            return True  # no constant_value input: pads with 0
        return self.float_constant(node, 2) == 0.0

    def float_constant(self, node: Node, position: int) -> float | None:
        """The scalar value of the node's float constant ONNX input at `position`; None otherwise."""
        constant = _onnx_input(node, position)
        if constant is None or not self.graph.is_float(constant):
            return None
        producer = constant.owner_op()
        if not isinstance(producer, ConstantOp):
            return None
        from qconvert.interpret import constant_array  # the interpreter owns reading constants

        return float(np.asarray(constant_array(producer)).reshape(-1)[0])

    def quantize_normalization(self, node: Node) -> None:
        self.activation(node.inputs[0])
        scale = node.inputs[1]
        axis = self.per_channel_axis(scale, 1, node.op_type)
        if axis is not None:
            self.weight_per_channel(scale, axis)
        elif self.graph.is_initializer(scale):
            self.weight(scale)
        else:
            self.activation(scale)
        if len(node.inputs) > 2:
            self.bias(node, 2, node.inputs[0], scale)
        if not self.output_disabled(node):
            for output in node.outputs:
                self.activation(output)

    quantize_InstanceNormalization = quantize_normalization
    quantize_LayerNormalization = quantize_normalization
    quantize_BatchNormalization = quantize_normalization


for _op_type in DIRECT_8BIT:
    setattr(Planner, f"quantize_{_op_type}", Planner.quantize_direct)


def plan_quantization(
    module: ModuleOp, scheme: Scheme, value_names: Mapping[Value, str] | None = None
) -> tuple[Graph, Plan]:
    """Mark the tensors onnxruntime's QDQ quantizer would quantize, on a module with calibrated pairs
    (`value_names`: ONNX names of values the module does not name, for messages)."""
    graph = Graph(module, value_names)
    return graph, Planner(graph, scheme, default_opset(module)).run()
