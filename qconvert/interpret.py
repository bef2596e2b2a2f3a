"""Reference executor of lifted modules: numpy + ml_dtypes, with ONNX semantics for every quant cast.

`interpret(module, inputs)` runs `func.func @main` op by op:

- `quant.qcast`: `numerics.quantize(x, params, Rounding.ONNX, saturate=...)`: `clamp(rne(x / s) + zp)`
  for integer storage, `x / s` in f32 as onnxruntime computes it (f16 / bf16 upcast first); float
  storage honours the op's `saturate` attribute (default true, as ONNX's);
- `quant.dcast`: `numerics.dequantize(q, params, Rounding.ONNX)`;
- `quant.scast` and `"qconvert.storage_cast"`: reinterpretation; the array is held in the storage
  container (`numerics.integer_storage_dtype`: uint8 for `u8`, ml_dtypes.int4 for `i4`, ...) while
  quantized, and returned as that container when cast back to the storage tensor;
- `arith.constant`: its dense array (`onnx.elem_type` restores an unsigned ONNX type the signless IR
  integer type does not carry);
- `onnx.*` generic ops: onnx's reference implementation of the op (`onnx.reference.ReferenceEvaluator`
  on a one-node model at the module's `onnx.opset_import`), so float ops are not re-implemented here.

Inputs and outputs are keyed by the `onnx.name` of the function's arguments and results (`arg<i>` /
`result<i>` when a module carries none). Raises `InputError` for a missing input or an op it cannot run.
"""

from __future__ import annotations

from collections.abc import Mapping

import ml_dtypes
import numpy as np

from qconvert.errors import InputError
from qconvert.ir.attributes import (
    ArrayAttr,
    BoolAttr,
    DenseArrayAttr,
    DenseElementsAttr,
    DenseResourceAttr,
    DictionaryAttr,
    IntegerAttr,
    StringAttr,
)
from qconvert.ir.core import Operation, Value
from qconvert.ir.dialects.arith import ConstantOp
from qconvert.ir.dialects.builtin import ModuleOp
from qconvert.ir.dialects.func import FuncOp, ReturnOp
from qconvert.ir.dialects.quant import DequantizeCastOp, QuantizeCastOp, StorageCastOp
from qconvert.ir.quant_types import (
    EXPRESSED_DTYPES,
    FLOAT_STORAGE_DTYPES,
    QuantizedType,
    UniformQuantizedPerAxisType,
    UniformQuantizedSubChannelType,
    UniformQuantizedType,
)
from qconvert.ir.types import FloatType, IntegerType, element_type_of
from qconvert.numerics import Rounding, UniformParams, dequantize, integer_storage_dtype, quantize

FLOAT_STORAGE_CAST = "qconvert.storage_cast"  # the float-storage scast of frontends/onnx/lift.py
ONNX_DTYPES: dict[str, np.dtype] = {
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64),
    "uint4": np.dtype(ml_dtypes.uint4),
    "uint2": np.dtype(ml_dtypes.uint2),
}


def uniform_params(quant_type: QuantizedType) -> UniformParams:
    """The numerics parameters of a `!quant.uniform` type (per-tensor, per-axis or sub-channel)."""
    storage = quant_type.storage_type
    if isinstance(storage, IntegerType):
        storage_dtype = integer_storage_dtype(storage.width, quant_type.is_signed)
    else:
        storage_dtype = FLOAT_STORAGE_DTYPES[storage.name]
    assert isinstance(quant_type.expressed_type, FloatType)
    common = {
        "storage_dtype": storage_dtype,
        "storage_type_min": quant_type.storage_type_min,
        "storage_type_max": quant_type.storage_type_max,
        "expressed_dtype": EXPRESSED_DTYPES[quant_type.expressed_type.name],
    }
    width = storage.width

    def unwrap(zero_points: np.ndarray) -> np.ndarray:
        values = np.asarray(zero_points, dtype=np.int64)
        if isinstance(storage, IntegerType) and not quant_type.is_signed:
            values = values & ((1 << width) - 1)
        return values

    if isinstance(quant_type, UniformQuantizedType):
        return UniformParams(
            scale=np.array(quant_type.scale), zero_point=unwrap(np.array(quant_type.zero_point)), **common
        )
    if isinstance(quant_type, UniformQuantizedPerAxisType):
        return UniformParams(
            scale=np.array(quant_type.scales),
            zero_point=unwrap(np.array(quant_type.zero_points)),
            quantized_dimension=quant_type.quantized_dimension,
            **common,
        )
    if isinstance(quant_type, UniformQuantizedSubChannelType):
        return UniformParams(
            scale=quant_type.scales.array.astype(np.float64),
            zero_point=unwrap(quant_type.zero_points.array),
            block_sizes=quant_type.block_size_info,
            **common,
        )
    raise InputError(f"cannot interpret values of type {quant_type}")


