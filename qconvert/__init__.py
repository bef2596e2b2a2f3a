"""qconvert: quantized ONNX models through MLIR's quant dialect, every number checked on a real engine.

The Python API, one function per CLI verb (each loads what it needs on first use):

    import qconvert
    result = qconvert.calibrate("model.onnx", "samples/", method=qconvert.Method.ENTROPY, out="m.qdq.onnx")
    report = qconvert.check("m.qdq.onnx", "samples/", backend="stablehlo")
    module = qconvert.convert("m.qdq.onnx", to="stablehlo", form=qconvert.Form.INTEGER)
    lifted = qconvert.import_onnx("m.qdq.onnx")
    outputs = qconvert.run("m.mlir", "samples/")

Results have a short repr and `to_json()`; errors are `qconvert.InputError` (bad input, naming the
parameter) and the other `qconvert.QConvertError`s. The enums name every choice: `Method`, `QuantType`,
`Form`, `Semantics`, `Target`, `Executor`, `SentinelPolicy` (plain strings are accepted too).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from qconvert.calibrate.sentinel import SentinelPolicy
    from qconvert.errors import InputError, QConvertError

__all__ = [
    "Executor",
    "Form",
    "InputError",
    "Method",
    "QConvertError",
    "QuantType",
    "Semantics",
    "SentinelPolicy",
    "Target",
    "__version__",
    "calibrate",
    "check",
    "convert",
    "import_onnx",
    "run",
]

VERB_MODULES = ("calibrate", "check", "convert", "run")  # each a callable package or module (public_api.py)


def _choices(name: str, values: Any, doc: str) -> type[enum.StrEnum]:
    """A StrEnum of `values` (`entropy` -> Method.ENTROPY, `moving-average` -> MOVING_AVERAGE)."""
    choices = enum.StrEnum(name, [(str(v).upper().replace("-", "_"), str(v)) for v in values])  # type: ignore[misc]
    choices.__doc__ = doc
    choices.__module__ = __name__
    return choices


def _enum(name: str) -> Any:
    if name == "Method":
        from qconvert.calibrate.methods import METHODS

        return _choices(name, METHODS, "Calibration methods (`calibrate(method=...)`, `--method`).")
    if name == "QuantType":
        from qconvert.numerics.calibration import QUANT_TYPES

        return _choices(
            name, QUANT_TYPES, "Storage types (`scheme['activation_type']`, `--activation-type`)."
        )
    if name == "Target":
        from qconvert.backends import backend_names

        return _choices(name, backend_names(), "Backends (`convert(to=...)`, `--to`).")
    if name == "Executor":
        from qconvert.calibrate.workers import ENGINES

        return _choices(
            name, ENGINES, "Where calibration's workers run (`calibrate(engine=...)`, `--executor`)."
        )
    if name in ("Form", "Semantics"):
        from qconvert.backends import stablehlo

        return getattr(stablehlo, name)
    if name == "SentinelPolicy":
        from qconvert.calibrate.sentinel import SentinelPolicy

        return SentinelPolicy
    return None


def __getattr__(name: str) -> Any:
    if name in VERB_MODULES:  # importing the package makes it callable (qconvert/public_api.py)
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    if name == "import_onnx":
        from qconvert.frontends.onnx import import_onnx
        from qconvert.public_api import api_function

        value: Any = api_function("import_onnx", import_onnx)
    elif name == "__version__":
        from importlib import metadata

        try:
            value = metadata.version(__name__)
        except metadata.PackageNotFoundError:  # a source tree never installed
            value = "unknown"
    elif name in ("InputError", "QConvertError"):
        from qconvert import errors

        value = getattr(errors, name)
    else:
        value = _enum(name)
        if value is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # computed once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
