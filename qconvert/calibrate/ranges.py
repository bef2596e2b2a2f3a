"""Calibrated ranges: per-tensor (min, max) with their statistics, and their JSON files.

NOTE: a range is keyed by ONNX tensor name (attach.py puts ranges on the IR). Ranges hold float32 values
(stored as the float64 of the float32); JSON writes them with `repr`, which round-trips exactly, and
non-finite bounds as the strings "inf" / "-inf" / "nan".
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qconvert.atomic_file import atomic_text_file
from qconvert.errors import InputError

FORMAT = "qconvert.calibration_ranges"
VERSION = 1


def as_float32(value: float) -> float:
    """The float64 holding the nearest float32 of `value` (ranges are float32 values, as onnxruntime's)."""
    return float(np.float32(value))


@dataclass(slots=True)
class TensorRange:
    """The observed range of one tensor, plus what the observer learned on the way.

    `min`/`max` are float32 values; `method` names the observer (minmax, percentile, ...); `std` is
    set by the Distribution observer (float8 scales); `samples` counts observed samples; `nan_count` /
    `inf_count` count excluded non-finite elements; `sentinel` explains a range dominated by a
    sentinel value (the tensor is then normally kept in float); `note` says where the method's own rule
    gave way (an entropy pick that would clip most values).
    """

    name: str
    min: float
    max: float
    method: str = "minmax"
    std: float | None = None
    samples: int = 0
    nan_count: int = 0
    inf_count: int = 0
    sentinel: str | None = None
    note: str | None = None

    def __post_init__(self) -> None:
        self.min = as_float32(self.min)
        self.max = as_float32(self.max)
        if self.std is not None:
            self.std = as_float32(self.std)

    def to_json(self) -> dict[str, object]:
        entry: dict[str, object] = {
            "min": _float_out(self.min),
            "max": _float_out(self.max),
            "method": self.method,
        }
        if self.std is not None:
            entry["std"] = _float_out(self.std)
        for key in ("samples", "nan_count", "inf_count"):
            if getattr(self, key):
                entry[key] = getattr(self, key)
        for key in ("sentinel", "note"):
            if getattr(self, key) is not None:
                entry[key] = getattr(self, key)
        return entry


@dataclass(slots=True)
class CalibrationRanges:
    """Every observed tensor's range, by ONNX tensor name, and where they came from.

    `metadata` is free-form JSON (model path, method, sample count, qconvert version, ...).
    """

    ranges: dict[str, TensorRange] = field(default_factory=dict)
    metadata: dict[str, object] = field(default_factory=dict)

    def add(self, tensor_range: TensorRange) -> None:
        self.ranges[tensor_range.name] = tensor_range

    def __getitem__(self, name: str) -> TensorRange:
        return self.ranges[name]

    def __contains__(self, name: object) -> bool:
        return name in self.ranges

    def __len__(self) -> int:
        return len(self.ranges)

    def to_json(self) -> dict[str, object]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "metadata": self.metadata,
            "tensors": {name: r.to_json() for name, r in self.ranges.items()},
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write JSON atomically (temp file, then rename): no partial file on failure."""
        text = json.dumps(self.to_json(), indent=1, allow_nan=False) + "\n"
        with atomic_text_file(path) as stream:
            stream.write(text)

    @classmethod
    def from_json(cls, data: object, source: str = "<ranges>") -> CalibrationRanges:
        """Parse the JSON structure `save` writes; InputError naming `source` and the entry otherwise."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InputError(f'{source}: not a qconvert ranges file (expected "format": "{FORMAT}")')
        version = data.get("version")
        if version != VERSION:
            raise InputError(
                f"{source}: ranges file version {version!r} is not supported (expected {VERSION})"
            )
        metadata = data.get("metadata", {})
        tensors = data.get("tensors")
        if not isinstance(metadata, dict) or not isinstance(tensors, dict):
            raise InputError(f'{source}: "metadata" and "tensors" must be JSON objects')
        result = cls(metadata=metadata)
        for name, entry in tensors.items():
            result.add(_range_from_json(name, entry, source))
        return result

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CalibrationRanges:
        try:
            text = Path(path).read_text()
        except OSError as error:
            raise InputError(f"{path}: cannot read ranges file: {error.strerror or error}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise InputError(f"{path}:{error.lineno}:{error.colno}: invalid JSON: {error.msg}") from None
        return cls.from_json(data, str(path))


def _float_out(value: float) -> float | str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _float_in(value: object, where: str) -> float:
    if isinstance(value, str) and value in ("inf", "-inf", "nan"):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f'{where} must be a number (or "inf", "-inf", "nan"), got {value!r}')
    return float(value)


def _range_from_json(name: str, entry: object, source: str) -> TensorRange:
    where = f"{source}: tensor '{name}'"
    if not isinstance(entry, dict):
        raise InputError(f'{where}: expected an object with "min" and "max"')
    for key in ("min", "max"):
        if key not in entry:
            raise InputError(f'{where}: missing "{key}"')
    low = _float_in(entry["min"], f'{where}: "min"')
    high = _float_in(entry["max"], f'{where}: "max"')
    for key, value in (("min", low), ("max", high)):
        if math.isnan(value):
            raise InputError(f'{where}: "{key}" is NaN; a range needs numbers (or "inf", "-inf")')
    if low > high:
        raise InputError(f"{where}: min {entry['min']!r} must not exceed max {entry['max']!r}")
    largest = float(np.finfo(np.float32).max)
    for key, value in (("min", low), ("max", high)):
        if math.isfinite(value) and abs(value) > largest:  # ranges are float32 values
            raise InputError(f'{where}: "{key}" {value!r} is past float32\'s largest value ({largest:.8g})')
    counts = {}
    for key in ("samples", "nan_count", "inf_count"):
        value = entry.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f'{where}: "{key}" must be a non-negative integer, got {value!r}')
        counts[key] = value
    std = entry.get("std")
    texts = {key: entry.get(key) for key in ("sentinel", "note")}
    for key, text in texts.items():
        if text is not None and not isinstance(text, str):
            raise InputError(f'{where}: "{key}" must be a string')
    method = entry.get("method", "minmax")
    if not isinstance(method, str):
        raise InputError(f'{where}: "method" must be a string')
    return TensorRange(
        name,
        low,
        high,
        method=method,
        std=None if std is None else _float_in(std, f'{where}: "std"'),
        **texts,  # type: ignore[arg-type]
        **counts,
    )
