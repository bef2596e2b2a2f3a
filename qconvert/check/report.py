"""The `qconvert check` report: verdicts per node and per output, and the comparison of two tensors.

NOTE: the verdict (`CheckReport.verdict`) is one of
- FAILED: a node outside its bound (quantization nodes: any bit), an output below the noise floor's
  margin (`floor_failure`), or a user tolerance not met;
- INCOMPLETE: nothing failed, but some node or output was "not run" (or nothing ran at all), and the user
  did not accept it (`allow_not_run`); the not-run reasons are grouped by op type and reason;
- PASSED: everything ran and passed, or (`allow_not_run`) what did not run was accepted explicitly, which
  the verdict line says ("PASSED (3 not run, accepted)").
`passed` (exit code 0) is true only for PASSED. A node whose mismatches are all explained by the chosen
rounding semantics (`--semantics stablehlo`: StableHLO adds the zero point before rounding) passes only
when the measured count equals the predicted one. An SQNR of `inf` (no difference) is written to JSON as
`null`; any other non-finite number (an infinite max_lsb_diff, a tolerance of inf) is written as the string
"inf", "-inf" or "nan" (`json_safe`), so the file stays valid JSON (strict parsers reject Infinity / NaN).

End to end, an output FAILS by default when its SQNR is both `FLOOR_MARGIN_DB` below the noise floor
(onnxruntime optimized against unoptimized) and below its step level less `STEP_SLACK_DB`. The step level
is the SQNR that an error of one quantization step on every element would give, 10 log10(sum ref^2 /
sum step^2) (a dequantized output's step is its scale, an integer output's is 1); a float output no
DequantizeLinear produces takes `FLOAT_OUTPUT_LEVEL_DB` instead (40.9 dB is what int8 quantization of a
Gaussian signal clipped at 4 sigma gives: a difference that large is a whole quantization's worth of
error). The 0.5 dB slack keeps exactly one step on every element (`--semantics stablehlo` on ties; float32
rounding of the dequantized values) from failing. Both conditions must hold: the floor alone can be
115 dB for a float-ish model, where 70 dB is still a correct quantized reference; the step level alone
would pass a float model computed wrong by a fraction of a step. 10 dB covers MiniLM-class models where
cascaded quantization near-ties put our reference a few dB under the floor (each near-tie flips one step;
one flipped step in 8192 elements costs ~40 dB under an exact floor but stays far above the step level).
Where flips cascade through layers further than that (a float output after coarse static quantization:
the corpus's MiniLM QDQ sentence embedding at 31 dB against an exact floor), the interpreter backend
replays the run in lockstep (check/lockstep.py): taking onnxruntime's step wherever a QuantizeLinear
flipped by one step on an input within 2^-10 of a step of onnxruntime's. An output whose replay passes
the rule is not failed, and the report counts the flips (`near_tie_flips`, the replay in `lockstep`).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qconvert.atomic_file import atomic_text_file

EVALUATED_BY_NUMERICS = "quant-typed ops (qconvert.numerics)"
EVALUATED_BY_REFERENCE = "generic onnx.* op (the interpreter's kernel, or onnx's reference implementation)"
EVALUATED_BY_FOLDING = "folded to a constant when lifted (no op left to run)"

PASS, FAIL, NOT_RUN = "pass", "fail", "not run"
# In a not-run reason: the backend raised something other than an input error, a bug of ours (exit 3).
BUG_MARKER = "(a bug)"
PASSED, FAILED, INCOMPLETE = "PASSED", "FAILED", "INCOMPLETE"
FLOOR_MARGIN_DB = 10.0
FLOAT_OUTPUT_LEVEL_DB = 40.0
STEP_SLACK_DB = 0.5  # exactly one step everywhere (--semantics stablehlo on ties) is not below the level
EXAMPLE_NODES = 3  # node names shown per group of not-run nodes
METRICS = ("elements", "mismatches", "max_abs_diff", "max_lsb_diff", "sqnr_db", "cosine")
# Elements off by k quantization steps are counted for k = 0 .. STEPS_OFF_CAP; the last count holds every
# element STEPS_OFF_CAP or more steps off (or non-finite), so the histogram stays short on a wild node.
STEPS_OFF_CAP = 16


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
    # Sums that merge across batches: sum ref^2, sum (ref - ours)^2, sum ref*ours, sum ours^2, sum step^2.
    signal: float = 0.0
    noise: float = 0.0
    dot: float = 0.0
    ours_energy: float = 0.0
    step_energy: float | None = None
    comparable: bool = True  # False: shapes or dtypes differ, nothing to measure
    # Elements off by k steps, k = 0 .. STEPS_OFF_CAP (the last: that many or more); None: no step known.
    steps_off: list[int] | None = None

    def merged(self, other: Comparison) -> Comparison:
        """This comparison and `other` (another batch of the same output) as one."""
        step = None
        if self.step_energy is not None and other.step_energy is not None:
            step = self.step_energy + other.step_energy
        lsb = None
        if self.max_lsb_diff is not None and other.max_lsb_diff is not None:
            lsb = max(self.max_lsb_diff, other.max_lsb_diff)
        comparable = self.comparable and other.comparable
        signal, noise = self.signal + other.signal, self.noise + other.noise
        dot, ours_energy = self.dot + other.dot, self.ours_energy + other.ours_energy
        steps_off = None
        if self.steps_off is not None and other.steps_off is not None:
            steps_off = add_steps_off(self.steps_off, other.steps_off)
        return Comparison(
            elements=self.elements + other.elements,
            mismatches=self.mismatches + other.mismatches,
            max_abs_diff=max(self.max_abs_diff, other.max_abs_diff),
            max_lsb_diff=lsb,
            sqnr_db=_sqnr(signal, noise) if comparable else -math.inf,
            cosine=_cosine(dot, signal, ours_energy, noise) if comparable else math.nan,
            within_tolerance=self.within_tolerance and other.within_tolerance,
            signal=signal,
            noise=noise,
            dot=dot,
            ours_energy=ours_energy,
            step_energy=step,
            comparable=comparable,
            steps_off=steps_off,
        )

    @property
    def step_level_db(self) -> float | None:
        """The SQNR an error of one quantization step on every element would give (None: no step known)."""
        if self.step_energy is None or self.step_energy == 0.0 or self.signal == 0.0:
            return None
        return 10.0 * math.log10(self.signal / self.step_energy)

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
    family: str | None = None  # None: a quantization node (bit-exact); else its float family (bounds.py)
    bound: str | None = None  # the float bound applied, in words
    max_abs_diff: float | None = None
    max_bound_ratio: float | None = None  # float nodes: max |diff| / bound (1 or less passes)
    # What `accumulate` gathers for the report: elements off by k steps, and sum ref^2 / sum (ref - ours)^2.
    steps_off: list[int] | None = None
    signal: float = 0.0
    noise: float = 0.0

    def accumulate(self, comparison: Comparison) -> None:
        """Add one compared output's steps-off counts and SQNR sums (the report's plots)."""
        if comparison.steps_off is not None:
            previous = self.steps_off
            self.steps_off = (
                comparison.steps_off if previous is None else add_steps_off(previous, comparison.steps_off)
            )
        self.add_sqnr_sums(comparison.signal, comparison.noise if comparison.comparable else math.inf)

    def add_sqnr_sums(self, signal: float, noise: float) -> None:
        """Add one output's sum ref^2 and sum (ref - ours)^2 (`sqnr_sums`; noise inf: not comparable)."""
        self.signal += signal
        self.noise += noise

    @property
    def sqnr_db(self) -> float | None:
        """The node's SQNR against onnxruntime (inf: exact), None when nothing was compared."""
        if self.verdict == NOT_RUN or not self.elements:
            return None
        return _sqnr(self.signal, self.noise)

    @property
    def label(self) -> str:
        return self.op_type if not self.domain else f"{self.domain}.{self.op_type}"

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "op_type": self.label,
            "verdict": self.verdict,
            "evaluated_by": self.evaluated_by,
            "elements": self.elements,
            "mismatches": self.mismatches,
            "max_lsb_diff": self.max_lsb_diff,
            "reason": self.reason,
            "judged": "bit-exact" if self.family is None else f"float bound ({self.family})",
        }
        if self.family is not None:
            entry["bound"] = self.bound
            entry["max_abs_diff"] = None if self.max_abs_diff is None else _finite(self.max_abs_diff)
            entry["max_bound_ratio"] = None if self.max_bound_ratio is None else _finite(self.max_bound_ratio)
        if self.group is not None:
            entry["fused_group"] = self.group
        if self.predicted_mismatches is not None:
            entry["predicted_mismatches"] = self.predicted_mismatches
            entry["explanation"] = self.explanation
        sqnr = self.sqnr_db
        entry["sqnr_db"] = None if sqnr is None else _finite(sqnr)  # inf (exact) is null, as end to end
        entry["exact"] = self.verdict != NOT_RUN and self.elements > 0 and self.noise == 0.0
        entry["steps_off"] = self.steps_off
        return entry


