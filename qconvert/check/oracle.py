"""The oracle side of `qconvert check`: the inputs (an `.npz`, or seeded random arrays) and onnxruntime.

onnxruntime runs the source model with graph optimizations disabled (the spec oracle), every
intermediate tensor it can return exposed as a graph output; with default optimizations it gives the
noise floor.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper

from qconvert.calibrate.dataset import available_memory
from qconvert.check.ort_large import inference_session
from qconvert.errors import InputError

RANDOM_SEED = 0
DEFAULT_TOKEN_RANGE = 32

# Element types onnxruntime's Python API returns; float8 e4m3fn comes back as its uint8 bits.
ORT_RETURNS = frozenset(
    {
        TensorProto.FLOAT,
        TensorProto.DOUBLE,
        TensorProto.FLOAT16,
        TensorProto.INT8,
        TensorProto.INT16,
        TensorProto.INT32,
        TensorProto.INT64,
        TensorProto.UINT8,
        TensorProto.UINT16,
        TensorProto.UINT32,
        TensorProto.UINT64,
        TensorProto.BOOL,
        TensorProto.FLOAT8E4M3FN,
    }
)


# Inputs --------------------------------------------------------------------------------------------
def graph_inputs(model: ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def _input_dtype(info: onnx.ValueInfoProto) -> np.dtype:
    elem_type = info.type.tensor_type.elem_type
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError):
        raise InputError(f"graph input '{info.name}': element type {elem_type} is not supported") from None


def _input_dims(info: onnx.ValueInfoProto) -> list[int | None]:
    return [d.dim_value if d.HasField("dim_value") else None for d in info.type.tensor_type.shape.dim]


def load_inputs(model: ModelProto, path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The arrays of an `.npz`, one per graph input by name, checked against the model's inputs."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, EOFError) as error:
        raise InputError(f"{path}: not a readable .npz of input arrays ({error})") from None
    check_arrays(model, arrays, str(path))
    return arrays


def check_arrays(model: ModelProto, arrays: Mapping[str, np.ndarray], where: str = "inputs") -> None:
    """Every graph input given exactly once, with the model's dtype and a compatible shape."""
    path = where
    expected = graph_inputs(model)
    names = [i.name for i in expected]
    missing = [n for n in names if n not in arrays]
    extra = sorted(set(arrays) - set(names))
    if missing or extra:
        parts = [
            f"missing input(s) {missing}" if missing else "",
            f"unknown array(s) {extra}" if extra else "",
        ]
        raise InputError(f"{path}: {'; '.join(p for p in parts if p)}; the model takes {names}")
    for info in expected:
        array, dtype, dims = arrays[info.name], _input_dtype(info), _input_dims(info)
        if array.dtype != dtype:
            raise InputError(
                f"{path}: input '{info.name}' has dtype {array.dtype}; the model expects {dtype}"
            )
        if len(array.shape) != len(dims) or any(d is not None and d != s for d, s in zip(dims, array.shape)):
            shown = "x".join("?" if d is None else str(d) for d in dims)
            raise InputError(
                f"{path}: input '{info.name}' has shape {list(array.shape)}; the model expects [{shown}]"
            )


def _token_range(model: ModelProto, name: str) -> int:
    """Ids feeding a Gather's indices range over its table (initializer or a DQ of one), else [0, 32)."""
    initializers = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[1] != name:
            continue
        table = node.input[0]
        producer = producers.get(table)
        if producer is not None and producer.op_type == "DequantizeLinear":
            table = producer.input[0]
        if table in initializers:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            dims = initializers[table].dims
            return int(dims[axis]) if dims else DEFAULT_TOKEN_RANGE
    return DEFAULT_TOKEN_RANGE


