"""The storage-ONNX contract: how a stripped model records the quantization of its boundary values.

A model written by `qconvert convert MODEL --to onnx-storage -o OUT.onnx` takes and returns storage
integers. Each stripped graph input / output is recorded twice, with the same JSON value:

- in the model's `metadata_props`: `qconvert.storage.input.<name>` / `qconvert.storage.output.<name>`,
  and `qconvert.storage.float` = {name: reason} for the boundary values left float (absent when none);
- in the sidecar `OUT.quant.json` beside the model (`sidecar_path`): {"format": "qconvert-storage/1",
  "inputs": {...}, "outputs": {...}, "float": {...}}.

Each value (`StorageEntry`): {"storage": "uint8", "scale": [...], "zero_point": [...], "axis": null | int,
"quant_type": "!quant.uniform<u8:f32, 0.0039215688593685627>"}, written with sorted keys and no spaces.
A stripped input receives ONNX's `QuantizeLinear(x)` of what the source model received, a stripped output
gives the storage values the source model's final DequantizeLinear read.

The writer (backends/onnx_storage), the ONNX frontend (which gives boundary values their quant types back)
and `qconvert.storage` (quantize_inputs / dequantize_outputs) all read this module; it imports no ONNX.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qconvert.errors import InputError, QConvertError
from qconvert.ir.parser import parse_type
from qconvert.ir.printer import print_type
from qconvert.ir.quant_types import (
    QuantizedType,
    UniformQuantizedPerAxisType,
    UniformQuantizedType,
    float_dtype,
    uniform_params,
)
from qconvert.ir.types import DYNAMIC, IntegerType, RankedTensorType, Type, UnrankedTensorType
from qconvert.numerics import UniformParams, integer_storage_dtype, storage_range

KEY_PREFIX = "qconvert.storage."
INPUT_KEY_PREFIX = f"{KEY_PREFIX}input."
OUTPUT_KEY_PREFIX = f"{KEY_PREFIX}output."
FLOAT_KEY = f"{KEY_PREFIX}float"
SIDECAR_FORMAT = "qconvert-storage/1"
SIDECAR_SUFFIX = ".quant.json"
# Storage types a stripped boundary value may have (ONNX tensor type names; onnxruntime takes them as inputs).
BOUNDARY_STORAGE = ("uint8", "int8", "uint16", "int16", "uint4", "int4")
ENTRY_KEYS = frozenset({"storage", "scale", "zero_point", "axis", "quant_type"})


def canonical_json(value: object) -> str:
    """The contract's JSON spelling: sorted keys, no spaces (so that equal entries are equal bytes)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def sidecar_path(model_path: str | os.PathLike[str]) -> Path:
    """`OUT.onnx` -> `OUT.quant.json` (same folder, same stem)."""
    return Path(model_path).with_suffix(SIDECAR_SUFFIX)


def storage_name(quant_type: QuantizedType) -> str | None:
    """`uint8` for `!quant.uniform<u8:...>`: the ONNX tensor type of the storage; None for float storage."""
    storage = quant_type.storage_type
    if not isinstance(storage, IntegerType):
        return None
    return f"{'int' if quant_type.is_signed else 'uint'}{storage.width}"


def boundary_problem(container: Type) -> str | None:
    """Why a value of type `container` (a tensor of a quant type) cannot be a stripped boundary value;
    None when it can. The reasons are the ones the conversion's summary prints per name."""
    quant_type = getattr(container, "element_type", container)
    if not isinstance(quant_type, QuantizedType):
        return f"{container} is not quantized"
    if not isinstance(quant_type, UniformQuantizedType | UniformQuantizedPerAxisType):
        return (
            f"{print_type(quant_type)} is not per-tensor or per-axis (the metadata records one scale per "
            f"tensor or per channel)"
        )
    name = storage_name(quant_type)
    if name not in BOUNDARY_STORAGE:
        spelling = quant_type.storage_type_spelling
        return f"storage {spelling} cannot be a graph input or output (only {', '.join(BOUNDARY_STORAGE)})"
    if isinstance(quant_type, UniformQuantizedPerAxisType):
        axis = quant_type.quantized_dimension
        if isinstance(container, UnrankedTensorType):
            return f"per-axis quantization along axis {axis} of a tensor of unknown rank"
        if isinstance(container, RankedTensorType) and container.shape[axis] == DYNAMIC:
            return f"per-axis quantization along axis {axis}, which is dynamic"
    return None


