"""Terminal output of `qconvert calibrate`: the progress bar (samples/s, ETA) and the summary of ranges."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

from qconvert.calibrate.api import CalibrationResult
from qconvert.calibrate.collect import ProgressCallback
from qconvert.calibrate.counting import uses_c_loops
from qconvert.calibrate.dataset import AS_GIVEN, counted
from qconvert.calibrate.entropy import uses_c_screen
from qconvert.calibrate.evaluate import Agreement
from qconvert.stdout_console import stdout_console


class SamplesPerSecondColumn(ProgressColumn):
    """`123.4/s` (samples per second), from rich's smoothed speed of the task."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("" if speed is None else f"{speed:,.1f}/s", style="progress.data.speed")


@contextlib.contextmanager
def progress_bar(
    enabled: bool, description: str = "calibrating", unit: str = "samples"
) -> Iterator[ProgressCallback]:
    """A progress callback drawing a bar on stderr (nothing when not `enabled` or stderr is no terminal,
    where rich would leave an empty line); the bar goes away at exit."""
    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield lambda done, total: None
        return
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(bar_width=24),
        MofNCompleteColumn(),
        TextColumn(unit),
        SamplesPerSecondColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
    with progress:
        task = progress.add_task(description, total=None)

        def update(done: int, total: int | None) -> None:
            progress.update(task, completed=done, total=total)

        yield update


def summary_table(result: CalibrationResult) -> Table:
    """One row per calibrated tensor: min, max, and why it stays float or what a sentinel did."""
    title = f"{len(result.ranges)} ranges ({result.method})"
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("tensor", overflow="fold")
    table.add_column("min", justify="right")
    table.add_column("max", justify="right")
    table.add_column("note", overflow="fold")
    for name, tensor_range in result.ranges.ranges.items():
        note = result.keep_float.get(name) or tensor_range.sentinel or tensor_range.note or ""
        if name in result.keep_float:
            note = f"[yellow]{note}[/yellow]"
        table.add_row(name, f"{tensor_range.min:.6g}", f"{tensor_range.max:.6g}", note)
    return table


def agreement_table(agreement: Agreement, unit: str = "sample") -> Table:
    """One row per graph output: how close the QDQ model's values are to the float model's."""
    first = counted(agreement.samples, unit)
    title = f"QDQ model against float in onnxruntime ({agreement.level}), first {first}"
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    mismatches = any(output.nonfinite_mismatches for output in agreement.outputs)
    columns = ["output", "mean cosine", "lowest cosine", "max |error|"] + (
        ["Inf/NaN differ"] if mismatches else []
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "output" else "right", overflow="fold")
    for output in agreement.outputs:
        extra = [str(output.nonfinite_mismatches)] if mismatches else []
        if output.matching is not None:
            table.add_row(output.name, f"{output.matching:.2%} equal", "", "", *extra)
            continue
        cells = (output.mean_cosine, output.lowest_cosine, output.max_abs_error)
        table.add_row(output.name, *("-" if value is None else f"{value:.6g}" for value in cells), *extra)
    return table


def loss_table(agreement: Agreement, count: int) -> Table:
    """The `count` activations whose own quantize-dequantize moves them most, worst first."""
    title = (
        f"activations losing most to their own Q/DQ ({len(agreement.tensors or [])} quantized; relative "
        f"error ‖x - x̂‖ / ‖x‖ of their quantize-dequantize x̂)"
    )
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("tensor", overflow="fold")
    table.add_column("mean error", justify="right")
    table.add_column("largest error", justify="right")
    for loss in agreement.worst_tensors(count):
        cells = (loss.mean_relative_error, loss.largest_relative_error)
        table.add_row(loss.name, *("-" if value is None else f"{value:.6g}" for value in cells))
    return table


def headline(result: CalibrationResult) -> str:
    """`calibrated 64 samples (8 batches of 8) in 0.21 s, 301 samples/s; wrote out.onnx`."""
    parts = []
    stats = result.stats
    if stats is None:
        parts.append(f"loaded {len(result.ranges)} ranges")
    else:
        rate = result.samples_per_second
        speed = "" if rate is None else f", {rate:,.1f} {result.unit}s/s"
        workers = "" if result.workers == 1 else f" on {result.workers} workers ({result.engine})"
        runs = f"{counted(stats.samples_used, result.unit)} " + (
            "(each item of the data as given)"
            if result.batch_size == AS_GIVEN
            else f"({counted(stats.batches, 'batch')} of up to {result.batch_size})"
        )
        parts.append(f"calibrated {runs}{workers} in {result.seconds_collecting:.2f} s{speed}")
        if not (uses_c_loops() and uses_c_screen()):
            parts.append(
                "counted with numpy's loops: qconvert's C extension is not built (reinstalled with a C "
                "compiler, calibration runs 1.3-1.5x faster)"
            )
    written = [str(path) for path in (result.output, result.ranges_path) if path is not None]
    if written:
        parts.append(f"wrote {', '.join(written)}")
    return "; ".join(parts)


def render(
    result: CalibrationResult, stdout: TextIO, stderr: TextIO, quiet: bool, worst_tensors: int = 0
) -> None:
    """Warnings on stderr always; the table and the headline on stdout unless `quiet`."""
    errors = Console(file=stderr, highlight=False, soft_wrap=True)
    for warning in result.warnings:
        errors.print(f"qconvert: warning: {warning}", markup=False)
    if quiet:
        return
    # Piped output gets wide rows (rich assumes 80 columns off a terminal): one tensor per line, for grep.
    with stdout_console(stdout, piped_width=200) as out:
        out.print(summary_table(result))
        if result.agreement is not None and result.agreement.outputs:
            out.print(agreement_table(result.agreement, result.unit))
        if result.agreement is not None and worst_tensors > 0 and result.agreement.tensors:
            out.print(loss_table(result.agreement, worst_tensors))
        for note in result.notes:
            if not any(f"'{name}'" in note for name in result.keep_float):  # already a warning above
                out.print(f"note: {note}", markup=False)
        out.print(headline(result), markup=False)
