"""Shared test helpers. NOTE: engine tests skip where an engine is missing, and fail instead in CI.

`.ci/run` exports QCONVERT_REQUIRE_ENGINES=1, so a test that needs jaxlib, IREE or torch-mlir runs there
or fails; it never passes silently by skipping. Use it as:

    from conftest import require_module
    ir = require_module("torch_mlir.ir")
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

import pytest

REQUIRE_ENGINES_ENV = "QCONVERT_REQUIRE_ENGINES"


def engines_required() -> bool:
    """True when a missing engine must fail the test instead of skipping it (set by .ci/run)."""
    return os.environ.get(REQUIRE_ENGINES_ENV, "") not in ("", "0")


def require_module(name: str) -> ModuleType:
    """Import `name`, or skip the calling test with the reason; fail instead under QCONVERT_REQUIRE_ENGINES=1.

    Only a missing module (ImportError) skips: any other error while importing is a real failure.
    """
    try:
        return importlib.import_module(name)
    except ImportError as e:
        reason = f"module {name!r} is not importable ({e})"
        if engines_required():
            pytest.fail(f"{reason}, and {REQUIRE_ENGINES_ENV}=1 requires every engine", pytrace=False)
        pytest.skip(reason)


def require_tosa_python() -> None:
    """Skip the calling test unless tosa-tools' own environment exists (the TOSA reference model, tosa-opt);
    fail instead under QCONVERT_REQUIRE_ENGINES=1. See qconvert.backends.tosa for where it is looked for."""
    from qconvert.backends.tosa import missing_message, tosa_python

    if tosa_python() is not None:
        return
    reason = missing_message()
    if engines_required():
        pytest.fail(f"{reason}, and {REQUIRE_ENGINES_ENV}=1 requires every engine", pytrace=False)
    pytest.skip(reason)


def _status_bytes(field: str) -> int:
    """A `/proc/self/status` memory field (`VmRSS`; `VmHWM`, the peak since the last reset), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/self/status")


def reset_peak_memory() -> int:
    """Reset this process's high-water mark (`clear_refs` 5) and return its resident size now: in a full run
    pytest has peaked at gigabytes before a module starts, and ru_maxrss never goes down."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_bytes("VmRSS")


def peak_memory() -> int:
    """This process's peak resident size since the last `reset_peak_memory`, in bytes."""
    return _status_bytes("VmHWM")
