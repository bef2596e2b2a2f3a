"""Runs real upstream MLIR (torch-mlir's Python bindings) on jobs read from stdin, one JSON line out per job.

A separate process because upstream MLIR can crash on generated input (it dies with SIGSEGV on a
sub-channel type with float storage): `harness.MlirOracle` restarts it after the job that killed it.

Input: one JSON list of jobs `{"text": ..., "pipelines": [pipeline, ...]}`. Output, one line per job:
`{"parse": outcome, "pipelines": [outcome, ...]}` where an outcome is
`{"ok": bool, "text": str | null, "errors": [[message, line, column], ...], "notes": [message, ...]}`.
Every pipeline runs on a fresh parse of the job's text; mlir's PassManager verifies its output.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

from torch_mlir import ir, passmanager

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


def run(context: ir.Context, text: str, pipeline: str | None) -> dict[str, Any]:
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
    for number, job in enumerate(jobs):
        if number % 500 == 499:  # keep the uniquer's memory bounded
            context = ir.Context()
            context.allow_unregistered_dialects = True
        parsed = run(context, job["text"], None)
        pipelines = job.get("pipelines", ()) if parsed["ok"] else ()
        result = {"parse": parsed, "pipelines": [run(context, job["text"], p) for p in pipelines]}
        sys.stdout.write(json.dumps(result) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
