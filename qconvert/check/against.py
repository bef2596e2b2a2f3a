"""`qconvert check OUT.onnx --against MODEL`: a stripped model (`--to onnx-storage`) against its source.

Both run in onnxruntime on the same data. The source model takes the float inputs, the stripped model
`qconvert.storage.quantize_inputs` of them (ONNX's QuantizeLinear rule, `qconvert.numerics`). The source
also returns, as extra graph outputs, the values its final DequantizeLinear nodes read (the storage that
each stripped output must equal) and what the QuantizeLinear of each stripped input computed. Compared:

- `input`: each stripped input's storage (quantize_inputs) against the source's QuantizeLinear output,
  bit-exact (onnxruntime optimizations off, the spec oracle): the input's metadata is right;
- `storage`: each stripped output against the storage the source's final DequantizeLinear read, bit-exact;
- `dequantized`: `dequantize_outputs` of each stripped output against the source's float output, exactly
  (`--form qdq`): the output's metadata is right;
- `float`: each output left float against the source's, exactly;
- for `--form qdq`, at onnxruntime optimizations off and on (both models at the same level each time).

A `--form qoperator` model (QLinear* / QGemm ... ops the source does not have; detected) is compared
bit-exactly only against the source under optimizations on, where onnxruntime fuses the source's Q/DQ into
its own QLinear kernels (off, the source runs float DequantizeLinear -> op -> QuantizeLinear, which integer
kernels do not reproduce bit for bit); and end to end (`end to end`): dequantize_outputs of the stripped
model (float outputs as they are) against the source's float outputs with optimizations off, judged by
check's noise-floor rule (report.py's module NOTE; the floor is the source optimized against unoptimized).

Verdict as check's: PASSED only when every comparison ran and passed; INCOMPLETE when one could not run
(an output the stripped model lacks, a model onnxruntime cannot load or run at one optimization level);
FAILED when any failed. Each comparison counts its mismatches over every batch, with the first differing
index. int4 / uint4 storage is fed and read as packed OrtValues (ort_values.py).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import ModelProto

from qconvert.atomic_file import atomic_text_file
from qconvert.calibrate.dataset import DataSource
from qconvert.check.feeds import Feed, model_feeds
from qconvert.check.oracle import graph_inputs, ort_session
from qconvert.check.ort_values import run_values
from qconvert.check.report import (
    FAIL,
    FAILED,
    INCOMPLETE,
    NOT_RUN,
    PASS,
    PASSED,
    Comparison,
    OutputResult,
    compare,
)
from qconvert.errors import InputError
from qconvert.ir.dialects.qconvert import QOPERATOR_OPS
from qconvert.numerics import broadcast_params
from qconvert.storage import StorageBoundary

BIT_EXACT, NOISE_FLOOR = "bit-exact", "noise floor"
OFF, ON = "off", "on"  # onnxruntime graph optimizations: disabled / all
FORMS = ("qdq", "qoperator")
# Ops of a --form qoperator model: the qconvert dialect's QOperator ops, by their ONNX op types.
QOPERATOR_OP_TYPES = frozenset(op.ONNX_OP_TYPE for op in QOPERATOR_OPS)


@dataclass(frozen=True, slots=True)
class Difference:
    """Where a comparison first differed: the batch, the element's index in it, both values."""

    batch: int
    index: tuple[int, ...]
    ours: float | int
    reference: float | int

    def shown(self) -> str:
        where = f"batch {self.batch} index {list(self.index)}"
        return f"{where}: {self.ours} (stripped) vs {self.reference} (source)"


