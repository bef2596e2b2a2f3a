"""Per-tensor quantization overrides: onnxruntime's `TensorQuantOverrides`, read from its own JSON form.

NOTE: the form is onnxruntime's `extra_options["TensorQuantOverrides"]`, so a file written for
`quantize_static` works unchanged: `{"tensor name": [{"quant_type": "QUInt16", "symmetric": true, ...}]}`.
Keys and their meaning (onnxruntime's `calc_quant_params` / `_calc_initializer_quant_params`):
- `quant_type`: the tensor's storage instead of the scheme's (onnxruntime's QuantType name or ours);
- `symmetric`, `rmin`, `rmax`: inputs of the usual scale rule; `reduce_range`: initializers only;
- `scale` and `zero_point` (both or neither, without the four above): the parameters themselves;
- `axis` (initializers): per-channel along it, whatever `per_channel` says, for the weights placement
  quantizes per channel (Conv, ConvTranspose, Gemm, MatMul, normalizations; elsewhere a note says it had
  no effect); an override without `axis` makes a weight per-tensor even with `per_channel`
  (onnxruntime's `is_tensor_per_channel`). Conv and Gemm take only their output-channel axis.
A `symmetric` override on a Relu/Clip output keeps the op (its Q/DQ no longer clamps at 0). `rmin`/`rmax`
are the calibrated range's replacement, so `--block-size` weights (scales per block) ignore them.
Not supported, refused by name: per-channel lists (one dict per channel) and `rmin`/`rmax`/`scale` beside
`axis` (onnxruntime applies those to channel 0 alone), `convert` (a second type for some consumers),
float8 types, zero points outside the type's range, and overrides of biases (onnxruntime then quantizes
the bias as a weight).
An override on a tensor that shares its input's parameters (Reshape, Transpose, MaxPool, ... outputs) has
no effect there, as in onnxruntime: the input's parameters, overridden or not, are used.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from qconvert.errors import InputError
from qconvert.numerics.calibration import FLOAT8, QUANT_TYPES

# onnxruntime QuantType enum names -> our storage kind names (1:1).
ORT_QUANT_TYPE_NAMES = {
    "QInt8": "int8",
    "QUInt8": "uint8",
    "QInt16": "int16",
    "QUInt16": "uint16",
    "QInt4": "int4",
    "QUInt4": "uint4",
    "QFLOAT8E4M3FN": "float8e4m3fn",
}
# Keys onnxruntime refuses beside an explicit scale and zero point.
_RULE_KEYS = frozenset({"symmetric", "reduce_range", "rmin", "rmax"})


@dataclass(frozen=True, slots=True)
class TensorOverride:
    """One tensor's overrides (None: the scheme's setting, or the calibrated range)."""

    quant_type: str | None = None
    symmetric: bool | None = None
    reduce_range: bool | None = None
    rmin: float | None = None
    rmax: float | None = None
    scale: float | None = None
    zero_point: int | None = None
    axis: int | None = None

    def to_json(self) -> dict[str, object]:
        """onnxruntime's form (one dict), with the keys that are set."""
        return {
            item.name: getattr(self, item.name)
            for item in fields(self)
            if getattr(self, item.name) is not None
        }


def storage_name(value: object) -> str:
    """Our storage kind name for onnxruntime's QuantType (an enum or its name) or ours."""
    name = getattr(value, "name", value)  # onnxruntime's QuantType enum member
    return ORT_QUANT_TYPE_NAMES.get(str(name), str(name))


