"""TOSA backend (issue 19): integer-only TOSA 1.0 lowered from StableHLO's quantized form (convert.py,
legalize_quant.py, legalize.py, ops.py), `qconvert convert MODEL --to tosa`; and its engines: the TOSA
reference model and tosa-opt, run from tosa-tools' own virtual environment (run.py).

    from qconvert.backends.tosa import TosaOptions, convert_to_tosa, write_tosa
    tosa_module = convert_to_tosa(module, TosaOptions(rounding="single"))   # storage integers in and out

    from qconvert.backends.tosa import run_reference, validate, tosa_python
    (y,) = run_reference(mlir_text, [x])        # TOSA MLIR text on the reference model
    validate(mlir_text, profiles=("pro_int",))  # '' or tosa-opt's diagnostics

TOSA's integer arithmetic (RESCALE, TABLE, ...) is `qconvert.numerics.tosa`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qconvert.backends import lazy_exports

if TYPE_CHECKING:
    from .backend import BACKEND, TosaBackend
    from .conformance import ConformanceCase, generate_conformance, load_conformance, run_generator
    from .convert import QUANT_TYPE, convert_to_tosa, write_tosa
    from .emulate import SUPPORTED_OPS, emulate_module, emulate_tosa, parse_tosa
    from .iree import IREE_PACKAGES, compile_iree, iree_available, run_iree
    from .options import TosaOptions
    from .run import (
        TOSA_PYTHON_ENV,
        TOSA_TOOLS_VERSION,
        EngineError,
        GraphDescription,
        ReferenceJob,
        ReferenceResult,
        describe_flatbuffers,
        deserialize,
        missing_message,
        require_tosa_python,
        run_reference,
        run_reference_jobs,
        serialize,
        tosa_python,
        tosa_tool,
        validate,
    )
    from .samples import SampleGraph, sample_graphs

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
        "deserialize",
        "missing_message",
        "require_tosa_python",
        "run_reference",
        "run_reference_jobs",
        "serialize",
        "tosa_python",
        "tosa_tool",
        "validate",
    )
}
_EXPORTS.update(
    {name: ("emulate", name) for name in ("SUPPORTED_OPS", "emulate_module", "emulate_tosa", "parse_tosa")}
)
_EXPORTS.update(
    {name: ("iree", name) for name in ("IREE_PACKAGES", "compile_iree", "iree_available", "run_iree")}
)
_EXPORTS.update({name: ("samples", name) for name in ("SampleGraph", "sample_graphs")})
_EXPORTS.update({name: ("backend", name) for name in ("BACKEND", "TosaBackend")})
_EXPORTS["TosaOptions"] = ("options", "TosaOptions")
_EXPORTS.update({name: ("convert", name) for name in ("QUANT_TYPE", "convert_to_tosa", "write_tosa")})
_EXPORTS.update(
    {
        name: ("conformance", name)
        for name in ("ConformanceCase", "generate_conformance", "load_conformance", "run_generator")
    }
)

__all__ = [
    "BACKEND",
    "ConformanceCase",
    "EngineError",
    "GraphDescription",
    "IREE_PACKAGES",
    "QUANT_TYPE",
    "ReferenceJob",
    "ReferenceResult",
    "SUPPORTED_OPS",
    "SampleGraph",
    "TOSA_PYTHON_ENV",
    "TOSA_TOOLS_VERSION",
    "TosaBackend",
    "TosaOptions",
    "compile_iree",
    "convert_to_tosa",
    "describe_flatbuffers",
    "deserialize",
    "emulate_module",
    "emulate_tosa",
    "generate_conformance",
    "iree_available",
    "load_conformance",
    "missing_message",
    "parse_tosa",
    "require_tosa_python",
    "run_generator",
    "run_iree",
    "run_reference",
    "run_reference_jobs",
    "sample_graphs",
    "serialize",
    "tosa_python",
    "tosa_tool",
    "validate",
    "write_tosa",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)