@dataclass(slots=True, kw_only=True)
class AgainstResult:
    """One comparison of one boundary value: what (`input`, `storage`, `dequantized`, `float`, `end to end`),
    at which onnxruntime optimization level, judged how; merged over every batch."""

    name: str
    what: str
    level: str
    judged: str
    comparison: Comparison | None = None
    floor: Comparison | None = None  # noise floor comparisons: the source optimized against unoptimized
    mismatches: int = 0  # bitwise, for bit-exact comparisons
    first: Difference | None = None
    reason: str | None = None  # why it was not run, or why it cannot be compared (shapes, dtypes)

    @property
    def failure(self) -> str | None:
        if self.comparison is None:
            return None
        if not self.comparison.comparable:
            return self.reason or "shapes or dtypes differ"
        if self.judged == BIT_EXACT:
            if not self.mismatches:
                return None
            where = f", first at {self.first.shown()}" if self.first is not None else ""
            return f"{self.mismatches}/{self.comparison.elements} elements differ{where}"
        result = OutputResult(name=self.name, ours=self.comparison, noise_floor=self.floor)
        return result.floor_failure

    @property
    def verdict(self) -> str:
        if self.comparison is None:
            return NOT_RUN
        return FAIL if self.failure else PASS

    @property
    def label(self) -> str:
        """`output 'logits' (storage, optimizations off)`."""
        kind = "input" if self.what == "input" else "output"
        details = self.what if self.level == "-" else f"{self.what}, optimizations {self.level}"
        return f"{kind} '{self.name}' ({details})"

    def to_json(self) -> dict[str, Any]:
        comparison = self.comparison
        return {
            "name": self.name,
            "compared": self.what,
            "optimizations": self.level,
            "judged": self.judged,
            "verdict": self.verdict,
            "elements": comparison.elements if comparison else None,
            "mismatches": (self.mismatches if self.judged == BIT_EXACT else comparison.mismatches)
            if comparison
            else None,
            "first_difference": None
            if self.first is None
            else {
                "batch": self.first.batch,
                "index": list(self.first.index),
                "ours": self.first.ours,
                "reference": self.first.reference,
            },
            "max_abs_diff": _finite(comparison.max_abs_diff) if comparison else None,
            "sqnr_db": _finite(comparison.sqnr_db) if comparison else None,
            "noise_floor_sqnr_db": _finite(self.floor.sqnr_db) if self.floor else None,
            "failure": self.failure,
            "reason": self.reason,
        }


@dataclass(slots=True, kw_only=True)
class AgainstReport:
    """Every comparison of a stripped model against its source; `passed` decides the exit code."""

    stripped: str
    source: str
    form: str
    inputs_source: str
    results: list[AgainstResult] = field(default_factory=list)
    samples: int = 0
    notes: list[str] = field(default_factory=list)

    def count(self, verdict: str) -> int:
        return sum(1 for result in self.results if result.verdict == verdict)

    @property
    def verdict(self) -> str:
        if self.count(FAIL):
            return FAILED
        if self.count(NOT_RUN) or not self.count(PASS):
            return INCOMPLETE
        return PASSED

    @property
    def passed(self) -> bool:
        return self.verdict == PASSED

    @property
    def verdict_line(self) -> str:
        counts = f"{self.count(PASS)} passed, {self.count(FAIL)} failed, {self.count(NOT_RUN)} not run"
        return f"{self.verdict}: {counts} ({self.samples} samples)"

    def to_json(self) -> dict[str, Any]:
        return {
            "stripped": self.stripped,
            "source": self.source,
            "form": self.form,
            "inputs": self.inputs_source,
            "samples": self.samples,
            "verdict": self.verdict,
            "comparisons": [result.to_json() for result in self.results],
            "notes": self.notes,
        }

    def write_json(self, path: str | os.PathLike[str]) -> None:
        """Write the JSON report atomically (a temporary file in the same folder, then a rename)."""
        text = json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n"
        with atomic_text_file(path) as stream:
            stream.write(text)


def check_against(
    stripped_path: str | os.PathLike[str],
    source_path: str | os.PathLike[str],
    inputs: DataSource | Mapping[str, np.ndarray] | None = None,
    *,
    max_samples: int | None = None,
    batch_size: int | None = None,
    form: str | None = None,
    show_progress: bool = False,
) -> AgainstReport:
    """Compare the stripped model `stripped_path` with its source `source_path` in onnxruntime (see the
    module doc). `inputs`: the source model's float inputs, the same sources as `check`'s `--data`
    (streamed in batches of `batch_size`, at most `max_samples` samples), a dict of arrays (one run), or
    None for seeded random inputs. `form`: `qdq` or `qoperator`; None detects it (QLinear* ops the source
    lacks). `show_progress` counts the samples on stderr. InputError for a model without storage
    metadata, inputs that do not fit the source, or two models whose graph inputs differ."""
    from qconvert.frontends.onnx.load import read_model

    if max_samples is not None and max_samples < 1:
        raise InputError(f"--max-samples {max_samples}: expected 1 or more")
    boundary = StorageBoundary.of(stripped_path)
    header, _ = read_model(source_path)
    stripped = _load(stripped_path)
    source = _load(source_path)
    _same_inputs(boundary, header, str(stripped_path), str(source_path))
    if form is None:
        form = "qoperator" if _qoperator_ops(stripped) - _qoperator_ops(source) else "qdq"
    elif form not in FORMS:
        raise InputError(f"form {form!r}: expected one of {', '.join(FORMS)}")
    feeds, inputs_source, notes = _feeds(header, inputs, max_samples, batch_size)
    del header
    report = AgainstReport(
        stripped=str(stripped_path), source=str(source_path), form=form, inputs_source=inputs_source
    )
    run = _Run(report, boundary, stripped, source)
    with _progress(show_progress) as bar:
        task = bar.add_task("both models", total=None)
        for index, feed in enumerate(feeds):
            run.batch(index, feed.arrays, feed.samples)
            bar.advance(task, feed.samples)
    report.results = run.results()
    report.notes.extend(notes)
    if form == "qoperator":
        report.notes.append(
            "--form qoperator: storage compared bit-exactly with onnxruntime optimizations on only (the "
            "source's Q/DQ fused into onnxruntime's QLinear kernels); end to end against the source's float "
            "outputs (optimizations off) beside the noise floor"
        )
    return report


