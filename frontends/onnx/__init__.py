"""ONNX frontend: lifts ONNX graphs (float or QDQ) into the qconvert IR (see lift.py for the mapping)."""

from .lift import import_onnx

__all__ = ["import_onnx"]
