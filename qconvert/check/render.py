"""Terminal rendering of a `qconvert check` report: rich tables of node verdicts and output differences."""

from __future__ import annotations

import math
from typing import Any

from qconvert.check.report import (
    EVALUATED_BY_FOLDING,
    EVALUATED_BY_NUMERICS,
    EVALUATED_BY_REFERENCE,
    FAIL,
    FAILED,
    INCOMPLETE,
    NOT_RUN,
    PASS,
    PASSED,
    CheckReport,
    Comparison,
    LayerResult,
)
from qconvert.stdout_console import grouped_notes, shown_rows


def _number(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.{digits}g}"


def _metrics(comparison: Comparison | None) -> list[str]:
    if comparison is None:
        return ["not run", "-", "-", "-", "-"]
    return [
        f"{comparison.mismatches}/{comparison.elements}",
        _number(comparison.max_abs_diff),
        _number(comparison.max_lsb_diff),
        "exact" if math.isinf(comparison.sqnr_db) and comparison.sqnr_db > 0 else _number(comparison.sqnr_db),
        _number(comparison.cosine, 6),
    ]


SHORT_EVALUATED_BY = {
    EVALUATED_BY_NUMERICS: "qconvert numerics",
    EVALUATED_BY_REFERENCE: "generic onnx op",
    EVALUATED_BY_FOLDING: "folded at lift",
}


def _op_label(layer: LayerResult) -> str:
    label = layer.op_type if not layer.domain else f"{layer.domain}.{layer.op_type}"
    return f"{label} (fused quantized op)" if layer.group is not None else label


def _backend_label(report: CheckReport) -> str:
    """`interpreter`, or `stablehlo on xla, quantized form, onnx semantics`."""
    parts = [f"on {report.engine}" if report.engine else "", f"{report.form} form" if report.form else ""]
    parts.append(f"{report.semantics} semantics" if report.semantics else "")
    details = ", ".join(p for p in parts if p)
    return f"{report.backend} {details}" if details else report.backend


ROWS_SHOWN = 20  # rows of each node table without --verbose


def _worst(layers: list[LayerResult], key: Any, limit: int | None) -> tuple[list[LayerResult], str]:
    """The rows a table lists (the worst first when there are more than `limit`; None: all, in graph
    order) and its title's tail counting the rest."""
    shown = shown_rows(len(layers), limit)
    if shown == len(layers):
        return layers, ""
    worst = sorted(layers, key=lambda layer: -(key(layer) or 0.0))[:shown]
    return worst, f"; the worst {shown} first, {len(layers) - shown} more (--verbose lists all)"


