"""ascendc backend: a quantized model as the calls a Huawei Ascend kernel makes through the AscendC
quantization APIs (AscendQuant / AscendDequant / AscendAntiQuant), with kernel sources and host tiling.

    from qconvert.convert import convert, write
    artifact = convert("models/digits_cnn.qdq.onnx", to="ascendc", product="atlas-a2")
    write(artifact, "digits.ascendc", to="ascendc")     # callgraph.json, kernels/, tiling.json, constants/

    qconvert check models/digits_cnn.qdq.onnx --backend ascendc   # each site on the emulator vs onnxruntime

No Ascend hardware, CANN toolkit or simulator runs here: the calls are judged by the emulator of the
documented semantics (qconvert/numerics/ascendc.py) against onnxruntime, and the kernels by compiling them
against a header declaring the documented signatures (tests/backends/ascendc/stub/kernel_operator.h).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qconvert.backends import lazy_exports

if TYPE_CHECKING:
    from .backend import BACKEND, AscendcArtifact, AscendcBackend, build_artifact, write_folder
    from .callgraph import CallGraph, Site, build_call_graph
    from .options import AscendcOptions
    from .products import PRODUCTS

# Public name -> (module of this package, its name there); loaded on first use.
_EXPORTS: dict[str, tuple[str, str]] = {
    "BACKEND": ("backend", "BACKEND"),
    "AscendcArtifact": ("backend", "AscendcArtifact"),
    "AscendcBackend": ("backend", "AscendcBackend"),
    "AscendcOptions": ("options", "AscendcOptions"),
    "CallGraph": ("callgraph", "CallGraph"),
    "PRODUCTS": ("products", "PRODUCTS"),
    "Site": ("callgraph", "Site"),
    "build_artifact": ("backend", "build_artifact"),
    "build_call_graph": ("callgraph", "build_call_graph"),
    "write_folder": ("backend", "write_folder"),
}

__all__ = [
    "AscendcArtifact",
    "AscendcBackend",
    "AscendcOptions",
    "BACKEND",
    "CallGraph",
    "PRODUCTS",
    "Site",
    "build_artifact",
    "build_call_graph",
    "write_folder",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)
