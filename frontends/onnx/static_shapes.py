"""Static shapes through the shape-computing subgraphs of an export, and checked input-shape overrides.

torch's exporter (and the others) writes a model's sizes as computations: Shape -> Gather -> Unsqueeze ->
Concat -> Reshape, ConstantOfShape / Expand of computed shapes, Range for position ids, Equal / Where on
shapes. onnx's shape inference, even with data propagation, stops at several of them (Slice with a
computed end, Range, Where). Once the graph inputs have static shapes those computations are constants:
`infer_static_types` evaluates them (onnx's reference implementation, one node at a time, small tensors
only), makes them initializers of a scratch copy of the graph (weights left out: big initializers become
typed inputs), and runs onnx's shape inference again, until nothing more becomes known. Only the types
are written back (value_info and graph outputs): the graph keeps every node, so `check` judges the model
as it was given and errors name its nodes; the StableHLO lowering folds the same nodes itself.

Why here, at load, and not as an IR pass: every consumer (the lifter and so every backend, the
interpreter, `check`'s oracle and node cases) reads the types the frontend gives, and an op's shape rules
stay written once, in onnx's own shape inference, instead of a second copy over the IR.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from onnx import (
    AttributeProto,
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    TypeProto,
    ValueInfoProto,
    helper,
    numpy_helper,
)

from qconvert.errors import InputError
from qconvert.onnx_semantics import DEFAULT_DOMAINS

from .wire import RawData

FOLD_MAX_ELEMENTS = 4096
"""Values folded at load are shape computations: tiny. Anything larger is data, left to inference."""
MAX_ROUNDS = 64  # fold / infer rounds; each round makes at least one more node known
NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
)
FOLDABLE_KINDS = "biuf"  # numpy kinds of values we fold: bool, integers, floats (no strings, no float8)

Infer = Callable[[ModelProto], ModelProto]


# Input-shape overrides ---------------------------------------------------------------------------
def dims_text(dims: Sequence[object]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def model_dims(info: ValueInfoProto) -> list[int | str] | None:
    """The declared dims of a graph input (an int, a dim_param name, or '?'); None when it has no shape."""
    tensor_type = info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor_type.shape.dim]


def check_input_shapes(
    model: ModelProto, input_shapes: Mapping[str, Sequence[int]], source: str = "--input-shape"
) -> None:
    """InputError unless every named graph input exists and each shape agrees with its static dims.

    `source` says where the shapes came from in the messages (`--input-shape`, `the --data array`)."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = {i.name: i for i in model.graph.input if i.name not in initializers}
    for name, shape in input_shapes.items():
        given = [int(s) for s in shape]
        if name not in inputs:
            if name in initializers:
                raise InputError(
                    f"{source} names '{name}', an initializer (a weight) of the model, not a graph input; "
                    f"the inputs are {sorted(inputs)}"
                )
            close = difflib.get_close_matches(name, list(inputs), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise InputError(
                f"{source} names '{name}', which is not a graph input (the inputs are {sorted(inputs)}){hint}"
            )
        if any(s < 0 for s in given):
            raise InputError(f"{source} {name}={dims_text(given)}: dims must be 0 or more")
        kind = inputs[name].type.WhichOneof("value")
        if kind not in (None, "tensor_type"):
            raise InputError(
                f"{source} gives input '{name}' a shape; it is a {kind.removesuffix('_type')}, not a tensor"
            )
        dims = model_dims(inputs[name])
        if dims is None:
            continue  # the model does not say: any shape is the user's to give
        if len(dims) != len(given):
            raise InputError(
                f"{source} gives input '{name}' rank {len(given)} {dims_text(given)}; the model's input "
                f"'{name}' has rank {len(dims)} {dims_text(dims)}"
            )
        clashes = [
            f"dim {i} is {d} in the model, {g} given"
            for i, (d, g) in enumerate(zip(dims, given))
            if isinstance(d, int) and d != g
        ]
        if clashes:
            raise InputError(
                f"{source} gives input '{name}' the shape {dims_text(given)}, which contradicts the model's "
                f"static {dims_text(dims)}: {'; '.join(clashes)}"
            )


def override_input_shapes(
    model: ModelProto, input_shapes: Mapping[str, Sequence[int]], source: str = "--input-shape"
) -> None:
    """Set the dims of the named graph inputs (`--input-shape x=1x128`), checked by `check_input_shapes`."""
    check_input_shapes(model, input_shapes, source)
    inputs = {i.name: i for i in model.graph.input}
    for name, shape in input_shapes.items():
        tensor_type = inputs[name].type.tensor_type
        tensor_type.shape.ClearField("dim")
        for size in shape:
            tensor_type.shape.dim.add().dim_value = int(size)


# Fold and infer ----------------------------------------------------------------------------------
def is_static(type_proto: TypeProto | None) -> bool:
    if type_proto is None or type_proto.WhichOneof("value") != "tensor_type":
        return False
    tensor_type = type_proto.tensor_type
    return tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in tensor_type.shape.dim)