@dataclass(frozen=True)
class StorageEntry:
    """One stripped input or output: its storage type and quantization parameters (see the module doc)."""

    storage: str
    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int | None
    quant_type: str

    @classmethod
    def of(cls, container: Type) -> StorageEntry:
        """The entry of a value of type `container`; ValueError with `boundary_problem`'s reason."""
        problem = boundary_problem(container)
        if problem is not None:
            raise ValueError(problem)
        quant_type = getattr(container, "element_type", container)
        assert isinstance(quant_type, QuantizedType)
        params = uniform_params(quant_type)  # zero points of unsigned types unwrapped to [0, 2^n)
        return cls(
            storage=storage_name(quant_type) or "",
            scale=tuple(float(s) for s in params.scale.reshape(-1)),
            zero_point=tuple(int(z) for z in params.zero_point.reshape(-1)),
            axis=params.quantized_dimension,
            quant_type=print_type(quant_type),
        )

    def as_json_value(self) -> dict[str, Any]:
        return {
            "storage": self.storage,
            "scale": list(self.scale),
            "zero_point": list(self.zero_point),
            "axis": self.axis,
            "quant_type": self.quant_type,
        }

    def to_json(self) -> str:
        return canonical_json(self.as_json_value())

    @classmethod
    def from_json_value(cls, value: object, where: str) -> StorageEntry:
        """The entry of a decoded JSON value; InputError naming `where` where it breaks the contract."""
        if not isinstance(value, dict) or set(value) != ENTRY_KEYS:
            keys = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise InputError(f"{where}: expected the keys {sorted(ENTRY_KEYS)}, found {keys}")
        storage, scale, zero_point, axis = (value[k] for k in ("storage", "scale", "zero_point", "axis"))
        if storage not in BOUNDARY_STORAGE:
            raise InputError(f"{where}: storage {storage!r} is not one of {', '.join(BOUNDARY_STORAGE)}")
        numbers = (int, float)
        if not isinstance(scale, list) or not scale or not all(isinstance(s, numbers) for s in scale):
            raise InputError(f"{where}: scale must be a non-empty list of numbers, found {scale!r}")
        if not isinstance(zero_point, list) or not all(type(z) is int for z in zero_point):
            raise InputError(f"{where}: zero_point must be a list of integers, found {zero_point!r}")
        if len(zero_point) != len(scale):
            raise InputError(f"{where}: {len(scale)} scales but {len(zero_point)} zero points")
        if axis is not None and (type(axis) is not int or axis < 0):
            raise InputError(f"{where}: axis must be null or a non-negative integer, found {axis!r}")
        if axis is None and len(scale) != 1:
            raise InputError(f"{where}: {len(scale)} scales need an axis")
        if not isinstance(value["quant_type"], str):
            raise InputError(f"{where}: quant_type must be a string")
        entry = cls(storage, tuple(float(s) for s in scale), tuple(zero_point), axis, value["quant_type"])
        try:
            entry.params()
        except ValueError as error:  # parameters the numerics refuse (a zero scale, a wild zero point)
            raise InputError(f"{where}: {error}") from None
        except InputError as error:  # a quant_type that does not parse or disagrees
            raise InputError(f"{where}: {error.message}") from None
        return entry

    def params(self) -> UniformParams:
        """The numerics' parameters of the entry (`qconvert.numerics.quantize` / `dequantize` take them):
        the expressed type of `quant_type`, and the storage type's full range, since ONNX's QuantizeLinear
        saturates to the whole range whatever bounds the IR type narrows to."""
        signed = not self.storage.startswith("uint")
        width = int(self.storage.removeprefix("u").removeprefix("int"))
        low, high = storage_range(width, signed)
        return UniformParams(
            scale=tuple(self.scale) if self.axis is not None else self.scale[0],
            zero_point=tuple(self.zero_point) if self.axis is not None else self.zero_point[0],
            storage_dtype=integer_storage_dtype(width, signed),
            storage_type_min=low,
            storage_type_max=high,
            quantized_dimension=self.axis,
            expressed_dtype=float_dtype(self.quantized_type().expressed_type),
        )

    def quantized_type(self) -> QuantizedType:
        """The IR type `quant_type` spells; InputError when it does not parse or disagrees with the entry."""
        try:
            parsed = parse_type(self.quant_type)
            matches = isinstance(parsed, QuantizedType) and StorageEntry.of(parsed) == self
        except ValueError as error:
            raise InputError(f"quant_type {self.quant_type!r}: {error}") from None
        except QConvertError as error:
            raise InputError(f"quant_type {self.quant_type!r} does not parse: {error.message}") from None
        if not matches:
            raise InputError(f"quant_type {self.quant_type!r} disagrees with the entry's other fields")
        return parsed


