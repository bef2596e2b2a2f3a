"""TOSA backend (issue 19), so far its engines: the TOSA reference model and tosa-opt, run from tosa-tools'
own virtual environment (run.py). Not yet a registered backend: `--to tosa` comes with the lowering.

    from qconvert.backends.tosa import run_reference, validate, tosa_python
    (y,) = run_reference(mlir_text, [x])        # TOSA MLIR text on the reference model
    validate(mlir_text, profiles=("pro_int",))  # '' or tosa-opt's diagnostics

TOSA's integer arithmetic (RESCALE, TABLE, ...) is `qconvert.numerics.tosa`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .run import (
        TOSA_PYTHON_ENV,
        TOSA_TOOLS_VERSION,
        EngineError,
        GraphDescription,
        ReferenceJob,
        ReferenceResult,
        describe_flatbuffers,
        missing_message,
        require_tosa_python,
        run_reference,
        run_reference_jobs,
        tosa_python,
        tosa_tool,
        validate,
    )

# Public name -> (module of this package, its name there); loaded on first use.
_EXPORTS: dict[str, tuple[str, str]] = {
    name: ("run", name)
    for name in (
        "TOSA_PYTHON_ENV",
        "TOSA_TOOLS_VERSION",
        "EngineError",
        "GraphDescription",
        "ReferenceJob",
        "ReferenceResult",
        "describe_flatbuffers",
        "missing_message",
        "require_tosa_python",
        "run_reference",
        "run_reference_jobs",
        "tosa_python",
        "tosa_tool",
        "validate",
    )
}

__all__ = [
    "TOSA_PYTHON_ENV",
    "TOSA_TOOLS_VERSION",
    "EngineError",
    "GraphDescription",
    "ReferenceJob",
    "ReferenceResult",
    "describe_flatbuffers",
    "missing_message",
    "require_tosa_python",
    "run_reference",
    "run_reference_jobs",
    "tosa_python",
    "tosa_tool",
    "validate",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