def _is_small(tensor: TensorProto) -> bool:
    """Small enough to be a shape computation's operand, and held in the file (never external data)."""
    return tensor.data_location != TensorProto.EXTERNAL and math.prod(tensor.dims) <= FOLD_MAX_ELEMENTS


def _small_array(tensor: TensorProto, raw: RawData | None) -> np.ndarray | None:
    """The value of a small initializer (`_is_small`), None when numpy cannot hold it or we do not fold it."""
    if raw is not None:  # detached by load_model: put it back on a copy (it is small)
        copy = TensorProto()
        copy.CopyFrom(tensor)
        copy.raw_data = bytes(raw)
        tensor = copy
    try:
        array = numpy_helper.to_array(tensor)
    except Exception:  # an element type numpy cannot hold
        return None
    return array if array.dtype.kind in FOLDABLE_KINDS else None


def _is_integral(type_proto: TypeProto | None) -> bool:
    """True for an integer or bool tensor type (an unknown type is given the benefit of the doubt)."""
    if type_proto is None or type_proto.WhichOneof("value") != "tensor_type":
        return type_proto is None
    elem_type = type_proto.tensor_type.elem_type
    if elem_type == TensorProto.UNDEFINED:
        return True
    try:
        kind = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).kind
    except (KeyError, TypeError, ValueError):  # not an element type onnx knows
        return False
    return elem_type == TensorProto.BOOL or kind in "iu"


def _has_subgraph(node: NodeProto) -> bool:
    return any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for a in node.attribute)


def _shape_value(node: NodeProto, type_proto: TypeProto | None) -> np.ndarray | None:
    """Shape / Size of a typed tensor when the dims it reads are static (Shape's start / end as in the
    spec, clamped: `x.shape[1:]` of a tensor with a dynamic batch is known), else None."""
    if type_proto is None or type_proto.WhichOneof("value") != "tensor_type":
        return None
    if not type_proto.tensor_type.HasField("shape"):
        return None
    dims = list(type_proto.tensor_type.shape.dim)
    rank = len(dims)
    start, end = 0, rank
    if node.op_type == "Shape":
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        start, end = int(attributes.get("start", 0)), int(attributes.get("end", rank))
        start = min(max(start + rank if start < 0 else start, 0), rank)
        end = min(max(end + rank if end < 0 else end, 0), rank)
    read = dims[start:end]
    if not all(d.HasField("dim_value") for d in read):
        return None
    shape = np.asarray([d.dim_value for d in read], dtype=np.int64)
    return np.asarray(np.prod(shape, dtype=np.int64), dtype=np.int64) if node.op_type == "Size" else shape