def _load(path: str | os.PathLike[str]) -> ModelProto:
    """The whole model (external data included) for onnxruntime."""
    from qconvert.frontends.onnx.load import read_model

    read_model(path)  # a missing or unparsable file: its InputError
    try:
        return onnx.load_model(str(path))
    except (OSError, ValueError) as error:
        raise InputError(f"{path}: cannot read the model's external data ({error})") from None


def _same_inputs(
    boundary: StorageBoundary, source: ModelProto, stripped_label: str, source_label: str
) -> None:
    initializers = {t.name for t in source.graph.initializer}
    source_inputs = [i.name for i in source.graph.input if i.name not in initializers]
    stripped_inputs = list(boundary.inputs or {})
    if sorted(source_inputs) != sorted(stripped_inputs):
        raise InputError(
            f"{stripped_label} takes inputs {stripped_inputs} but {source_label} takes {source_inputs}: "
            "not a stripped copy of that model"
        )


def _qoperator_ops(model: ModelProto) -> set[str]:
    return {node.op_type for node in model.graph.node if node.op_type in QOPERATOR_OP_TYPES}


def _feeds(
    header: ModelProto,
    inputs: DataSource | Mapping[str, np.ndarray] | None,
    max_samples: int | None,
    batch_size: int | None,
) -> tuple[Iterator[Feed], str, list[str]]:
    """check's feeds (feeds.py), but random inputs need static shapes: --against takes no --input-shape."""
    if inputs is None:
        for info in graph_inputs(header):
            dims = info.type.tensor_type.shape.dim
            if not info.type.tensor_type.HasField("shape") or any(not d.HasField("dim_value") for d in dims):
                raise InputError(
                    f"graph input '{info.name}' has dynamic dims: give --data (inputs for both models)"
                )
    return model_feeds(header, inputs, max_samples, batch_size)


