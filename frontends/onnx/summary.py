"""What `qconvert inspect` and `qconvert import --elide-weights` need from a model and its lifted module.

`summarize(module)` counts ops by name and quantized tensors by scheme (per-tensor, per-axis,
sub-channel) and storage type; `quantization_styles(model)` names how the ONNX model was quantized
(static Q/DQ, QOperator, dynamic, weight-only, MatMulNBits) with counts, from the ONNX graph itself
(dynamic and weight-only models have no quantized tensor type in the lifted IR); `elide_weights(module)`
replaces large constants by MLIR's elided form, `dense_resource<__elided__>`, which parses back (with no
data) like upstream's `--mlir-elide-elementsattrs-if-larger`.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, ValueInfoProto, helper

from qconvert.interpret import input_names, output_names
from qconvert.ir.attributes import DenseElementsAttr, DenseResourceAttr
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.onnx import node_name
from qconvert.ir.dialects.qconvert import QOperatorOp
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp, StorageCastOp
from qconvert.ir.quant_types import (
    QuantizedType,
    UniformQuantizedPerAxisType,
    UniformQuantizedSubChannelType,
    UniformQuantizedType,
)
from qconvert.ir.types import element_type_of
from qconvert.storage_metadata import StorageEntry, StorageMetadata

ELIDED = "__elided__"
OUTPUT_KEY = ":output"  # ModuleSummary.quantized: a QOperator op's quantized result, by its node's name
INPUT_KEY = ":input"  # ... and its constant quantized operands (weights), by their ONNX input position


@dataclass
class ModuleSummary:
    """Counts that describe a lifted model; `lines()` is the text `qconvert inspect` prints."""

    inputs: list[str]
    outputs: list[str]
    ops: Counter[str] = field(default_factory=Counter)
    schemes: Counter[str] = field(default_factory=Counter)
    storage_types: Counter[str] = field(default_factory=Counter)
    constants: int = 0
    constant_bytes: int = 0
    styles: list[QuantizationStyle] | None = None  # from the ONNX graph (quantization_styles), when known
    storage: StorageMetadata | None = None  # a stripped model's boundary (its qconvert.storage metadata)
    # from the ONNX graph, when known (summarize_model): each input and output's type, the opsets
    input_types: list[TensorDescription] = field(default_factory=list)
    output_types: list[TensorDescription] = field(default_factory=list)
    opsets: dict[str, int] = field(default_factory=dict)
    # each quantized tensor once, in graph order: (ONNX node the cast was lifted from, its quant type)
    quantized: dict[str, QuantizedType] = field(default_factory=dict)
    quantized_tensor_names: dict[str, str] = field(default_factory=dict)  # node name -> tensor name

    def quantized_tensors(self) -> list[dict[str, object]]:
        """Each quantized tensor: its name, storage, scale(s), zero point(s), axis, block (for --json)."""
        return [
            {"tensor": self.quantized_tensor_names.get(node, node), **describe_quant_type(quant_type)}
            for node, quant_type in self.quantized.items()
        ]

    def lines(self, shown: int | None = 12) -> list[str]:
        """The summary as text; `shown`: quantized tensors listed (None: all), the rest counted."""
        if self.input_types:
            out = ["inputs:"] + [f"  {tensor.line()}" for tensor in self.input_types]
            out += ["outputs:"] + [f"  {tensor.line()}" for tensor in self.output_types]
        else:
            out = [f"inputs: {', '.join(self.inputs)}", f"outputs: {', '.join(self.outputs)}"]
        if self.opsets:
            out.append(
                "opsets: " + ", ".join(f"{domain or 'ai.onnx'} {v}" for domain, v in self.opsets.items())
            )
        out.append(f"constants: {self.constants} ({self.constant_bytes} bytes)")
        if self.styles is not None:
            names = " + ".join(style.name for style in self.styles) or "none (no quantization op or pattern)"
            out.append(f"quantization style: {names}")
            out += [f"  {style.line()}" for style in self.styles]
        out.append("ops:")
        out += [f"  {name}: {count}" for name, count in sorted(self.ops.items())]
        out.append("quantized tensors by scheme (quant.qcast / quant.dcast):")
        # dynamic and weight-only quantization scale at run time or by float ops: no quant-typed tensor
        none = "  none (the style above types no tensor)" if self.styles else "  none"
        out += [f"  {name}: {count}" for name, count in sorted(self.schemes.items())] or [none]
        out.append("storage types:")
        out += [f"  {name}: {count}" for name, count in sorted(self.storage_types.items())] or ["  none"]
        tensors = self.quantized_tensors()
        if tensors:
            out.append(f"quantized tensors ({len(tensors)}):")
            listed = tensors if shown is None else tensors[:shown]
            out += [f"  {tensor['tensor']}: {quant_type_line(tensor)}" for tensor in listed]
            if len(tensors) > len(listed):
                out.append(f"  ... and {len(tensors) - len(listed)} more (--verbose lists all)")
        if self.storage:
            out.append("storage boundary (stripped by qconvert: feed and read storage integers):")
            out += [f"  input '{name}': {describe_entry(e)}" for name, e in self.storage.inputs.items()]
            out += [f"  output '{name}': {describe_entry(e)}" for name, e in self.storage.outputs.items()]
            out += [f"  kept float '{name}': {reason}" for name, reason in self.storage.float_reasons.items()]
        return out

    def to_json(self) -> dict[str, object]:
        """What `lines()` says, for `qconvert inspect --json`: counts as name -> count, sorted by name."""
        styles = (
            None
            if self.styles is None
            else [{"name": s.name, "counts": dict(sorted(s.counts.items()))} for s in self.styles]
        )
        return {
            "inputs": self.inputs,
            "outputs": self.outputs,
            "input_types": [tensor.to_json() for tensor in self.input_types],
            "output_types": [tensor.to_json() for tensor in self.output_types],
            "opsets": {domain or "ai.onnx": version for domain, version in self.opsets.items()},
            "constants": self.constants,
            "constant_bytes": self.constant_bytes,
            "quantization_styles": styles,
            "ops": dict(sorted(self.ops.items())),
            "schemes": dict(sorted(self.schemes.items())),
            "storage_types": dict(sorted(self.storage_types.items())),
            "storage": json.loads(self.storage.sidecar_text()) if self.storage else None,
            "quantized_tensors": self.quantized_tensors(),
        }


@dataclass(frozen=True)
class TensorDescription:
    """A graph input or output as the ONNX model declares it: `image: float32 [batch, 1, 8, 8]`."""

    name: str
    dtype: str
    shape: list[int | str] | None  # a str: a named (dynamic) dim; None: the rank is unknown

    def line(self) -> str:
        shape = "unknown shape" if self.shape is None else "[" + ", ".join(str(d) for d in self.shape) + "]"
        return f"{self.name}: {self.dtype} {shape}"

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "dtype": self.dtype, "shape": self.shape}


def _dtype_name(elem_type: int) -> str:
    """`float32`, `int8`, `float8e4m3fn`: numpy's name where numpy has the type, else ONNX's, lowercased."""
    if not elem_type:
        return "?"
    with contextlib.suppress(KeyError, ValueError, TypeError):
        return str(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)))
    return TensorProto.DataType.Name(elem_type).lower()


def describe_value(value: ValueInfoProto) -> TensorDescription:
    """The dtype and shape an ONNX value info declares (a dynamic dim by its name, or '?')."""
    tensor_type = value.type.tensor_type
    dtype = _dtype_name(tensor_type.elem_type)
    if not value.type.HasField("tensor_type"):
        return TensorDescription(value.name, value.type.WhichOneof("value") or "?", None)
    if not tensor_type.HasField("shape"):
        return TensorDescription(value.name, dtype, None)
    shape: list[int | str] = [
        dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or "?")
        for dim in tensor_type.shape.dim
    ]
    return TensorDescription(value.name, dtype, shape)


def describe_quant_type(quant_type: QuantizedType) -> dict[str, object]:
    """A quant type's parameters by name: storage, scale(s), zero point(s), axis, block size(s)."""
    described: dict[str, object] = {
        "storage": quant_type.storage_type_spelling,
        "scheme": scheme_of(quant_type),
    }
    if isinstance(quant_type, UniformQuantizedType):
        described |= {"scale": quant_type.scale, "zero_point": quant_type.zero_point}
    elif isinstance(quant_type, UniformQuantizedPerAxisType):
        described |= {
            "axis": quant_type.quantized_dimension,
            "scales": list(quant_type.scales),
            "zero_points": list(quant_type.zero_points),
        }
    elif isinstance(quant_type, UniformQuantizedSubChannelType):
        described |= {
            "axes": list(quant_type.quantized_dimensions),
            "block_sizes": list(quant_type.block_sizes),
            "scales_shape": list(quant_type.scales.array.shape),
            "scale_range": [float(quant_type.scales.array.min()), float(quant_type.scales.array.max())],
            "zero_points": sorted({int(z) for z in np.unique(quant_type.zero_points.array)[:8]}),
        }
    return described


