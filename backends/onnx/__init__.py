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

from .save import save_onnx
from .write import build_model, write_onnx

__all__ = ["build_model", "save_onnx", "write_onnx"]
