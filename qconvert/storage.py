"""Feeding a stripped model: floats in, storage integers to and from the model, floats back out.

A model written by `qconvert convert MODEL --to onnx-storage -o OUT.onnx` takes and returns the storage
integers of its quantized boundary values; their parameters travel with it (qconvert/storage_metadata.py:
`metadata_props`, and the sidecar `OUT.quant.json`). Feeding it takes one call each way:

    feeds = qconvert.storage.quantize_inputs("OUT.onnx", {"image": image_f32})
    storage = dict(zip(output_names, session.run(None, feeds)))
    logits = qconvert.storage.dequantize_outputs("OUT.onnx", storage)["logits"]

`quantize_inputs` applies ONNX's QuantizeLinear to each stripped input (`qconvert.numerics.quantize`,
`Rounding.ONNX`: saturate(round_half_even(x / scale) + zero_point), pinned against onnxruntime), so the
stripped model receives exactly what the source model's QuantizeLinear computed; `dequantize_outputs` applies
ONNX's DequantizeLinear (`qconvert.numerics.dequantize`) to each stripped output. Inputs and outputs left
float pass through. A model read once can serve many calls: `StorageBoundary.of(model)`.

int4 / uint4 storage comes back as ml_dtypes' int4 / uint4 arrays; onnxruntime's Python API takes them only
as packed OrtValues, which `qconvert.check.ort_values.run_values` makes (and unpacks the results of).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from onnx import ModelProto, helper

from qconvert.errors import InputError
from qconvert.numerics import UniformParams, dequantize, quantize
from qconvert.storage_metadata import SIDECAR_SUFFIX, StorageEntry, StorageMetadata, sidecar_path

ModelSource = str | os.PathLike[str] | ModelProto


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A graph input or output as the stripped model declares it: element dtype (None when ONNX has no numpy
    dtype for it) and dims (None for a dynamic dim)."""

    dtype: np.dtype | None
    dims: tuple[int | None, ...] | None  # None: no shape declared

    def shown(self) -> str:
        if self.dims is None:
            return "any shape"
        return "[" + "x".join("?" if d is None else str(d) for d in self.dims) + "]"