def quant_type_line(described: dict[str, object]) -> str:
    """`i8, scale 0.0039215689, zero point -128`; per-axis: axis, the scales' count and range."""
    storage = described["storage"]
    if "scale" in described:
        return f"{storage} per-tensor, scale {described['scale']:.8g}, zero point {described['zero_point']}"
    if "axis" in described:
        scales = cast(list[float], described["scales"])
        zero_points = sorted(set(cast(list[int], described["zero_points"])))
        shown = ", ".join(str(z) for z in zero_points[:4]) + (", ..." if len(zero_points) > 4 else "")
        return (
            f"{storage} per-axis (axis {described['axis']}), {len(scales)} scales in "
            f"[{min(scales):.6g}, {max(scales):.6g}], zero points {{{shown}}}"
        )
    if "block_sizes" in described:
        low, high = cast(list[float], described["scale_range"])
        return (
            f"{storage} blocked (axes {described['axes']}, block sizes {described['block_sizes']}), scales "
            f"{'x'.join(str(d) for d in cast(list[int], described['scales_shape']))} "
            f"in [{low:.6g}, {high:.6g}]"
        )
    return str(storage)


def describe_entry(entry: StorageEntry, shown: int = 4) -> str:
    """`int8, scale 0.0039215689, zero point -128 (!quant.uniform<...>)`; per-axis: the first `shown`."""
    scales = ", ".join(f"{s:.8g}" for s in entry.scale[:shown])
    zero_points = ", ".join(str(z) for z in entry.zero_point[:shown])
    if entry.axis is None:
        return f"{entry.storage}, scale {scales}, zero point {zero_points} ({entry.quant_type})"
    more = ", ..." if len(entry.scale) > shown else ""
    return (
        f"{entry.storage}, per-axis along axis {entry.axis}: {len(entry.scale)} scales [{scales}{more}], "
        f"zero points [{zero_points}{more}]"
    )