def parse_overrides(raw: Mapping[str, Any], source: str = "tensor overrides") -> dict[str, TensorOverride]:
    """onnxruntime's TensorQuantOverrides dict (or already parsed `TensorOverride`s) -> name -> override.
    InputError naming `source` and the tensor for anything onnxruntime would refuse or we do not support."""
    if not isinstance(raw, Mapping):
        raise InputError(
            f"{source}: expected an object of tensor name -> [overrides], got {type(raw).__name__}"
        )
    parsed = {}
    for name, entry in raw.items():
        if isinstance(entry, TensorOverride):
            parsed[str(name)] = entry
            continue
        where = f"{source}: tensor '{name}'"
        if not isinstance(entry, list | tuple) or not entry:
            raise InputError(f"{where}: expected a non-empty list of override dicts, got {entry!r}")
        if len(entry) > 1:
            raise InputError(
                f"{where}: per-channel override lists (one dict per channel) are not supported; give one "
                f"dict (with 'axis' for a per-channel weight)"
            )
        parsed[str(name)] = _parse_one(next(iter(entry)), where)
    return parsed


def read_overrides(path: str | os.PathLike[str]) -> dict[str, TensorOverride]:
    """The overrides of a JSON file in onnxruntime's form; InputError naming the file when unreadable."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"--overrides {os.fspath(path)}: cannot read it as JSON: {error}") from None
    return parse_overrides(raw, f"--overrides {os.fspath(path)}")


def _parse_one(options: object, where: str) -> TensorOverride:
    if not isinstance(options, Mapping):
        raise InputError(f"{where}: expected a dict of overrides, got {options!r}")
    if "convert" in options:
        raise InputError(f"{where}: 'convert' (a second type for some consumers) is not supported")
    known = {item.name for item in fields(TensorOverride)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise InputError(f"{where}: unknown override key(s) {unknown}; known: {sorted(known)}")
    if ("scale" in options) != ("zero_point" in options):
        raise InputError(f"{where}: give both 'scale' and 'zero_point', or neither")
    if "axis" in options and {"rmin", "rmax", "scale"} & set(options):
        raise InputError(
            f"{where}: {sorted({'rmin', 'rmax', 'scale'} & set(options))} with 'axis' would set one channel "
            f"(onnxruntime's per-channel lists, one dict per channel, are not supported)"
        )
    if "scale" in options and _RULE_KEYS & set(options):
        raise InputError(
            f"{where}: {sorted(_RULE_KEYS & set(options))} cannot be combined with 'scale' and 'zero_point'"
        )
    values: dict[str, Any] = {}
    try:
        if "quant_type" in options:
            values["quant_type"] = storage_name(options["quant_type"])
        for key in ("symmetric", "reduce_range"):
            if key in options:
                values[key] = _boolean(options[key])
        for key in ("rmin", "rmax", "scale"):
            if key in options:
                values[key] = float(options[key])
        for key in ("zero_point", "axis"):
            if key in options:
                values[key] = _integer(options[key])
    except (TypeError, ValueError) as error:
        raise InputError(f"{where}: {error}") from None
    override = TensorOverride(**values)
    if override.quant_type is not None and override.quant_type not in QUANT_TYPES:
        raise InputError(
            f"{where}: quant_type '{override.quant_type}' is not one of {', '.join(ORT_QUANT_TYPE_NAMES)}"
        )
    if override.quant_type == FLOAT8:
        raise InputError(f"{where}: float8e4m3fn overrides are not supported (use it for the whole scheme)")
    if override.scale is not None and not override.scale > 0:
        raise InputError(f"{where}: scale must be positive, got {override.scale}")
    if override.rmin is not None and override.rmax is not None and not override.rmin <= override.rmax:
        raise InputError(f"{where}: rmin {override.rmin} is above rmax {override.rmax}")
    return override


def _boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected true or false, got {value!r}")
    return value


def _integer(value: object) -> int:
    if isinstance(value, bool) or int(value) != value:  # type: ignore[call-overload]
        raise TypeError(f"expected an integer, got {value!r}")
    return int(value)  # type: ignore[call-overload]


__all__ = [
    "ORT_QUANT_TYPE_NAMES",
    "TensorOverride",
    "parse_overrides",
    "read_overrides",
    "storage_name",
]
