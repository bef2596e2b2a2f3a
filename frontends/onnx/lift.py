"""Lift an ONNX model into the IR: one `func.func @main`, graph inputs as arguments, outputs returned.

Mapping (`import_onnx`):

- QuantizeLinear (opsets 10-25) becomes `quant.qcast` (float -> `!quant.uniform` tensor) then a storage
  cast to the ONNX-visible storage tensor. DequantizeLinear becomes the storage cast back then
  `quant.dcast`. The storage cast is `quant.scast` for integer storage (`tensor<4xi8>`), and the
  `qconvert.storage_cast` (FloatStorageCastOp) for float8 / float4 storage (`tensor<4xf8E4M3FN>`), because
  upstream's `quant.scast` admits signless integers only; both are pure reinterpretations. A
  DequantizeLinear whose input comes straight from a lifted QuantizeLinear with the same quantized type
  uses the quantized value directly (no scast pair in between).
  `saturate` (float storage only; integer storage always saturates) is kept as a `saturate` bool
  attribute on the `quant.qcast`. `precision` (opset 23+) is kept as `onnx.precision` when set; the
  interpreter computes x / scale as onnxruntime does (f32, see qconvert/numerics/).
- QOperator nodes (QLinearConv, QLinearMatMul, MatMulInteger, ConvInteger, DynamicQuantizeLinear and
  com.microsoft QLinearAdd / Mul / Concat / Sigmoid / LeakyRelu / AveragePool / GlobalAveragePool,
  QGemm, DynamicQuantizeMatMul) become quant-typed `qconvert.*` ops, see frontends/onnx/qoperator.py.
- Scale and zero point must be constants (initializers or `Constant` nodes); their values go into the
  quant type. A DequantizeLinear whose input is an initializer becomes an `arith.constant` holding the
  storage array (`dense<...> : tensor<...xi8>`), a storage cast, and the `quant.dcast`.
- `Constant` nodes with a `value` tensor become `arith.constant`; every other node becomes a generic
  op named `onnx.<OpType>` for the default domain and `onnx.<domain>.<OpType>` otherwise
  (`"onnx.com.microsoft.QLinearAdd"`), attributes converted by frontends/onnx/attributes.py, plus
  `onnx.node_name`; absent optional inputs / outputs are listed in `onnx.absent_inputs` /
  `onnx.absent_outputs` (`array<i64: ...>` of their positions).
- The module carries `onnx.opset_import = {"" = 21 : i64, ...}`; each function argument and result has
  `{onnx.name = "x"}` (and `onnx.elem_type` when the ONNX type is unsigned, since IR integers are
  signless, see dtypes.py); unsigned constants carry `onnx.elem_type` likewise.

Unsupported (reported together, each with node name and opset): nodes with subgraph, sparse-tensor or
type attributes (If, Loop, Scan, ...), ops of a domain the model does not import, default-domain ops
unknown to ONNX at the model's opset, and calls of model-local functions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, TensorProto, TypeProto, numpy_helper

from qconvert.errors import InputError
from qconvert.ir.attributes import (
    ArrayAttr,
    Attribute,
    BoolAttr,
    DenseArrayAttr,
    DenseResourceAttr,
    DictionaryAttr,
    IntegerAttr,
    LazyElements,
    StringAttr,
)
from qconvert.ir.core import Block, GenericOp, Operation, Value
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.func import FuncOp, ReturnOp
from qconvert.ir.dialects.onnx import (
    ABSENT_INPUTS,
    ABSENT_OUTPUTS,
    DEFAULT_DOMAIN_KEY,
    DEFAULT_DOMAINS,
    ELEM_TYPE,
    NODE_NAME,
    OPSET_IMPORT,
    TENSOR_NAME,
)
from qconvert.ir.dialects.qconvert import NOTE, STORAGE_CASTS, FloatStorageCastOp
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp, StorageCastOp
from qconvert.ir.quant_types import QuantizedType
from qconvert.ir.types import (
    DYNAMIC,
    I64,
    FloatType,
    FunctionType,
    OpaqueType,
    RankedTensorType,
    Type,
    UnrankedTensorType,
    with_element_type,
)
from qconvert.problem_groups import ProblemGroup, group_problems, listing
from qconvert.storage_metadata import StorageEntry, StorageMetadata, boundary_problem

from . import attributes as attrs
from .blockwise import NOTE_SIGNS, needs_signs, split_scale_signs
from .dtypes import (
    BY_NAME,
    ELEMENT_TYPES,
    EXPRESSED,
    FLOAT_STORAGE,
    UNKNOWN_ELEMENT,
    UNREPRESENTABLE_STORAGE,
    ElementType,
)
from .load import load_model
from .qoperator import lift_qoperator
from .quant import NodeRef, check_storage, normalize_axis, padded_shape, quant_type_of
from .weights import RESOURCE_THRESHOLD, ResourceNames, as_resource, initializer_array, lazy_elements
from .wire import RawData


def import_onnx(
    source: str | os.PathLike[str] | ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    resource_threshold: int = RESOURCE_THRESHOLD,
    map_file: bool = False,
) -> ModuleOp:
    """Lift an ONNX model (path or ModelProto) into a module holding one `func.func @main`.

    `input_shapes` overrides graph input dims before shape inference (`{"x": (1, 128)}`). Weights of
    at least `resource_threshold` elements become lazily read `dense_resource` constants (weights.py;
    external data is memory-mapped, never loaded whole); 0 keeps every constant inline. `map_file`: those
    weights view a mapping of the file instead of being parsed into the proto (no copy of them; the same
    module), for a caller done with the module before the file could change (`load_model`'s caveat):
    calibrate, which refuses to write over its model. Raises `InputError` (a one-paragraph message naming
    the node or file) for any bad or unsupported model.
    """

    def detach(tensor: TensorProto, raw_data: RawData) -> bool:
        return as_resource(tensor.data_type, tuple(tensor.dims), resource_threshold)

    loaded = load_model(source, input_shapes, detach=detach, map_file=map_file)
    lifter = Lifter(
        loaded.model, loaded.inference_error, loaded.base_dir, resource_threshold, loaded.detached
    )
    if not isinstance(source, ModelProto):
        lifter.source_name = str(source)
    return lifter.lift()


def op_name(domain: str, op_type: str) -> str:
    """`onnx.Relu` for the default domain, `onnx.com.microsoft.QLinearAdd` otherwise."""
    return f"onnx.{op_type}" if domain in DEFAULT_DOMAINS else f"onnx.{domain}.{op_type}"


class Lifter:
    """One model -> one module. State lives here: ONNX value name -> IR value, constant caches."""

    def __init__(
        self,
        model: ModelProto,
        inference_error: InputError | None = None,
        base_dir: Path | None = None,
        resource_threshold: int = RESOURCE_THRESHOLD,
        detached: Mapping[str, RawData] | None = None,
    ) -> None:
        self.model = model
        self.base_dir = base_dir  # where external data lives (already checked by load.py)
        self.detached = detached or {}  # raw_data load.py took out of initializers
        self.resource_threshold = resource_threshold
        self.resource_names = ResourceNames()
        self.inference_error = inference_error
        self.graph = model.graph
        self.opsets: dict[str, int] = {}
        for entry in model.opset_import:
            self.opsets["" if entry.domain in DEFAULT_DOMAINS else entry.domain] = entry.version
        self.initializers = {t.name: t for t in self.graph.initializer}
        self.type_protos: dict[str, TypeProto] = {}
        for info in [*self.graph.input, *self.graph.value_info, *self.graph.output]:
            if info.type.WhichOneof("value") is not None:
                self.type_protos.setdefault(info.name, info.type)
        self.values: dict[str, Value] = {}
        self.constant_arrays: dict[str, np.ndarray] = {}  # Constant-node outputs, for Q/DQ parameters
        self.onnx_types: dict[str, int] = {}  # ONNX element type of every value we know it for
        self.block: Block | None = None
        self.source_name = "the model"  # for messages about the model as a whole
        # A stripped model's inputs seen as their quant types (its metadata): storage argument -> view.
        self.boundary_views: dict[Value, Value] = {}

    # Types -------------------------------------------------------------------------------------
    def onnx_type(self, name: str) -> int:
        if name in self.onnx_types:
            return self.onnx_types[name]
        if name in self.initializers:
            return self.initializers[name].data_type
        proto = self.type_protos.get(name)
        if proto is not None and proto.WhichOneof("value") == "tensor_type":
            return proto.tensor_type.elem_type
        return 0

    def ir_type(self, name: str) -> Type:
        """`tensor<1x?x4xf32>` from the inferred ONNX type; `tensor<*x!onnx.unknown>` when unknown."""
        if name in self.initializers:
            tensor = self.initializers[name]
            entry = ELEMENT_TYPES.get(tensor.data_type)
            return RankedTensorType(tuple(tensor.dims), entry.ir_type if entry else UNKNOWN_ELEMENT)
        proto = self.type_protos.get(name)
        if proto is None:
            return UnrankedTensorType(UNKNOWN_ELEMENT)
        kind = proto.WhichOneof("value")
        if kind != "tensor_type":
            return OpaqueType("onnx", kind.removesuffix("_type") if kind else "unknown")
        tensor_type = proto.tensor_type
        entry = ELEMENT_TYPES.get(tensor_type.elem_type)
        element = entry.ir_type if entry else UNKNOWN_ELEMENT
        if not tensor_type.HasField("shape"):
            return UnrankedTensorType(element)
        dims = tuple(d.dim_value if d.HasField("dim_value") else DYNAMIC for d in tensor_type.shape.dim)
        return RankedTensorType(dims, element)

    def name_attrs(self, name: str, dim_names: bool = False) -> DictionaryAttr:
        entries: list[tuple[str, Attribute]] = [(TENSOR_NAME, StringAttr(name))]
        entry = ELEMENT_TYPES.get(self.onnx_type(name))
        if entry is not None and entry.is_unsigned_integer:
            entries.append((ELEM_TYPE, StringAttr(entry.name)))
        proto = self.type_protos.get(name)
        if dim_names and proto is not None and proto.WhichOneof("value") == "tensor_type":
            # Names of the dynamic dims (`["batch", "sequence"]`, "" for a static or unnamed dim), so that
            # a backend needing static shapes can say which dimension of which input to give.
            params = [d.dim_param if not d.HasField("dim_value") else "" for d in proto.tensor_type.shape.dim]
            if any(params):
                entries.append(("onnx.dim_params", ArrayAttr(tuple(StringAttr(p) for p in params))))
        return DictionaryAttr(tuple(entries))

    # Values ------------------------------------------------------------------------------------
    def insert(self, op: Operation) -> Operation:
        assert self.block is not None
        return self.block.append(op)

    def constant(self, array: np.ndarray, onnx_type: int, name: str = "") -> Value:
        if as_resource(onnx_type, tuple(array.shape), self.resource_threshold):
            array.setflags(write=False)
            return self.constant_op(
                None, onnx_type, name, LazyElements(array.shape, array.dtype, lambda: array)
            )
        return self.constant_op(attrs.tensor_attr(array, onnx_type), onnx_type, name)

    def constant_op(
        self, attribute: Attribute | None, onnx_type: int, name: str, elements: LazyElements | None = None
    ) -> Value:
        """`arith.constant` of `attribute`, or (None) of `dense_resource<name>` over `elements`."""
        if attribute is None:
            assert elements is not None
            element = ELEMENT_TYPES[onnx_type].ir_type
            resource_name = self.resource_names(name)
            attribute = DenseResourceAttr(resource_name, RankedTensorType(elements.shape, element), elements)
        op = ConstantOp.create(attribute)
        entry = ELEMENT_TYPES.get(onnx_type)
        if entry is not None and entry.is_unsigned_integer:
            op.attributes[ELEM_TYPE] = StringAttr(entry.name)
        return self.insert(op).result

    def value(self, node: NodeProto, name: str) -> Value:
        """The IR value of an ONNX input name, materializing an initializer on first use."""
        found = self.values.get(name)
        if found is not None:
            return found
        if name in self.initializers:
            tensor = self.initializers[name]
            raw = self.detached.get(name)
            elements = lazy_elements(tensor, self.base_dir, self.resource_threshold, raw)
            if elements is not None:
                value = self.constant_op(None, tensor.data_type, name, elements)
            else:
                value = self.constant(initializer_array(tensor, self.base_dir, raw), tensor.data_type, name)
            self.values[name] = value
            return value
        raise InputError(
            f"node '{display_name(node)}' ({node.op_type}): input '{name}' is neither a graph input, an "
            f"initializer, nor the output of an earlier node (missing initializer?)"
        )

    def has_quant_storage(self, node: NodeProto) -> bool:
        """False for storage MLIR's quant types cannot hold (FNUZ float8): those nodes stay generic."""
        storage_value = node.output[0] if node.op_type == "QuantizeLinear" else node.input[0]
        entry = ELEMENT_TYPES.get(self.onnx_type(storage_value))
        return entry is None or entry.name not in UNREPRESENTABLE_STORAGE

    def has_constant_parameters(self, node: NodeProto) -> bool:
        """True when the scale and zero point of a Q/DQ node are initializers or Constant outputs."""
        parameters = [name for name in node.input[1:3] if name]
        return all(name in self.initializers or name in self.constant_arrays for name in parameters)

    def constant_array(self, node: NodeRef, name: str, what: str) -> np.ndarray:
        if name in self.initializers:
            return initializer_array(self.initializers[name], self.base_dir, self.detached.get(name))
        if name in self.constant_arrays:
            return self.constant_arrays[name]
        raise node.error(
            f"{what} '{name}' must be a constant (an initializer or a Constant node): dynamic "
            f"quantization parameters are not supported"
        )

    # Checks ------------------------------------------------------------------------------------
    def unsupported_nodes(self) -> list[tuple[str, str, str]]:
        """(op, node name, reason) of every node `lift` cannot lift; op is `onnx.If, opset 21`."""
        local_functions = {(f.domain, f.name) for f in self.model.functions}
        problems = []
        for node in self.graph.node:
            domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
            opset = self.opsets.get(domain)
            kind = f"{op_name(domain, node.op_type)}, opset {opset}"
            name = display_name(node)
            if opset is None:
                problems.append((kind, name, f"domain '{domain}' is not in the model's opset_import"))
            elif (node.domain, node.op_type) in local_functions:
                problems.append((kind, name, "calls a model-local function (not lifted yet)"))
            elif domain == "" and not _has_schema(node.op_type, opset):
                problems.append((kind, name, f"no ONNX operator of this name at opset {opset}"))
            else:
                kinds = sorted(
                    {
                        attrs.UNSUPPORTED_KINDS[a.type]
                        for a in node.attribute
                        if a.type in attrs.UNSUPPORTED_KINDS
                    }
                )
                if kinds:
                    problems.append((kind, name, f"{'/'.join(kinds)} attributes are not lifted yet"))
        return problems

    # Lifting -----------------------------------------------------------------------------------
    def check_liftable(self) -> None:
        """InputError listing the nodes `lift` cannot lift (before any work that would need them), grouped
        by op and reason: `'typo' (onnx.NoSuchOp, opset 21): ...`, or `onnx.If, opset 21 x40 (nodes 'a',
        'b', 'c' and 37 more): ...`."""
        problems = self.unsupported_nodes()
        if not problems:
            return

        def line(group: ProblemGroup) -> str:
            if len(group.names) == 1:
                return f"'{group.names[0]}' ({group.kind}): {group.reason}"
            return f"{group.kind} x{len(group.names):,} (nodes {group.names_text()}): {group.reason}"

        groups = group_problems(problems)
        if len(groups) == 1:  # one kind: one line
            raise InputError(f"the model has {len(problems):,} unsupported node(s): {line(groups[0])}")
        kinds = f" ({len(groups)} kind(s), the most frequent first)"
        raise InputError(
            f"the model has {len(problems):,} unsupported node(s){kinds}:\n" + listing(groups, line)
        )

    def lift(self) -> ModuleOp:
        self.check_liftable()
        if self.inference_error is not None:
            raise self.inference_error
        module = ModuleOp.create()
        # The default domain is spelled `ai.onnx`: MLIR refuses an empty attribute name (`"" = 17`).
        module.attributes[OPSET_IMPORT] = DictionaryAttr(
            tuple(
                (domain or DEFAULT_DOMAIN_KEY, IntegerAttr(version, I64))
                for domain, version in sorted(self.opsets.items())
            )
        )
        arguments = [i.name for i in self.graph.input if i.name not in self.initializers]
        argument_types = [self.ir_type(name) for name in arguments]
        function = FuncOp.create("main", FunctionType(tuple(argument_types), ()))
        block = Block(argument_types)
        function.regions[0].append(block)
        self.block = block
        for name, argument in zip(arguments, block.arguments):
            self.values[name] = argument
        storage = StorageMetadata.from_metadata_props(
            {entry.key: entry.value for entry in self.model.metadata_props}, self.source_name
        )
        self.view_stripped_inputs(storage, arguments, block)
        for node in self.graph.node:
            self.lift_node(node)
        results = []
        for output in self.graph.output:
            if output.name not in self.values and output.name not in self.initializers:
                raise InputError(f"graph output '{output.name}' is produced by no node")
            results.append(self.value(NodeProto(name="<graph output>"), output.name))
        self.check_stripped_outputs(storage, results)
        self.insert(ReturnOp(results))
        for op in reversed(list(block.ops)):  # storage casts a folded Q -> DQ pair left unused
            if isinstance(op, STORAGE_CASTS) and not op.results[0].uses:
                op.erase()
        function.function_type = FunctionType(tuple(argument_types), tuple(v.type for v in results))
        function.attributes["arg_attrs"] = ArrayAttr(
            tuple(self.name_attrs(n, dim_names=True) for n in arguments)
        )
        function.attributes["res_attrs"] = ArrayAttr(
            tuple(self.name_attrs(o.name) for o in self.graph.output)
        )
        module.body.append(function)
        return module

    # Stripped models (qconvert/storage_metadata.py) -------------------------------------------------
    def boundary_type(self, entry: StorageEntry, name: str, kind: str, stored: Type) -> Type:
        """The quantized type of stripped input / output `name` (storage type `stored`), as the metadata
        records it; InputError when the metadata and the graph disagree."""
        where = f"{self.source_name}: metadata of stripped {kind} '{name}'"
        try:
            quant_type = entry.quantized_type()
        except InputError as error:
            raise InputError(f"{where}: {error.message}") from None
        onnx_type = ELEMENT_TYPES.get(self.onnx_type(name))
        if onnx_type is None or onnx_type.name != entry.storage:
            found = onnx_type.name if onnx_type is not None else "unknown"
            raise InputError(f"{where}: storage {entry.storage}, but the graph {kind} is {found}")
        container = with_element_type(stored, quant_type)
        problem = boundary_problem(container)
        if problem is not None:
            raise InputError(f"{where}: {problem}")
        return container

    def view_stripped_inputs(self, storage: StorageMetadata, arguments: list[str], block: Block) -> None:
        """Each stripped input is seen as its quant type through a `quant.scast` at the start of @main,
        placed as `strip-func-quant-types` places its glue (in reverse argument order)."""
        unknown = sorted(set(storage.inputs) - set(arguments))
        if unknown:
            raise InputError(f"{self.source_name}: metadata names stripped inputs {unknown} the graph lacks")
        for name, argument in reversed(list(zip(arguments, block.arguments))):
            entry = storage.inputs.get(name)
            if entry is not None:
                container = self.boundary_type(entry, name, "input", argument.type)
                self.boundary_views[argument] = self.insert(storage_cast(argument, container)).results[0]

    def check_stripped_outputs(self, storage: StorageMetadata, results: list[Value]) -> None:
        """A stripped output is the storage of the quant type the metadata records (the model's last
        QuantizeLinear or QLinear op makes it); InputError when the model makes another."""
        names = [output.name for output in self.graph.output]
        unknown = sorted(set(storage.outputs) - set(names))
        if unknown:
            raise InputError(f"{self.source_name}: metadata names stripped outputs {unknown} the graph lacks")
        for name, value in zip(names, results):
            entry = storage.outputs.get(name)
            if entry is None:
                continue
            container = self.boundary_type(entry, name, "output", value.type)
            producer = value.owner_op()
            if isinstance(producer, STORAGE_CASTS) and producer.operands[0].type != container:
                raise InputError(
                    f"{self.source_name}: metadata of stripped output '{name}' says {entry.quant_type}, "
                    f"but the model computes {producer.operands[0].type}"
                )

    def lift_node(self, node: NodeProto) -> None:
        domain = "" if node.domain in DEFAULT_DOMAINS else node.domain
        if (
            domain == ""
            and node.op_type in ("QuantizeLinear", "DequantizeLinear")
            and not (self.has_constant_parameters(node) and self.has_quant_storage(node))
        ):
            # A run-time scale, or FNUZ float8 storage, has no quant type: keep the node as a generic op.
            self.lift_generic(node, domain)
        elif domain == "" and node.op_type == "QuantizeLinear":
            self.lift_quantize(node)
        elif domain == "" and node.op_type == "DequantizeLinear":
            self.lift_dequantize(node)
        elif domain == "" and node.op_type == "Constant" and _attribute(node, "value") is not None:
            tensor = _attribute(node, "value").t  # type: ignore[union-attr]
            array = numpy_helper.to_array(tensor)
            self.constant_arrays[node.output[0]] = array
            self.onnx_types[node.output[0]] = tensor.data_type
            self.values[node.output[0]] = self.constant(array, tensor.data_type, node.output[0])
        elif not lift_qoperator(self, node, domain, self.node_ref(node)):
            self.lift_generic(node, domain)

    def lift_generic(self, node: NodeProto, domain: str) -> None:
        present_inputs = [(i, name) for i, name in enumerate(node.input) if name]
        operands = [self.value(node, name) for _, name in present_inputs]
        present_outputs = [(i, name) for i, name in enumerate(node.output) if name]
        attributes: dict[str, Attribute] = {a.name: attrs.from_onnx_attribute(a) for a in node.attribute}
        attributes[NODE_NAME] = StringAttr(node.name)
        if len(present_inputs) != len(node.input):
            absent = tuple(i for i, name in enumerate(node.input) if not name)
            attributes[ABSENT_INPUTS] = DenseArrayAttr(I64, absent)
        if len(present_outputs) != len(node.output):
            absent = tuple(i for i, name in enumerate(node.output) if not name)
            attributes[ABSENT_OUTPUTS] = DenseArrayAttr(I64, absent)
        op = GenericOp(
            op_name(domain, node.op_type),
            operands,
            [self.ir_type(name) for _, name in present_outputs],
            attributes,
        )
        self.insert(op)
        for (_, name), result in zip(present_outputs, op.results):
            self.values[name] = result

    def node_ref(self, node: NodeProto) -> NodeRef:
        return NodeRef(display_name(node), node.op_type, self.opsets.get("", 0))

    def quant_parameters(
        self, node: NodeProto, ref: NodeRef
    ) -> tuple[np.ndarray, ElementType, np.ndarray | None]:
        if len(node.input) < 2 or not node.input[1]:
            raise ref.error("the scale input is missing")
        scale = self.constant_array(ref, node.input[1], "scale")
        scale_type = ELEMENT_TYPES.get(self.onnx_type(node.input[1]))
        if scale_type is None:
            raise ref.error("the scale's element type is unknown")
        zero_point = None
        if len(node.input) > 2 and node.input[2]:
            zero_point = self.constant_array(ref, node.input[2], "zero point")
        return scale, scale_type, zero_point

    def lift_quantize(self, node: NodeProto) -> None:
        ref = self.node_ref(node)
        x = self.value(node, node.input[0])
        scale, scale_type, zero_point = self.quant_parameters(node, ref)
        output_dtype = _int_attribute(node, "output_dtype", 0)
        if zero_point is not None:
            storage = ELEMENT_TYPES.get(self.onnx_type(node.input[2]))
            if storage is None:
                raise ref.error("the zero point's element type is unknown")
            if output_dtype and output_dtype != storage.onnx_type:
                other = ELEMENT_TYPES.get(output_dtype)
                raise ref.error(
                    f"output_dtype {other.name if other else output_dtype} differs from the zero point's "
                    f"type {storage.name}"
                )
        elif output_dtype:
            storage = ELEMENT_TYPES.get(output_dtype)
            if storage is None:
                raise ref.error(f"output_dtype {output_dtype} is not an ONNX element type")
        else:
            storage = BY_NAME["uint8"]
        check_storage(ref, storage, quantize=True)
        x_type = x.type
        expressed = getattr(x_type, "element_type", None)
        if not isinstance(expressed, FloatType) or expressed.name not in EXPRESSED_FLOATS:
            raise ref.error(f"input of type {x_type} is not supported (a f32, f16, bf16 or f64 tensor is)")
        quant_type = quant_type_of(
            ref,
            scale=scale,
            scale_type=scale_type,
            zero_point=zero_point,
            storage=storage,
            expressed=expressed,
            input_shape=_shape(x_type),
            axis=_int_attribute(node, "axis", 1),
            block_size=_int_attribute(node, "block_size", 0),
        )
        attributes: dict[str, Attribute] = {NODE_NAME: StringAttr(node.name)}
        if storage.name in FLOAT_STORAGE:
            attributes["saturate"] = BoolAttr(bool(_int_attribute(node, "saturate", 1)))
        precision = _int_attribute(node, "precision", 0)
        if precision:
            attributes["onnx.precision"] = IntegerAttr(precision, I64)
        padding = self.ragged_padding(ref, x_type, node)
        source = x if padding is None else self.pad_to_blocks(x, padding, node.name)
        quantized = self.insert(
            QuantizeCastOp(source, with_element_type(source.type, quant_type), attributes=attributes)
        ).result
        stored = self.insert(storage_cast(quantized, with_element_type(source.type, storage.ir_type))).result
        if padding is not None:
            stored = self.slice_from_blocks(stored, _shape(x_type), padding[0], node.name)  # type: ignore[arg-type]
        self.values[node.output[0]] = stored
        self.onnx_types[node.output[0]] = storage.onnx_type

    def lift_dequantize(self, node: NodeProto) -> None:
        ref = self.node_ref(node)
        scale, scale_type, zero_point = self.quant_parameters(node, ref)
        storage = ELEMENT_TYPES.get(self.onnx_type(node.input[0]))
        if storage is None:
            raise ref.error(f"the element type of input '{node.input[0]}' is unknown")
        check_storage(ref, storage, quantize=False)
        padding = self.ragged_padding(ref, self.ir_type(node.input[0]), node)
        if padding is not None and node.input[0] in self.initializers and node.input[0] not in self.values:
            # A ragged constant (a weight) is padded here, not by an onnx.Pad a backend would fold
            padded_array = pad_array(self.constant_array(ref, node.input[0], "input"), *padding)
            x = self.constant(padded_array, storage.onnx_type, node.input[0])
            padding_done = True
        else:
            x = self.value(node, node.input[0])
            padding_done = False
        block_size = _int_attribute(node, "block_size", 0)
        signs = None
        if block_size > 0 and needs_signs(np.asarray(scale)):
            # onnxruntime's symmetric n-bit quantizer writes negative block scales: dequantize with |scale|,
            # then multiply by the signs (exact; frontends/onnx/blockwise.py)
            scale, signs = split_scale_signs(np.asarray(scale))
        output_dtype = _int_attribute(node, "output_dtype", 0)
        if output_dtype:
            expressed_entry = ELEMENT_TYPES.get(output_dtype)
        elif ref.opset >= 19:
            expressed_entry = scale_type
        else:
            expressed_entry = BY_NAME["float"]
        if expressed_entry is None or expressed_entry.name not in EXPRESSED:
            raise ref.error(f"output type {output_dtype} is not float, float16, bfloat16 or double")
        quant_type = quant_type_of(
            ref,
            scale=scale,
            scale_type=scale_type,
            zero_point=zero_point,
            storage=storage,
            expressed=expressed_entry.ir_type,
            input_shape=_shape(x.type),
            axis=_int_attribute(node, "axis", 1),
            block_size=_int_attribute(node, "block_size", 0),
        )
        if zero_point is not None:
            # After quant_type_of, so that a value outside the storage range is reported as such.
            zero_type = ELEMENT_TYPES.get(self.onnx_type(node.input[2]))
            if zero_type is not None and zero_type.name != storage.name:
                raise ref.error(f"zero point type {zero_type.name} differs from input type {storage.name}")
        unpadded_shape = _shape(self.ir_type(node.input[0])) if padding_done else _shape(x.type)
        padded = x if padding is None or padding_done else self.pad_to_blocks(x, padding, node.name)
        quantized = self.quantized_view(padded, quant_type)
        result = self.insert(
            DequantizeCastOp(
                quantized,
                with_element_type(padded.type, expressed_entry.ir_type),
                attributes={NODE_NAME: StringAttr(node.name)},
            )
        ).result
        if signs is not None:
            axis = normalize_axis(ref, _int_attribute(node, "axis", 1), len(quantized.type.shape))  # type: ignore[attr-defined]
            result = self.apply_block_signs(
                result, signs, axis, block_size, expressed_entry.onnx_type, node.name
            )
        if padding is not None:
            result = self.slice_from_blocks(result, unpadded_shape, padding[0], node.name)  # type: ignore[arg-type]
        self.values[node.output[0]] = result
        self.onnx_types[node.output[0]] = expressed_entry.onnx_type

    def ragged_padding(self, ref: NodeRef, type_: Type, node: NodeProto) -> tuple[int, int] | None:
        """(axis, padded size) when a blocked Q/DQ's block size does not divide its axis (ONNX's shorter
        last block; quant.py types the tensor padded to whole blocks), else None."""
        block_size = _int_attribute(node, "block_size", 0)
        shape = _shape(type_)
        if block_size <= 0 or shape is None:
            return None
        axis = normalize_axis(ref, _int_attribute(node, "axis", 1), len(shape))
        padded = padded_shape(shape, axis, block_size)
        return None if padded == shape else (axis, padded[axis])

    def pad_to_blocks(self, value: Value, padding: tuple[int, int], node_name: str) -> Value:
        """`value` padded with zeros at the end of `axis` to `size` (whole blocks), as an `onnx.Pad`."""
        axis, size = padding
        shape = tuple(value.type.shape)  # type: ignore[attr-defined]
        pads = np.zeros(2 * len(shape), np.int64)
        pads[len(shape) + axis] = size - shape[axis]
        result_type = RankedTensorType(
            (*shape[:axis], size, *shape[axis + 1 :]),
            value.type.element_type,  # type: ignore[attr-defined]
        )
        op = GenericOp(
            "onnx.Pad",
            [value, self.constant(pads, TensorProto.INT64)],
            [result_type],
            {NODE_NAME: StringAttr(node_name), "mode": StringAttr("constant")},
        )
        return self.insert(op).results[0]

    def slice_from_blocks(self, value: Value, shape: tuple[int, ...], axis: int, node_name: str) -> Value:
        """The first `shape[axis]` entries of a value padded by `pad_to_blocks`, as an `onnx.Slice`."""

        def index(number: int) -> Value:
            return self.constant(np.asarray([number], np.int64), TensorProto.INT64)

        element = value.type.element_type  # type: ignore[attr-defined]
        op = GenericOp(
            "onnx.Slice",
            [value, index(0), index(shape[axis]), index(axis)],
            [RankedTensorType(shape, element)],
            {NODE_NAME: StringAttr(node_name)},
        )
        return self.insert(op).results[0]

    def apply_block_signs(
        self, weight: Value, signs: np.ndarray, axis: int, block_size: int, onnx_type: int, node_name: str
    ) -> Value:
        """`weight` times `signs` (one per block of `block_size` along `axis`), as exact float ops:
        Reshape to [..., blocks, block_size, ...], Mul by signs shaped [..., blocks, 1, ...], Reshape back."""
        shape = tuple(weight.type.shape)  # type: ignore[attr-defined]
        element = weight.type.element_type  # type: ignore[attr-defined]
        blocks = signs.shape[axis]
        split = (*shape[:axis], blocks, block_size, *shape[axis + 1 :])
        sign_shape = (*signs.shape[:axis], blocks, 1, *signs.shape[axis + 1 :])
        name = StringAttr(node_name)

        def reshape(value: Value, dims: tuple[int, ...]) -> Value:
            target = self.constant(np.asarray(dims, np.int64), TensorProto.INT64)
            op = GenericOp(
                "onnx.Reshape", [value, target], [RankedTensorType(dims, element)], {NODE_NAME: name}
            )
            return self.insert(op).results[0]

        sign_value = self.constant(np.ascontiguousarray(signs.reshape(sign_shape)), onnx_type)
        attributes: dict[str, Attribute] = {NODE_NAME: name, NOTE: StringAttr(NOTE_SIGNS)}
        product = GenericOp(
            "onnx.Mul", [reshape(weight, split), sign_value], [RankedTensorType(split, element)], attributes
        )
        return reshape(self.insert(product).results[0], shape)

    def quantized_view(self, stored: Value, quant_type: QuantizedType) -> Value:
        """`stored` seen as `quant_type`: the qcast result it came from, or a new storage cast."""
        target = with_element_type(stored.type, quant_type)
        view = self.boundary_views.get(stored)
        if view is not None and view.type == target:
            return view  # a stripped input's quant type, from the model's metadata
        producer = stored.owner_op()
        if isinstance(producer, STORAGE_CASTS) and producer.operands[0].type == target:
            return producer.operands[0]  # type: ignore[union-attr]
        return self.insert(storage_cast(stored, target)).result


def storage_cast(value: Value, result_type: Type) -> Operation:
    """`quant.scast` for integer storage, `qconvert.storage_cast` for float storage (either way)."""
    elements = [getattr(t, "element_type", t) for t in (value.type, result_type)]
    storages = [e.storage_type if isinstance(e, QuantizedType) else e for e in elements]
    if any(isinstance(s, FloatType) for s in storages):
        return FloatStorageCastOp(value, result_type)
    return StorageCastOp(value, result_type)


# The IR names of the expressed types `!quant.uniform` takes (dtypes.EXPRESSED, by ONNX name).
EXPRESSED_FLOATS = {"f32", "f16", "bf16", "f64"}


def pad_array(array: np.ndarray, axis: int, size: int) -> np.ndarray:
    """`array` with zeros appended along `axis` up to `size` (its dtype kept: int4 too)."""
    shape = list(array.shape)
    shape[axis] = size - shape[axis]
    return np.concatenate([array, np.zeros(shape, array.dtype)], axis=axis)


def display_name(node: NodeProto) -> str:
    """The node's name, or `<unnamed, output 'y'>` when the model leaves it empty."""
    if node.name:
        return node.name
    return f"<unnamed, output '{node.output[0]}'>" if node.output else "<unnamed>"


def _shape(type_: Type) -> tuple[int, ...] | None:
    return type_.shape if isinstance(type_, RankedTensorType) else None


def _attribute(node: NodeProto, name: str) -> onnx.AttributeProto | None:
    return next((a for a in node.attribute if a.name == name), None)


def _int_attribute(node: NodeProto, name: str, default: int) -> int:
    attribute = _attribute(node, name)
    if attribute is None:
        return default
    if attribute.type != onnx.AttributeProto.INT:  # validate.py checks known attributes; this, any
        kind = onnx.AttributeProto.AttributeType.Name(attribute.type)
        raise InputError(
            f"node '{display_name(node)}' ({node.op_type}): attribute '{name}' is a {kind}, not an INT"
        )
    return int(attribute.i)


def _has_schema(op_type: str, opset: int) -> bool:
    try:
        onnx.defs.get_schema(op_type, opset, "")
    except onnx.defs.SchemaError:
        return False
    return True
