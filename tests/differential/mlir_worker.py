"""Runs real upstream MLIR (torch-mlir's Python bindings) on jobs read from stdin, one JSON line out per job.

A separate process because upstream MLIR can crash on valid input (SIGSEGV: a sub-channel type with float
storage, `lower-quant-ops` on `!quant.any`, ...): `harness.MlirOracle` restarts it after the job that
killed it and records that job as crashed.

Usage: `python mlir_worker.py [torch_mlir | iree.compiler]` (whose MLIR Python bindings to use).
Input: one JSON list of jobs `[text, pipeline or null]`. Output, one line per job: an outcome
`{"ok": bool, "text": str | null, "errors": [[message, line, column], ...], "notes": [message, ...]}`.
A job parses its text (which verifies it) and runs the pipeline, if any, with MLIR's PassManager, which
verifies the result.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from typing import Any

# The Python package whose `ir` and `passmanager` modules to use: torch_mlir (default) or iree.compiler.
BINDINGS = sys.argv[1] if len(sys.argv) > 1 else "torch_mlir"
ir = importlib.import_module(f"{BINDINGS}.ir")
passmanager = importlib.import_module(f"{BINDINGS}.passmanager")

LOCATION = re.compile(r'loc\("[^"]*":(\d+):(\d+)\)')


def failure(error: Exception) -> dict[str, Any]:
    errors: list[list[Any]] = []
    notes: list[str] = []
    diagnostics = getattr(error, "error_diagnostics", None)
    if not diagnostics:  # not an MLIRError with diagnostics: keep its text
        return {"ok": False, "text": None, "errors": [[str(error), None, None]], "notes": []}
    for diagnostic in diagnostics:
        match = LOCATION.search(str(diagnostic.location))
        line, column = (int(match.group(1)), int(match.group(2))) if match else (None, None)
        errors.append([diagnostic.message, line, column])
        notes += [note.message for note in diagnostic.notes]
    return {"ok": False, "text": None, "errors": errors, "notes": notes}


def run(context: Any, text: str, pipeline: str | None) -> dict[str, Any]:
    with context:
        try:
            module = ir.Module.parse(text)
            if pipeline is not None:
                passmanager.PassManager.parse(pipeline).run(module.operation)
            return {"ok": True, "text": str(module), "errors": [], "notes": []}
        except Exception as error:  # MLIRError (parse, verify, pass failure) or a bindings error
            return failure(error)


def main() -> None:
    jobs = json.load(sys.stdin)
    context = ir.Context()
    context.allow_unregistered_dialects = True
    for number, (text, pipeline) in enumerate(jobs):
        if number % 1000 == 999:  # keep the type uniquer's memory bounded
            context = ir.Context()
            context.allow_unregistered_dialects = True
        sys.stdout.write(json.dumps(run(context, text, pipeline)) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
