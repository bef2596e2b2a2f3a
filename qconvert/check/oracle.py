"""The oracle side of `qconvert check`: the inputs (an `.npz`, or seeded random arrays) and onnxruntime.

onnxruntime runs the source model with graph optimizations disabled (the spec oracle), every
intermediate tensor it can return exposed as a graph output; with default optimizations it gives the
noise floor.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper
from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

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
def ort_session(model: ModelProto, optimized: bool, label: str, base_dir: Path | None = None) -> Any:
    """An onnxruntime CPU session; `label` (the model's file) starts its error message. `base_dir`: the
    folder of the model's external data, which onnxruntime then maps itself (not a copy per session)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if base_dir is not None:
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", str(base_dir)
        )
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
    model: ModelProto,
    inputs: Mapping[str, np.ndarray],
    types: Mapping[str, int],
    label: str,
    hidden: Collection[str] = (),
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """onnxruntime, optimizations disabled, every node output exposed (but `hidden`, computed on demand:
    `deferred_dequantizes`): values, and why some are absent."""
    exposed = ModelProto()
    exposed.CopyFrom(model)
    outputs = {o.name for o in exposed.graph.output} | set(hidden)
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


# Models over 2 GB (issue 23) ----------------------------------------------------------------------------
# A weight's DequantizeLinear whose float output has at least this many elements (64 MiB in float32) is not
# returned by the oracle run: computed on demand, one at a time (nodes.DeferredValues), and its own case is
# judged in slices of `WEIGHT_SLICE_ELEMENTS`.
DEFERRED_ELEMENTS = 2**24
WEIGHT_SLICE_ELEMENTS = 2**22


@dataclass
class CheckModel:
    """The model as check runs it. For a model with external data, its weights (`nodes.weight_chooser`)
    are graph inputs of `model`, fed from one memory mapping of the data file (`weights`), so that every
    onnxruntime session and the backend read the same pages instead of copies; `source` is the model as
    written (its external data mapped by onnxruntime from `base_dir`: the optimized session folds and packs
    weights as it does for the file). Without external data, `source` is `model` and `weights` is empty."""

    model: ModelProto
    source: ModelProto
    inference_error: InputError | None
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    base_dir: Path | None = None
    mappings: list[np.memmap] = field(default_factory=list)

    def release_pages(self) -> None:
        """Drop the mapped weights' pages from this process (clean file pages: read again when next used),
        between phases that each read every weight once, so that they are not all resident at once."""
        for mapping in self.mappings:
            with contextlib.suppress(AttributeError, OSError, ValueError):
                mapping._mmap.madvise(mmap.MADV_DONTNEED)  # type: ignore[attr-defined]


def load_for_check(
    source: str | os.PathLike[str], input_shapes: Mapping[str, Any] | None = None
) -> CheckModel:
    """The model with inferred shapes (`load`), its external data mapped rather than read (`CheckModel`)."""
    from qconvert.check.nodes import move_to_inputs, weight_chooser
    from qconvert.frontends.onnx.load import load, load_model

    loaded = load_model(source, input_shapes)
    model = loaded.model
    attributes = any(
        attribute.HasField("t") and uses_external_data(attribute.t)
        for node in model.graph.node
        for attribute in node.attribute
    )
    external = [t for t in model.graph.initializer if uses_external_data(t)]
    if not external or attributes or loaded.base_dir is None:
        model, inference_error = load(source, input_shapes)
        return CheckModel(model, model, inference_error)
    original = ModelProto()
    original.CopyFrom(model)
    chosen = weight_chooser(model)
    mappings: dict[str, np.memmap] = {}

    def mapped(tensor: TensorProto) -> np.ndarray | None:
        if not uses_external_data(tensor):
            return None
        array = _mapped(tensor, loaded.base_dir, mappings) if chosen(tensor) else None
        if array is None:  # a quantization parameter (a constant of the IR), or storage numpy cannot view
            load_external_data_for_tensor(tensor, str(loaded.base_dir))
            tensor.data_location = TensorProto.DEFAULT
            del tensor.external_data[:]
        return array

    weights = move_to_inputs(model, mapped)
    return CheckModel(
        model, original, loaded.inference_error, weights, loaded.base_dir, list(mappings.values())
    )


def _mapped(tensor: TensorProto, base_dir: Path, mappings: dict[str, np.memmap]) -> np.ndarray | None:
    """A read-only view of `tensor`'s external data (validate.py checked location, offset and length)."""
    if tensor.data_type == TensorProto.STRING:
        return None
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type))
    except (KeyError, ValueError, TypeError):
        return None
    entries = {entry.key: entry.value for entry in tensor.external_data}
    count = math.prod(tensor.dims)
    offset = int(entries.get("offset", 0) or 0)
    length = int(entries.get("length", count * dtype.itemsize) or 0)
    if dtype.itemsize * count != length or dtype.kind not in "fiub":  # packed 4-bit types: read as bytes
        return None
    location = entries["location"]
    if location not in mappings:
        mappings[location] = np.memmap(base_dir / location, dtype=np.uint8, mode="r")
    return mappings[location][offset : offset + length].view(dtype).reshape(tuple(tensor.dims))


def deferred_dequantizes(model: ModelProto, weights: Mapping[str, np.ndarray]) -> list[onnx.NodeProto]:
    """The DequantizeLinear nodes of a mapped weight (scale and zero point initializers) whose output holds
    `DEFERRED_ELEMENTS` or more: computed on demand (`dequantize_on_demand`), never all at once."""
    initializers = {t.name for t in model.graph.initializer}
    return [
        node
        for node in model.graph.node
        if node.op_type == "DequantizeLinear"
        and node.domain in ("", "ai.onnx")
        and node.input
        and node.input[0] in weights
        and all(name in initializers for name in node.input[1:] if name)
        and weights[node.input[0]].size >= DEFERRED_ELEMENTS
    ]


def dequantize_on_demand(
    model: ModelProto,
    node: onnx.NodeProto,
    values: Mapping[str, np.ndarray],
    types: Mapping[str, int],
    label: str,
) -> Callable[[], np.ndarray]:
    """What the oracle run would have returned for `node`'s output: onnxruntime, optimizations disabled, on
    the node alone (its weight fed from the mapping, its parameters as initializers)."""

    def compute() -> np.ndarray:
        from qconvert.check.nodes import cut_model

        output = node.output[0]
        shaped = {name: values[name] for name in node.input if name}  # and the output's shape, next
        weight = shaped[node.input[0]]
        placeholder_type = helper.tensor_dtype_to_np_dtype(types.get(output, TensorProto.FLOAT))
        shaped[output] = np.broadcast_to(np.zeros((), placeholder_type), weight.shape)
        cut, feeds = cut_model(model, [node], [output], shaped, types, set(), feed_weights=True)
        session = ort_session(cut, optimized=False, label=label)
        return float8_views(run_session(session, feeds), types)[output]

    return compute