def scheme_of(quant_type: QuantizedType) -> str:
    if isinstance(quant_type, UniformQuantizedPerAxisType):
        return "per-axis"
    if isinstance(quant_type, UniformQuantizedSubChannelType):
        return "sub-channel (blocked)"
    return "per-tensor"


def summarize(module: ModuleOp) -> ModuleSummary:
    summary = ModuleSummary(input_names(module), output_names(module))
    for op in module.walk():
        if op is module or op.name in ("func.func", "func.return"):
            continue
        summary.ops[op.name] += 1
        if isinstance(op, ConstantOp) and isinstance(op.value, DenseElementsAttr):
            summary.constants += 1
            summary.constant_bytes += op.value.array.nbytes
        elif isinstance(op, ConstantOp) and isinstance(op.value, DenseResourceAttr):
            elements = op.value.elements  # shape and dtype only: the blob is not read
            summary.constants += 1
            if elements is not None:
                summary.constant_bytes += (
                    int(np.prod(elements.shape, dtype=np.int64)) * elements.dtype.itemsize
                )
        quantized = None
        if isinstance(op, QuantizeCastOp):
            quantized = element_type_of(op.result.type)
        elif isinstance(op, DequantizeCastOp):
            quantized = element_type_of(op.input.type)
        if isinstance(quantized, QuantizedType):
            summary.schemes[scheme_of(quantized)] += 1
            summary.storage_types[quantized.storage_type_spelling] += 1
            summary.quantized.setdefault(node_name(op) or f"#{len(summary.quantized)}", quantized)
        elif op.name.startswith("qconvert.") and node_name(op) and op.results:  # a QOperator op's output
            if isinstance(op, QOperatorOp):
                _constant_operands(op, summary)
            result_type = element_type_of(op.results[0].type)
            if isinstance(result_type, QuantizedType):
                summary.quantized.setdefault(f"{node_name(op)}{OUTPUT_KEY}", result_type)
    return summary