def _evaluate(
    model: ModelProto,
    node: NodeProto,
    known: Mapping[str, np.ndarray],
    cache: dict[tuple[object, ...], object],
) -> list[np.ndarray] | None:
    """The node's outputs by onnx's reference implementation (`cache`: its evaluators, by op, attributes
    and input dtypes), or None when it cannot run them."""
    if node.op_type == "Constant" and len(node.attribute) == 1:  # read directly: most nodes of an export
        value = helper.get_attribute_value(node.attribute[0])
        if node.attribute[0].name == "value":
            value = numpy_helper.to_array(value)
        elif node.attribute[0].name in ("value_int", "value_ints"):
            value = np.asarray(value, np.int64)
        else:
            return None
        return [value] if value.dtype.kind in FOLDABLE_KINDS and value.size <= FOLD_MAX_ELEMENTS else None
    present = [name for name in node.input if name]
    # One evaluator per op, attributes and input types: an export repeats the same few shape ops.
    key = (
        node.domain,
        node.op_type,
        tuple(a.SerializeToString() for a in node.attribute),
        tuple(str(known[name].dtype) if name else "" for name in node.input),
        len(node.output),
    )
    feeds = {f"in{i}": known[name] for i, name in enumerate(node.input) if name}
    try:
        evaluator = cache.get(key)
        if evaluator is None:
            evaluator = cache[key] = _evaluator(model, node, [known[name].dtype for name in present])
        results = evaluator.run(None, feeds)  # type: ignore[attr-defined]
    except Exception:  # the reference raises any exception type; inference then says what it can
        return None
    arrays = [np.asarray(r) for r in results]
    if any(a.dtype.kind not in FOLDABLE_KINDS or a.size > FOLD_MAX_ELEMENTS for a in arrays):
        return None
    return arrays


def _evaluator(model: ModelProto, node: NodeProto, dtypes: Sequence[np.dtype]) -> object:
    """onnx's ReferenceEvaluator of `node` alone, its inputs named in0, in1, ... and outputs out0, ..."""
    from onnx.reference import ReferenceEvaluator

    renamed = NodeProto()
    renamed.CopyFrom(node)
    renamed.ClearField("input")
    renamed.input.extend(f"in{i}" if name else "" for i, name in enumerate(node.input))
    renamed.ClearField("output")
    renamed.output.extend(f"out{i}" if name else "" for i, name in enumerate(node.output))
    names = [name for name in renamed.input if name]
    inputs = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(dtype), None)
        for name, dtype in zip(names, dtypes)
    ]
    outputs = [ValueInfoProto(name=name) for name in renamed.output if name]
    graph = helper.make_graph([renamed], "fold", inputs, outputs)
    single = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return ReferenceEvaluator(single)


class _Types(Mapping[str, TypeProto]):
    """The type of each value: a known value's from its array (exact), else the last inference's."""

    def __init__(self, inferred: ModelProto, known: Mapping[str, np.ndarray]) -> None:
        graph = inferred.graph
        # value_info last: a graph output declared without a type must not hide what inference found.
        self.inferred = {info.name: info.type for info in [*graph.output, *graph.input, *graph.value_info]}
        self.known = known
        self.made: dict[str, TypeProto] = {}

    def __getitem__(self, name: str) -> TypeProto:
        if name in self.known:
            if name not in self.made:  # made on demand: most known values are never asked about
                array = self.known[name]
                elem_type = helper.np_dtype_to_tensor_dtype(array.dtype)
                self.made[name] = helper.make_tensor_type_proto(elem_type, list(array.shape))
            return self.made[name]
        return self.inferred[name]

    def __contains__(self, name: object) -> bool:
        return name in self.known or name in self.inferred

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(self.inferred), **dict.fromkeys(self.known)})

    def __len__(self) -> int:
        return len(set(self.inferred) | set(self.known))


def _lazy_sources(model: ModelProto) -> dict[str, NodeProto | TensorProto]:
    """Name -> the Constant node (default domain) or the small initializer holding its value: read only
    when a node to fold takes it (most of them never are)."""
    sources: dict[str, NodeProto | TensorProto] = {}
    for tensor in model.graph.initializer:
        if _is_small(tensor):
            sources.setdefault(tensor.name, tensor)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.domain in DEFAULT_DOMAINS and node.output and node.output[0]:
            sources[node.output[0]] = node
    return sources


