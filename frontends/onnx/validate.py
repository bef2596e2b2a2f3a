"""Structural checks of a parsed ONNX model, before anything reads its tensors or trusts its attributes.

NOTE: a malformed model must be an `InputError` naming the tensor / node / value and what is wrong, never
an exception deep inside numpy (a reshape of too few elements) or a silently wrong lift (dims of -1 read
as whatever the data holds). `check_model_structure` walks the proto once, reading nothing but sizes:

- every tensor (initializers, `Constant` values, TENSOR / TENSORS attributes, at any graph depth): a known
  `data_type`, dims >= 0, and exactly as much data as the dims need (raw_data bytes with sub-byte types
  packed, the typed field's entry count, or an external span with offset >= 0 that lies inside its file);
- graph inputs / outputs / value_info: dims >= 0;
- nodes of an op ONNX knows at the model's opset: every attribute of the kind the schema declares (an
  `axis` that is a STRING), every required input present (a DequantizeLinear with no inputs).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto

from qconvert.errors import InputError

# Bits per element of the types ONNX packs below one byte (raw_data and int32_data both packed).
_PACKED_BITS = {
    TensorProto.INT4: 4,
    TensorProto.UINT4: 4,
    TensorProto.FLOAT4E2M1: 4,
    getattr(TensorProto, "INT2", -2): 2,
    getattr(TensorProto, "UINT2", -3): 2,
}
# Six-bit floats: raw_data packed, int32_data one entry per element.
_SIX_BITS = {getattr(TensorProto, "FLOAT6E2M3", -4), getattr(TensorProto, "FLOAT6E3M2", -5)}
_DEFAULT_DOMAINS = ("", "ai.onnx")
# A graph input of more elements is refused: shape folding and the StableHLO lowering index a tensor's
# elements with 32-bit integers (2**32 x 2**32 was a MemoryError / overflow there, exit 3).
MAX_INPUT_ELEMENTS = 2**31 - 1


def _data_type_name(data_type: int) -> str | None:
    if data_type == TensorProto.UNDEFINED:
        return None
    try:
        return TensorProto.DataType.Name(data_type)
    except ValueError:
        return None


def _raw_bytes(data_type: int, count: int) -> int:
    """Bytes of `count` elements in raw_data (sub-byte types packed, low bits first)."""
    if data_type in _PACKED_BITS:
        return math.ceil(count * _PACKED_BITS[data_type] / 8)
    if data_type in _SIX_BITS:
        return math.ceil(count * 6 / 8)
    return count * onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize


def _field_entries(data_type: int, count: int) -> int:
    """Entries of the typed field (`int32_data`, `float_data`, ...) that `count` elements take."""
    if data_type in _PACKED_BITS:
        return math.ceil(count * _PACKED_BITS[data_type] / 8)  # one packed byte per int32 entry
    if data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
        return 2 * count
    return count


def check_tensor(tensor: TensorProto, where: str, base_dir: Path | None, raw_size: int | None = None) -> None:
    """InputError unless the tensor's type is known and its data holds exactly what its dims say;
    `raw_size`: the length of its raw_data when load.py keeps that outside the proto (wire.py)."""
    what = f"{where} '{tensor.name}'"
    if _data_type_name(tensor.data_type) is None:
        raise InputError(f"{what}: data_type {tensor.data_type} is not an ONNX element type")
    dims = list(tensor.dims)
    if any(d < 0 for d in dims):
        raise InputError(f"{what}: dims {dims} have a negative dim")
    count = math.prod(dims)  # Python integers: 2**32 x 2**32 x 2**32 does not wrap
    kind = TensorProto.DataType.Name(tensor.data_type).lower()
    if tensor.data_location == TensorProto.EXTERNAL:
        _check_external(tensor, what, base_dir, _raw_bytes(tensor.data_type, count), dims, kind)
        return
    if raw_size is None and tensor.HasField("raw_data"):
        raw_size = len(tensor.raw_data)
    if raw_size is not None:
        if tensor.data_type == TensorProto.STRING:
            raise InputError(f"{what}: a string tensor cannot use raw_data")
        expected = _raw_bytes(tensor.data_type, count)
        if raw_size != expected:
            raise InputError(
                f"{what}: raw_data holds {raw_size} bytes, but dims {dims} of {kind} need {expected}"
            )
        return
    field = onnx.helper.tensor_dtype_to_field(tensor.data_type)
    held = len(getattr(tensor, field))
    expected = _field_entries(tensor.data_type, count)
    if held != expected:
        raise InputError(f"{what}: {field} holds {held} entries, but dims {dims} of {kind} need {expected}")


def _check_external(
    tensor: TensorProto, what: str, base_dir: Path | None, nbytes: int, dims: list[int], kind: str
) -> None:
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location", "")
    numbers: dict[str, int] = {}
    for key in ("offset", "length"):
        text = info.get(key)
        if text is None or text == "":
            continue
        try:
            numbers[key] = int(text)
        except ValueError:
            raise InputError(f"{what}: external data {key} '{text}' is not an integer") from None
        if numbers[key] < 0:
            raise InputError(f"{what}: external data {key} {numbers[key]} in '{location}' is negative")
    offset = numbers.get("offset", 0)
    length = numbers.get("length", nbytes)
    if length != nbytes:
        raise InputError(
            f"{what}: external data length {length} in '{location}' does not match dims {dims} of {kind} "
            f"({nbytes} bytes)"
        )
    if base_dir is None or not location:
        return  # load.py says what is wrong with a missing location or folder
    path = base_dir / location
    try:
        size = os.stat(path).st_size
    except OSError:
        return  # load.check_external_data names the missing file
    if offset + nbytes > size:
        raise InputError(
            f"{what}: external data '{location}' holds {size} bytes, fewer than offset {offset} + "
            f"{nbytes} bytes of the tensor (truncated file?)"
        )


def _check_value_info(info: ValueInfoProto, where: str) -> None:
    is_tensor = info.type.WhichOneof("value") == "tensor_type"
    if is_tensor and where == "graph input" and _data_type_name(info.type.tensor_type.elem_type) is None:
        raise InputError(
            f"{where} '{info.name}': elem_type {info.type.tensor_type.elem_type} is not an ONNX element type"
        )
    if not is_tensor or not info.type.tensor_type.HasField("shape"):
        return
    dims = [d.dim_value for d in info.type.tensor_type.shape.dim if d.HasField("dim_value")]
    if any(d < 0 for d in dims):
        shown = [
            d.dim_value if d.HasField("dim_value") else d.dim_param or "?"
            for d in info.type.tensor_type.shape.dim
        ]
        raise InputError(f"{where} '{info.name}': shape {shown} has a negative dim")
    count = math.prod(dims)
    if where == "graph input" and max(dims, default=0) > MAX_INPUT_ELEMENTS:  # even beside a 0 dim
        raise InputError(
            f"{where} '{info.name}': shape {dims} has a dim over {MAX_INPUT_ELEMENTS} (2**31 - 1), more than "
            "the lowerings index (32-bit element indices; a 0 dim beside it still leaves later tensors huge)"
        )
    if where == "graph input" and count > MAX_INPUT_ELEMENTS:
        raise InputError(
            f"{where} '{info.name}': shape {dims} holds {count} elements, more than the {MAX_INPUT_ELEMENTS} "
            "(2**31 - 1) an input's elements can be indexed by in the lowerings (32-bit element indices)"
        )


def _node_label(node: NodeProto) -> str:
    name = node.name or (f"<unnamed, output '{node.output[0]}'>" if node.output else "<unnamed>")
    return f"node '{name}' ({node.op_type})"


def _check_node(node: NodeProto, opsets: dict[str, int]) -> None:
    domain = "" if node.domain in _DEFAULT_DOMAINS else node.domain
    opset = opsets.get(domain)
    if opset is None:
        return  # the lifter reports a domain the model does not import
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, domain)
    except onnx.defs.SchemaError:
        return  # unknown ops: the lifter's unsupported-node report
    label = _node_label(node)
    for attribute in node.attribute:
        declared = schema.attributes.get(attribute.name)
        if declared is None or attribute.type == AttributeProto.UNDEFINED:
            continue
        if attribute.type != declared.type.value and declared.type.value != AttributeProto.UNDEFINED:
            expected = AttributeProto.AttributeType.Name(declared.type.value)
            got = AttributeProto.AttributeType.Name(attribute.type)
            raise InputError(
                f"{label}: attribute '{attribute.name}' is a {got}, but {node.op_type} (opset {opset}) takes "
                f"an {expected}"
            )
    for kind, names, most in (
        ("input", node.input, schema.max_input),
        ("output", node.output, schema.max_output),
    ):
        if len(names) > most:
            raise InputError(
                f"{label}: {len(names)} {kind}s, but {node.op_type} (opset {opset}) takes at most {most}"
            )
    option = onnx.defs.OpSchema.FormalParameterOption
    for index, formal in enumerate(schema.inputs):
        if formal.option != option.Single:
            continue
        if index >= len(node.input) or not node.input[index]:
            raise InputError(
                f"{label}: required input {index} ('{formal.name}') is missing (the node has "
                f"{len(node.input)} input(s))"
            )


def _text(value: str | bytes, what: str) -> None:
    """protobuf hands back a `string` field that is not valid UTF-8 as bytes: name it, as ONNX refuses it."""
    if isinstance(value, bytes):
        raise InputError(f"{what} {value!r} is not valid UTF-8")


def _check_names(graph: GraphProto) -> None:
    for tensor in graph.initializer:
        _text(tensor.name, "an initializer name")
    for infos in (graph.input, graph.output, graph.value_info):
        for info in infos:
            _text(info.name, "a graph value name")
    for index, node in enumerate(graph.node):
        where = f"node #{index}"
        for field in ("name", "op_type", "domain"):
            _text(getattr(node, field), f"{where}: its {field}")
        for name in [*node.input, *node.output]:
            _text(name, f"{where} ({node.op_type}): a tensor name")
        for attribute in node.attribute:
            _text(attribute.name, f"{where} ({node.op_type}): an attribute name")
            for value in [attribute.s] if attribute.type == AttributeProto.STRING else attribute.strings:
                try:
                    value.decode("utf-8")
                except UnicodeDecodeError:
                    label = _node_label(node)
                    raise InputError(
                        f"{label}: attribute '{attribute.name}' string {value!r} is not valid UTF-8"
                    ) from None


def _graphs(graph: GraphProto) -> Iterator[GraphProto]:
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            elif attribute.type == AttributeProto.GRAPHS:
                for body in attribute.graphs:
                    yield from _graphs(body)


def check_model_structure(
    model: ModelProto, base_dir: Path | None, raw_sizes: Mapping[int, int] | None = None
) -> None:
    """InputError on the first malformed tensor, value shape, attribute kind or missing input;
    `raw_sizes`: main-graph initializer position -> raw_data length, for raw_data kept out of the proto."""
    opsets = {("" if e.domain in _DEFAULT_DOMAINS else e.domain): e.version for e in model.opset_import}
    for graph in _graphs(model.graph):
        _check_names(graph)
        sizes = raw_sizes if graph is model.graph and raw_sizes else {}
        for index, tensor in enumerate(graph.initializer):
            check_tensor(tensor, "initializer", base_dir, sizes.get(index))
        for kind, infos in (("input", graph.input), ("output", graph.output), ("value", graph.value_info)):
            for info in infos:
                _check_value_info(info, f"graph {kind}")
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == AttributeProto.TENSOR:
                    check_tensor(
                        attribute.t, f"{_node_label(node)}: attribute '{attribute.name}' tensor", base_dir
                    )
                elif attribute.type == AttributeProto.TENSORS:
                    for tensor in attribute.tensors:
                        check_tensor(
                            tensor, f"{_node_label(node)}: attribute '{attribute.name}' tensor", base_dir
                        )
            _check_node(node, opsets)


def _tensor_types(graph: GraphProto) -> dict[str, int]:
    """The element type of every tensor value the graph declares or inference gave (0: unknown)."""
    types = {tensor.name: tensor.data_type for tensor in graph.initializer}
    for info in [*graph.input, *graph.value_info, *graph.output]:
        if info.type.WhichOneof("value") == "tensor_type" and info.type.tensor_type.elem_type:
            types.setdefault(info.name, info.type.tensor_type.elem_type)
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in _DEFAULT_DOMAINS and node.output:
            for attribute in node.attribute:
                if attribute.type == AttributeProto.TENSOR:
                    types.setdefault(node.output[0], attribute.t.data_type)
    return types


def _type_string(elem_type: int) -> str:
    """ONNX's spelling of a tensor type in its schemas' constraints: `tensor(float)`, `tensor(int8)`."""
    return f"tensor({TensorProto.DataType.Name(elem_type).lower()})"


def check_type_constraints(model: ModelProto) -> None:
    """InputError when a node's input has an element type its op's schema does not allow (int8 into
    GlobalAveragePool, a string into Add), or two inputs bound to one type parameter differ (float + int8),
    with the node, the input, its type and the types allowed. Reads the types shape inference gave (it runs
    with check_type off, so that the lifter can name unsupported ops first); ops of other domains, inputs
    of unknown type and non-tensor values are left to the lifter and onnxruntime."""
    opsets = {("" if e.domain in _DEFAULT_DOMAINS else e.domain): e.version for e in model.opset_import}
    opset = opsets.get("")
    if opset is None:
        return
    types = _tensor_types(model.graph)
    option = onnx.defs.OpSchema.FormalParameterOption
    for node in model.graph.node:
        if node.domain not in _DEFAULT_DOMAINS:
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, "")
        except onnx.defs.SchemaError:
            continue
        if not schema.inputs:
            continue
        allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
        bound: dict[str, tuple[str, str]] = {}  # type parameter -> (input, its type) first bound to it
        for index, name in enumerate(node.input):
            if not name or not types.get(name):
                continue
            formal = schema.inputs[min(index, len(schema.inputs) - 1)]
            if index >= len(schema.inputs) and formal.option != option.Variadic:
                continue
            given = _type_string(types[name])
            parameter = formal.type_str
            permitted = allowed.get(parameter, {parameter})
            if not any(p.startswith("tensor(") for p in permitted):
                continue  # sequences, optionals: not judged here
            label = _node_label(node)
            if given not in permitted:
                shown = ", ".join(
                    sorted(p[len("tensor(") : -1] for p in permitted if p.startswith("tensor("))
                )
                raise InputError(
                    f"{label}: input {index} ('{name}') is {given[len('tensor(') : -1]}, but "
                    f"{node.op_type} (opset {opset}) takes {formal.name} of {shown}"
                )
            # Q/DQ zero points: the lifter names a storage mismatch itself ("zero point 300 is out of range")
            homogeneous = (
                formal.option != option.Variadic or formal.is_homogeneous
            ) and node.op_type not in (
                "QuantizeLinear",
                "DequantizeLinear",
            )
            first = bound.setdefault(parameter, (name, given))
            if parameter in allowed and homogeneous and first[1] != given:
                raise InputError(
                    f"{label}: input {index} ('{name}') is {given[len('tensor(') : -1]}, but input "
                    f"'{first[0]}' is {first[1][len('tensor(') : -1]}; {node.op_type} takes both as one type "
                    f"{parameter}"
                )
