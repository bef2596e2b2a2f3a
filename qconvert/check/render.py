"""Terminal rendering of a `qconvert check` report: rich tables of node verdicts and output differences."""

from __future__ import annotations

import math
from typing import Any

from qconvert.check.report import (
    EVALUATED_BY_NUMERICS,
    EVALUATED_BY_REFERENCE,
    FAIL,
    NOT_RUN,
    PASS,
    CheckReport,
    Comparison,
    LayerResult,
)


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


SHORT_EVALUATED_BY = {EVALUATED_BY_NUMERICS: "qconvert numerics", EVALUATED_BY_REFERENCE: "onnx reference"}


def _op_label(layer: LayerResult) -> str:
    label = layer.op_type if not layer.domain else f"{layer.domain}.{layer.op_type}"
    return f"{label} (fused quantized op)" if layer.group is not None else label


def _backend_label(report: CheckReport) -> str:
    """`interpreter`, or `stablehlo on xla, quantized form, onnx semantics`."""
    parts = [f"on {report.engine}" if report.engine else "", f"{report.form} form" if report.form else ""]
    parts.append(f"{report.semantics} semantics" if report.semantics else "")
    details = ", ".join(p for p in parts if p)
    return f"{report.backend} {details}" if details else report.backend


def render(report: CheckReport, console: Any = None, summary_only: bool = False) -> None:
    """The report as rich tables: layers by op type and verdict, failing nodes, outputs vs noise floor;
    `summary_only`: the final verdict line alone."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    verdict = "[green]PASSED[/green]" if report.passed else "[red]FAILED[/red]"
    counts = f"{report.count(PASS)} passed, {report.count(FAIL)} failed, {report.count(NOT_RUN)} not run"
    out_of_tolerance = sum(1 for o in report.outputs.values() if o.failed_tolerances)
    if out_of_tolerance:
        counts += f"; {out_of_tolerance} output(s) out of tolerance"
    if summary_only:
        console.print(f"{verdict}: {counts}")
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
    failing = [layer for layer in report.layers.values() if layer.verdict == FAIL]
    if failing:
        table = Table(title="failing nodes (must be bit-exact)")
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
    explained = [layer for layer in report.layers.values() if layer.predicted_mismatches is not None]
    if explained:
        table = Table(title=f"differences from onnxruntime due to {report.semantics} rounding semantics")
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
    not_run: dict[str, list[LayerResult]] = {}
    for layer in report.layers.values():
        if layer.verdict == NOT_RUN:
            not_run.setdefault(_op_label(layer), []).append(layer)
    for op, members in not_run.items():
        console.print(
            f"[yellow]not run[/yellow] {op} x{len(members)}, e.g. {members[0].node}: {members[0].reason}"
        )
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
        for failure in output.failed_tolerances:
            console.print(f"[red]{output.name}: {failure}[/red]")
        if output.reason:
            console.print(f"[yellow]{output.name} not run end to end:[/yellow] {output.reason}")
    for note in report.notes:
        console.print(f"note: {note}")
    console.print(f"{verdict}: {counts}")
