"""What the corpus tests and `status.py` run on each corpus model, and how an outcome is judged.

Five operations per entry, through qconvert's Python API, shapes pinned from the entry's inputs `.npz` (as a
user passes `--input-shape` for a model exported with dynamic axes):

- `convert:quantized`, `convert:integer`, `convert:qdq`: `qconvert.convert.convert(..., to="stablehlo",
  form=...)` and printing the module; ok when both succeed;
- `check:interpreter`: `qconvert.check.check(model, inputs)`;
- `check:xla`: `qconvert.check.check(model, inputs, backend="stablehlo", engine="xla")`.

A check is ok only when every node and every output ran (nothing "not run"), nothing failed (per node, and
end to end by the report's own noise-floor rule), the report itself passed, and, as a guard independent of
that rule, each output's SQNR against onnxruntime is at least `min(floor, FLOOR_CAP_DB) - FLOOR_MARGIN_DB`
(the floor: onnxruntime optimized against itself unoptimized). A float op computed wrong, like
BatchNormalization's training-mode formula at 19 dB against a 115 dB floor, fails both.
"""

from __future__ import annotations

import io
import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

OPERATIONS = ("convert:quantized", "convert:integer", "convert:qdq", "check:interpreter", "check:xla")
FLOOR_CAP_DB = 60.0  # a floor above this (or exact) asks for no more than 60 - 20 = 40 dB
FLOOR_MARGIN_DB = 20.0
REASON_LENGTH = 110


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    reason: str  # "" when ok; otherwise one short line
    seconds: float


def input_shapes(inputs_path: Path) -> dict[str, tuple[int, ...]]:
    with np.load(inputs_path) as data:
        return {name: tuple(int(d) for d in data[name].shape) for name in data.files}


def short(text: str, length: int = REASON_LENGTH) -> str:
    """One line: the first non-empty line of `text`, with the following lines' gist, cut to `length`."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = " | ".join(lines[:3]) if lines else "(no message)"
    line = line.removeprefix("error: ")
    return line if len(line) <= length else line[: length - 1] + "…"


def run_convert(model: Path, inputs: Path, form: str) -> None:
    from qconvert.convert import convert, write

    module = convert(str(model), to="stablehlo", form=form, input_shapes=input_shapes(inputs))
    write(module, io.StringIO())


def run_check(model: Path, inputs: Path, backend: str) -> Any:
    from qconvert.check import check

    if backend == "xla":
        return check(str(model), str(inputs), backend="stablehlo", engine="xla")
    return check(str(model), str(inputs))


def judge_report(report: Any) -> str:
    """'' when the report is a full pass within the noise floor; otherwise the first problem, short."""
    problems: list[str] = []
    not_run = [layer for layer in report.layers.values() if layer.verdict == "not run"]
    if not_run:
        ops = Counter(layer.op_type for layer in not_run)
        first = not_run[0]
        problems.append(
            f"{len(not_run)} node(s) not run ({', '.join(f'{op} x{n}' for op, n in ops.most_common(3))}): "
            f"{first.reason or '?'}"
        )
    failed = [layer for layer in report.layers.values() if layer.verdict == "fail"]
    if failed:
        ops = Counter(layer.op_type for layer in failed)
        problems.append(
            f"{len(failed)} node(s) failed ({', '.join(f'{op} x{n}' for op, n in ops.most_common(3))})"
        )
    for name, output in report.outputs.items():
        if output.ours is None:
            problems.append(f"output {name} not run: {output.reason or '?'}")
            continue
        floor = output.noise_floor.sqnr_db if output.noise_floor is not None else math.inf
        needed = min(floor, FLOOR_CAP_DB) - FLOOR_MARGIN_DB
        # near-tie quantization flips, replayed in lockstep by check (qconvert/check/lockstep.py): the
        # replay, which differs from ours only by those flips, must meet the floor instead
        judged = output.lockstep if output.lockstep is not None and output.tie_flips else output.ours
        sqnr = judged.sqnr_db
        if math.isnan(sqnr) or sqnr < needed:
            problems.append(f"output {name}: SQNR {sqnr:.1f} dB, floor {floor:.1f} dB (needs {needed:.0f})")
        elif output.verdict == "fail":
            problems.append(f"output {name} failed: {', '.join(getattr(output, 'failures', []) or ['?'])}")
    if not problems and not report.passed:
        problems.append("the report did not pass")
    return short(problems[0]) if problems else ""


def run_operation(model: Path, inputs: Path, operation: str) -> Outcome:
    """Run one operation on one corpus model; never raises (a crash is an outcome, with its type)."""
    kind, variant = operation.split(":")
    started = time.perf_counter()
    try:
        if kind == "convert":
            run_convert(model, inputs, variant)
            reason = ""
        else:
            reason = judge_report(run_check(model, inputs, variant))
    except Exception as error:  # every failure is data for the matrix
        name = type(error).__name__
        reason = short(str(error)) if name == "InputError" else short(f"{name}: {error}")
    return Outcome(not reason, reason, time.perf_counter() - started)
