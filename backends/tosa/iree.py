"""Compile TOSA MLIR text with IREE (`iree-base-compiler`, input type tosa, llvm-cpu) in process and run it
with `iree-base-runtime`: the second engine of the TOSA backend, beside the reference model (run.py).

    from qconvert.backends.tosa import compile_iree, run_iree
    (y,) = run_iree(mlir_text, [x])                 # compile and run @main
    binary = compile_iree(mlir_text)                # the .vmfb, to run many inputs: run_iree(binary, [x])
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType

import numpy as np

from qconvert.errors import InputError

from .run import EngineError

__all__ = ["IREE_PACKAGES", "compile_iree", "iree_available", "run_iree"]

IREE_PACKAGES = "iree-base-compiler iree-base-runtime"
# The host's own CPU features: the binary runs only here, which is what a check wants.
_COMPILE_FLAGS = ("--iree-llvmcpu-target-cpu=host",)


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise InputError(
            f"running TOSA on IREE needs the Python packages {IREE_PACKAGES} (pip install {IREE_PACKAGES}); "
            f"{name} is not importable"
        ) from None


def iree_available() -> bool:
    """Whether IREE's compiler and runtime are importable."""
    try:
        importlib.import_module("iree.compiler")
        importlib.import_module("iree.runtime")
    except ImportError:
        return False
    return True


def compile_iree(mlir: str) -> bytes:
    """The llvm-cpu VM flatbuffer of TOSA MLIR text; EngineError with IREE's diagnostics when it refuses."""
    compiler = _import("iree.compiler")
    try:
        return bytes(
            compiler.compile_str(
                mlir, target_backends=["llvm-cpu"], input_type="tosa", extra_args=list(_COMPILE_FLAGS)
            )
        )
    except compiler.CompilerToolError as error:
        raise EngineError(f"iree-compile refused the TOSA module:\n{str(error)[-4000:]}") from None


def run_iree(
    module: str | bytes, inputs: Sequence[np.ndarray], function: str = "main"
) -> tuple[np.ndarray, ...]:
    """Outputs of `function` of TOSA text (compiled first) or of a binary from `compile_iree`, on `inputs`."""
    runtime = _import("iree.runtime")
    binary = compile_iree(module) if isinstance(module, str) else module
    context = runtime.SystemContext(config=runtime.Config("local-task"))
    context.add_vm_module(runtime.VmModule.copy_buffer(context.instance, binary))
    try:
        entry = context.modules.module[function]
    except KeyError:
        raise InputError(f"the TOSA module compiled by IREE has no function @{function}") from None
    try:
        # reshaped: numpy's ascontiguousarray makes a 0-d array 1-d, which IREE refuses for a scalar input
        results = entry(*[np.ascontiguousarray(array).reshape(np.shape(array)) for array in inputs])
    except (RuntimeError, ValueError) as error:
        raise EngineError(f"IREE failed to run @{function}: {error}") from None
    results = results if isinstance(results, tuple | list) else [results]
    # Copies: to_host() may map the device buffer, which goes with `context` when this returns.
    return tuple(np.array(result.to_host(), copy=True) for result in results)
