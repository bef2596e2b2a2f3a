"""Initializers as lazily read constants: large ones become `dense_resource` blobs (STYLE.md P5).

A weight of at least `RESOURCE_THRESHOLD` elements whose element type has a whole-byte layout (i8..i64,
f16, bf16, f32, f64, f8*) becomes `dense_resource<name> : tensor<...>` backed by `LazyElements`: shape
and dtype come from the TensorProto; the bytes are read on first use (the interpreter) or only while
they are printed (`qconvert.ir.printer.write_module`), so lifting a model never copies its weights:

- external data (`onnx.save(..., save_as_external_data=True)`, and every model over 2 GB) is an
  `np.memmap` of the `location` file at `offset` (read-only): the OS pages it in as the printer walks it.
  `load.check_external_data` has already refused locations outside the model's folder.
- `raw_data` is viewed with `np.frombuffer`, in protobuf's `bytes` object (its one copy), or in the
  memory-mapped model file where calibration loaded it so (load.py's `map_file`, wire.py).
- the typed fields (`float_data`, `int32_data`, ...) go through `onnx.numpy_helper.to_array`.

Smaller constants, sub-byte types (int4, float4, ...), bool and strings stay inline `dense<...>`.
Resource names are the initializer names made MLIR bare identifiers (`/enc/q/MatMul` ->
`_enc_q_MatMul`), unique within the module (`_1`, `_2` suffixes).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from onnx import TensorProto, numpy_helper
from onnx.external_data_helper import uses_external_data

from qconvert.errors import InputError
from qconvert.ir.attributes import LazyElements
from qconvert.ir.parser import resource_dtype
from qconvert.ir.types import RankedTensorType

from .dtypes import ELEMENT_TYPES
from .wire import RawData

RESOURCE_THRESHOLD = 64
"""Constants of at least this many elements print as `dense_resource` blobs (0: never)."""

_NOT_BARE = re.compile(r"[^a-zA-Z0-9_$.]")


class ResourceNames:
    """MLIR bare identifiers for initializer names, unique within one module."""

    def __init__(self) -> None:
        self.used: set[str] = {"__elided__"}

    def __call__(self, name: str) -> str:
        base = _NOT_BARE.sub("_", name) or "weight"
        if not (base[0].isalpha() or base[0] == "_"):
            base = "_" + base
        candidate, counter = base, 0
        while candidate in self.used:
            counter += 1
            candidate = f"{base}_{counter}"
        self.used.add(candidate)
        return candidate


def external_data(tensor: TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def as_resource(onnx_type: int, shape: tuple[int, ...], threshold: int) -> bool:
    """Whether a constant of this type and shape prints as a `dense_resource` blob."""
    entry = ELEMENT_TYPES.get(onnx_type)
    if threshold <= 0 or entry is None or entry.dtype is None:
        return False
    if int(np.prod(shape, dtype=np.int64)) < threshold:
        return False
    resource = resource_dtype(RankedTensorType(shape, entry.ir_type))
    return resource is not None and resource.itemsize == entry.dtype.itemsize


def lazy_elements(
    tensor: TensorProto, base_dir: Path | None, threshold: int, raw: RawData | None = None
) -> LazyElements | None:
    """The tensor as lazily read elements, or None when it should stay an inline `dense<...>`; `raw`
    is its raw_data when load.py detached it from the proto."""
    shape = tuple(int(d) for d in tensor.dims)
    if not as_resource(tensor.data_type, shape, threshold):
        return None
    dtype = ELEMENT_TYPES[tensor.data_type].dtype
    assert dtype is not None
    if raw is not None:
        return LazyElements(shape, dtype, lambda: _view_raw(tensor.name, raw, dtype, shape))
    if uses_external_data(tensor):
        if base_dir is None:
            raise InputError(f"initializer '{tensor.name}' uses external data, but the model has no folder")
        _external_span(tensor, base_dir, dtype, shape)  # sizes checked while lifting, nothing read
        return LazyElements(shape, dtype, lambda: _map_external(tensor, base_dir, dtype, shape))
    if tensor.HasField("raw_data"):
        return LazyElements(shape, dtype, lambda: _view_raw(tensor.name, tensor.raw_data, dtype, shape))
    return LazyElements(shape, dtype, lambda: numpy_helper.to_array(tensor).reshape(shape))


def initializer_array(tensor: TensorProto, base_dir: Path | None, raw: RawData | None = None) -> np.ndarray:
    """The whole array (small tensors, and quantization parameters), external data read from its file."""
    if raw is not None:
        with_data = TensorProto()
        with_data.CopyFrom(tensor)
        with_data.raw_data = bytes(raw)
        return numpy_helper.to_array(with_data)
    if uses_external_data(tensor):
        if base_dir is None:
            raise InputError(f"initializer '{tensor.name}' uses external data, but the model has no folder")
        try:
            return numpy_helper.to_array(tensor, str(base_dir))
        except (OSError, ValueError) as error:
            raise InputError(
                f"initializer '{tensor.name}': cannot read its external data ({error})"
            ) from None
    return numpy_helper.to_array(tensor)


def _external_span(
    tensor: TensorProto, base_dir: Path, dtype: np.dtype, shape: tuple[int, ...]
) -> tuple[Path, int, int]:
    """The file, offset and byte count of a tensor's external data, checked against the file's size."""
    info = external_data(tensor)
    path = (base_dir / info.get("location", "")).resolve()
    offset = int(info.get("offset", 0) or 0)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    length = info.get("length")
    if length is not None and int(length) != nbytes:
        raise InputError(
            f"initializer '{tensor.name}': external data length {length} in '{info.get('location')}' "
            f"does not match its shape {list(shape)} of {dtype} ({nbytes} bytes)"
        )
    size = path.stat().st_size
    if offset + nbytes > size:
        raise InputError(
            f"initializer '{tensor.name}': external data '{info.get('location')}' holds {size} bytes, "
            f"fewer than offset {offset} + {nbytes} bytes of the tensor (truncated file?)"
        )
    return path, offset, nbytes


def _map_external(tensor: TensorProto, base_dir: Path, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    path, offset, nbytes = _external_span(tensor, base_dir, dtype, shape)
    if nbytes == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def _view_raw(name: str, raw: RawData, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != nbytes:
        raise InputError(
            f"initializer '{name}': raw_data holds {len(raw)} bytes, its shape {list(shape)} of "
            f"{dtype} needs {nbytes}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape)
