"""ONNX backend: write the IR back out as an ONNX model (QDQ form: quant casts become Q/DQ nodes).

    from qconvert.backends.onnx import write_onnx, save_onnx
    proto = write_onnx(module)                  # onnx.ModelProto, checked with full_check=True
    save_onnx(module, "out.onnx")               # atomic; external data beside it when > 2 GB
    save_onnx(module, "out.onnx", opset=21, external_data=True)

The module is what `qconvert.frontends.onnx.import_onnx` produces, possibly transformed by passes or
calibration: one `func.func @main`, `onnx.name` on its arguments and results, generic `"onnx.X"` ops,
`quant.qcast` / `quant.dcast` / `quant.scast`, `arith.constant`, and the QOperator ops the frontend lifts
to `qconvert.*`. The mapping is in write.py (graph, names, opset), qdq.py (quant types -> Q/DQ
parameters, and what is lost: narrowed storage bounds) and qoperator.py (`qconvert.*` -> QLinearConv,
com.microsoft QLinearAdd, ...).

Not written (InputError naming the op or value): `!quant.calibrated` types (finalize calibration first),
ops of other dialects (`stablehlo.add`), storage ONNX lacks (i3, u32, ...), blocks along two axes,
elided weights.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qconvert.backends import lazy_exports

if TYPE_CHECKING:
    from .backend import BACKEND, OnnxBackend, OnnxOptions
    from .qoperator_fusion import QOperatorRewrite, onnxruntime_fusions, qdq_to_qoperator
    from .save import save_onnx
    from .types import UnwritableType, data_type, shape_of
    from .write import build_model, write_onnx

# Public name -> (module of this package, its name there); loaded on first use, so that the registry
# and the CLI's help read `BACKEND` without importing onnx.
_EXPORTS: dict[str, tuple[str, str]] = {
    "BACKEND": ("backend", "BACKEND"),
    "OnnxBackend": ("backend", "OnnxBackend"),
    "OnnxOptions": ("backend", "OnnxOptions"),
    "save_onnx": ("save", "save_onnx"),
    "QOperatorRewrite": ("qoperator_fusion", "QOperatorRewrite"),
    "onnxruntime_fusions": ("qoperator_fusion", "onnxruntime_fusions"),
    "qdq_to_qoperator": ("qoperator_fusion", "qdq_to_qoperator"),
    "UnwritableType": ("types", "UnwritableType"),
    "data_type": ("types", "data_type"),
    "shape_of": ("types", "shape_of"),
    "build_model": ("write", "build_model"),
    "write_onnx": ("write", "write_onnx"),
}

__all__ = [
    "BACKEND",
    "OnnxBackend",
    "OnnxOptions",
    "QOperatorRewrite",
    "UnwritableType",
    "build_model",
    "data_type",
    "onnxruntime_fusions",
    "qdq_to_qoperator",
    "save_onnx",
    "shape_of",
    "write_onnx",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)
