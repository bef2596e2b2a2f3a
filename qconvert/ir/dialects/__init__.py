"""Op definitions, one module per MLIR dialect; importing this package registers them all."""

from qconvert.ir.dialects import arith, builtin, func, linalg, math, qconvert, quant, shape, tensor

__all__ = ["arith", "builtin", "func", "linalg", "math", "qconvert", "quant", "shape", "tensor"]
