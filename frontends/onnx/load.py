"""Loading an ONNX model: protobuf parsing, external-data confinement, input-shape overrides, shapes.

NOTE: every failure a user can cause here is an `InputError` naming the file (or tensor) at fault.
External data is checked before any of it is read: a `location` that is absolute or resolves outside
the model's folder (`../secret`, a symlink out) is refused. Shape inference runs on the model without
its external data (small even for models over 2 GB), typing com.microsoft QOperator outputs too
(`qoperator.infer_contrib_shapes`), then the data is loaded.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import ModelProto, TensorProto
from onnx.external_data_helper import load_external_data_for_model, uses_external_data

from qconvert.errors import InputError

from .static_shapes import infer_static_types, override_input_shapes
from .validate import check_model_structure, check_type_constraints
from .wire import RawData, strip_raw_data

MICROSOFT_DOMAIN = "com.microsoft"


def _external_tensors(model: ModelProto) -> list[TensorProto]:
    tensors = [t for t in model.graph.initializer if uses_external_data(t)]
    for node in model.graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t") and uses_external_data(attribute.t):
                tensors.append(attribute.t)
    return tensors


def check_external_data(model: ModelProto, base_dir: Path) -> None:
    """Refuse external-data locations outside `base_dir` (absolute paths, `..`, symlinks out)."""
    root = base_dir.resolve()
    for tensor in _external_tensors(model):
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (root / location).resolve()
        if os.path.isabs(location) or not target.is_relative_to(root):
            raise InputError(
                f"initializer '{tensor.name}': external data location '{location}' is outside the model's "
                f"folder {root}; refusing to read it (move the data file next to the model)"
            )
        if not target.is_file():
            raise InputError(
                f"initializer '{tensor.name}': external data file '{location}' not found in {root}"
            )


def _static_inputs(model: ModelProto) -> bool:
    """Whether every graph input (initializers aside) has a known rank and only fixed dims."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers or not value.type.HasField("tensor_type"):
            continue
        tensor_type = value.type.tensor_type
        dims = tensor_type.shape.dim
        if not tensor_type.HasField("shape") or any(not d.HasField("dim_value") for d in dims):
            return False
    return True


def _node_errors(error: Exception) -> list[str]:
    """The per-node lines of onnx's inference error (`(op_type:Conv, node name: c): ...`), one per node."""
    return [line for line in str(error).splitlines() if "(op_type:" in line]


# Ops whose declared output shapes onnx's inference contradicts in valid models (it computes ceil_mode
# pools and STFT's frames differently from onnxruntime): their declared shapes are trusted, as onnxruntime's.
_INFERENCE_DIFFERS = frozenset({"MaxPool", "AveragePool", "LpPool", "STFT", "DequantizeLinear"})
_NODE_LINE = re.compile(r"\(op_type:(?P<op>[^,]*), node name: (?P<name>[^)]*)\): (?:\[\w+\] )?(?P<what>.*)")


def _inference_differs(line: str) -> bool:
    found = _NODE_LINE.search(line)
    return found is None or found["op"] in _INFERENCE_DIFFERS


def _contradiction(line: str) -> str:
    """onnx's line on a declared shape its node contradicts, as our message naming the node."""
    found = _NODE_LINE.search(line)
    if found is None:
        return f"a declared shape contradicts its node: {line.strip()}"
    name = found["name"] or "<unnamed>"
    return (
        f"node '{name}' ({found['op']}): a declared shape of its output (graph output or value_info) "
        f"contradicts what the node computes from its inputs: {found['what'].strip()}"
    )


def read_model(source: str | os.PathLike[str] | ModelProto) -> tuple[ModelProto, Path | None]:
    """Parse the protobuf (without external data) and return it with its folder (None for a proto)."""
    if isinstance(source, ModelProto):
        model = ModelProto()
        model.CopyFrom(source)
        _check_structure(model, None, "<ModelProto>")
        return model, None
    path = Path(source)
    if not path.is_file():
        raise InputError(f"{path}: no such model file")
    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except (DecodeError, RuntimeWarning, ValueError, OSError) as error:
        raise InputError(f"{path}: not a valid ONNX model (protobuf does not parse: {error})") from None
    _check_parsed(model, path)
    return model, path.parent