def random_inputs(model: ModelProto, seed: int = RANDOM_SEED) -> dict[str, np.ndarray]:
    """Seeded inputs: floats ~ N(0, 1), integer ids in the Gather table's range ([0, 32) by default)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for info in graph_inputs(model):
        dims = _input_dims(info)
        if any(d is None for d in dims):
            raise InputError(
                f"graph input '{info.name}' has dynamic dims; "
                f"give --input-shape {info.name}=D0xD1... or --data"
            )
        shape = tuple(int(d) for d in dims)  # type: ignore[arg-type]
        dtype = _input_dtype(info)
        # float64 draws, then the input's dtype: two copies, refused before either is allocated
        needed = math.prod(shape) * (8 + dtype.itemsize)
        available = available_memory()
        if available is not None and needed > available:
            raise InputError(
                f"graph input '{info.name}' of shape {list(shape)}: random inputs of that size need "
                f"{needed / 2**30:.2f} GiB, more than the {available / 2**30:.2f} GiB this process can still "
                f"allocate; give smaller --input-shape dims or --data"
            )
        if dtype.kind == "f":
            arrays[info.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            arrays[info.name] = rng.integers(0, _token_range(model, info.name), shape).astype(dtype)
        elif dtype.kind == "b":
            arrays[info.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            raise InputError(f"graph input '{info.name}': cannot generate random {dtype} values; give --data")
    return arrays


# onnxruntime ---------------------------------------------------------------------------------------
def ort_session(model: ModelProto, optimized: bool, label: str) -> Any:
    """An onnxruntime CPU session; `label` (the model's file) starts its error message."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    options.log_severity_level = 4  # fatal only: its errors reach us as exceptions, named once by us
    # Without onnxruntime's arena, the memory of the every-intermediate oracle run goes back when the run
    # ends (an 82 M-parameter model: 0.3 GB less at the check's peak); it costs no measurable time here.
    options.enable_cpu_mem_arena = False
    if not optimized:
        # The spec oracle runs on one thread: onnxruntime's DynamicQuantizeLSTM quantizes its hidden state
        # per chunk of batch rows when it has more, so its numbers depend on the thread count.
        options.intra_op_num_threads = 1
    try:
        return inference_session(model, options, ["CPUExecutionProvider"])  # any size (ort_large.py)
    except Exception as error:  # onnxruntime raises its own exception types for any invalid model
        raise InputError(f"{label}: onnxruntime cannot load the model: {ort_message(error)}") from None


_SOURCE_LOCATION = re.compile(r"(?:/onnxruntime_src/|[\w./-]*onnxruntime/)[\w./-]+:\d+ (?:[^\n]*?\)\s)?")


def ort_message(error: BaseException) -> str:
    """onnxruntime's exception text without its C++ source locations and function signatures (read by
    users of the model, not of onnxruntime's sources)."""
    return _SOURCE_LOCATION.sub("", str(error)).strip()


def run_session(session: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    try:
        return dict(zip(names, session.run(names, dict(inputs))))
    except Exception as error:
        raise InputError(f"onnxruntime cannot run the model on these inputs: {error}") from None


def element_types(model: ModelProto) -> dict[str, int]:
    """The ONNX element type of every value shape inference (or the graph) knows."""
    types = {t.name: t.data_type for t in model.graph.initializer}
    for info in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
            types.setdefault(info.name, info.type.tensor_type.elem_type)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            types.setdefault(node.output[0], node.attribute[0].t.data_type)
    return types


def _type_name(elem_type: int) -> str:
    return helper.tensor_dtype_to_string(elem_type).removeprefix("TensorProto.").lower()


def run_oracle(
    model: ModelProto, inputs: Mapping[str, np.ndarray], types: Mapping[str, int], label: str
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """onnxruntime, optimizations disabled, every node output exposed: values, and why some are absent."""
    exposed = ModelProto()
    exposed.CopyFrom(model)
    outputs = {o.name for o in exposed.graph.output}
    unreturnable: dict[str, str] = {}
    for node in exposed.graph.node:
        for name in node.output:
            if not name or name in outputs:
                continue
            elem_type = types.get(name)
            if elem_type is not None and elem_type not in ORT_RETURNS:
                unreturnable[name] = (
                    f"onnxruntime's Python API does not return {_type_name(elem_type)} "
                    f"tensors (value '{name}')"
                )
                continue
            exposed.graph.output.append(onnx.ValueInfoProto(name=name))
            outputs.add(name)
    session = ort_session(exposed, optimized=False, label=label)
    return float8_views(run_session(session, inputs), types), unreturnable


def float8_views(values: dict[str, np.ndarray], types: Mapping[str, int]) -> dict[str, np.ndarray]:
    """onnxruntime returns float8 e4m3fn tensors as their uint8 bits: view them as what they are."""
    for name, array in list(values.items()):
        if types.get(name) == TensorProto.FLOAT8E4M3FN and array.dtype == np.uint8:
            values[name] = array.view(ml_dtypes.float8_e4m3fn)
    return values


def typed_for_lift(
    model: ModelProto, values: Mapping[str, np.ndarray], types: Mapping[str, int]
) -> ModelProto:
    """The model with the type onnxruntime computed for every value shape inference left untyped
    (com.microsoft ops), so that DequantizeLinear after a QGemm knows its storage type."""
    typed = ModelProto()
    typed.CopyFrom(model)
    for node in typed.graph.node:
        for name in node.output:
            if name and name not in types and name in values:
                array = values[name]
                typed.graph.value_info.append(
                    helper.make_tensor_value_info(
                        name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape
                    )
                )
    return typed