def _constant_operands(op: QOperatorOp, summary: ModuleSummary) -> None:
    """A QOperator op's weights: each operand that is a storage cast of a constant (the frontend's lifted
    initializer), keyed by the op's node and the operand's ONNX input position (named in summarize_model)."""
    positions = op.onnx_inputs()
    for label, value in op.named_operands().items():
        cast_op = value.owner_op()
        quant_type = element_type_of(value.type)
        if (
            isinstance(cast_op, StorageCastOp)
            and isinstance(cast_op.input.owner_op(), ConstantOp)
            and isinstance(quant_type, QuantizedType)
            and label in positions
        ):
            summary.quantized.setdefault(f"{node_name(op)}{INPUT_KEY}{positions.index(label)}", quant_type)


def elide_weights(module: ModuleOp, threshold: int = 16) -> int:
    """Replace constants of more than `threshold` elements, and every `dense_resource` blob, by
    `dense_resource<__elided__>` (no data; MLIR prints elided resources so); the count."""
    elided = 0
    for op in module.walk():
        value = op.attributes.get("value") if isinstance(op, ConstantOp) else None
        if (isinstance(value, DenseElementsAttr) and value.array.size > threshold) or (
            isinstance(value, DenseResourceAttr) and value.name != ELIDED
        ):
            op.attributes["value"] = DenseResourceAttr(ELIDED, value.type)
            elided += 1
    return elided


# Quantization styles, from the ONNX graph ----------------------------------------------------------------

MICROSOFT = "com.microsoft"
# onnxruntime's quantize_dynamic and the com.microsoft ops that quantize activations at run time
DYNAMIC_OPS = frozenset(
    {
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "ConvInteger",
        f"{MICROSOFT}.DynamicQuantizeMatMul",
        f"{MICROSOFT}.DynamicQuantizeLSTM",
        f"{MICROSOFT}.MatMulIntegerToFloat",
        f"{MICROSOFT}.DynamicQuantizeLinear",
    }
)
# Ops computing on quantized tensors with scales and zero points as inputs (onnxruntime's QOperator format)
QOPERATOR_OPS = frozenset({"QLinearConv", "QLinearMatMul", f"{MICROSOFT}.QGemm", f"{MICROSOFT}.QAttention"})
BLOCKWISE_OPS = frozenset(
    {f"{MICROSOFT}.MatMulNBits", f"{MICROSOFT}.MatMulBnb4", f"{MICROSOFT}.GatherBlockQuantized"}
)
# Ops whose weight input a weight-only model dequantizes (activations stay float)
WEIGHT_CONSUMERS = frozenset(
    {
        "MatMul",
        "Gemm",
        "Conv",
        "ConvTranspose",
        "LSTM",
        "GRU",
        "RNN",
        "Einsum",
        "Attention",
        "MultiHeadAttention",
    }
)
# Layout ops a dequantized weight may pass through before its consumer
PASS_THROUGH = frozenset({"Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Cast"})
INTEGER_TYPES = frozenset(
    {
        TensorProto.INT8,
        TensorProto.UINT8,
        TensorProto.INT16,
        TensorProto.UINT16,
        TensorProto.INT4,
        TensorProto.UINT4,
        TensorProto.INT32,
    }
)
FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})

STYLE_DESCRIPTIONS = {
    "static Q/DQ": "activations quantized and dequantized in the graph, as quantize_static writes QDQ",
    "QOperator": "ops on quantized tensors, as quantize_static writes QOperator",
    "dynamic": "activations quantized at run time, as quantize_dynamic writes",
    "weight-only": "integer weights dequantized to float, activations float",
    "block-wise (MatMulNBits)": "n-bit block-quantized weights, com.microsoft ops",
}