def read_model_mapped(
    source: str | os.PathLike[str] | ModelProto,
) -> tuple[ModelProto, Path | None, dict[int, RawData] | None]:
    """`read_model`, with the main graph's initializer raw_data left in a mapping of the file: returned
    by initializer position, absent from the proto (wire.py). None instead of that dict when the model
    was parsed whole (a ModelProto, a text format, a file the wire walk does not take)."""
    if isinstance(source, ModelProto):
        return *read_model(source), None
    path = Path(source)
    extension_format = onnx.serialization.registry.get_format_from_file_extension(path.suffix)
    stripped = None
    if path.is_file() and extension_format in (None, "protobuf"):
        with contextlib.suppress(OSError, DecodeError, RuntimeWarning, ValueError):
            stripped = strip_raw_data(path)
    if stripped is None:  # read_model gives the error, if there is one
        return *read_model(path), None
    raw_data = dict(stripped.raw_data)
    _check_parsed(stripped.model, path, {index: len(raw) for index, raw in raw_data.items()})
    return stripped.model, path.parent, raw_data


def _check_parsed(model: ModelProto, path: Path, raw_sizes: dict[int, int] | None = None) -> None:
    if not model.HasField("graph") or model.ir_version <= 0:
        raise InputError(
            f"{path}: not a valid ONNX model (no graph or no ir_version: truncated or not an ONNX file)"
        )
    _check_structure(model, path.parent, str(path), raw_sizes)


def _check_structure(
    model: ModelProto, base_dir: Path | None, label: str, raw_sizes: dict[int, int] | None = None
) -> None:
    """Before any tensor is read or any attribute trusted: a malformed model is one InputError."""
    try:
        check_model_structure(model, base_dir, raw_sizes)
    except InputError as error:
        raise InputError(f"{label}: {error.message}") from None


@dataclass
class LoadedModel:
    """A model read for lifting: shapes inferred, external data checked (read later, memory-mapped)."""

    model: ModelProto
    inference_error: InputError | None
    base_dir: Path | None  # the model's folder (None for a ModelProto)
    label: str  # what errors call the model: its path, or "<ModelProto>"
    # initializer name -> its raw_data, kept out of the proto for shape inference (which would copy the
    # whole serialized model several times over): a view of the mapped file (wire.py), or bytes taken
    # out of a parsed proto; weights.py views them with frombuffer.
    detached: dict[str, RawData] = field(default_factory=dict)


def load(
    source: str | os.PathLike[str] | ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    shapes_from: str = "--input-shape",
) -> tuple[ModelProto, InputError | None]:
    """The model with inferred shapes and its external data loaded; InputError on any bad input.

    A shape-inference failure is returned, not raised, with the model as it was: the lifter first
    reports unsupported nodes (the usual cause, e.g. an op of a domain the model does not import), and
    raises the inference error only when there are none.
    """
    loaded = load_model(source, input_shapes, load_external_data=True, shapes_from=shapes_from)
    return loaded.model, loaded.inference_error


