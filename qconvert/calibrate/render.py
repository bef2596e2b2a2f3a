"""Terminal output of `qconvert calibrate`: the progress bar (samples/s, ETA) and the summary of ranges."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TextIO

from rich.console import Console
from rich.progress import (
    Progress,
    TextColumn,
)
from rich.table import Table

from qconvert.calibrate.api import CalibrationResult
from qconvert.calibrate.collect import ProgressCallback
from qconvert.calibrate.counting import uses_c_loops
from qconvert.calibrate.dataset import AS_GIVEN, counted
from qconvert.calibrate.entropy import uses_c_screen
from qconvert.calibrate.evaluate import Agreement
from qconvert.stdout_console import grouped_notes, progress_columns, shown_rows, stdout_console


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
        *progress_columns(unit),
        console=console,
        transient=True,
    )
    with progress:
        task = progress.add_task(description, total=None)

        def update(done: int, total: int | None) -> None:
            progress.update(task, completed=done, total=total)

        yield update


ROWS_SHOWN = 25  # rows of a summary table without --verbose


def _worst_first(result: CalibrationResult) -> list[str]:
    """Tensors with a note first (kept float, a sentinel), then the widest ranges (the coarsest steps)."""
    ranges = result.ranges.ranges

    def key(name: str) -> tuple[bool, float]:
        tensor_range = ranges[name]
        noted = (
            name in result.keep_float or tensor_range.sentinel is not None or tensor_range.note is not None
        )
        return (not noted, -(float(tensor_range.max) - float(tensor_range.min)))

    return sorted(ranges, key=key)


def summary_table(result: CalibrationResult, limit: int | None = ROWS_SHOWN) -> Table:
    """One row per calibrated tensor: min, max, the scale and zero point written, and why it stays float
    (`float`: its warning is above) or what a sentinel did. More than `limit` rows (None: no limit): the
    worst `limit` (notes first, then the widest ranges) and a count of the rest."""
    names = list(result.ranges.ranges)
    shown = shown_rows(len(names), limit)
    title = f"{len(result.ranges)} ranges ({result.method})"
    if shown < len(names):
        names = _worst_first(result)[:shown]
        title += f"; the {shown} with notes or the widest ranges first, {len(result.ranges) - shown} more"
        title += " (--verbose lists all)"
    with_parameters = bool(result.quantization)
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("tensor", overflow="fold")
    table.add_column("min", justify="right")
    table.add_column("max", justify="right")
    if with_parameters:
        table.add_column("scale", justify="right")
        table.add_column("zero point", justify="right")
    table.add_column("note", overflow="fold")
    for name in names:
        tensor_range = result.ranges.ranges[name]
        note = tensor_range.sentinel or tensor_range.note or ""
        if name in result.keep_float:  # the reason is the warning printed above: said once
            note = "[yellow]float[/yellow] (warning above)"
        cells = [name, f"{tensor_range.min:.6g}", f"{tensor_range.max:.6g}"]
        if with_parameters:
            written = result.quantization.get(name)
            cells += (
                ["-", "-"] if written is None else [f"{written['scale']:.6g}", str(written["zero_point"])]
            )
        table.add_row(*cells, note)
    return table


def agreement_table(agreement: Agreement, unit: str = "sample", held_out: str | None = None) -> Table:
    """One row per graph output: how close the QDQ model's values are to the float model's; `held_out`:
    where the samples came from when they are not the first calibration samples (the search's)."""
    first = counted(agreement.samples, unit)
    samples = f"first {first}" if held_out is None else f"{first} held out ({held_out})"
    title = f"QDQ model against float in onnxruntime ({agreement.level}), {samples}"
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
    result: CalibrationResult,
    stdout: TextIO,
    stderr: TextIO,
    quiet: bool,
    worst_tensors: int = 0,
    verbose: bool = False,
) -> None:
    """Warnings on stderr always (each once); the table and the headline on stdout unless `quiet`;
    `verbose`: every range, not the worst ROWS_SHOWN."""
    errors = Console(file=stderr, highlight=False, soft_wrap=True)
    for warning in grouped_notes(list(dict.fromkeys(result.warnings))):
        errors.print(f"qconvert: warning: {warning}", markup=False)
    if quiet:
        return
    # Piped output gets wide rows (rich assumes 80 columns off a terminal): one tensor per line, for grep.
    with stdout_console(stdout, piped_width=200) as out:
        out.print(summary_table(result, None if verbose else ROWS_SHOWN))
        if result.agreement is not None and result.agreement.outputs:
            search = result.search  # a search compares on its held-out samples, not on the first ones
            held_out = None if search is None else search.eval_source
            out.print(agreement_table(result.agreement, result.unit, held_out))
        if result.agreement is not None and worst_tensors > 0 and result.agreement.tensors:
            out.print(loss_table(result.agreement, worst_tensors))
        notes = [note for note in result.notes if not any(f"'{name}'" in note for name in result.keep_float)]
        for note in grouped_notes(notes):  # a note repeated per tensor: one line with a count
            out.print(f"note: {note}", markup=False)
        out.print(headline(result), markup=False)