@dataclass(frozen=True)
class StorageBoundary:
    """The stripped inputs and outputs of one model, with their numerics' parameters, and (when read from
    the model rather than a sidecar alone) every graph input and output, to check feeds against."""

    label: str  # the model's file (or "model"), first in every message
    metadata: StorageMetadata
    inputs: dict[str, TensorSpec] | None = None  # None: read from a sidecar, the graph is unknown
    outputs: dict[str, TensorSpec] | None = None
    params: dict[tuple[str, str], UniformParams] = field(default_factory=dict)  # ("input", name) -> params

    @classmethod
    def of(cls, model: ModelSource | StorageBoundary) -> StorageBoundary:
        """The boundary of `model`: an ONNX file (its metadata_props, else the sidecar beside it), a sidecar
        (`OUT.quant.json`), or a ModelProto. InputError when no storage metadata is found or it breaks the
        contract."""
        if isinstance(model, StorageBoundary):
            return model
        if isinstance(model, ModelProto):
            return cls._from_model(model, "model", None)
        path = Path(model)
        if path.name.endswith(SIDECAR_SUFFIX):
            return cls._build(str(path), _read_sidecar(path), None, None)
        from qconvert.frontends.onnx.load import read_model

        proto, _ = read_model(path)
        return cls._from_model(proto, str(path), path)

    @classmethod
    def _from_model(cls, model: ModelProto, label: str, path: Path | None) -> StorageBoundary:
        props = {prop.key: prop.value for prop in model.metadata_props}
        metadata = StorageMetadata.from_metadata_props(props, label)
        if not metadata and path is not None and sidecar_path(path).is_file():
            metadata = _read_sidecar(sidecar_path(path))
        if not metadata:
            raise InputError(
                f"{label}: no qconvert.storage metadata (and no {SIDECAR_SUFFIX} sidecar): not a model "
                "written by `qconvert convert MODEL --to onnx-storage`, or one with nothing stripped"
            )
        initializers = {t.name for t in model.graph.initializer}
        inputs = {i.name: _spec(i) for i in model.graph.input if i.name not in initializers}
        outputs = {o.name: _spec(o) for o in model.graph.output}
        for kind, entries, declared in (
            ("input", metadata.inputs, inputs),
            ("output", metadata.outputs, outputs),
        ):
            for name, entry in entries.items():
                if name not in declared:
                    raise InputError(
                        f"{label}: the metadata names {kind} '{name}', which the graph does not have"
                    )
                spec = declared[name]
                if spec.dtype is not None and spec.dtype != _storage_dtype(entry):
                    raise InputError(
                        f"{label}: {kind} '{name}' is {spec.dtype} in the graph but {entry.storage} in the"
                        " metadata"
                    )
        return cls._build(label, metadata, inputs, outputs)

    @classmethod
    def _build(
        cls,
        label: str,
        metadata: StorageMetadata,
        inputs: dict[str, TensorSpec] | None,
        outputs: dict[str, TensorSpec] | None,
    ) -> StorageBoundary:
        params = {("input", name): entry.params() for name, entry in metadata.inputs.items()}
        params.update({("output", name): entry.params() for name, entry in metadata.outputs.items()})
        return cls(label, metadata, inputs, outputs, params)

    def quantize_inputs(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        """`feeds` (what the source model took, by input name) as the stripped model takes them: each
        stripped input quantized with ONNX's QuantizeLinear rule, the others unchanged."""
        if not isinstance(feeds, Mapping):
            raise InputError(
                f"{self.label}: feeds must map input names to arrays, got {type(feeds).__name__}"
            )
        if self.inputs is not None:
            unknown = [name for name in feeds if name not in self.inputs]
            if unknown:
                raise InputError(
                    f"{self.label}: unknown input(s) {unknown}; the model takes {list(self.inputs)}"
                )
        expected = list(self.inputs) if self.inputs is not None else list(self.metadata.inputs)
        missing = [name for name in expected if name not in feeds]
        if missing:
            raise InputError(f"{self.label}: missing feed(s) {missing}; the model takes {expected}")
        quantized: dict[str, np.ndarray] = {}
        for name, value in feeds.items():
            array = np.asarray(value)
            entry = self.metadata.inputs.get(name)
            if entry is None:
                quantized[name] = array
                continue
            if not _is_float(array.dtype):
                raise InputError(
                    f"{self.label}: input '{name}' has dtype {array.dtype}: quantize_inputs takes the float "
                    f"values the source model took (the stripped model takes their {entry.storage} storage)"
                )
            self._check_shape("input", name, array.shape, entry)
            quantized[name] = quantize(array, self.params[("input", name)])
        return quantized

    def dequantize_outputs(self, outputs: Mapping[str, object] | Sequence[object]) -> dict[str, np.ndarray]:
        """The stripped model's outputs (by name, or the list `session.run(None, ...)` returns, in graph
        order) with each stripped output dequantized (ONNX's DequantizeLinear); the others unchanged."""
        if not isinstance(outputs, Mapping):
            if self.outputs is None:
                raise InputError(f"{self.label}: a sidecar names no output order: give the outputs by name")
            if len(outputs) != len(self.outputs):
                raise InputError(
                    f"{self.label}: {len(outputs)} outputs given; the model has {len(self.outputs)} "
                    f"({list(self.outputs)})"
                )
            outputs = dict(zip(self.outputs, outputs))
        if self.outputs is not None:
            unknown = [name for name in outputs if name not in self.outputs]
            if unknown:
                raise InputError(
                    f"{self.label}: unknown output(s) {unknown}; the model has {list(self.outputs)}"
                )
        floats: dict[str, np.ndarray] = {}
        for name, value in outputs.items():
            array = np.asarray(value)
            entry = self.metadata.outputs.get(name)
            if entry is None:
                floats[name] = array
                continue
            if array.dtype != _storage_dtype(entry):
                raise InputError(
                    f"{self.label}: output '{name}' has dtype {array.dtype}; its storage is {entry.storage}"
                )
            self._check_shape("output", name, array.shape, entry)
            floats[name] = dequantize(array, self.params[("output", name)])
        return floats

    def _check_shape(self, kind: str, name: str, shape: tuple[int, ...], entry: StorageEntry) -> None:
        """The graph's static dims (when the model was read), and the channel count along a per-axis axis."""
        declared = (self.inputs if kind == "input" else self.outputs) or {}
        spec = declared.get(name)
        if spec is not None and spec.dims is not None:
            dims = spec.dims
            if len(dims) != len(shape) or any(d is not None and d != s for d, s in zip(dims, shape)):
                raise InputError(
                    f"{self.label}: {kind} '{name}' has shape {list(shape)}; the model expects {spec.shown()}"
                )
        if entry.axis is not None and (entry.axis >= len(shape) or shape[entry.axis] != len(entry.scale)):
            raise InputError(
                f"{self.label}: {kind} '{name}' has shape {list(shape)}; its {len(entry.scale)} scales "
                f"run along axis {entry.axis}"
            )


def quantize_inputs(
    model: ModelSource | StorageBoundary, feeds: Mapping[str, object]
) -> dict[str, np.ndarray]:
    """`feeds` for the stripped `model`: each stripped input quantized as the source model's QuantizeLinear
    did (ONNX's rule, `qconvert.numerics.quantize`), the other inputs unchanged. `model`: the stripped
    ONNX file, its `.quant.json` sidecar, a ModelProto or a `StorageBoundary`. InputError for a model
    without storage metadata, a missing or unknown feed, a wrong dtype (a stripped input takes floats) or
    shape."""
    return StorageBoundary.of(model).quantize_inputs(feeds)


def dequantize_outputs(
    model: ModelSource | StorageBoundary, outputs: Mapping[str, object] | Sequence[object]
) -> dict[str, np.ndarray]:
    """The stripped `model`'s `outputs` (by name, or a list in graph order) with each stripped output
    dequantized (ONNX's DequantizeLinear, `qconvert.numerics.dequantize`), the others unchanged.
    InputError for a model without storage metadata, an unknown output, a wrong dtype or shape."""
    return StorageBoundary.of(model).dequantize_outputs(outputs)


def _read_sidecar(path: Path) -> StorageMetadata:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read the sidecar ({error})") from None
    return StorageMetadata.from_sidecar(text, str(path))


def _spec(info: object) -> TensorSpec:
    tensor_type = info.type.tensor_type  # type: ignore[attr-defined]
    try:
        dtype: np.dtype | None = np.dtype(helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
    except (KeyError, ValueError, TypeError):
        dtype = None
    if not tensor_type.HasField("shape"):
        return TensorSpec(dtype, None)
    dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim)
    return TensorSpec(dtype, dims)


def _storage_dtype(entry: StorageEntry) -> np.dtype:
    return np.dtype(entry.params().storage_dtype)


def _is_float(dtype: np.dtype) -> bool:
    import ml_dtypes

    return dtype.kind == "f" or dtype == np.dtype(ml_dtypes.bfloat16)


__all__ = ["ModelSource", "StorageBoundary", "TensorSpec", "dequantize_outputs", "quantize_inputs"]