@dataclass(slots=True)
class _Folding:
    """What the fold / infer rounds of `infer_static_types` over one model share: the values made known
    so far and where the others come from."""

    model: ModelProto
    detached: Mapping[str, RawData]  # raw data load_model took off the initializers
    sources: Mapping[str, NodeProto | TensorProto]  # `_lazy_sources`: Constant nodes, small initializers
    known: dict[str, np.ndarray] = field(default_factory=dict)  # value name -> its folded array
    folded: set[int] = field(default_factory=set)  # indices of the nodes whose outputs are known
    protos: dict[str, TensorProto] = field(default_factory=dict)  # known values as initializers, made once
    cache: dict[tuple[object, ...], object] = field(default_factory=dict)  # `_evaluate`'s evaluators

    def read_inputs(self, node: NodeProto) -> bool:
        """Make known the Constant and initializer values `node` takes; False when one cannot be (too
        large, a type we do not fold)."""
        for name in node.input:
            if not name or name in self.known:
                continue
            source = self.sources[name]
            if isinstance(source, NodeProto):
                values = _evaluate(self.model, source, self.known, self.cache)
                value = values[0] if values else None
            else:
                value = _small_array(source, self.detached.get(name))
            if value is None:
                return False
            self.known[name] = value
        return True

    def fold_round(self, types: Mapping[str, TypeProto]) -> set[str]:
        """Make known every node whose value the types and known values determine; returns their outputs.
        Constant nodes are not folded themselves (onnx's inference reads them): their values, like those
        of small initializers, are read when a node to fold takes them."""
        progress: set[str] = set()
        for index, node in enumerate(self.model.graph.node):
            op_type = node.op_type
            if index in self.folded or op_type == "Constant" or not node.output or not node.output[0]:
                continue
            if op_type in ("Shape", "Size"):
                if not node.input or node.domain not in DEFAULT_DOMAINS:
                    continue
                value = _shape_value(node, types.get(node.input[0]))
                if value is None:
                    continue
                arrays: list[np.ndarray] | None = [value]
            else:
                # Cheapest test first: most nodes of a model have an input that is not known.
                if not node.input or any(
                    name and name not in self.known and name not in self.sources for name in node.input
                ):
                    continue
                if node.domain not in DEFAULT_DOMAINS or op_type in NONDETERMINISTIC or _has_subgraph(node):
                    continue
                if not all(_is_integral(types.get(name)) for name in node.output if name):
                    continue  # shape computations are integers: float values (weights, activations) stay
                if not self.read_inputs(node):
                    continue  # a value too large or of a type we do not fold
                arrays = _evaluate(self.model, node, self.known, self.cache)
            outputs = [name for name in node.output if name]
            if arrays is None or len(arrays) != len(outputs):
                continue
            for name, array in zip(outputs, arrays):
                self.known[name] = array
                progress.add(name)
            self.folded.add(index)
        return progress

    def types_can_improve(self, new: set[str], types: Mapping[str, TypeProto]) -> bool:
        """True when a value newly known by folding feeds a node that is not folded and whose outputs are
        not all static yet, or are integers (onnx's data propagation may then carry the value on): only
        then can another round of inference type more. A float model without pinned inputs stops after
        one round."""
        if not new:
            return False
        for index, node in enumerate(self.model.graph.node):
            if index in self.folded or not any(name in new for name in node.input):
                continue
            outputs = [name for name in node.output if name]
            if not all(is_static(types.get(name)) for name in outputs):
                return True
            if all(_is_integral(types.get(name)) for name in outputs):
                return True
        return False

    def scratch_model(self, carried: Sequence[ValueInfoProto] = ()) -> ModelProto:
        """The model for one inference round: folded nodes gone and their values initializers (Constant
        nodes, never folded, stay nodes), small initializers as they are, the others typed graph inputs
        (so no weight is copied), and the value_info of the last round (`carried`, else the declared
        one), so that types the com.microsoft inference found need not be found again."""
        model, folded, detached = self.model, self.folded, self.detached
        graph = GraphProto(name=model.graph.name)
        graph.node.extend(node for index, node in enumerate(model.graph.node) if index not in folded)
        folded_values = {name for index in folded for name in model.graph.node[index].output if name}
        # Small initializers go in whole (copying them costs less than typing them), and not as graph
        # inputs (exports with initializers listed as inputs): inference then reads their values.
        small = {t.name for t in model.graph.initializer if _is_small(t) and t.name not in detached}
        listed = set()
        for info in model.graph.input:
            if info.name not in folded_values and info.name not in small:
                graph.input.append(info)
                listed.add(info.name)
        for tensor in model.graph.initializer:
            if tensor.name in folded_values:
                continue
            if tensor.name in small:
                graph.initializer.append(tensor)
            elif tensor.name not in listed:
                graph.input.append(
                    helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
                )
                listed.add(tensor.name)
        graph.sparse_initializer.extend(model.graph.sparse_initializer)
        for name in folded_values:
            if name not in self.protos:  # made once: the rounds reuse it
                self.protos[name] = numpy_helper.from_array(self.known[name], name)
            graph.initializer.append(self.protos[name])
        graph.output.extend(model.graph.output)
        graph.value_info.extend(
            info for info in carried or model.graph.value_info if info.name not in folded_values
        )
        scratch = ModelProto(ir_version=model.ir_version, producer_name=model.producer_name, graph=graph)
        scratch.opset_import.extend(model.opset_import)
        scratch.functions.extend(model.functions)
        return scratch