@dataclass(frozen=True)
class StorageMetadata:
    """Every stripped input and output of one model, and the boundary values left float with why."""

    inputs: dict[str, StorageEntry] = field(default_factory=dict)
    outputs: dict[str, StorageEntry] = field(default_factory=dict)
    float_reasons: dict[str, str] = field(default_factory=dict)

    def metadata_props(self) -> dict[str, str]:
        """The model's `metadata_props` entries: inputs, outputs (in graph order), then the float reasons."""
        props = {f"{INPUT_KEY_PREFIX}{name}": entry.to_json() for name, entry in self.inputs.items()}
        props.update({f"{OUTPUT_KEY_PREFIX}{name}": entry.to_json() for name, entry in self.outputs.items()})
        if self.float_reasons:
            props[FLOAT_KEY] = canonical_json(self.float_reasons)
        return props

    def sidecar_text(self) -> str:
        """The sidecar file's text: the same values, indented for people, keys sorted."""
        value = {
            "format": SIDECAR_FORMAT,
            "inputs": {name: entry.as_json_value() for name, entry in self.inputs.items()},
            "outputs": {name: entry.as_json_value() for name, entry in self.outputs.items()},
            "float": dict(self.float_reasons),
        }
        return json.dumps(value, sort_keys=True, indent=2) + "\n"

    @classmethod
    def from_metadata_props(cls, props: Mapping[str, str], where: str) -> StorageMetadata:
        """The storage entries among a model's `metadata_props` (other keys are ignored); InputError naming
        `where` and the key for an entry that does not follow the contract. Empty when there is none."""
        inputs: dict[str, StorageEntry] = {}
        outputs: dict[str, StorageEntry] = {}
        float_reasons: dict[str, str] = {}
        for key, text in props.items():
            if not key.startswith(KEY_PREFIX):
                continue
            place = f"{where}: metadata '{key}'"
            value = _decode(text, place)
            if key == FLOAT_KEY:
                float_reasons = _reasons(value, place)
            elif key.startswith(INPUT_KEY_PREFIX):
                inputs[key.removeprefix(INPUT_KEY_PREFIX)] = StorageEntry.from_json_value(value, place)
            elif key.startswith(OUTPUT_KEY_PREFIX):
                outputs[key.removeprefix(OUTPUT_KEY_PREFIX)] = StorageEntry.from_json_value(value, place)
            else:
                raise InputError(f"{place}: not a key of the storage contract ({SIDECAR_FORMAT})")
        return cls(inputs, outputs, float_reasons)

    @classmethod
    def from_sidecar(cls, text: str, where: str) -> StorageMetadata:
        """The sidecar's entries; InputError naming `where` when it is not a `qconvert-storage/1` file."""
        value = _decode(text, where)
        if not isinstance(value, dict) or value.get("format") != SIDECAR_FORMAT:
            raise InputError(f'{where}: not a {SIDECAR_FORMAT} sidecar (its "format" differs)')
        sections = {}
        for section in ("inputs", "outputs"):
            entries = value.get(section, {})
            if not isinstance(entries, dict):
                raise InputError(f'{where}: "{section}" must be an object')
            sections[section] = {
                name: StorageEntry.from_json_value(entry, f"{where}: {section}['{name}']")
                for name, entry in entries.items()
            }
        return cls(sections["inputs"], sections["outputs"], _reasons(value.get("float", {}), where))

    def __bool__(self) -> bool:
        return bool(self.inputs or self.outputs)


def _decode(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"{where}: not JSON ({error})") from None


def _reasons(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InputError(f"{where}: the float reasons must be an object of strings")
    return dict(value)


__all__ = [
    "BOUNDARY_STORAGE",
    "FLOAT_KEY",
    "INPUT_KEY_PREFIX",
    "OUTPUT_KEY_PREFIX",
    "SIDECAR_FORMAT",
    "SIDECAR_SUFFIX",
    "StorageEntry",
    "StorageMetadata",
    "boundary_problem",
    "canonical_json",
    "sidecar_path",
    "storage_name",
]