class _Run:
    """The sessions of both models and the comparisons, merged batch by batch (one batch in memory)."""

    def __init__(
        self, report: AgainstReport, boundary: StorageBoundary, stripped: ModelProto, source: ModelProto
    ) -> None:
        self.report, self.boundary = report, boundary
        self.qoperator = report.form == "qoperator"
        self.levels = (ON,) if self.qoperator else (OFF, ON)
        self.outputs = [o.name for o in source.graph.output]
        stripped_outputs = {o.name for o in stripped.graph.output}
        self.comparisons: dict[tuple[str, str, str], AgainstResult] = {}
        producers = {name: node for node in source.graph.node for name in node.output}
        graph_inputs = {i.name for i in source.graph.input}
        # Storage each stripped output must equal: the input of the source's final DequantizeLinear.
        self.storage_of: dict[str, str] = {}
        for name in boundary.metadata.outputs:
            producer = producers.get(name)
            if producer is None or producer.op_type != "DequantizeLinear":
                self._not_run(name, "storage", f"the source's output '{name}' is not a DequantizeLinear's")
                continue
            read = producer.input[0]
            if read not in producers and read not in graph_inputs:
                self._not_run(name, "storage", f"the source's DequantizeLinear of '{name}' reads a constant")
                continue
            self.storage_of[name] = read
        # What the source's QuantizeLinear made of each stripped input.
        self.quantized_as: dict[str, str] = {}
        for name in boundary.metadata.inputs:
            quantize = next(
                (n for n in source.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == name), None
            )
            if quantize is None:
                self._not_run(name, "input", f"no QuantizeLinear of input '{name}' in the source")
            else:
                self.quantized_as[name] = quantize.output[0]
        for name in self.outputs:
            if name not in stripped_outputs:
                self._not_run(name, "output", f"the stripped model has no output '{name}'")
        for name in stripped_outputs - set(self.outputs):
            self._not_run(name, "output", f"the source model has no output '{name}'")
        self.stripped_outputs = [name for name in self.outputs if name in stripped_outputs]
        label = report.source
        extra_storage = [read for read in self.storage_of.values() if read in producers]
        # Optimizations off: the spec oracle, which must load (else the source is bad input). On: only the
        # storage read (QuantizeLinear outputs) is exposed, as few changes to what onnxruntime fuses as the
        # comparison needs; a level a model cannot load at is not run, with why (`errors`).
        self.errors: dict[str, str] = {}
        exposed = _exposing(source, [*extra_storage, *self.quantized_as.values()])
        self.source_sessions = {OFF: ort_session(exposed, False, label)}
        self.stripped_sessions: dict[str, Any] = {}
        for level in self.levels:
            try:
                if level == ON:
                    self.source_sessions[ON] = ort_session(_exposing(source, extra_storage), True, label)
                self.stripped_sessions[level] = ort_session(stripped, level == ON, report.stripped)
            except InputError as error:
                self.errors[level] = error.message

    def _not_run(self, name: str, what: str, reason: str) -> None:
        self.comparisons[(name, what, "-")] = AgainstResult(
            name=name, what=what, level="-", judged="-", reason=reason
        )

    def batch(self, index: int, feeds: dict[str, np.ndarray], samples: int) -> None:
        """Run both models on one batch (of `samples` samples) and merge the comparisons."""
        self.report.samples += samples
        quantized = self.boundary.quantize_inputs(feeds)
        source: dict[str, dict[str, np.ndarray]] = {}
        stripped: dict[str, dict[str, np.ndarray]] = {}
        for level, session in self.source_sessions.items():
            if level != OFF and level in self.errors:
                continue
            try:
                source[level] = run_values(session, feeds)
            except InputError as error:
                if level == OFF:
                    raise  # the spec oracle cannot run these inputs: bad input, as check says
                self.errors[level] = f"{self.report.source}: {error.message}"
                continue
            source[level].update({name: feeds[name] for name in self.storage_of.values() if name in feeds})
            if level in self.stripped_sessions and level not in self.errors:
                try:
                    stripped[level] = run_values(self.stripped_sessions[level], quantized)
                except InputError as error:
                    self.errors[level] = f"{self.report.stripped}: {error.message}"
        for name, produced in self.quantized_as.items():
            self._exact(name, "input", OFF, index, quantized[name], source[OFF][produced])
        for level in self.levels:
            self._compare_level(level, index, source, stripped.get(level))

    def _compare_level(
        self,
        level: str,
        index: int,
        source: dict[str, dict[str, np.ndarray]],
        stripped: dict[str, np.ndarray] | None,
    ) -> None:
        """Every comparison at `level`; each one not run (with the level's error) when a model did not."""
        storage = self.boundary.metadata.outputs
        ran = stripped is not None and level in source
        dequantized = self.boundary.dequantize_outputs({n: stripped[n] for n in storage}) if ran else {}
        for name in self.stripped_outputs:
            if self.qoperator:
                ours = dequantized.get(name, stripped[name]) if ran else None
                floor = (source[OFF][name], source[ON][name]) if ran else None
                self._end_to_end(name, index, ours, floor, self.errors.get(level))
            if name in storage and name in self.storage_of:
                self._exact(name, "storage", level, index, *self._pair(ran, stripped, source, level, name))
            if self.qoperator:
                continue
            if name in storage:
                reference = source[level][name] if ran else None
                self._exact(name, "dequantized", level, index, dequantized.get(name), reference)
            else:
                self._exact(name, "float", level, index, *self._pair(ran, stripped, source, level, name))

    def _pair(
        self,
        ran: bool,
        stripped: dict[str, np.ndarray] | None,
        source: dict[str, dict[str, np.ndarray]],
        level: str,
        name: str,
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The stripped model's output `name` and what the source gave for it (its storage read, if any)."""
        if not ran:
            return None, None
        assert stripped is not None
        return stripped[name], source[level][self.storage_of.get(name, name)]

    def _result(self, name: str, what: str, level: str, judged: str) -> AgainstResult:
        key = (name, what, level)
        if key not in self.comparisons:
            self.comparisons[key] = AgainstResult(name=name, what=what, level=level, judged=judged)
        return self.comparisons[key]

    def _exact(
        self,
        name: str,
        what: str,
        level: str,
        index: int,
        ours: np.ndarray | None,
        reference: np.ndarray | None,
    ) -> None:
        result = self._result(name, what, level, BIT_EXACT)
        if ours is None or reference is None:  # a model did not run: what earlier batches gave is void
            result.comparison, result.reason = None, self.errors.get(level, "not computed")
            return
        comparison = compare(reference, ours)
        if not comparison.comparable:
            theirs = f"{reference.dtype}{list(reference.shape)}"
            result.reason = f"ours is {ours.dtype}{list(ours.shape)}, the source's {theirs}"
            result.mismatches += comparison.elements
        else:
            differs = _bitwise_differs(ours, reference)
            count = int(np.count_nonzero(differs))
            if count and result.first is None:
                position = np.unravel_index(int(np.argmax(differs)), differs.shape)
                result.first = Difference(
                    index,
                    tuple(int(i) for i in position),
                    ours[position].item(),
                    reference[position].item(),
                )
            result.mismatches += count
        result.comparison = comparison if result.comparison is None else result.comparison.merged(comparison)

    def _end_to_end(
        self,
        name: str,
        index: int,
        ours: np.ndarray | None,
        floor: tuple[np.ndarray, np.ndarray] | None,
        error: str | None,
    ) -> None:
        """Ours (optimizations on) against the source unoptimized, beside the source optimized (`floor`)."""
        result = self._result(name, "end to end", f"{ON} vs source {OFF}", NOISE_FLOOR)
        if ours is None or floor is None:
            result.comparison, result.reason = None, error or "not computed"
            return
        reference, optimized = floor
        lsb = None
        entry = self.boundary.metadata.outputs.get(name)
        if entry is not None and reference.shape == ours.shape:
            lsb = broadcast_params(self.boundary.params[("output", name)], reference.shape)[0]
        comparison, floor = compare(reference, ours, lsb), compare(reference, optimized, lsb)
        result.comparison = comparison if result.comparison is None else result.comparison.merged(comparison)
        result.floor = floor if result.floor is None else result.floor.merged(floor)

    def results(self) -> list[AgainstResult]:
        return list(self.comparisons.values())


def _progress(enabled: bool) -> Any:
    """A transient sample counter on stderr (nothing when disabled)."""
    from rich.console import Console
    from rich.progress import Progress, TextColumn

    columns = (TextColumn("{task.description}"), TextColumn("{task.completed} samples"))
    return Progress(*columns, console=Console(stderr=True), transient=True, disable=not enabled)


def _exposing(model: ModelProto, names: list[str]) -> ModelProto:
    """`model` with `names` added to its graph outputs (those it has already stay once)."""
    exposed = ModelProto()
    exposed.CopyFrom(model)
    present = {o.name for o in exposed.graph.output}
    for name in names:
        if name not in present:
            exposed.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    return exposed


def _bitwise_differs(ours: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Elements whose bits differ (float: -0.0 differs from 0.0, a NaN equals the same NaN)."""
    if ours.dtype.kind == "f":
        unsigned = np.dtype(f"u{ours.dtype.itemsize}")
        return ours.view(unsigned) != reference.view(unsigned)
    return ours != reference


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def render_against(report: AgainstReport, console: Any = None, summary_only: bool = False) -> None:
    """The report as a rich table, then each failure in words, the notes and the verdict line."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    color = {PASSED: "green", FAILED: "red", INCOMPLETE: "yellow"}[report.verdict]
    if not summary_only:
        table = Table(
            title=f"{report.stripped} ({report.form}) against {report.source} in onnxruntime, "
            f"inputs {report.inputs_source}"
        )
        for column in ("value", "compared", "optimizations", "judged", "mismatches", "max |diff|", "SQNR dB"):
            table.add_column(column, overflow="fold")
        table.add_column("verdict", no_wrap=True)
        for result in report.results:
            comparison = result.comparison
            if comparison is None:
                row = ["-", "-", "-"]
            else:
                mismatches = result.mismatches if result.judged == BIT_EXACT else comparison.mismatches
                sqnr = "exact" if comparison.sqnr_db == math.inf else f"{comparison.sqnr_db:.4g}"
                if result.floor is not None:
                    floor = "exact" if result.floor.sqnr_db == math.inf else f"{result.floor.sqnr_db:.4g}"
                    sqnr += f" (floor {floor})"
                row = [f"{mismatches}/{comparison.elements}", f"{comparison.max_abs_diff:.4g}", sqnr]
            table.add_row(result.name, result.what, result.level, result.judged, *row, result.verdict)
        console.print(table)
    for result in report.results:
        if result.verdict == FAIL:
            console.print(f"[red]{result.label}: {result.failure}[/red]", highlight=False)
        elif result.verdict == NOT_RUN:
            console.print(f"[yellow]not run[/yellow] {result.label}: {result.reason}", highlight=False)
    if not summary_only:
        for note in report.notes:
            console.print(f"note: {note}", highlight=False)
    console.print(f"[{color}]{report.verdict_line}[/{color}]", highlight=False)


__all__ = ["AgainstReport", "AgainstResult", "Difference", "check_against", "render_against"]