def load_model(
    source: str | os.PathLike[str] | ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    load_external_data: bool = False,
    detach: Callable[[TensorProto, RawData], bool] | None = None,
    map_file: bool = False,
    shapes_from: str = "--input-shape",
) -> LoadedModel:
    """`load`, for the lifter: external data is checked (inside the model's folder, present) but not
    read unless `load_external_data`; the raw_data of the initializers `detach(tensor, raw_data)`
    selects is moved out of the proto into `LoadedModel.detached` before shape inference, so no step
    copies the weights. `map_file`: that raw_data is never parsed but viewed in a mapping of the file
    (`read_model_mapped`), for callers done with it before the file could change: while the views
    live, the file stays open, and a file truncated in place ends the process (SIGBUS)."""
    if detach is not None and map_file:
        model, base_dir, mapped = read_model_mapped(source)
    else:
        (model, base_dir), mapped = read_model(source), None
    if input_shapes:
        override_input_shapes(model, input_shapes, shapes_from)
    external = _external_tensors(model)
    if external and base_dir is None:
        raise InputError(
            "the model uses external data but was given as a ModelProto; pass its path so the data can "
            "be found (and checked to lie in the model's folder)"
        )
    if external:
        assert base_dir is not None
        check_external_data(model, base_dir)
    detached: dict[str, RawData] = {}
    if detach is not None:
        for index, tensor in enumerate(model.graph.initializer):
            if mapped is None:  # parsed whole: the raw_data is in the proto (reading it copies it)
                raw_data = tensor.raw_data if tensor.HasField("raw_data") else None
            else:
                raw_data = mapped.get(index)
            if raw_data is None:
                continue
            if tensor.name not in detached and detach(tensor, raw_data):
                detached[tensor.name] = raw_data
                tensor.ClearField("raw_data")
            elif mapped is not None:  # kept in the proto, as a whole parse has it
                tensor.raw_data = bytes(raw_data)
    infer_contrib = None
    if any(node.domain == MICROSOFT_DOMAIN for node in model.graph.node):
        # Imported here: it imports the IR, which reading a float model for calibration does not need.
        from .qoperator import infer_contrib_shapes as infer_contrib

    def infer(scratch: ModelProto) -> ModelProto:
        # A strict pass first, as a check, where the inputs are static: a node whose op cannot take its
        # inputs' ranks or types is the model's error. Without data propagation, which in strict mode
        # refuses models onnxruntime runs (MiniLM's embedding Add, once check declares one batch's shapes);
        # from symbolic dims nothing is refused.
        if _static_inputs(scratch):
            try:
                onnx.shape_inference.infer_shapes(
                    scratch, check_type=False, strict_mode=True, data_prop=False
                )
            except onnx.shape_inference.InferenceError as error:
                # ...but not a declared shape it contradicts (onnx's inference differs from onnxruntime's
                # on ceil_mode pools and STFT, and the declared one is then right), nor an input onnx could
                # not type (`is null`: downstream of a deprecated op, e.g. GroupNormalization-18)
                lines = _node_errors(error)
                if not all("differ" in line or "instead is null" in line for line in lines):
                    raise
                contradicted.extend(
                    line for line in lines if "differ" in line and not _inference_differs(line)
                )
        inferred = onnx.shape_inference.infer_shapes(
            scratch, check_type=False, strict_mode=False, data_prop=True
        )
        if infer_contrib is not None:  # com.microsoft QOperator outputs, then downstream again
            inferred = infer_contrib(inferred)
        return inferred

    label = "<ModelProto>" if isinstance(source, ModelProto) else str(source)
    inference_error = None
    contradicted: list[str] = []
    try:
        # Shape computations of static inputs fold, so their results get static types (static_shapes.py).
        model = infer_static_types(model, infer, detached)
    except Exception as error:  # onnx raises InferenceError, ValidationError or RuntimeError
        inference_error = InputError(f"{label}: onnx shape inference failed: {error}")
    if inference_error is None:  # else the lifter names the inference error (or an unsupported op) first
        try:  # with the types inference gave: a node its op's schema refuses never reaches a lowering
            check_type_constraints(model)
        except InputError as error:
            raise InputError(f"{label}: {error.message}") from None
    if contradicted:  # the backends trust a declared shape: one its node cannot produce is the model's error
        raise InputError(f"{label}: {_contradiction(contradicted[0])}")
    if external and load_external_data:
        assert base_dir is not None
        load_external_data_for_model(model, str(base_dir))
    return LoadedModel(model, inference_error, base_dir, label, detached)