def render(
    report: CheckReport, console: Any = None, summary_only: bool = False, limit: int | None = ROWS_SHOWN
) -> None:
    """The report as rich tables: layers by op type and verdict, failing nodes, outputs vs noise floor;
    `summary_only`: the final verdict line alone; `limit`: rows of each node table (None: all)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    color = {PASSED: "green", FAILED: "red", INCOMPLETE: "yellow"}[report.verdict]
    verdict = f"[{color}]{report.verdict_line}[/{color}]"
    counts = (
        f"nodes: {report.count(PASS)} passed, {report.count(FAIL)} failed, {report.count(NOT_RUN)} not run"
    )
    outputs_failed = sum(1 for o in report.outputs.values() if o.verdict == FAIL)
    outputs_not_run = sum(1 for o in report.outputs.values() if o.verdict == NOT_RUN)
    counts += f"; outputs: {len(report.outputs) - outputs_failed - outputs_not_run} passed"
    counts += f", {outputs_failed} failed, {outputs_not_run} not run"
    if report.samples:
        counts += f" ({report.samples} samples end to end)"
    if summary_only:
        console.print(f"{verdict}: {counts}")
        _print_not_run(report, console)
        return
    layers = Table(
        title=f"per node: {report.model} ({_backend_label(report)}, inputs {report.inputs_source})"
    )
    for column in ("op", "evaluated by", "passed", "failed", "not run"):
        layers.add_column(column, justify="left" if column in ("op", "evaluated by") else "right")
    groups: dict[tuple[str, str], list[LayerResult]] = {}
    for layer in report.layers.values():
        by = SHORT_EVALUATED_BY.get(layer.evaluated_by or "", layer.evaluated_by or "-")
        groups.setdefault((_op_label(layer), by), []).append(layer)
    for (op, by), members in groups.items():
        tallies = [sum(1 for m in members if m.verdict == v) for v in (PASS, FAIL, NOT_RUN)]
        layers.add_row(op, by, *(str(t) for t in tallies))
    layers.add_row("total", "", str(report.count(PASS)), str(report.count(FAIL)), str(report.count(NOT_RUN)))
    console.print(layers)
    failing = [layer for layer in report.layers.values() if layer.verdict == FAIL and layer.family is None]
    failing, rest = _worst(failing, lambda layer: layer.max_lsb_diff, limit)
    if failing:
        table = Table(title=f"failing quantization nodes (must be bit-exact){rest}")
        for column in ("node", "op", "mismatches", "max lsb diff"):
            table.add_column(column)
        for layer in failing:
            table.add_row(
                layer.node,
                _op_label(layer),
                f"{layer.mismatches}/{layer.elements}",
                _number(layer.max_lsb_diff),
            )
        console.print(table)
    failing = [
        layer for layer in report.layers.values() if layer.verdict == FAIL and layer.family is not None
    ]
    failing, rest = _worst(failing, lambda layer: layer.max_bound_ratio, limit)
    if failing:
        table = Table(title=f"failing float nodes (outside the float32 bound of their op family){rest}")
        for column in ("node", "op", "outside bound", "max |diff|", "max diff/bound", "bound"):
            table.add_column(column, overflow="fold")
        for layer in failing:
            table.add_row(
                layer.node,
                _op_label(layer),
                f"{layer.mismatches}/{layer.elements}",
                _number(layer.max_abs_diff),
                _number(layer.max_bound_ratio),
                f"{layer.family}: {layer.bound}",
            )
        console.print(table)
    explained = [layer for layer in report.layers.values() if layer.predicted_mismatches is not None]
    explained, rest = _worst(explained, lambda layer: layer.mismatches, limit)
    if explained:
        table = Table(
            title=f"differences from onnxruntime due to {report.semantics} rounding semantics{rest}"
        )
        for column in ("node", "op", "differing", "predicted", "why"):
            table.add_column(column, overflow="fold")
        for layer in explained:
            table.add_row(
                layer.node,
                _op_label(layer),
                f"{layer.mismatches}/{layer.elements}",
                str(layer.predicted_mismatches),
                layer.explanation or "",
            )
        console.print(table)
    outputs = Table(
        title="end to end vs onnxruntime (optimizations off); noise floor = onnxruntime default vs off"
    )
    outputs.add_column("output", overflow="fold")
    for column in ("mismatches", "max |diff|", "max lsb", "SQNR dB", "cosine", "verdict"):
        outputs.add_column(column, no_wrap=True)
    for output in report.outputs.values():
        outputs.add_row(output.name, *_metrics(output.ours), output.verdict)
        outputs.add_row("  noise floor", *_metrics(output.noise_floor), "", end_section=True)
    console.print(outputs)
    for output in report.outputs.values():
        for failure in output.failures:
            console.print(f"[red]{output.name}: {failure}[/red]")
    for note in grouped_notes(report.notes):  # a note repeated per node: one line with a count
        console.print(f"note: {note}")
    _print_not_run(report, console)
    console.print(f"{verdict}: {counts}")


def _print_not_run(report: CheckReport, console: Any) -> None:
    """Not-run nodes and outputs, one line per op type and reason, with a count and a few names."""
    for group in report.not_run_groups():
        shown = ", ".join(group.examples) + (", ..." if group.count > len(group.examples) else "")
        console.print(
            f"[yellow]not run[/yellow] {group.what} x{group.count} ({shown}): {group.example_reason}",
            highlight=False,
        )
    if report.not_run and report.verdict == INCOMPLETE:
        console.print("(--allow-not-run accepts what was not run)", highlight=False)
