"""Runs the same text through upstream MLIR (a worker process) and through qconvert, and compares.

An `Outcome` is what one side did with a text: accepted it (and printed it) or rejected it (with the error
messages and their line:column). A `Comparison` pairs the two and names the way they differ, and
`report` groups differences into classes (by message template) with the shortest input of each class.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import traceback
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

WORKER = Path(__file__).with_name("mlir_worker.py")

# qconvert pass name -> the pipeline that runs the same pass in mlir-opt (anchors as upstream registers them).
PIPELINES = {
    "lower-quant-ops": "builtin.module(func.func(lower-quant-ops))",
    "normalize-quant-types": "builtin.module(func.func(normalize-quant-types))",
    "strip-func-quant-types": "builtin.module(strip-func-quant-types)",
}

Diag = tuple[str, int | None, int | None]


@dataclass(frozen=True)
class Outcome:
    ok: bool
    text: str | None = None
    errors: tuple[Diag, ...] = ()
    notes: tuple[str, ...] = ()
    crashed: bool = False  # MLIR died, or qconvert raised something other than a QConvertError

    @property
    def messages(self) -> tuple[str, ...]:
        return tuple(message for message, _, _ in self.errors)

    @property
    def locations(self) -> tuple[tuple[int | None, int | None], ...]:
        return tuple((line, column) for _, line, column in self.errors)

    def describe(self) -> str:
        if self.ok:
            return f"accepted:\n{self.text}"
        what = "CRASHED" if self.crashed else "rejected"
        lines = [f"  {line}:{column}: {message}" for message, line, column in self.errors]
        lines += [f"  note: {note}" for note in self.notes]
        return f"{what}:\n" + "\n".join(lines)

    @staticmethod
    def from_json(data: dict) -> Outcome:
        return Outcome(
            ok=data["ok"],
            text=data["text"],
            errors=tuple((m, line, column) for m, line, column in data["errors"]),
            notes=tuple(data["notes"]),
        )


# -------------------------------------------------------------------------------------------------------
# Upstream MLIR


class MlirOracle:
    """Feeds jobs to `mlir_worker.py`; a job that kills the worker becomes a `crashed` outcome."""

    def __init__(self, bindings: str = "torch_mlir", python: str = sys.executable) -> None:
        self.bindings = bindings
        self.python = python
        self.restarts = 0

    def run(self, jobs: Sequence[tuple[str, str | None]]) -> list[Outcome]:
        """For each (text, pass name or None): the outcome of parsing (and running that pass)."""
        results: list[Outcome] = []
        while len(results) < len(jobs):
            pending = jobs[len(results) :]
            payload = [[text, PIPELINES[name] if name else None] for text, name in pending]
            process = subprocess.run(
                [self.python, str(WORKER), self.bindings],
                input=json.dumps(payload),
                capture_output=True,
                text=True,
                check=False,
            )
            results += [Outcome.from_json(json.loads(line)) for line in process.stdout.splitlines()]
            if process.returncode != 0 and len(results) < len(jobs):
                if not process.stdout and "Traceback" in process.stderr:  # the worker itself is broken
                    raise RuntimeError(f"MLIR worker failed:\n{process.stderr[-3000:]}")
                message = f"MLIR crashed (exit code {process.returncode})"
                results.append(Outcome(ok=False, errors=((message, None, None),), crashed=True))
                self.restarts += 1
        return results


# Inputs on which upstream MLIR (torch-mlir 20261001) dies with SIGSEGV, so they are not sent to it: one
# regex per pass (None: parsing). `test_known_upstream_crashes` checks that each still crashes.
KNOWN_CRASHES: dict[str | None, dict[str, re.Pattern[str]]] = {
    None: {
        "sub-channel type with float storage": re.compile(r"!quant\.uniform<f\w+(<[^>]*>)?:\w+:\{"),
    },
    "lower-quant-ops": {
        "quant cast of !quant.any or !quant.calibrated": re.compile(r"!quant\.(any|calibrated)"),
        "si/ui/float storage with explicit bounds": re.compile(r"!quant\.uniform<(si|ui|f)\w+<"),
    },
    "strip-func-quant-types": {
        "!quant.calibrated in a signature": re.compile(r"!quant\.calibrated"),
    },
}


def known_crash(text: str, pass_name: str | None) -> str | None:
    """Why upstream MLIR would crash on this job (and so it is not run), or None."""
    for stage in (None, pass_name) if pass_name else (None,):
        for reason, pattern in KNOWN_CRASHES.get(stage, {}).items():
            if pattern.search(text):
                return reason
    return None


# -------------------------------------------------------------------------------------------------------
# qconvert


def ours_failure(error: Exception) -> Outcome:
    from qconvert.errors import QConvertError

    if isinstance(error, QConvertError):
        errors = tuple(
            (d.message, d.loc.line if d.loc else None, d.loc.column if d.loc else None)
            for d in error.diagnostics()
            if d.severity == "error"
        )
        notes = tuple(d.message for d in error.diagnostics() if d.severity == "note")
        return Outcome(ok=False, errors=errors, notes=notes)
    last = traceback.extract_tb(error.__traceback__)[-1]
    where = f"{Path(last.filename).name}:{last.lineno}"
    return Outcome(
        ok=False, errors=((f"{type(error).__name__} at {where}: {error}", None, None),), crashed=True
    )


def ours_parse(text: str) -> Outcome:
    from qconvert.ir.parser import ParserOptions, parse_module
    from qconvert.ir.printer import print_module
    from qconvert.ir.verify import verify

    try:
        module = parse_module(text, "-", options=ParserOptions(allow_unregistered_dialect=True))
        verify(module)
        return Outcome(ok=True, text=print_module(module))
    except Exception as error:
        return ours_failure(error)


def ours_pass(text: str, pass_name: str) -> Outcome:
    from qconvert.ir.parser import ParserOptions, parse_module
    from qconvert.ir.printer import print_module
    from qconvert.ir.verify import verify
    from qconvert.passes import get_pass

    try:
        module = parse_module(text, "-", options=ParserOptions(allow_unregistered_dialect=True))
        verify(module)
        get_pass(pass_name).run(module)
        verify(module)
        return Outcome(ok=True, text=print_module(module))
    except Exception as error:
        return ours_failure(error)


def pass_unavailable(pass_name: str) -> str | None:
    """Why qconvert cannot run `pass_name` at all (not implemented yet), or None when it can."""
    from qconvert.passes import get_pass

    try:
        get_pass(pass_name)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


# -------------------------------------------------------------------------------------------------------
# Comparison


@dataclass
class Comparison:
    category: str
    text: str  # the whole input given to both sides
    mlir: Outcome
    ours: Outcome
    subject: str = ""  # the generated part (a type text), for reports

    @property
    def verdict(self) -> str:
        if self.mlir.crashed:
            return "mlir-crashed"
        if self.ours.crashed:
            return "ours-crashed"
        if self.mlir.ok and self.ours.ok:
            return "same-text" if self.mlir.text == self.ours.text else "text-differs"
        if self.mlir.ok:
            return "mlir-accepts-ours-rejects"
        if self.ours.ok:
            return "mlir-rejects-ours-accepts"
        return "both-reject"

    @property
    def agrees(self) -> bool:
        """Same validity and, when valid, the same text (a crash of qconvert never agrees)."""
        return self.verdict in ("same-text", "both-reject")

    @property
    def messages_equal(self) -> bool:
        return self.mlir.messages == self.ours.messages

    @property
    def locations_equal(self) -> bool:
        return self.mlir.locations == self.ours.locations

    def describe(self) -> str:
        return (
            f"[{self.category}] {self.verdict}\n--- input:\n{self.text.rstrip()}\n"
            f"--- MLIR {self.mlir.describe().rstrip()}\n--- qconvert {self.ours.describe().rstrip()}"
        )


NUMBER = re.compile(r"-?(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|INF|NaN|nan|inf)")
QUOTED = re.compile(r"'[^']*'")


def template(message: str) -> str:
    """A message with its numbers and quoted types replaced: the class a message belongs to."""
    text = QUOTED.sub("'T'", message)
    return NUMBER.sub("N", text)


def mismatch_class(comparison: Comparison) -> str:
    """The class a disagreement belongs to, for grouping reports."""
    verdict = comparison.verdict
    if verdict == "mlir-rejects-ours-accepts":
        return f"{verdict}: MLIR says {template(comparison.mlir.messages[-1])!r}"
    if verdict == "mlir-accepts-ours-rejects":
        return f"{verdict}: ours says {template(comparison.ours.messages[-1])!r}"
    if verdict == "ours-crashed":
        return f"{verdict}: {comparison.ours.messages[-1].split(':')[0]}"
    if verdict in ("both-reject", "same-text"):
        mlir = " | ".join(template(m) for m in comparison.mlir.messages)
        ours = " | ".join(template(m) for m in comparison.ours.messages)
        if mlir != ours:
            return f"message: MLIR {mlir!r} vs ours {ours!r}"
        return f"location: MLIR {comparison.mlir.locations} vs ours {comparison.ours.locations} for {mlir!r}"
    if verdict == "text-differs":
        return f"{verdict}: {first_difference(comparison.mlir.text or '', comparison.ours.text or '')}"
    return f"{verdict}: [{comparison.category}]"


def first_difference(mlir: str, ours: str) -> str:
    """Where two printed modules first differ: the 3 characters from there on each side, digits as N."""
    for upstream, own in zip([*mlir.splitlines(), ""], [*ours.splitlines(), ""]):
        if upstream != own:
            start = next(
                (i for i, (a, b) in enumerate(zip(upstream, own)) if a != b), min(len(upstream), len(own))
            )
            cut = slice(start, start + 3)
            return (
                f"MLIR {re.sub(r'[0-9]+', 'N', upstream[cut])!r} vs ours {re.sub(r'[0-9]+', 'N', own[cut])!r}"
            )
    return "(same lines)"


@dataclass
class Report:
    title: str
    classes: dict[str, list[Comparison]] = field(default_factory=lambda: defaultdict(list))

    def add(self, comparison: Comparison) -> None:
        self.classes[mismatch_class(comparison)].append(comparison)

    def __bool__(self) -> bool:
        return bool(self.classes)

    def render(self, examples: int = 1, limit: int = 40) -> str:
        lines = [
            f"{self.title}: {sum(map(len, self.classes.values()))} mismatches in {len(self.classes)} classes"
        ]
        ordered = sorted(self.classes.items(), key=lambda item: -len(item[1]))
        for name, members in ordered[:limit]:
            lines.append(f"\n=== {len(members)}x {name}")
            for comparison in sorted(members, key=lambda c: len(c.text))[:examples]:
                lines.append(comparison.describe())
        if len(ordered) > limit:
            lines.append(f"\n... and {len(ordered) - limit} more classes")
        return "\n".join(lines)


def collect(title: str, comparisons: Iterable[Comparison], wrong: Callable[[Comparison], bool]) -> Report:
    report = Report(title)
    for comparison in comparisons:
        if wrong(comparison):
            report.add(comparison)
    return report