def infer_static_types(
    model: ModelProto, infer: Infer, detached: Mapping[str, RawData] | None = None
) -> ModelProto:
    """`model` with the types of its values (value_info, graph outputs) inferred as far as the static
    input shapes and the shape computations allow. `infer` is one round of shape inference (onnx's, plus
    the com.microsoft ops'); its exception in the first round propagates (the caller reports it), a
    later round's ends the folding with the types found so far. The model is modified in place."""
    folding = _Folding(model, detached or {}, _lazy_sources(model))
    inferred = infer(folding.scratch_model())
    types = _Types(inferred, folding.known)
    for _ in range(MAX_ROUNDS):
        new = folding.fold_round(types)
        if not folding.types_can_improve(new, types):
            break
        try:
            inferred = infer(folding.scratch_model(inferred.graph.value_info))
        except Exception:  # onnx raises InferenceError, ValidationError or RuntimeError
            break
        types = _Types(inferred, folding.known)
    _write_types(model, inferred, types)  # `types` reads `known` as it is now: the last folds included
    return model


def _write_types(model: ModelProto, inferred: ModelProto, types: Mapping[str, TypeProto]) -> None:
    """value_info of every node output the rounds typed (the last inference's entries as they are, a
    folded value's from its array); graph outputs where the inferred type is static (an output declared
    without a type keeps none otherwise, as onnx's inference leaves it)."""
    graph = model.graph
    produced = {name for node in graph.node for name in node.output if name}
    value_info = [info for info in inferred.graph.value_info if info.name in produced]
    typed = {info.name for info in value_info}
    for name in produced - typed:  # folded into initializers of the scratch, or typed only as an output
        if name in types and types[name].WhichOneof("value") is not None:
            value_info.append(helper.make_value_info(name, types[name]))
    typed = {info.name for info in value_info}
    value_info.extend(info for info in graph.value_info if info.name not in typed)  # e.g. of initializers
    graph.ClearField("value_info")
    graph.value_info.extend(value_info)
    for output in graph.output:
        found = types.get(output.name)
        if found is not None and is_static(found):
            output.type.CopyFrom(found)
