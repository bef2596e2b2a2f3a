"""onnx-storage backend: a quantized ONNX model whose inputs and outputs are its storage integers.

    from qconvert.convert import convert, write
    stripped = convert("models/digits_cnn.qdq.onnx", to="onnx-storage")       # inputs / outputs: all
    write(stripped, "digits.storage.onnx", to="onnx-storage")                  # + digits.storage.quant.json

    from qconvert.backends.onnx_storage import strip_to_storage, save_storage_model
    model = strip_to_storage(module, form="qoperator", inputs="image", outputs="all")
    save_storage_model(model, "out.onnx")

What `strip-func-quant-types` does to a `func.func` signature, at an ONNX model's boundary: a graph input
that is quantized on entry (one QuantizeLinear, or several with the same parameters, and nothing else
reading it) takes the storage tensor instead (uint8 / int8 / uint16 / int16 / uint4 / int4), and an output
that comes straight from a DequantizeLinear returns what that node read. The parameters travel with the
model (qconvert/storage_metadata.py: `metadata_props` and `OUT.quant.json`); what stays float is listed
with the reason. `--form qoperator` also rewrites the inner Q/DQ patterns to QLinear* ops (the ONNX
backend's `qdq_to_qoperator`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qconvert.backends import lazy_exports

if TYPE_CHECKING:
    from .backend import BACKEND, OnnxStorageBackend
    from .options import StorageOptions
    from .strip import StorageModel, save_storage_model, strip_to_storage

# Public name -> (module of this package, its name there); loaded on first use, so that the registry
# and the CLI's help read `BACKEND` without importing onnx.
_EXPORTS: dict[str, tuple[str, str]] = {
    "BACKEND": ("backend", "BACKEND"),
    "OnnxStorageBackend": ("backend", "OnnxStorageBackend"),
    "StorageOptions": ("options", "StorageOptions"),
    "StorageModel": ("strip", "StorageModel"),
    "save_storage_model": ("strip", "save_storage_model"),
    "strip_to_storage": ("strip", "strip_to_storage"),
}

__all__ = [
    "BACKEND",
    "OnnxStorageBackend",
    "StorageModel",
    "StorageOptions",
    "save_storage_model",
    "strip_to_storage",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)