@dataclass(slots=True, kw_only=True)
class OutputResult:
    """End to end, one graph output: ours against the oracle, beside the noise floor."""

    name: str
    ours: Comparison | None
    noise_floor: Comparison | None
    failed_tolerances: list[str] = field(default_factory=list)
    reason: str | None = None
    samples: int = 0
    # The interpreter's replay in lockstep (check/lockstep.py): ours with onnxruntime's step taken at
    # near-tie QuantizeLinear flips, and how many elements flipped; None when not replayed.
    lockstep: Comparison | None = None
    tie_flips: int = 0

    def _below_floor(self, comparison: Comparison) -> str | None:
        assert self.noise_floor is not None
        sqnr, floor = comparison.sqnr_db, self.noise_floor.sqnr_db
        step_level = comparison.step_level_db
        level = step_level if step_level is not None else FLOAT_OUTPUT_LEVEL_DB
        if math.isnan(sqnr) or (sqnr < floor - FLOOR_MARGIN_DB and sqnr < level - STEP_SLACK_DB):
            what = "one quantization step on every element" if step_level is not None else "a float output"
            return (
                f"SQNR {sqnr:.2f} dB is more than {FLOOR_MARGIN_DB:g} dB below the noise floor "
                f"({_db(floor)}) and below {level:.1f} dB ({what})"
            )
        return None

    @property
    def explained_by_ties(self) -> bool:
        """Far below the floor, but the lockstep replay, differing only by near-tie flips, is not."""
        if self.ours is None or self.noise_floor is None or self.lockstep is None or not self.tie_flips:
            return False
        return self._below_floor(self.ours) is not None and self._below_floor(self.lockstep) is None

    @property
    def floor_failure(self) -> str | None:
        """Why the SQNR is far below the noise floor (see the module NOTE), or None; a difference that
        near-tie quantization flips explain (check/lockstep.py) is not a failure."""
        if self.ours is None or self.noise_floor is None or self.explained_by_ties:
            return None
        return self._below_floor(self.ours)

    @property
    def failures(self) -> list[str]:
        floor = self.floor_failure
        return [*self.failed_tolerances, *([floor] if floor else [])]

    @property
    def verdict(self) -> str:
        if self.ours is None:
            return NOT_RUN
        return FAIL if self.failures else PASS

    def to_json(self) -> dict[str, Any]:
        empty: dict[str, Any] = dict.fromkeys(METRICS)
        entry = self.ours.to_json() if self.ours is not None else empty
        entry["verdict"] = self.verdict
        entry["failed_tolerances"] = self.failed_tolerances
        entry["below_noise_floor"] = self.floor_failure
        entry["samples"] = self.samples
        entry["reason"] = self.reason
        entry["near_tie_flips"] = self.tie_flips
        entry["steps_off"] = self.ours.steps_off if self.ours is not None else None  # for the report
        entry["lockstep"] = self.lockstep.to_json() if self.lockstep is not None else None
        entry["noise_floor"] = self.noise_floor.to_json() if self.noise_floor is not None else empty
        return entry


