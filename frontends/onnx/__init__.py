"""ONNX frontend: lifts ONNX graphs (float or QDQ) into the qconvert IR (see lift.py for the mapping)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .lift import import_onnx

__all__ = ["import_onnx"]


def __getattr__(name: str) -> Any:
    # The lifter imports the whole IR (a tenth of a second); calibration reads models with .load alone.
    if name == "import_onnx":
        from .lift import import_onnx

        return import_onnx
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
