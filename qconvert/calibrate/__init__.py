"""Calibration: datasets, mergeable observers, `!quant.calibrated` ranges, finalize to `!quant.uniform`.

from qconvert.calibrate import calibrate
result = calibrate("model.onnx", "data/", method="percentile", out="model.qdq.onnx")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qconvert.public_api import make_callable

if TYPE_CHECKING:
    from qconvert.calibrate.api import CalibrationResult, calibrate

__all__ = ["CalibrationResult", "calibrate"]


def __getattr__(name: str) -> Any:
    # Lazy: worker processes import observers and collect without the IR, finalize and the writer.
    if name in __all__:
        from qconvert.calibrate import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# `qconvert.calibrate(...)` runs calibrate() (qconvert/public_api.py: this package shares the verb's name)
make_callable(__name__, "qconvert.calibrate.api", "calibrate", "calibrate")