def _names(function: FuncOp, key: str, count: int, prefix: str) -> list[str]:
    entries = function.attributes.get(key)
    names = []
    for index in range(count):
        name = f"{prefix}{index}"
        if isinstance(entries, ArrayAttr) and isinstance(entries.elements[index], DictionaryAttr):
            found = dict(entries.elements[index].entries).get("onnx.name")  # type: ignore[union-attr]
            if isinstance(found, StringAttr):
                name = found.value
        names.append(name)
    return names


def _main(module: ModuleOp) -> FuncOp:
    functions = [op for op in module.body.ops if isinstance(op, FuncOp)]
    for function in functions:
        if function.sym_name == "main":
            return function
    if len(functions) == 1:
        return functions[0]
    raise InputError("the module has no func.func @main to interpret")


def input_names(module: ModuleOp) -> list[str]:
    function = _main(module)
    return _names(function, "arg_attrs", len(function.function_type.inputs), "arg")


def output_names(module: ModuleOp) -> list[str]:
    function = _main(module)
    return _names(function, "res_attrs", len(function.function_type.results), "result")


class Interpreter:
    """Runs one module; keeps the per-op onnx reference evaluators so repeated calls stay cheap."""

    def __init__(self, module: ModuleOp) -> None:
        self.module = module
        self.function = _main(module)
        opsets = module.attributes.get("onnx.opset_import")
        self.opsets: dict[str, int] = {}
        if isinstance(opsets, DictionaryAttr):
            self.opsets = {k: v.value for k, v in opsets.entries if isinstance(v, IntegerAttr)}
        self._evaluators: dict[int, object] = {}

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = input_names(self.module)
        missing = [n for n in names if n not in inputs]
        if missing:
            raise InputError(f"missing input(s) {missing}; the module takes {names}")
        env: dict[Value, np.ndarray] = {}
        for name, argument in zip(names, self.function.body.arguments):
            env[argument] = np.asarray(inputs[name])
        for op in self.function.body.ops:
            if isinstance(op, ReturnOp):
                return dict(zip(output_names(self.module), (env[v] for v in op.operands)))
            results = self.execute(op, [env[v] for v in op.operands])
            env.update(zip(op.results, results))
        raise InputError("func.func @main has no return")

    def execute(self, op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
        if isinstance(op, ConstantOp):
            return [constant_array(op)]
        if isinstance(op, QuantizeCastOp):
            quant_type = element_type_of(op.result.type)
            saturate = op.attributes.get("saturate")
            flag = saturate.value if isinstance(saturate, BoolAttr) else True
            return [quantize(operands[0], uniform_params(quant_type), Rounding.ONNX, saturate=flag)]  # type: ignore[arg-type]
        if isinstance(op, DequantizeCastOp):
            quant_type = element_type_of(op.input.type)
            return [dequantize(operands[0], uniform_params(quant_type), Rounding.ONNX)]  # type: ignore[arg-type]
        if isinstance(op, StorageCastOp) or op.name == FLOAT_STORAGE_CAST:
            return [reinterpret(operands[0], op)]
        if op.name.startswith("onnx."):
            return self.run_onnx(op, operands)
        raise InputError(f"the interpreter cannot run '{op.name}'")

    # onnx.* ops --------------------------------------------------------------------------------
    def run_onnx(self, op: Operation, operands: list[np.ndarray]) -> list[np.ndarray]:
        evaluator = self._evaluators.get(id(op))
        if evaluator is None:
            evaluator = self._evaluators[id(op)] = self.make_evaluator(op, operands)
        feeds = {f"in{i}": array for i, array in enumerate(operands)}
        try:
            results = evaluator.run(None, feeds)  # type: ignore[attr-defined]
        except Exception as error:  # the reference raises any exception type for bad inputs
            raise InputError(f"'{op.name}' ({node_name(op)}): onnx reference failed: {error}") from None
        return [np.asarray(r) for r in results]

    def make_evaluator(self, op: Operation, operands: list[np.ndarray]) -> object:
        import onnx
        from onnx import helper
        from onnx.reference import ReferenceEvaluator

        from qconvert.frontends.onnx.attributes import to_onnx_attribute

        _, _, qualified = op.name.partition(".")
        domain, _, op_type = qualified.rpartition(".")
        absent_inputs = _int_list(op.attributes.get("onnx.absent_inputs"))
        absent_outputs = _int_list(op.attributes.get("onnx.absent_outputs"))
        input_names, present = [], iter(range(len(operands)))
        for position in range(len(operands) + len(absent_inputs)):
            input_names.append("" if position in absent_inputs else f"in{next(present)}")
        output_names, present = [], iter(range(len(op.results)))
        for position in range(len(op.results) + len(absent_outputs)):
            output_names.append("" if position in absent_outputs else f"out{next(present)}")
        node = helper.make_node(op_type, input_names, output_names, domain=domain)
        node.attribute.extend(
            to_onnx_attribute(key, value)
            for key, value in op.attributes.items()
            if not key.startswith("onnx.")
        )
        graph = helper.make_graph(
            [node],
            "single_op",
            [
                helper.make_tensor_value_info(
                    f"in{i}", helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)
                )
                for i, a in enumerate(operands)
            ],
            [onnx.ValueInfoProto(name=name) for name in output_names if name],
        )
        opsets = [helper.make_opsetid(d, v) for d, v in self.opsets.items()] or [helper.make_opsetid("", 21)]
        model = helper.make_model(graph, opset_imports=opsets)
        try:
            return ReferenceEvaluator(model)
        except Exception as error:
            raise InputError(
                f"'{op.name}' ({node_name(op)}): no onnx reference implementation ({error})"
            ) from None


