"""onnxruntime runs whose feeds and results may be 4-bit: int4 / uint4 as ml_dtypes arrays in and out.

onnxruntime's Python API has no numpy type for int4 / uint4 (`session.run` refuses such feeds and cannot
return such results), but its OrtValues hold them: two elements per byte, the first in the low nibble.
`run_values` packs and unpacks them through the value's memory; every other type goes as numpy.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np
from onnx import TensorProto

from qconvert.errors import InputError

PACKED = {"int4": TensorProto.INT4, "uint4": TensorProto.UINT4}


def to_ort_value(array: np.ndarray) -> Any:
    """`array` as an onnxruntime OrtValue (4-bit arrays packed two to a byte)."""
    import onnxruntime as ort

    array = np.asarray(array)
    if array.dtype.name not in PACKED:
        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
    nibbles = array.astype(np.int8).reshape(-1).view(np.uint8) & 0xF  # two's complement's low nibble
    nibbles = np.concatenate([nibbles, np.zeros(nibbles.size % 2, np.uint8)])
    packed = np.ascontiguousarray(nibbles[0::2] | (nibbles[1::2] << 4))
    value = ort.OrtValue.ortvalue_from_shape_and_type(list(array.shape), PACKED[array.dtype.name])
    if value.tensor_size_in_bytes() != packed.nbytes:
        raise AssertionError(f"onnxruntime holds {array.dtype.name}{list(array.shape)} in another layout")
    ctypes.memmove(value.data_ptr(), packed.ctypes.data, packed.nbytes)
    return value


def from_ort_value(value: Any) -> np.ndarray:
    """An onnxruntime OrtValue as numpy; int4 / uint4 unpacked to ml_dtypes' int4 / uint4."""
    kind = value.data_type().removeprefix("tensor(").removesuffix(")")
    if kind not in PACKED:
        return value.numpy()
    size = value.tensor_size_in_bytes()
    raw = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(value.data_ptr())).copy()
    nibbles = np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(-1)[: int(np.prod(value.shape()))]
    values = np.where(nibbles > 7, nibbles.astype(np.int16) - 16, nibbles) if kind == "int4" else nibbles
    return values.astype(getattr(ml_dtypes, kind)).reshape(value.shape())


def run_values(session: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of `session` by name, 4-bit feeds and results included; InputError when it fails."""
    names = [output.name for output in session.get_outputs()]
    values = {name: to_ort_value(array) for name, array in feeds.items()}
    try:
        results = session.run_with_ort_values(names, values)
        return {name: from_ort_value(result) for name, result in zip(names, results, strict=True)}
    except Exception as error:  # onnxruntime raises its own exception types for any failure
        raise InputError(f"onnxruntime cannot run the model on these inputs: {error}") from None


__all__ = ["PACKED", "from_ort_value", "run_values", "to_ort_value"]