@dataclass
class QuantizationStyle:
    """One quantization style found in a model: its name and what was counted for it."""

    name: str
    counts: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def counted(self) -> str:
        """`12 MatMulInteger, 8 DynamicQuantizeLinear`: most frequent first."""
        return ", ".join(f"{count} {what}" for what, count in sorted(self.counts.items(), key=_by_count))

    def line(self) -> str:
        return f"{self.name} ({STYLE_DESCRIPTIONS[self.name]}): {self.counted()}"


def _by_count(item: tuple[str, int]) -> tuple[int, str]:
    return (-item[1], item[0])


def _op_key(node: NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _constant_types(model: ModelProto) -> dict[str, int]:
    """Element type of every constant value: initializers and Constant nodes' tensors (data not read)."""
    constants = {init.name: init.data_type for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attribute in node.attribute:
                if attribute.name == "value" and attribute.HasField("t"):
                    constants[node.output[0]] = attribute.t.data_type
    return constants


def quantization_styles(model: ModelProto) -> list[QuantizationStyle]:
    """Which quantization styles the graph (main graph only) uses, most used first, with counts.

    - static Q/DQ: a QuantizeLinear of a non-constant value whose output feeds a DequantizeLinear, and
      the DequantizeLinear of a constant (a weight) feeding an op whose activation is dequantized too;
    - QOperator: QLinear* ops (ai.onnx, com.microsoft) and QGemm / QAttention;
    - dynamic: DynamicQuantizeLinear, MatMulInteger, ConvInteger, DynamicQuantizeMatMul,
      DynamicQuantizeLSTM, MatMulIntegerToFloat;
    - weight-only: an integer constant -> Cast(to float) -> [Sub] -> Mul, or a DequantizeLinear of a
      constant, reaching (through layout ops) a MatMul / Gemm / Conv / recurrent op none of whose inputs
      is a dequantized activation;
    - block-wise: com.microsoft MatMulNBits (by bit width), MatMulBnb4, GatherBlockQuantized.
    """
    nodes = list(model.graph.node)
    constants = _constant_types(model)
    producers = {output: node for node in nodes for output in node.output}
    consumers: dict[str, list[NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    styles = {name: QuantizationStyle(name) for name in STYLE_DESCRIPTIONS}

    def activation_dequantized(name: str) -> bool:
        """Whether `name` is (through layout ops) a DequantizeLinear of a value computed at run time."""
        node = producers.get(name)
        while node is not None and node.op_type in PASS_THROUGH and node.input:
            node = producers.get(node.input[0])
        return node is not None and node.op_type == "DequantizeLinear" and node.input[0] not in constants

    def final_consumers(name: str) -> Iterable[NodeProto]:
        for consumer in consumers.get(name, []):
            if consumer.op_type in PASS_THROUGH:
                yield from final_consumers(consumer.output[0])
            else:
                yield consumer

    def dequantized_weight(output: str, pattern: str) -> None:
        """A weight dequantized to float: weight-only where its consumer's activations are float."""
        for consumer in final_consumers(output):
            if consumer.op_type not in WEIGHT_CONSUMERS:
                continue
            if any(activation_dequantized(name) for name in consumer.input if name):
                if pattern == "DequantizeLinear":
                    styles["static Q/DQ"].counts["DequantizeLinear of a constant"] += 1
            else:
                styles["weight-only"].counts[f"{pattern} -> {consumer.op_type}"] += 1

    for node in nodes:
        key = _op_key(node)
        if key in DYNAMIC_OPS:
            styles["dynamic"].counts[key.removeprefix(f"{MICROSOFT}.")] += 1
        elif key in QOPERATOR_OPS or node.op_type.startswith("QLinear"):
            styles["QOperator"].counts[key.removeprefix(f"{MICROSOFT}.")] += 1
        elif key in BLOCKWISE_OPS:
            bits = next((a.i for a in node.attribute if a.name == "bits"), None)
            label = key.removeprefix(f"{MICROSOFT}.") + (f" ({bits}-bit)" if bits else "")
            styles["block-wise (MatMulNBits)"].counts[label] += 1
        elif key == "QuantizeLinear" and node.input[0] not in constants:
            if any(c.op_type == "DequantizeLinear" for c in consumers.get(node.output[0], [])):
                styles["static Q/DQ"].counts["QuantizeLinear -> DequantizeLinear"] += 1
        elif key == "DequantizeLinear" and node.input[0] in constants:
            dequantized_weight(node.output[0], "DequantizeLinear")
        elif key == "Cast" and constants.get(node.input[0]) in INTEGER_TYPES:
            to = next((a.i for a in node.attribute if a.name == "to"), None)
            scaled = _scaled_by_mul(node.output[0], consumers)
            if to in FLOAT_TYPES and scaled is not None:
                dequantized_weight(scaled.output[0], "Cast -> Mul")
    found = [style for style in styles.values() if style.total]
    return sorted(found, key=lambda style: -style.total)


def _scaled_by_mul(name: str, consumers: dict[str, list[NodeProto]]) -> NodeProto | None:
    """The Mul that scales a cast weight, directly or after a Sub (zero point)."""
    for consumer in consumers.get(name, []):
        if consumer.op_type == "Mul":
            return consumer
        if consumer.op_type == "Sub":
            return next((c for c in consumers.get(consumer.output[0], []) if c.op_type == "Mul"), None)
    return None


def summarize_model(
    source: str | ModelProto, input_shapes: dict[str, tuple[int, ...]] | None = None
) -> ModuleSummary:
    """`summarize` of the lifted model, with the ONNX graph's quantization styles (what `inspect` prints).

    When the model does not lift, the InputError says why and still names the styles (read from the graph).
    """
    from qconvert.errors import InputError

    from .lift import import_onnx
    from .load import read_model

    model = read_model(source)[0]
    styles = quantization_styles(model)
    where = source if isinstance(source, str) else "the model"
    storage = StorageMetadata.from_metadata_props({p.key: p.value for p in model.metadata_props}, where)
    try:
        module = import_onnx(source, input_shapes)
    except InputError as error:
        found = "; ".join(f"{style.name}: {style.counted()}" for style in styles) or "none"
        note = f"\n(the model's quantization style, read from the graph: {found})"
        raise InputError(error.message + note, error.loc, error.related) from None
    summary = summarize(module)
    summary.styles = styles
    summary.storage = storage
    initializers = {init.name for init in model.graph.initializer}
    summary.input_types = [describe_value(v) for v in model.graph.input if v.name not in initializers]
    summary.output_types = [describe_value(v) for v in model.graph.output]
    summary.opsets = {entry.domain: entry.version for entry in model.opset_import}
    # a tensor is named by what is quantized: a Q node's input, or a DQ node's (its Q node's input if any)
    quantizers = {node.output[0]: node for node in model.graph.node if node.op_type == "QuantizeLinear"}
    for node in model.graph.node:
        if node.name in summary.quantized and node.input:
            quantizer = quantizers.get(node.input[0]) if node.op_type == "DequantizeLinear" else None
            summary.quantized_tensor_names[node.name] = (quantizer or node).input[0]
        if f"{node.name}{OUTPUT_KEY}" in summary.quantized and node.output:  # QLinear*: what it computes
            summary.quantized_tensor_names[f"{node.name}{OUTPUT_KEY}"] = node.output[0]
        for position, name in enumerate(node.input):  # QLinear*'s weights: the initializers it reads
            if name and f"{node.name}{INPUT_KEY}{position}" in summary.quantized:
                summary.quantized_tensor_names[f"{node.name}{INPUT_KEY}{position}"] = name
    # a tensor quantized then dequantized is listed once (the Q and DQ nodes name the same tensor)
    seen: set[str] = set()
    for node_key in list(summary.quantized):
        tensor = summary.quantized_tensor_names.get(node_key, node_key)
        if tensor in seen:
            del summary.quantized[node_key]
        seen.add(tensor)
    return summary
