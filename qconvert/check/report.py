"""The `qconvert check` report: verdicts per node and per output, and the comparison of two tensors.

NOTE: `CheckReport.passed` is true when no per-node comparison and no tolerance failed, and something ran
(a quantization node, or the whole model end to end); "not run" nodes and outputs are listed and counted
but do not fail the check. A node whose mismatches are all explained by the chosen rounding semantics
(`--semantics stablehlo`: StableHLO adds the zero point before rounding) passes only when the measured
count equals the predicted one. An SQNR of `inf` (no difference) is written to JSON as `null`.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qconvert.atomic_file import atomic_text_file

EVALUATED_BY_NUMERICS = "quant-typed ops (qconvert.numerics)"
EVALUATED_BY_REFERENCE = "onnx reference implementation (generic onnx.* op)"

PASS, FAIL, NOT_RUN = "pass", "fail", "not run"
METRICS = ("elements", "mismatches", "max_abs_diff", "max_lsb_diff", "sqnr_db", "cosine")


@dataclass(frozen=True, slots=True, kw_only=True)
class Tolerances:
    """End-to-end tolerances; each is off (None) unless the user sets it. Per-node checks are always exact."""

    atol: float | None = None
    rtol: float | None = None
    max_lsb: float | None = None
    max_mismatch_fraction: float | None = None
    min_sqnr: float | None = None

    def to_json(self) -> dict[str, float | None]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """One tensor against its reference. `max_lsb_diff` is None where no quantization step applies."""

    elements: int
    mismatches: int
    max_abs_diff: float
    max_lsb_diff: float | None
    sqnr_db: float
    cosine: float
    within_tolerance: bool = True  # elementwise |ours - ref| <= atol + rtol |ref|, when those are set

    def to_json(self) -> dict[str, Any]:
        return {
            "elements": self.elements,
            "mismatches": self.mismatches,
            "max_abs_diff": _finite(self.max_abs_diff),
            "max_lsb_diff": None if self.max_lsb_diff is None else _finite(self.max_lsb_diff),
            "sqnr_db": _finite(self.sqnr_db),
            "cosine": _finite(self.cosine),
        }


@dataclass(slots=True, kw_only=True)
class LayerResult:
    """The per-node verdict of one quantization node, or of one fused quantized op (`group`: its nodes).

    `predicted_mismatches` / `explanation`: set when the backend's rounding semantics differ from ONNX's
    on purpose (`--semantics stablehlo`); the node passes when `mismatches == predicted_mismatches`.
    """

    node: str
    op_type: str
    domain: str
    verdict: str
    evaluated_by: str | None = None
    elements: int = 0
    mismatches: int = 0
    max_lsb_diff: float | None = None
    reason: str | None = None
    group: list[str] | None = None
    predicted_mismatches: int | None = None
    explanation: str | None = None

    def to_json(self) -> dict[str, Any]:
        entry = {
            "op_type": self.op_type if not self.domain else f"{self.domain}.{self.op_type}",
            "verdict": self.verdict,
            "evaluated_by": self.evaluated_by,
            "elements": self.elements,
            "mismatches": self.mismatches,
            "max_lsb_diff": self.max_lsb_diff,
            "reason": self.reason,
        }
        if self.group is not None:
            entry["fused_group"] = self.group
        if self.predicted_mismatches is not None:
            entry["predicted_mismatches"] = self.predicted_mismatches
            entry["explanation"] = self.explanation
        return entry


@dataclass(slots=True, kw_only=True)
class OutputResult:
    """End to end, one graph output: ours against the oracle, beside the noise floor."""

    name: str
    ours: Comparison | None
    noise_floor: Comparison | None
    failed_tolerances: list[str] = field(default_factory=list)
    reason: str | None = None

    @property
    def verdict(self) -> str:
        if self.ours is None:
            return NOT_RUN
        return FAIL if self.failed_tolerances else PASS

    def to_json(self) -> dict[str, Any]:
        empty: dict[str, Any] = dict.fromkeys(METRICS)
        entry = self.ours.to_json() if self.ours is not None else empty
        entry["verdict"] = self.verdict
        entry["failed_tolerances"] = self.failed_tolerances
        entry["reason"] = self.reason
        entry["noise_floor"] = self.noise_floor.to_json() if self.noise_floor is not None else empty
        return entry


@dataclass(slots=True, kw_only=True)
class CheckReport:
    """Everything `qconvert check` found; `passed` decides the exit code (see the module NOTE).

    `engine`, `form`, `semantics`: how the backend ran (None for the IR interpreter, which has no choice).
    """

    model: str
    backend: str
    tolerances: Tolerances
    layers: dict[str, LayerResult]
    outputs: dict[str, OutputResult]
    inputs_source: str
    engine: str | None = None
    form: str | None = None
    semantics: str | None = None
    notes: list[str] = field(default_factory=list)

    def count(self, verdict: str) -> int:
        return sum(1 for layer in self.layers.values() if layer.verdict == verdict)

    @property
    def explained_mismatches(self) -> int:
        """Elements that differ from onnxruntime only because of the chosen rounding semantics."""
        explained = (layer for layer in self.layers.values() if layer.predicted_mismatches is not None)
        return sum(layer.mismatches for layer in explained)

    @property
    def passed(self) -> bool:
        ran = self.count(PASS) > 0 or any(o.ours is not None for o in self.outputs.values())
        failed = self.count(FAIL) > 0 or any(o.failed_tolerances for o in self.outputs.values())
        return ran and not failed

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "backend": self.backend,
            "engine": self.engine,
            "form": self.form,
            "semantics": self.semantics,
            "passed": self.passed,
            "inputs": self.inputs_source,
            "summary": {
                "layers_passed": self.count(PASS),
                "layers_failed": self.count(FAIL),
                "layers_not_run": self.count(NOT_RUN),
            },
            "mismatches_explained_by_semantics": self.explained_mismatches,
            "tolerances": self.tolerances.to_json(),
            "layers": {name: layer.to_json() for name, layer in self.layers.items()},
            "outputs": {name: output.to_json() for name, output in self.outputs.items()},
            "notes": self.notes,
        }

    def write_json(self, path: str | os.PathLike[str]) -> None:
        """Write the JSON report atomically (a temporary file in the same folder, then a rename)."""
        text = json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n"
        with atomic_text_file(path) as stream:
            stream.write(text)


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


# Comparison ----------------------------------------------------------------------------------------
def _equal_mask(reference: np.ndarray, ours: np.ndarray) -> np.ndarray:
    if reference.dtype.kind in "iub":
        return reference == ours
    bits = np.dtype(f"u{reference.dtype.itemsize}")
    same_bits = reference.view(bits) == ours.view(bits)
    both_nan = np.isnan(reference.astype(np.float64)) & np.isnan(ours.astype(np.float64))
    return same_bits | both_nan


def compare(
    reference: np.ndarray,
    ours: np.ndarray,
    lsb_unit: np.ndarray | None = None,
    atol: float | None = None,
    rtol: float | None = None,
) -> Comparison:
    """Bitwise mismatches (NaN equals NaN), abs and LSB differences, SQNR and cosine of `ours` vs `reference`.

    `max_lsb_diff` is the integer difference for integer tensors, `|diff| / lsb_unit` for dequantized
    ones (`lsb_unit`: the scale, broadcast to the tensor), None otherwise.
    """
    reference, ours = np.asarray(reference), np.asarray(ours)
    elements = int(reference.size)
    if reference.shape != ours.shape or reference.dtype != ours.dtype:
        return Comparison(
            elements=elements,
            mismatches=elements,
            max_abs_diff=math.inf,
            max_lsb_diff=math.inf,
            sqnr_db=-math.inf,
            cosine=math.nan,
            within_tolerance=False,
        )
    mismatches = elements - int(np.count_nonzero(_equal_mask(reference, ours)))
    ref64, ours64 = reference.astype(np.float64), ours.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(ref64 - ours64)
    diff = np.where(np.isnan(ref64) & np.isnan(ours64), 0.0, diff)
    diff = np.where(np.isnan(diff), math.inf, diff)
    max_abs = float(diff.max()) if elements else 0.0
    if reference.dtype.kind in "iu":
        max_lsb: float | None = max_abs
    elif lsb_unit is not None and elements:
        with np.errstate(divide="ignore", invalid="ignore"):
            max_lsb = float(np.rint(diff / np.abs(lsb_unit)).max())
    else:
        max_lsb = None
    finite = np.isfinite(ref64) & np.isfinite(ours64)
    signal = float(np.sum(ref64[finite] ** 2))
    noise = float(np.sum((ref64[finite] - ours64[finite]) ** 2))
    if noise == 0.0:
        sqnr = math.inf
    elif signal == 0.0:
        sqnr = -math.inf
    else:
        sqnr = 10.0 * math.log10(signal / noise)
    norms = float(np.linalg.norm(ref64[finite]) * np.linalg.norm(ours64[finite]))
    cosine = float(np.dot(ref64[finite], ours64[finite]) / norms) if norms else (1.0 if noise == 0 else 0.0)
    within = True
    if atol is not None or rtol is not None:
        bound = (atol or 0.0) + (rtol or 0.0) * np.abs(ref64)
        within = bool(np.all(diff <= bound))
    return Comparison(
        elements=elements,
        mismatches=mismatches,
        max_abs_diff=max_abs,
        max_lsb_diff=max_lsb,
        sqnr_db=sqnr,
        cosine=cosine,
        within_tolerance=within,
    )


def tolerance_failures(comparison: Comparison, tolerances: Tolerances) -> list[str]:
    """The end-to-end tolerances `comparison` does not meet, each said in words."""
    failures = []
    if not comparison.within_tolerance:
        failures.append(f"|diff| > atol + rtol*|ref| (atol={tolerances.atol}, rtol={tolerances.rtol})")
    if tolerances.max_lsb is not None and (comparison.max_lsb_diff or 0.0) > tolerances.max_lsb:
        failures.append(f"max_lsb_diff {comparison.max_lsb_diff} > {tolerances.max_lsb}")
    if tolerances.max_mismatch_fraction is not None and comparison.elements:
        fraction = comparison.mismatches / comparison.elements
        if fraction > tolerances.max_mismatch_fraction:
            failures.append(f"mismatch fraction {fraction:.4g} > {tolerances.max_mismatch_fraction}")
    if tolerances.min_sqnr is not None and comparison.sqnr_db < tolerances.min_sqnr:
        failures.append(f"sqnr {comparison.sqnr_db:.2f} dB < {tolerances.min_sqnr} dB")
    return failures