def node_name(op: Operation) -> str:
    name = op.attributes.get("onnx.node_name")
    return f"node '{name.value}'" if isinstance(name, StringAttr) else "unnamed node"


def _int_list(attribute: object) -> set[int]:
    return {int(v) for v in attribute.values} if isinstance(attribute, DenseArrayAttr) else set()


def constant_array(op: ConstantOp) -> np.ndarray:
    value = op.value
    if isinstance(value, DenseElementsAttr):
        array = np.asarray(value.array)
    elif isinstance(value, DenseResourceAttr) and value.elements is not None:
        array = value.elements.get()
    else:
        raise InputError(f"the interpreter cannot read constant {value} (elided or without data)")
    elem_type = op.attributes.get("onnx.elem_type")
    if isinstance(elem_type, StringAttr) and elem_type.value in ONNX_DTYPES:
        array = _wrap(array, ONNX_DTYPES[elem_type.value])
    return array


def _wrap(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Two's-complement reinterpretation of integer values into `dtype` (int8 -56 -> uint8 200)."""
    if array.dtype == dtype:
        return array
    if array.dtype.kind in "iu" and np.dtype(dtype).kind in "iu" and array.dtype.itemsize == dtype.itemsize:
        return array.view(dtype)
    info = ml_dtypes.iinfo(dtype)
    values = array.astype(np.int64) & ((1 << info.bits) - 1)
    if info.min < 0:
        values = np.where(values > info.max, values - (1 << info.bits), values)
    return values.astype(dtype)


def reinterpret(array: np.ndarray, op: Operation) -> np.ndarray:
    """A storage cast: into the quantized side, hold the values in the storage container."""
    result_element = element_type_of(op.results[0].type)
    if isinstance(result_element, QuantizedType):
        params = uniform_params(result_element)
        if params.has_float_storage:
            return array.astype(params.storage_dtype)
        return _wrap(array, params.storage_dtype)
    return array  # back to the storage tensor: the container already holds the ONNX-visible type


def interpret(module: ModuleOp, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Execute `module`'s `func.func @main` on numpy inputs (by argument `onnx.name`); outputs by name."""
    return Interpreter(module).run(inputs)


__all__ = ["Interpreter", "input_names", "interpret", "output_names", "uniform_params"]