@dataclass(slots=True, kw_only=True)
class NotRunGroup:
    """Not-run nodes (or outputs) of one op type with one reason: how many, and a few of their names."""

    what: str
    reason: str
    example_reason: str
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"op_type": self.what, "reason": self.reason, "count": self.count, "examples": self.examples}


_QUOTED = re.compile(r"(?<!\w)'[^']*'")  # a quoted name, not an apostrophe (onnxruntime's)


def _db(value: float) -> str:
    return "exact" if value == math.inf else f"{value:.2f} dB"


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
    allow_not_run: bool = False
    samples: int = 0  # samples (or runs) compared end to end
    node_samples: int = 0  # samples of the first batch, which the per-node check used

    def __repr__(self) -> str:
        """`CheckReport(PASSED, digits.onnx on interpreter, nodes 19/0/0, outputs 1/0/0, 8 samples)`:
        passed / failed / not run; `to_json()` holds everything."""
        outputs = [sum(1 for o in self.outputs.values() if o.verdict == v) for v in (PASS, FAIL, NOT_RUN)]
        nodes = "/".join(str(self.count(v)) for v in (PASS, FAIL, NOT_RUN))
        where = self.backend + (f" ({self.engine})" if self.engine else "")
        return (
            f"CheckReport({self.verdict}, {self.model} on {where}, nodes {nodes}, "
            f"outputs {'/'.join(map(str, outputs))} (passed/failed/not run), {self.samples} samples)"
        )

    def count(self, verdict: str) -> int:
        return sum(1 for layer in self.layers.values() if layer.verdict == verdict)

    @property
    def not_run(self) -> int:
        """Nodes and outputs that were not run."""
        return self.count(NOT_RUN) + sum(1 for o in self.outputs.values() if o.verdict == NOT_RUN)

    @property
    def failed(self) -> bool:
        return self.count(FAIL) > 0 or any(o.verdict == FAIL for o in self.outputs.values())

    @property
    def ran(self) -> bool:
        return self.count(PASS) > 0 or any(o.ours is not None for o in self.outputs.values())

    @property
    def verdict(self) -> str:
        if self.failed:
            return FAILED
        if not self.ran or (self.not_run and not self.allow_not_run):
            return INCOMPLETE
        return PASSED

    @property
    def verdict_line(self) -> str:
        """`PASSED`, `PASSED (3 not run, accepted)`, `INCOMPLETE (88 not run)`, `FAILED`."""
        if self.verdict == PASSED and self.not_run:
            return f"{PASSED} ({self.not_run} not run, accepted)"
        if self.verdict == INCOMPLETE:
            return f"{INCOMPLETE} ({self.not_run} not run)" if self.ran else f"{INCOMPLETE} (nothing ran)"
        return self.verdict

    def not_run_groups(self) -> list[NotRunGroup]:
        """Not-run nodes and outputs grouped by op type and reason (names and values in quotes folded)."""
        groups: dict[tuple[str, str], NotRunGroup] = {}
        items = [
            (layer.label, layer.node, layer.reason or "")
            for layer in self.layers.values()
            if layer.verdict == NOT_RUN
        ]
        items += [
            ("output (end to end)", o.name, o.reason or "") for o in self.outputs.values() if o.ours is None
        ]
        for what, name, reason in items:
            key = (what, _QUOTED.sub("'…'", reason))
            group = groups.get(key)
            if group is None:
                group = groups[key] = NotRunGroup(what=what, reason=key[1], example_reason=reason)
            group.count += 1
            if len(group.examples) < EXAMPLE_NODES:
                group.examples.append(name)
        return sorted(groups.values(), key=lambda g: -g.count)

    @property
    def explained_mismatches(self) -> int:
        """Elements that differ from onnxruntime only because of the chosen rounding semantics."""
        explained = (layer for layer in self.layers.values() if layer.predicted_mismatches is not None)
        return sum(layer.mismatches for layer in explained)

    @property
    def passed(self) -> bool:
        return self.verdict == PASSED

    @property
    def bugs(self) -> list[str]:
        """The not-run reasons that are bugs of ours (`BUG_MARKER`), one per node or output."""
        reasons = [layer.reason or "" for layer in self.layers.values() if layer.verdict == NOT_RUN]
        reasons += [o.reason or "" for o in self.outputs.values() if o.ours is None]
        return [reason for reason in reasons if BUG_MARKER in reason]

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "backend": self.backend,
            "engine": self.engine,
            "form": self.form,
            "semantics": self.semantics,
            "verdict": self.verdict,
            "verdict_line": self.verdict_line,
            "passed": self.passed,
            "allow_not_run": self.allow_not_run,
            "inputs": self.inputs_source,
            "samples": self.samples,
            "node_samples": self.node_samples,
            "summary": {
                "layers_passed": self.count(PASS),
                "layers_failed": self.count(FAIL),
                "layers_not_run": self.count(NOT_RUN),
                "outputs_not_run": sum(1 for o in self.outputs.values() if o.ours is None),
            },
            "not_run": [group.to_json() for group in self.not_run_groups()],
            "mismatches_explained_by_semantics": self.explained_mismatches,
            "tolerances": self.tolerances.to_json(),
            "layers": {name: layer.to_json() for name, layer in self.layers.items()},
            "outputs": {name: output.to_json() for name, output in self.outputs.items()},
            "notes": self.notes,
        }

    def write_json(self, path: str | os.PathLike[str]) -> None:
        """Write the JSON report atomically (a temporary file in the same folder, then a rename)."""
        text = json.dumps(json_safe(self.to_json()), indent=2, allow_nan=False) + "\n"
        with atomic_text_file(path) as stream:
            stream.write(text)


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float (Python or numpy) as the string "inf", "-inf" or "nan", numpy
    scalars as Python numbers, tuples as lists: what `json.dumps(..., allow_nan=False)` accepts."""
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        number = float(value)
        if math.isnan(number):
            return "nan"
        if math.isinf(number):
            return "inf" if number > 0 else "-inf"
        return number
    return value


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
            comparable=False,
        )
    equal = _equal_mask(reference, ours)
    mismatches = elements - int(np.count_nonzero(equal))
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
    ref_finite, ours_finite = ref64[finite], ours64[finite]
    # Sums, not np.dot: BLAS's threads made each dot cost ~10 ms on a busy 2-core machine.
    signal = float(np.sum(ref_finite * ref_finite))
    noise = float(np.sum((ref_finite - ours_finite) ** 2))
    dot, ours_energy = float(np.sum(ref_finite * ours_finite)), float(np.sum(ours_finite * ours_finite))
    step_energy = None
    if reference.dtype.kind in "iub":  # an integer output's step is 1
        step_energy = float(np.count_nonzero(finite))
    elif lsb_unit is not None:
        steps = np.broadcast_to(np.abs(np.asarray(lsb_unit, np.float64)), reference.shape)[finite]
        step_energy = float(np.sum(steps * steps))
    steps_off = None
    if (reference.dtype.kind in "iub" or lsb_unit is not None) and not mismatches:
        steps_off = [elements]  # all 0 steps off: no pass over the data (bit-exact is the common case)
    elif reference.dtype.kind in "iub" or lsb_unit is not None:
        steps_off = _steps_off(diff, None if reference.dtype.kind in "iub" else lsb_unit, equal)
    within = True
    if atol is not None or rtol is not None:
        bound = (atol or 0.0) + (rtol or 0.0) * np.abs(ref64)
        within = bool(np.all(diff <= bound))
    return Comparison(
        elements=elements,
        mismatches=mismatches,
        max_abs_diff=max_abs,
        max_lsb_diff=max_lsb,
        sqnr_db=_sqnr(signal, noise),
        cosine=_cosine(dot, signal, ours_energy, noise),
        within_tolerance=within,
        signal=signal,
        noise=noise,
        dot=dot,
        ours_energy=ours_energy,
        step_energy=step_energy,
        steps_off=steps_off,
    )


def sqnr_sums(reference: np.ndarray, ours: np.ndarray) -> tuple[float, float]:
    """compare()'s SQNR sums alone, in two passes (a float node's report needs no more): sum ref^2 and
    sum (ref - ours)^2 over the elements finite in both; noise inf when the shapes differ."""
    reference, ours = np.asarray(reference), np.asarray(ours)
    if reference.shape != ours.shape:
        return 0.0, math.inf
    ref64, ours64 = reference.astype(np.float64, copy=False), ours.astype(np.float64, copy=False)
    finite = np.isfinite(ref64) & np.isfinite(ours64)
    if not finite.all():
        ref64, ours64 = ref64[finite], ours64[finite]
    return float(np.sum(ref64 * ref64)), float(np.sum((ref64 - ours64) ** 2))


def _steps_off(diff: np.ndarray, lsb_unit: np.ndarray | None, equal: np.ndarray) -> list[int]:
    """Elements off by k steps (`diff` in steps already when `lsb_unit` is None), k capped at STEPS_OFF_CAP;
    only the differing elements are divided, the equal ones are 0 steps off."""
    differing = ~equal
    off = diff[differing]
    if lsb_unit is not None:
        units = np.broadcast_to(np.abs(np.asarray(lsb_unit, np.float64)), diff.shape)[differing]
        with np.errstate(divide="ignore", invalid="ignore"):
            off = np.rint(off / units)
    off = np.nan_to_num(off, nan=STEPS_OFF_CAP, posinf=STEPS_OFF_CAP)  # 0/0 or NaN against a number: far off
    counts = np.bincount(np.minimum(off, STEPS_OFF_CAP).astype(np.int64), minlength=1)
    counts[0] += int(np.count_nonzero(equal))
    return _trimmed([int(c) for c in counts])


def add_steps_off(first: list[int], second: list[int]) -> list[int]:
    """Two steps-off histograms (lists of counts by k) as one."""
    longer, shorter = (first, second) if len(first) >= len(second) else (second, first)
    return _trimmed([count + (shorter[k] if k < len(shorter) else 0) for k, count in enumerate(longer)])


def _trimmed(counts: list[int]) -> list[int]:
    while len(counts) > 1 and counts[-1] == 0:
        counts.pop()
    return counts


def _sqnr(signal: float, noise: float) -> float:
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _cosine(dot: float, signal: float, ours_energy: float, noise: float) -> float:
    norms = math.sqrt(signal) * math.sqrt(ours_energy)
    if norms:
        return dot / norms
    return 1.0 if noise == 0 else 0.0


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
