"""StableHLO backend: lower the IR to StableHLO text (quantized, integer or qdq form), run it via jaxlib.

The public face of the backend; other packages (and a backend that builds on this one) import only these
names, never a module of this package:

    from qconvert.backends.stablehlo import convert_to_stablehlo, run_stablehlo, write_stablehlo
    converted = convert_to_stablehlo(module, Form.INTEGER, Semantics.ONNX, inline_weights=True)
    outputs = run_stablehlo(print_module(converted), [x], engine="xla")

`BACKEND` is the object `qconvert.backends` registers (options, convert, write, check runner). Importing
the package is cheap: each name loads its module on first use (jax only with the runner). `run` is
the runner's module (run.py), so its `run` function is exported as `run_stablehlo`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qconvert.backends import lazy_exports

if TYPE_CHECKING:
    from .backend import BACKEND, StableHLOBackend, StableHLOOptions
    from .check import StableHLOCheckRunner
    from .convert import (
        Conversion,
        ConversionStats,
        convert_to_stablehlo,
        convert_with_stats,
        elide_weights,
        stablehlo_lowerings,
        stablehlo_text,
        write_stablehlo,
    )
    from .dimension_numbers import ConvDimensionNumbers, DotDimensionNumbers
    from .engine_profile import JAXLIB, EngineProfile
    from .forms import ENGINE_NAMES, Form, Semantics
    from .lower_quant import predicted_mismatches
    from .run import EngineError, legalize_quant_to_math, verify
    from .run import run as run_stablehlo

# Public name -> (module of this package, its name there).
_EXPORTS: dict[str, tuple[str, str]] = {
    "BACKEND": ("backend", "BACKEND"),
    "ENGINE_NAMES": ("forms", "ENGINE_NAMES"),
    "StableHLOBackend": ("backend", "StableHLOBackend"),
    "StableHLOOptions": ("backend", "StableHLOOptions"),
    "StableHLOCheckRunner": ("check", "StableHLOCheckRunner"),
    "ConvDimensionNumbers": ("dimension_numbers", "ConvDimensionNumbers"),
    "DotDimensionNumbers": ("dimension_numbers", "DotDimensionNumbers"),
    "EngineProfile": ("engine_profile", "EngineProfile"),
    "JAXLIB": ("engine_profile", "JAXLIB"),
    "Conversion": ("convert", "Conversion"),
    "ConversionStats": ("convert", "ConversionStats"),
    "convert_to_stablehlo": ("convert", "convert_to_stablehlo"),
    "convert_with_stats": ("convert", "convert_with_stats"),
    "elide_weights": ("convert", "elide_weights"),
    "stablehlo_lowerings": ("convert", "stablehlo_lowerings"),
    "stablehlo_text": ("convert", "stablehlo_text"),
    "write_stablehlo": ("convert", "write_stablehlo"),
    "Form": ("forms", "Form"),
    "Semantics": ("forms", "Semantics"),
    "predicted_mismatches": ("lower_quant", "predicted_mismatches"),
    "EngineError": ("run", "EngineError"),
    "legalize_quant_to_math": ("run", "legalize_quant_to_math"),
    "run_stablehlo": ("run", "run"),
    "verify": ("run", "verify"),
}

__all__ = [
    "BACKEND",
    "ConvDimensionNumbers",
    "Conversion",
    "ConversionStats",
    "DotDimensionNumbers",
    "ENGINE_NAMES",
    "EngineError",
    "EngineProfile",
    "Form",
    "JAXLIB",
    "Semantics",
    "StableHLOBackend",
    "StableHLOCheckRunner",
    "StableHLOOptions",
    "convert_to_stablehlo",
    "convert_with_stats",
    "elide_weights",
    "legalize_quant_to_math",
    "predicted_mismatches",
    "run_stablehlo",
    "stablehlo_lowerings",
    "stablehlo_text",
    "verify",
    "write_stablehlo",
]


# A submodule's name (`run`, `ops`) is not an export: `from . import run` still finds the module.
__getattr__ = lazy_exports(__name__, _EXPORTS)
