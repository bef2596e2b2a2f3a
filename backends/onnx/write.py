"""The IR -> ONNX writer: one `func.func @main` becomes one onnx_ir graph (QDQ form).

| IR                                         | ONNX                                                    |
|--------------------------------------------|---------------------------------------------------------|
| function arguments / results               | graph inputs / outputs, named by `onnx.name`            |
| `arith.constant` (dense or dense_resource) | initializer (named after the resource when it has one)  |
| `quant.qcast` / `quant.dcast`              | QuantizeLinear / DequantizeLinear, parameters in qdq.py |
| `quant.scast`, `"qconvert.storage_cast"`   | nothing: the storage tensor is the ONNX value           |
| `"onnx.X"`, `"onnx.<domain>.X"`            | node X of the default domain / of `<domain>`            |
| `"qconvert.qlinear_conv"`, ...             | the QOperator node it was lifted from (qoperator.py)    |

Names: graph inputs and outputs keep their `onnx.name`, nodes their `onnx.node_name`; an initializer
is named by the constant's `onnx.name` (calibration sets it), else its `dense_resource` name (the lifted
initializer's, made an MLIR identifier), else `<t>_quantized` when it feeds `<t>_DequantizeLinear`. Q/DQ
values follow onnxruntime's quantizer (`<t>_scale`, `<t>_zero_point`, `<t>_QuantizeLinear_Output`, see
`Writer.qdq_names`), other nodes' outputs are `<node name>_output_<i>` (the TorchScript exporter's
convention, so exported names often come back); every name is made unique. The IR keeps no other
intermediate names. A value's ONNX type: its `onnx.elem_type`, else the storage type of the quant type a
`quant.scast` reads it as (an `i8` weight read as `u8` is written uint8), else its IR type (signless
integers signed).

Opset: opset.py (the model's own, raised to what the Q/DQ nodes need, at most 25 with Q/DQ nodes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from qconvert.errors import InputError
from qconvert.ir.attributes import (
    ArrayAttr,
    Attribute,
    BoolAttr,
    DenseElementsAttr,
    DenseResourceAttr,
    DictionaryAttr,
    FloatAttr,
    IntegerAttr,
    StringAttr,
)
from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.func import FuncOp, ReturnOp
from qconvert.ir.dialects.onnx import (
    ELEM_TYPE,
    TENSOR_NAME,
    absent_positions,
    main_function,
    node_name,
    op_label,
    opset_imports,
    signature_names,
)
from qconvert.ir.dialects.qconvert import STORAGE_CASTS
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp
from qconvert.ir.quant_types import QuantizedType
from qconvert.ir.types import Type, element_type_of
from qconvert.onnx_attributes import to_onnx_attribute

from .opset import choose_opset, convert_opset
from .qdq import FLOAT_STORAGE, QdqParameters, qdq_parameters
from .qoperator import qoperator_node
from .types import (
    UnwritableType,
    as_storage_array,
    check_writable,
    data_type,
    is_signless_narrow_integer,
    shape_of,
)

CONTRIB_DOMAINS = {"com.microsoft": 1}
PROTOBUF_LIMIT = 2**31  # a serialized ModelProto cannot reach 2 GiB


def _attribute_dicts(function: FuncOp, key: str, count: int) -> list[dict[str, Attribute]]:
    entries = function.attributes.get(key)
    result: list[dict[str, Attribute]] = [{} for _ in range(count)]
    if isinstance(entries, ArrayAttr):
        for index, entry in enumerate(entries.elements[:count]):
            if isinstance(entry, DictionaryAttr):
                result[index] = dict(entry.entries)
    return result


def _before_quant_casts(value: Value) -> Value:
    """The value a chain of quant.qcast/dcast starts from (`value` itself when it is not a cast's result)."""
    while isinstance(producer := value.owner_op(), QuantizeCastOp | DequantizeCastOp):
        value = producer.input
    return value


class Names:
    """Unique names in one namespace: `x`, then `x_1`, `x_2`, ..."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def reserve(self, name: str) -> None:
        self.used.add(name)

    def unique(self, base: str) -> str:
        candidate, counter = base, 0
        while candidate in self.used or not candidate:
            counter += 1
            candidate = f"{base}_{counter}"
        self.used.add(candidate)
        return candidate


def node_label(op: Operation) -> str:
    """`'quant.qcast' (node 'x_QuantizeLinear')` for error messages; calibration's qcasts name their
    tensor instead (`onnx.tensor_name`)."""
    if node_name(op):
        return op_label(op)
    tensor = op.attributes.get("onnx.tensor_name")
    if isinstance(tensor, StringAttr) and tensor.value:
        return f"'{op.name}' (tensor '{tensor.value}')"
    return f"'{op.name}'"


class Writer:
    """One module -> one onnx_ir model. Holds IR value -> ONNX value, names, initializers."""

    def __init__(self, module: ModuleOp, opset: int | None) -> None:
        self.module = module
        self.function = main_function(module, "to write as ONNX")
        self.requested_opset = opset
        self.opsets = opset_imports(module)
        self.values: dict[Value, ir.Value] = {}
        self.value_names = Names()
        self.node_names = Names()
        self.nodes: list[ir.Node] = []
        self.initializers: list[ir.Value] = []
        self.parameters: dict[tuple[str, str, tuple[int, ...], bytes], ir.Value] = {}
        self.required_opset = 1
        self.has_qdq = False
        self.counters: dict[str, int] = {}
        self.tensor_bases: dict[ir.Value, str] = {}  # Q output -> the `<t>` its parameters are named after
        self.generated_names: set[ir.Value] = set()  # initializers named "const..." for want of a name
        self.input_names: set[str] = set()

    # Graph ---------------------------------------------------------------------------------------
    def build(self) -> ir.Model:
        function = self.function
        body = function.body
        argument_types = function.function_type.inputs
        result_types = function.function_type.results
        argument_attrs = _attribute_dicts(function, "arg_attrs", len(argument_types))
        result_attrs = _attribute_dicts(function, "res_attrs", len(result_types))
        input_names = [name or f"arg{i}" for i, name in enumerate(signature_names(function, "inputs"))]
        output_names = [name or f"result{i}" for i, name in enumerate(signature_names(function, "outputs"))]
        if len(set(input_names)) != len(input_names):
            repeated = sorted({n for n in input_names if input_names.count(n) > 1})
            raise InputError(f"@{function.sym_name}: arguments share the onnx.name(s) {repeated}")
        self.input_names = set(input_names)
        for name in (*input_names, *output_names):
            self.value_names.reserve(name)
        inputs = []
        for index, (argument, name) in enumerate(zip(body.arguments, input_names)):
            where = f"argument {index} ('{name}') of @{function.sym_name}"
            value = ir.Value(name=name)
            elem_type = argument_attrs[index].get(ELEM_TYPE) or storage_view(argument)
            self._set_type(value, argument.type, elem_type, where)
            self.values[argument] = value
            inputs.append(value)
        outputs: list[ir.Value] = []
        for op in body.ops:
            if isinstance(op, ReturnOp):
                outputs = self.graph_outputs(op, output_names, result_attrs)
                break
            self.write_op(op)
        else:
            raise InputError(f"@{function.sym_name} has no func.return")
        opset_imports = {"": self.target_opset(), **{d: v for d, v in self.opsets.items() if d}}
        graph = ir.Graph(
            inputs,
            outputs,
            nodes=self.nodes,
            initializers=self.initializers,
            opset_imports=opset_imports,
            name=function.sym_name,
        )
        return ir.Model(graph, ir_version=10, producer_name="qconvert")

    def graph_outputs(
        self, op: ReturnOp, names: list[str], attributes: list[dict[str, Attribute]]
    ) -> list[ir.Value]:
        outputs: list[ir.Value] = []
        for index, (operand, name) in enumerate(zip(op.operands, names)):
            value = self.values[operand]
            if name in self.input_names and value.name != name:
                # An output named like an input is that input in ONNX: return it, not a Q/DQ round trip of
                # it (which calibrating such a model puts there), as the source model did. A module that
                # means that round trip on its input has to name the output otherwise.
                source = _before_quant_casts(operand)
                if source is not operand and self.values[source].name == name:
                    value = self.values[source]
            if name in names[:index] or (name in self.input_names and value.name != name):
                raise InputError(
                    f"result {index} of @{self.function.sym_name} is named '{name}' like another graph "
                    f"input or output: ONNX names must be unique"
                )
            if value.name != name and (value.producer() is None or value in outputs):
                # a graph input, an initializer, or a value already returned: ONNX needs a node between
                node = self.add_node("", "Identity", [value], {}, self.node_names.unique(f"{name}_Identity"))
                value = node.outputs[0]
            if name not in self.input_names:  # an input keeps its own (input) type
                value.name = name
                where = f"result {index} ('{name}') of @{self.function.sym_name}"
                self._set_type(value, operand.type, attributes[index].get(ELEM_TYPE), where)
            outputs.append(value)
        return outputs

    def target_opset(self) -> int:
        return choose_opset(self.opsets.get(""), self.required_opset, self.has_qdq, self.requested_opset)

    # Ops -----------------------------------------------------------------------------------------
    def write_op(self, op: Operation) -> None:
        for index, operand in enumerate(op.operands):
            check_writable(operand.type, f"operand {index} of {node_label(op)}")
        for index, result in enumerate(op.results):
            check_writable(result.type, f"result {index} of {node_label(op)}")
        if isinstance(op, ConstantOp):
            self.constant(op)
        elif isinstance(op, QuantizeCastOp | DequantizeCastOp):
            self.quant_cast(op)
        elif isinstance(op, STORAGE_CASTS):
            self.values[op.results[0]] = self.values[op.operands[0]]  # same bytes, same ONNX value
        elif op.name.startswith("onnx."):
            self.generic(op)
        elif op.name.startswith("qconvert."):
            self.qoperator(op)
        elif op.name == "func.call":
            raise InputError(
                f"{node_label(op)}: calls are not written to ONNX; inline them first (qconvert opt --inline)"
            )
        else:
            raise InputError(
                f"{node_label(op)}: the ONNX writer handles onnx.*, qconvert.*, quant.qcast/dcast/scast, "
                f"arith.constant and func.return; '{op.name}' has no ONNX equivalent"
            )

    def add_node(
        self, domain: str, op_type: str, inputs: list[ir.Value | None], attributes: dict[str, ir.Attr],
        name: str, num_outputs: int = 1, output_name: str | None = None,
    ) -> ir.Node:  # fmt: skip
        node = ir.Node(domain, op_type, inputs, attributes.values(), num_outputs=num_outputs, name=name)
        for index, output in enumerate(node.outputs):
            output.name = self.value_names.unique(output_name or f"{name}_output_{index}")
        self.nodes.append(node)
        return node

    def node_name(self, op: Operation, op_type: str) -> str:
        """The op's ONNX node name, made unique; `<op_type>_<i>` for an unnamed op."""
        name = node_name(op)
        if name:
            return self.node_names.unique(name)
        count = self.counters[op_type] = self.counters.get(op_type, -1) + 1
        return self.node_names.unique(f"{op_type}_{count}")

    def generic(self, op: Operation) -> None:
        _, _, qualified = op.name.partition(".")
        domain, _, op_type = qualified.rpartition(".")
        if domain and domain not in self.opsets:
            if domain not in CONTRIB_DOMAINS:
                raise InputError(
                    f"{node_label(op)}: domain '{domain}' is not in the module's onnx.opset_import"
                )
            self.opsets[domain] = CONTRIB_DOMAINS[domain]
        if domain == "" and op_type in ("QuantizeLinear", "DequantizeLinear"):
            self.has_qdq = True  # a run-time scale, or FNUZ storage: kept generic by the frontend
        absent_inputs, absent_outputs = absent_positions(op), absent_positions(op, "outputs")
        operands = iter(op.operands)
        inputs: list[ir.Value | None] = [
            None if position in absent_inputs else self.values[next(operands)]
            for position in range(len(op.operands) + len(absent_inputs))
        ]
        count = len(op.results) + len(absent_outputs)
        node = self.add_node(
            domain, op_type, inputs, self.node_attributes(op), self.node_name(op, op_type), count
        )
        present = [output for position, output in enumerate(node.outputs) if position not in absent_outputs]
        for position in absent_outputs:
            node.outputs[position].name = ""
        self.bind_results(op, present)

    def qoperator(self, op: Operation) -> None:
        """A QOperator op the frontend lifted to `qconvert.*`, back to its node (qoperator.py)."""
        found = qoperator_node(self, op)
        if found is None:
            raise InputError(f"{node_label(op)}: '{op.name}' is not a qconvert op the ONNX writer knows")
        domain, op_type, inputs, name = found
        if domain and domain not in self.opsets:
            self.opsets[domain] = CONTRIB_DOMAINS[domain]
        node = self.add_node(domain, op_type, inputs, self.node_attributes(op), name, len(op.results))
        self.bind_results(op, list(node.outputs))

    def node_attributes(self, op: Operation) -> dict[str, ir.Attr]:
        """The op's ONNX attributes (every attribute but the `onnx.*` bookkeeping)."""
        attributes: dict[str, ir.Attr] = {}
        for key, value in op.attributes.items():
            if key.startswith("onnx."):
                continue
            try:
                attributes[key] = ir.serde.deserialize_attribute(to_onnx_attribute(key, value))
            except TypeError as error:
                raise InputError(f"{node_label(op)}: {error}") from None
        return attributes

    def bind_results(self, op: Operation, outputs: list[ir.Value]) -> None:
        """Map `op`'s results to the node's outputs; type those whose ONNX type the IR type decides."""
        for result, output in zip(op.results, outputs, strict=True):
            self.values[result] = output
            if isinstance(element_type_of(result.type), QuantizedType) or not is_signless_narrow_integer(
                result.type
            ):  # a plain i8 is int8 or uint8: left to ONNX shape inference
                with contextlib.suppress(InputError):  # an unknown or opaque type: ONNX infers it
                    self._set_type(output, result.type, None, "")

    def constant(self, op: ConstantOp) -> None:
        value = op.value
        result_type = op.result.type
        element = element_type_of(result_type)
        where = f"constant {node_label(op)} of type {result_type}"
        try:
            onnx_type = self.constant_data_type(op, element)
        except UnwritableType as error:
            raise InputError(f"{where}: {error}") from None
        # An initializer's name: `onnx.name` (set by calibration), else the resource's (the lifted
        # initializer's name), else a generated one.
        recorded = op.attributes.get(TENSOR_NAME)
        name_base = recorded.value if isinstance(recorded, StringAttr) and recorded.value else "const"
        if isinstance(value, DenseElementsAttr):
            array = np.asarray(value.array)
        elif isinstance(value, DenseResourceAttr):
            if value.elements is None:
                raise InputError(
                    f"{where}: dense_resource<{value.name}> has no data (weights elided when the module "
                    f"was printed?); write the module from the lifted model instead"
                )
            array = value.elements.get()
            if name_base == "const":
                name_base = value.name
        elif isinstance(value, IntegerAttr | FloatAttr | BoolAttr):
            array = np.array(value.value)
        else:
            raise InputError(f"{where}: value {value} has no ONNX tensor equivalent")
        array = as_storage_array(array, onnx_type)
        shape = shape_of(result_type)
        if shape is not None and tuple(array.shape) != tuple(shape.numpy()):
            array = array.reshape(shape.numpy())  # a scalar attribute typed as a tensor
        name = self.value_names.unique(name_base)
        # No type / shape on the value: onnx_ir would repeat them as value_info; the tensor says both.
        initializer = ir.Value(name=name, const_value=ir.Tensor(array, dtype=onnx_type, name=name))
        self.initializers.append(initializer)
        self.values[op.result] = initializer
        if name_base == "const":
            self.generated_names.add(initializer)

    @staticmethod
    def constant_data_type(op: ConstantOp, element: Type) -> ir.DataType:
        return data_type(element, op.attributes.get(ELEM_TYPE) or storage_view(op.result))

    def quant_cast(self, op: QuantizeCastOp | DequantizeCastOp) -> None:
        quantize = isinstance(op, QuantizeCastOp)
        quantized = op.results[0] if quantize else op.operands[0]
        quant_type = element_type_of(quantized.type)
        op_type = "QuantizeLinear" if quantize else "DequantizeLinear"
        try:
            assert isinstance(quant_type, QuantizedType)
            params = qdq_parameters(quant_type, quantized.type, quantize=quantize)
        except UnwritableType as error:
            raise InputError(f"{node_label(op)} as {op_type}: {error}") from None
        self.has_qdq = True
        self.required_opset = max(self.required_opset, params.opset)
        name = self.node_name(op, op_type)
        source = self.values[op.operands[0]]
        tensor_name = op.attributes.get("onnx.tensor_name")  # calibration: the quantized tensor's name
        if (
            isinstance(tensor_name, StringAttr)
            and source.producer() is not None
            and tensor_name.value not in self.value_names.used
        ):
            source.name = tensor_name.value
            self.value_names.reserve(tensor_name.value)
        tensor, output_name = self.qdq_names(name, op_type, source, params)
        scale = self.parameter(params.scale, params.scale_type, f"{tensor}_scale")
        zero_point = self.parameter(params.zero_point, params.storage, f"{tensor}_zero_point")
        attributes = self.quant_attributes(op, params, quantize)
        node = self.add_node(
            "", op_type, [source, scale, zero_point], attributes, name, output_name=output_name
        )
        self.tensor_bases[node.outputs[0]] = tensor
        self.values[op.results[0]] = node.outputs[0]
        self._set_type(node.outputs[0], op.results[0].type, None, f"result of {node_label(op)}")

    def qdq_names(
        self, name: str, op_type: str, source: ir.Value, params: QdqParameters
    ) -> tuple[str, str | None]:
        """The tensor name `<t>` a Q/DQ node's parameters are named after, and its output's name.

        onnxruntime's names: node `<t>_QuantizeLinear`, output `<t>_QuantizeLinear_Output`, scale and
        zero point `<t>_scale` / `<t>_zero_point`, a quantized weight `<t>_quantized`, and an int32 bias's
        parameters `<t>_quantized_scale`. A DQ node without such a name shares its Q node's `<t>`.
        """
        tensor = name.removesuffix(f"_{op_type}")
        output_name = f"{name}_Output" if tensor != name else None
        if tensor == name:
            tensor = self.tensor_bases.get(source, name)
        if source in self.generated_names:  # an unnamed weight: `<t>_quantized`
            self.generated_names.discard(source)
            source.name = self.value_names.unique(f"{tensor}_quantized")
        if params.storage == ir.DataType.INT32 and source.const_value is not None and source.name:
            tensor = source.name
        return tensor, output_name

    def quant_attributes(self, op: Operation, params: QdqParameters, quantize: bool) -> dict[str, ir.Attr]:
        attributes: dict[str, ir.Attr] = {}
        if params.axis is not None:
            attributes["axis"] = ir.AttrInt64("axis", params.axis)
        if params.block_size is not None:
            attributes["block_size"] = ir.AttrInt64("block_size", params.block_size)
        if quantize and params.storage in FLOAT_STORAGE and params.storage != ir.DataType.FLOAT4E2M1:
            saturate = op.attributes.get("saturate")
            flag = saturate.value if isinstance(saturate, BoolAttr) else True
            attributes["saturate"] = ir.AttrInt64("saturate", int(flag))
        precision = op.attributes.get("onnx.precision")
        if quantize and isinstance(precision, IntegerAttr) and precision.value:
            self.required_opset = max(self.required_opset, 23)
            attributes["precision"] = ir.AttrInt64("precision", int(precision.value))
        return attributes

    def parameter(self, array: np.ndarray, onnx_type: ir.DataType, name: str) -> ir.Value:
        """A scale / zero-point initializer, shared by the nodes that name it alike with the same values
        (a Q/DQ pair), as onnxruntime's quantizer shares them."""
        array = np.array(array, order="C")  # a copy: np.ascontiguousarray would make a 0-d array 1-d
        key = (name, onnx_type.name, tuple(array.shape), array.tobytes())
        found = self.parameters.get(key)
        if found is not None:
            return found
        name = self.value_names.unique(name)
        value = ir.Value(name=name, const_value=ir.Tensor(array, dtype=onnx_type, name=name))
        self.initializers.append(value)
        self.parameters[key] = value
        return value

    # Types ---------------------------------------------------------------------------------------
    def _set_type(self, value: ir.Value, type_: Type, elem_type: Attribute | None, where: str) -> None:
        try:
            value.type = ir.TensorType(data_type(element_type_of(type_), elem_type))
            value.shape = shape_of(type_)
        except UnwritableType as error:
            raise InputError(f"{where}: {error}") from None


def storage_view(value: Value) -> StringAttr | None:
    """For a signless `i8`/`i4`/... tensor that a storage cast reads as a quant type: that type's ONNX
    storage name (`u8` -> "uint8"), standing in for a missing `onnx.elem_type`."""
    if not is_signless_narrow_integer(value.type):
        return None
    for user, _ in value.uses:
        if isinstance(user, STORAGE_CASTS):
            quantized = element_type_of(user.results[0].type)
            if isinstance(quantized, QuantizedType):
                return StringAttr(data_type(quantized).name.lower())
    return None


# Entry points ---------------------------------------------------------------------------------------
def build_model(
    module: ModuleOp, *, opset: int | None = None, metadata_props: Mapping[str, str] | None = None
) -> ir.Model:
    """The onnx_ir model of `module` at its target opset (see the module docstring), with
    `metadata_props` (key -> text) when given (the onnx-storage backend records its parameters there)."""
    writer = Writer(module, opset)
    model = writer.build()
    if metadata_props:
        model.metadata_props.update(metadata_props)
    base = writer.opsets.get("", None)
    target = model.graph.opset_imports[""]
    if base is not None and base != target:
        model = convert_opset(model, base, target)
    # The oldest IR version that knows the default domain's opset (contrib domains do not constrain it).
    model.ir_version = helper.find_min_ir_version_for([helper.make_opsetid("", target)], ignore_unknown=True)
    return model


def write_onnx(
    module: ModuleOp,
    *,
    opset: int | None = None,
    check: bool = True,
    metadata_props: Mapping[str, str] | None = None,
) -> onnx.ModelProto:
    """`module` as an ONNX ModelProto (QDQ form); see the package docstring.

    `opset` forces the default domain's opset (an error when the Q/DQ nodes need a newer one, or when it
    is past 25 and there are Q/DQ nodes). `check` runs `onnx.checker.check_model(full_check=True)` and
    turns a failure into InputError. Raises InputError naming the op for anything ONNX cannot express.
    """
    model = build_model(module, opset=opset, metadata_props=metadata_props)
    size = initializer_bytes(model)
    if size >= PROTOBUF_LIMIT:
        raise InputError(
            f"the model's weights take {size / 2**30:.2f} GiB, past protobuf's 2 GiB limit for one "
            f"ModelProto: write it with save_onnx(module, path), which puts them in external data"
        )
    proto = ir.serde.serialize_model(model)
    if check:
        check_proto(proto)
    return proto


def initializer_bytes(model: ir.Model) -> int:
    return sum(v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None)


def check_proto(proto: onnx.ModelProto | str) -> None:
    try:
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        reason = " ".join(str(error).split())  # onnx's message spans lines ("==> Context: ...")
        raise InputError(f"the written ONNX model fails onnx's checker: {reason}") from None
