"""`--target-cosine X` / `--target-metric`: widen the fewest activations to int16 until held-out outputs
reach the target.

NOTE: the search, in the order it runs:
1. the data streams: without `eval_data`, the last quarter of `--data`'s batches (at least one) is held out
   by batch index (kept in memory: every candidate runs on it) and the rest is calibrated on, read from the
   source again as it goes; the figures that decide are never the calibration set's;
2. one calibration (the caller's method, scheme, sentinel guard and outlier widening) and its ranges saved;
   each 8-bit activation ranked by a cheap bound of its own Q/DQ loss, no model run per candidate: one run
   of the float model exposing them all (the first 16 calibration samples), each tensor quantize-dequantized
   with its own parameters (`numerics`) and the relative error taken per channel of the last axis, averaged
   over channels (`channel_loss`: a whole-tensor error hides an outlier channel, per channel each crushed
   channel counts fully);
3. the ranked tensors grouped by role: the name with its layer index taken out (`group_of`:
   `/encoder/layer.3/output/dense/MatMul_output_0` -> `/encoder/layer.*/output/dense/MatMul_output_0`), a
   tensor with no layer index its own group; a group's bound is its members' largest channel loss;
4. candidates mixed in memory (`candidates.Mixer`): the model finalized once at the base precision and once
   with every ranked tensor int16 (symmetric: zero point 0, what TOSA's int16 profile takes; over the
   values calibration observed, its histogram's extent, not the method's 8-bit range: `_extent`), a candidate
   taking each tensor's Q/DQ parameters from one or the other; each measured by onnxruntime (optimizations
   off) on the held-out samples in large batches against the float outputs computed once
   (`target_metric.HeldOut`);
5. measurements: the base (passes: nothing widened), every ranked tensor int16 (misses: not reachable by
   widening; the best measured model is written and the summary says so), then each of the first
   `MEASURED_GROUPS` groups by bound left at the base precision with every other int16, on the first
   `SENSITIVITY_SAMPLES` held-out samples: its sensitivity is how much that raises the shortfall
   (`target_metric`: loss over loss allowed; such losses add up roughly over tensors quantized apart);
6. each tensor's estimated sensitivity: its group's measured one split over the members by channel loss
   (the loss no measured group explains split over the unmeasured tensors the same way); tensors in that
   order, and the fewest first k that pass looked for with at most `MAX_PROBES` whole-held-out
   evaluations: the first probe where the additive prediction falls under `MARGIN`, each next one where
   the prediction, rescaled by the last probe's measured over predicted loss, reaches the target, kept in
   the middle half of the bracket of a missing and a passing k (so the bracket shrinks by a quarter or
   more: the prediction alone crept down by 2-6 tensors a probe on MiniLM). Tensors
   tied in the finalized model (sharing Q/DQ parameters, or one bias) are widened together;
7. the chosen model is finalized for real and written to `out`, measured again on the held-out samples
   (`result.search.final`: the same figures as the mixed candidate's), and compared (`result.agreement`);
   every step (what was tried, widened count, each condition's value, seconds) is in `result.search` (JSON
   `search`) and in the summary's notes.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qconvert.calibrate.dataset import counted
from qconvert.calibrate.target_metric import Condition, HeldOut, Measurement, conditions_of
from qconvert.errors import InputError

if TYPE_CHECKING:
    from onnx import ModelProto

    from qconvert.calibrate.api import CalibrationResult
    from qconvert.calibrate.dataset import DataSource
    from qconvert.numerics import UniformParams

HELD_OUT_FRACTION = 0.25  # of --data's batches, when no --eval-data is given
RANKING_SAMPLES = 16  # the ranking's float run: the first whole batches of the calibration data up to this
SENSITIVITY_SAMPLES = 32  # held-out samples a group's sensitivity is measured on
MEASURED_GROUPS = 8  # groups (by bound) whose sensitivity is measured
MARGIN = 0.85  # predicted shortfall to aim at while missing (the additive model is rough)
MARGIN_BELOW = 0.0  # ... and once a probe passes: the fewest tensors predicted to pass
MAX_PROBES = 7  # whole-held-out evaluations spent looking for the fewest tensors
WIDE_TYPE = "int16"
_STORAGE = {"i8": (np.int8, -128, 127), "u8": (np.uint8, 0, 255), "i16": (np.int16, -32768, 32767)}
_STORAGE["u16"] = (np.uint16, 0, 65535)
_LAYER_INDEX = re.compile(r"(?<=[./_])\d+(?=/)")  # a path segment's trailing number: `layer.3/`, `h_3/`


@dataclass(frozen=True, slots=True)
class SearchStep:
    """One evaluated candidate: what it tried, how many tensors it widens, each condition's value."""

    tried: str
    widened: int
    values: tuple[float, ...]
    shortfall: float
    passed: bool
    samples: int
    seconds: float


@dataclass
class SearchReport:
    """The search as run: conditions, where the held-out data came from, the ranking and every step."""

    conditions: list[Condition]
    eval_source: str
    eval_samples: int
    calibration_samples: int = 0
    ranked: list[tuple[str, float]] = field(default_factory=list)  # tensor -> channel loss, worst first
    groups: list[dict[str, object]] = field(default_factory=list)  # group, tensors, bound, sensitivity
    steps: list[SearchStep] = field(default_factory=list)
    widened: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)  # widened tensor -> why
    reached: bool = False
    seconds: float = 0.0
    candidates: str = "mixed in memory"  # or why each candidate was finalized instead
    final: SearchStep | None = None  # the written model, measured again
    outputs: list[str] = field(default_factory=list)
    quantized: int = 0  # 8- and 16-bit activations of the written model (not the constants given Q/DQ)
    already_wide: int = 0  # activations 16-bit before the search (the outlier guard's, the outlier channels')
    activations: set[str] = field(default_factory=set)  # the model's (Constant outputs: ranked, not counted)
    int16_total: int | None = None  # int16 activations of the written model, as finalize wrote them
    no_effect: list[str] = field(default_factory=list)  # widened, but 8-bit as written (a weight's Q/DQ)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase

    def lap(self, phase: str, since: float) -> float:
        """Record the seconds since `since` as `phase`'s; the time now."""
        now = time.perf_counter()
        self.phases[phase] = now - since
        return now

    def to_json(self) -> dict[str, object]:
        return {
            "conditions": [c.spelled for c in self.conditions],
            "target_cosine": next((c.threshold for c in self.conditions if c.metric == "cosine"), None),
            "outputs": self.outputs,
            "eval_source": self.eval_source,
            "eval_samples": self.eval_samples,
            "calibration_samples": self.calibration_samples,
            "candidates": self.candidates,
            "ranked": [{"tensor": name, "channel_loss": loss} for name, loss in self.ranked],
            "groups": [{key: _finite(value) for key, value in group.items()} for group in self.groups],
            "steps": [_step_json(step) for step in self.steps],
            "widened_to_int16": self.widened,
            "why": self.why,
            "quantized_activations": self.quantized,
            "int16_before_the_search": self.already_wide,
            "int16_activations": self._int16_total(),
            "widened_without_effect": self.no_effect,
            "reached": self.reached,
            "final": None if self.final is None else _step_json(self.final),
            "seconds": self.seconds,
            "phases": self.phases,
        }

    def lines(self) -> list[str]:
        """The summary's notes: where the data came from, each step, the decision."""
        spelled = ", ".join(c.spelled for c in self.conditions)
        grouped = f" in {counted(len(self.groups), 'group')}" if self.groups else ""
        lines = [
            f"search ({spelled}): evaluated on {counted(self.eval_samples, 'held-out sample')} "
            f"({self.eval_source}); calibrated on {self.calibration_samples}; "
            f"{counted(len(self.ranked), '8-bit tensor')} ranked by their own per-channel loss"
            f"{grouped}; candidates {self.candidates}"
        ]
        for step in self.steps:
            lines.append(f"search: {step.tried}: {self._figures(step)}")
        chosen = ", ".join(f"{name} ({self.why.get(name, '')})" for name in self.widened) or "none"
        moot = set(self.no_effect)
        added = sum(1 for name in self.widened if name in self.activations and name not in moot)
        before = f", {self.already_wide} of them before the search (outliers)" if self.already_wide else ""
        constants = sum(1 for name in self.widened if name not in self.activations and name not in moot)
        also = f" and the Q/DQ of {counted(constants, 'constant')}" if constants else ""
        lines.append(
            f"search: widened to int16 by the search: {added} of {self.quantized} activations{also} "
            f"(int16 activations in all: {self._int16_total()}{before}): {chosen}"
        )
        if moot:
            lines.append(
                f"search: {counted(len(moot), 'chosen tensor')} stayed 8-bit as written (sharing a weight's "
                f"Q/DQ parameters, placement.py): {', '.join(self.no_effect)}"
            )
        if self.final is not None:
            lines.append(f"search: the written model: {self._figures(self.final)}")
        phases = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in self.phases.items())
        lines.append(f"search: {self.seconds:.1f} s: {phases}")
        if not self.reached:
            lines.append(
                f"search ({spelled}): not reached, even with every ranked activation int16; the best "
                f"candidate measured is written"
            )
        return lines

    def _int16_total(self) -> int:
        """The written model's int16 activations (estimated when no model was finalized to count them)."""
        if self.int16_total is not None:
            return self.int16_total
        return self.already_wide + sum(1 for name in self.widened if name in self.activations)

    def _figures(self, step: SearchStep) -> str:
        values = ", ".join(
            f"{c.spelled.split('>')[0].split('<')[0]} {v:.5f}" for c, v in zip(self.conditions, step.values)
        )
        verdict = "reaches" if step.passed else "misses"
        samples = counted(step.samples, "sample")
        return f"{step.widened} widened, {values} ({verdict}; {samples}, {step.seconds:.1f} s)"


def _finite(value: object) -> object:
    """JSON has no infinity: a non-finite figure (a target no candidate can reach, a max |error| over
    non-finite outputs) is written null."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _step_json(step: SearchStep) -> dict[str, object]:
    """A step as JSON: a shortfall or value that is infinite (`--target-cosine 1` missed, `max-abs<=0`
    missed: no loss is allowed) is null; `passed` says whether it was reached."""
    fields = asdict(step)
    fields["values"] = [_finite(value) for value in step.values]
    fields["shortfall"] = _finite(step.shortfall)
    return fields


def group_of(name: str) -> str:
    """The tensor's role: its name with the layer index of each path segment replaced by `*`."""
    return _LAYER_INDEX.sub("*", name)


def channel_loss(values: np.ndarray, restored: np.ndarray) -> float:
    """Mean over channels (last axis) of ‖x_c - x̂_c‖ / ‖x_c‖ over the channel's finite values (0 for a
    channel of zeros restored exactly): a crushed small channel beside an outlier one counts fully."""
    # float32: a ranking, not a figure (the exposing run on MiniLM spends its time in these reductions)
    left = np.asarray(values, np.float32).reshape(-1, values.shape[-1] if values.ndim else 1)
    right = np.asarray(restored, np.float32).reshape(left.shape)
    finite = np.isfinite(left) & np.isfinite(right)
    left, right = np.where(finite, left, 0.0), np.where(finite, right, 0.0)
    errors = np.linalg.norm(left - right, axis=0)
    norms = np.linalg.norm(left, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        relative = np.where(errors == 0, 0.0, errors / norms)
    relative = np.where(np.isfinite(relative), relative, 1.0)  # error on a channel of zeros: all lost
    return float(relative.mean()) if relative.size else 0.0


def _extent(histogram: Mapping[str, Any]) -> tuple[float, float] | None:
    """The observed values' extent from calibration's histogram (its occupied bins' outer edges): a
    widened tensor's 16-bit range. The method's range clips for 8 bits (percentile, MSE, entropy); at 16
    the step is 256 times finer and the clipped tail is the larger error (MiniLM's pre-GELU MatMuls)."""
    counts = histogram.get("counts") or []
    if not counts:
        return None
    start, width = float(histogram["start"]), float(histogram["width"])
    end = start + width * len(counts)
    if histogram.get("absolute"):  # counts of |x|: the extent is symmetric
        return -end, end
    return start, end


def _params(written: Mapping[str, object]) -> UniformParams | None:
    from qconvert.numerics import UniformParams

    storage = _STORAGE.get(str(written.get("storage")))
    if storage is None:  # 4-bit, float8: not ranked (widening them is not this search's choice)
        return None
    dtype, low, high = storage
    return UniformParams(
        scale=np.float64(written["scale"]),  # type: ignore[arg-type]
        zero_point=np.int64(written["zero_point"]),  # type: ignore[call-overload]
        storage_dtype=np.dtype(dtype),
        storage_type_min=low,
        storage_type_max=high,
    )


def known_activations(model: ModelProto) -> set[str]:
    """The model's activations: graph inputs and node outputs, not initializers or Constant outputs."""
    constants = {tensor.name for tensor in model.graph.initializer}
    names = {name for node in model.graph.node if node.op_type != "Constant" for name in node.output}
    names |= {value.name for value in model.graph.input}
    return names - constants


def rank_tensors(
    model: str | os.PathLike[str] | ModelProto,
    quantization: Mapping[str, Mapping[str, object]],
    batches: list[dict[str, np.ndarray]],
) -> list[tuple[str, float]]:
    """Each quantized activation's channel loss on `batches` (one float run exposing all), worst first."""
    from qconvert.calibrate.collect import augment_model, load_float_model, make_session
    from qconvert.numerics import Rounding, dequantize, quantize

    loaded = load_float_model(model)
    known = {name for node in loaded.model.graph.node for name in node.output}  # Constant outputs too
    known |= {tensor.name for tensor in loaded.model.graph.input}
    params = {name: p for name, w in quantization.items() if name in known and (p := _params(w)) is not None}
    names = list(params)
    if not names:
        return []
    session = make_session(augment_model(loaded, names), threads=0)
    losses: dict[str, list[float]] = {name: [] for name in names}
    for arrays in batches:
        for name, values in zip(names, session.run(names, arrays)):
            values = np.asarray(values)
            if not np.issubdtype(values.dtype, np.floating) or values.size == 0:
                continue
            restored = dequantize(quantize(values, params[name], Rounding.ONNX), params[name], Rounding.ONNX)
            losses[name].append(channel_loss(values, restored))
    ranked = [(name, float(np.mean(found)) if found else 0.0) for name, found in losses.items()]
    return sorted(ranked, key=lambda item: (-item[1], item[0]))


class _Split:
    """`--data` streamed: the calibration batches are read from the source again whenever calibration
    reads them (a function of no arguments, a re-openable data source); the held-out ones are kept."""

    def __init__(self, data: DataSource, model: ModelProto, batch_size: int | str | None) -> None:
        from qconvert.calibrate.dataset import open_dataset

        self.dataset = open_dataset(data, model, batch_size)
        count = sum(1 for _ in self.dataset.batches())  # a first read: how many batches
        if count < 2:
            raise InputError(
                "--target-cosine: --data holds one batch; a held-out split needs two or more "
                "(or give --eval-data)"
            )
        self.held = max(1, round(count * HELD_OUT_FRACTION))
        self.first_held = count - self.held
        self.count = count

    def calibration(self) -> Iterator[dict[str, np.ndarray]]:
        for batch in self.dataset.batches():
            if batch.index >= self.first_held:
                return
            yield batch.arrays

    def held_out(self) -> list[dict[str, np.ndarray]]:
        return [dict(batch.arrays) for batch in self.dataset.batches() if batch.index >= self.first_held]


def _first_samples(
    data: DataSource, model: ModelProto, batch_size: int | str | None, count: int
) -> list[dict[str, np.ndarray]]:
    """The first whole batches covering `count` samples."""
    from qconvert.calibrate.dataset import open_dataset

    chosen: list[dict[str, np.ndarray]] = []
    for batch in open_dataset(data, model, batch_size).batches():
        if sum(len(next(iter(arrays.values()))) for arrays in chosen) >= count:
            break
        chosen.append(dict(batch.arrays))
    return chosen


def search_target_cosine(
    model: str | os.PathLike[str] | ModelProto,
    data: DataSource,
    target: float | None,
    *,
    eval_data: DataSource | None = None,
    out: str | os.PathLike[str] | None = None,
    ranges_path: str | os.PathLike[str] | None = None,
    json_path: str | os.PathLike[str] | None = None,
    batch_size: int | str | None = None,
    calibrate_options: Mapping[str, Any] | None = None,
    target_outputs: Sequence[str] = (),
    target_metrics: Sequence[str | Condition] = (),
) -> CalibrationResult:
    """Calibrate on `data` (less its held-out quarter when `eval_data` is None), then widen the fewest
    activations to int16 until every condition holds on the held-out samples (`target`: a mean cosine, on
    `target_outputs` or every float output; `target_metrics`: `METRIC[:OUTPUT]>=VALUE` conditions, see
    target_metric.py); write that model to `out`. `calibrate_options`: the rest of `calibrate`'s keywords."""
    from qconvert.calibrate.api import calibrate, make_scheme
    from qconvert.calibrate.collect import load_float_model
    from qconvert.calibrate.dataset import open_dataset

    started = time.perf_counter()
    conditions = conditions_of(target, target_outputs, target_metrics)
    options = dict(calibrate_options or {})
    options.pop("evaluate_samples", None)
    options.pop("evaluate_tensors", None)
    loaded = load_float_model(model)
    reference: str | bytes = (
        model.SerializeToString() if not isinstance(model, str | os.PathLike) else os.fspath(model)
    )
    calibration: DataSource
    if eval_data is None:
        split = _Split(data, loaded.model, batch_size)
        calibration, held_out = split.calibration, split.held_out()
        source = f"the last {split.held} of --data's {split.count} batches, not used for calibration"
    else:
        calibration, source = data, "--eval-data"
        held_out = [
            dict(batch.arrays) for batch in open_dataset(eval_data, loaded.model, batch_size).batches()
        ]
    fixed = open_dataset(data, loaded.model, batch_size).fixed_batch
    evaluation = HeldOut(
        reference, held_out, conditions, batch_size=1 if fixed or batch_size == "given" else None,
        label=loaded.label,
    )  # fmt: skip
    scheme = make_scheme(options.pop("scheme", None))
    report = SearchReport(conditions, source, evaluation.samples)
    report.outputs = evaluation.names
    with tempfile.TemporaryDirectory(prefix="qconvert-search.") as scratch:
        saved, base_path = Path(scratch) / "ranges.json", Path(scratch) / "base.onnx"
        first = calibrate(
            model, calibration, scheme=scheme, out=base_path, ranges_path=saved, batch_size=batch_size,
            **options,
        )  # fmt: skip
        report.calibration_samples = first.stats.samples_used if first.stats is not None else 0
        lap = report.lap("calibration (and the held-out float outputs)", started)
        eight_bit = {
            name: written
            for name, written in first.quantization.items()
            if written.get("storage") in ("i8", "u8")
        }
        ranking = _first_samples(calibration, loaded.model, batch_size, RANKING_SAMPLES)
        report.ranked = [
            (name, loss)
            for name, loss in rank_tensors(model, eight_bit, ranking)
            if name not in scheme.tensor_overrides
        ]
        ranked = [name for name, _ in report.ranked]
        activations = report.activations = known_activations(loaded.model)  # not constants given Q/DQ
        report.quantized = sum(1 for name in first.quantization if name in activations)
        report.already_wide = sum(
            1
            for name, written in first.quantization.items()
            if name in activations and written.get("storage") in ("i16", "u16")
        )
        lap = report.lap("ranking", lap)

        extents = {name: _extent(found) for name, found in first.histograms.items()}

        def scheme_for(widened: Sequence[str]) -> Any:
            from qconvert.calibrate.overrides import TensorOverride

            chosen = make_scheme(scheme)
            for name in widened:
                low, high = extents.get(name) or (None, None)
                chosen.tensor_overrides[name] = TensorOverride(
                    quant_type=WIDE_TYPE, symmetric=True, rmin=low, rmax=high
                )
            return chosen

        build, together = _builder(model, saved, base_path, Path(scratch), ranked, scheme_for, report)
        steps: dict[tuple[frozenset[str], int], SearchStep] = {}
        lap = report.lap("the every-int16 model, finalized", lap)

        def measure(tried: str, widened: Sequence[str], held: HeldOut = evaluation) -> SearchStep:
            widened = together(widened)
            key = (frozenset(widened), held.samples)
            if key in steps:
                return steps[key]
            begun = time.perf_counter()
            found: Measurement = held.measure(build(widened))
            step = SearchStep(
                tried, len(widened), found.values, found.shortfall, found.passed, held.samples,
                time.perf_counter() - begun,
            )  # fmt: skip
            steps[key] = step
            report.steps.append(step)
            return step

        chosen = _choose(ranked, dict(report.ranked), measure, together, evaluation, report)
        chosen = [name for name in ranked if name in set(together(chosen))]
        for name in chosen:
            report.why.setdefault(name, "shares its Q/DQ parameters with a widened tensor (placement.py)")
        report.reached = measure("", chosen).passed
        report.widened = chosen
        lap = report.lap("evaluations", lap)
        final = calibrate(  # compared on the held-out samples (only when a model is written)
            model, held_out if out is not None else None, load_ranges=saved, scheme=scheme_for(chosen),
            out=out, evaluate_samples=evaluation.samples if out is not None else 0, batch_size=batch_size,
        )  # fmt: skip
        if final.quantization:  # the written storage: an override on a tensor sharing a weight's Q/DQ is moot
            report.int16_total = sum(
                1
                for name, written in final.quantization.items()
                if name in report.activations and written.get("storage") in ("i16", "u16")
            )
            report.no_effect = [
                name for name in chosen if final.quantization.get(name, {}).get("storage") in ("i8", "u8")
            ]
        if out is not None and os.fspath(out) != "-":
            begun = time.perf_counter()
            found = evaluation.measure(os.fspath(out))
            report.final = SearchStep(
                "the written model", len(chosen), found.values, found.shortfall, found.passed,
                evaluation.samples, time.perf_counter() - begun,
            )  # fmt: skip
        report.lap("the chosen model, finalized, written, compared", lap)
        if ranges_path is not None:
            clamped = {
                o for node in loaded.model.graph.node if node.op_type in ("Relu", "Clip") for o in node.output
            }
            _place(None, ranges_path, lambda: _searched_ranges(saved, chosen, extents, report.why, clamped))
    final.stats, final.batch_size = first.stats, first.batch_size
    final.seconds_collecting, final.method = first.seconds_collecting, first.method
    final.histograms = first.histograms
    final.warnings = list(dict.fromkeys([*first.warnings, *final.warnings]))
    final.notes = list(dict.fromkeys([*first.notes, *final.notes]))
    report.seconds = time.perf_counter() - started
    final.search = report
    final.notes.extend(report.lines())
    if not report.reached:  # the user asked for a figure the written model does not give: say so loudly
        final.warnings.append(report.lines()[-1])
    final.seconds_total = report.seconds
    if json_path is not None:
        _place(None, json_path, final.json_text)
    return final


def _builder(
    model: str | os.PathLike[str] | ModelProto,
    saved: Path,
    base_path: Path,
    scratch: Path,
    ranked: Sequence[str],
    scheme_for: Callable[[Sequence[str]], Any],
    report: SearchReport,
) -> tuple[Callable[[Sequence[str]], bytes | str], Callable[[Sequence[str]], list[str]]]:
    """(candidate(widened) -> the model to run: mixed in memory when the two finalized models allow it,
    else finalized and written (a path); together(widened) -> with the tensors sharing their parameters)."""
    import onnx

    from qconvert.calibrate.api import calibrate
    from qconvert.calibrate.candidates import Mixer

    def finalized(widened: Sequence[str]) -> str:
        path = scratch / "candidate.onnx"
        calibrate(model, None, load_ranges=saved, scheme=scheme_for(widened), out=path)
        return os.fspath(path)

    if not ranked:
        return finalized, list
    wide_path = finalized(ranked)
    mixer = Mixer(onnx.load(base_path), onnx.load(wide_path), ranked)
    if not mixer.mixable:
        report.candidates = f"finalized one by one ({mixer.reason})"
        return finalized, mixer.together
    if mixer.note:
        report.candidates = f"mixed in memory ({mixer.note})"
    return mixer.build, mixer.together


def _choose(
    ranked: Sequence[str],
    losses: Mapping[str, float],
    measure: Callable[..., SearchStep],
    together: Callable[[Sequence[str]], list[str]],
    evaluation: HeldOut,
    report: SearchReport,
) -> list[str]:
    """The search's decisions (NOTE 5-6): the tensors to widen, each with why in `report.why`."""
    base = measure("base (no tensor widened by the search)", [])
    if base.passed or not ranked:
        return []
    top = measure(f"every ranked tensor int16 ({len(ranked)})", list(ranked))
    if not top.passed:
        best = min(
            report.steps, key=lambda step: (step.shortfall, _losses(report.conditions, step), step.widened)
        )
        if best is not top:
            return []
        for name in ranked:
            report.why[name] = "the target is not reached: every ranked tensor int16 came closest"
        return list(ranked)
    groups: dict[str, list[str]] = {}
    for name in ranked:
        groups.setdefault(group_of(name), []).append(name)
    order = sorted(groups, key=lambda g: (-max(losses[n] for n in groups[g]), g))
    subset = evaluation.subset(SENSITIVITY_SAMPLES)
    top_subset = measure(f"every ranked tensor int16 ({len(ranked)})", list(ranked), subset).shortfall
    sensitivity: dict[str, float] = {}
    for group in order[:MEASURED_GROUPS]:
        left_out = set(together(groups[group]))  # with the tensors widened only together with them
        others = [n for n in ranked if n not in left_out]
        left = measure(
            f"sensitivity: {group} ({len(groups[group])}) left 8-bit, the rest int16", others, subset
        )
        sensitivity[group] = max(0.0, left.shortfall - top_subset)
    # Each tensor's share: its group's measured sensitivity split by channel loss; the loss no measured
    # group explains split over the unmeasured tensors the same way.
    estimate: dict[str, float] = {}
    unexplained = max(0.0, base.shortfall - top.shortfall - sum(sensitivity.values()))
    unmeasured = [n for g in order if g not in sensitivity for n in groups[g]]
    for group in order:
        members = groups[group]
        total = sum(losses[n] for n in members) or 1.0
        pool = sensitivity.get(group)
        for name in members:
            if pool is not None:
                estimate[name] = pool * losses[name] / total
        entry: dict[str, object] = {
            "group": group,
            "tensors": members,
            "bound": max(losses[n] for n in members),
        }
        entry["sensitivity"] = sensitivity.get(group)
        report.groups.append(entry)
    spread = sum(losses[n] for n in unmeasured) or 1.0
    for name in unmeasured:
        estimate[name] = unexplained * losses[name] / spread
    chosen_order = sorted(ranked, key=lambda n: (-estimate[n], -losses[n], n))
    remaining = [0.0] * (len(chosen_order) + 1)  # predicted shortfall left by the tensors after the first k
    for k in range(len(chosen_order) - 1, -1, -1):
        remaining[k] = remaining[k + 1] + estimate[chosen_order[k]]
    low, high = 0, len(chosen_order)  # the first `low` miss, the first `high` pass
    scale = 1.0  # measured over predicted shortfall above every-int16's, from the last probe

    def guess(aim: float) -> int:
        return next(
            (k for k in range(low + 1, high) if top.shortfall + scale * remaining[k] <= aim),
            (low + high) // 2,
        )

    probe = guess(MARGIN)
    for _ in range(MAX_PROBES):
        if high - low <= 1:
            break
        quarter = max(1, (high - low) // 4)  # the bracket shrinks by a quarter or more whatever the guess
        probe = min(max(probe, low + quarter), high - quarter)
        step = measure(f"widen the first {probe} by estimated sensitivity", chosen_order[:probe])
        predicted = remaining[probe]
        if predicted > 0:  # far inside the passing side the measured loss is noise: the scale stays bounded
            scale = min(max((step.shortfall - top.shortfall) / predicted, 0.5), 2.0)
        if step.passed:
            high = probe
            probe = guess(1.0 - MARGIN_BELOW)
        else:
            low = probe
            probe = guess(MARGIN)
    widened = chosen_order[:high]
    for name in widened:
        group = group_of(name)
        if group in sensitivity:
            how = f"group {group} measured {sensitivity[group]:.3g}"
        else:
            how = f"group {group} not measured: its share of the unexplained {unexplained:.3g}"
        report.why[name] = (
            f"estimated sensitivity {estimate[name]:.3g} ({how}), channel loss {losses[name]:.3g}"
        )
    return [n for n in ranked if n in widened]


def _searched_ranges(
    saved: Path,
    widened: Sequence[str],
    extents: Mapping[str, tuple[float, float] | None],
    why: Mapping[str, str],
    clamped: Collection[str],
) -> str:
    """The ranges JSON `--ranges` writes after a search: `--load-ranges` gives back the searched model.
    The tensors it widened join the widened outliers (reapplied at int16 symmetric on load, as the guard's
    and the outlier channels' are), their extents under `SEARCH_RANGES_KEY`, and their range is the extent
    the search widened them over (`_extent`; an override's rmin/rmax replaces the calibrated range, so the
    scales are the same) - except a Relu/Clip output (`clamped`): its input takes its saved range
    (placement.py's `adjust_tensor_ranges`) at the base precision, so it keeps the method's range and is
    widened over that on load (the extent from the metadata needs `calibrate(load_ranges=...)` to read it)."""
    import json

    from qconvert.calibrate.api import SEARCH_RANGES_KEY, WIDENED_OUTLIERS_KEY
    from qconvert.calibrate.ranges import CalibrationRanges, as_float32

    ranges = CalibrationRanges.load(saved)
    stored = ranges.metadata.get(WIDENED_OUTLIERS_KEY)
    recorded: dict[str, object] = dict(stored) if isinstance(stored, dict) else {}
    searched: dict[str, list[float]] = {}
    for name in widened:
        recorded[name] = f"widened to {WIDE_TYPE} by the search ({why.get(name, '')})"
        extent = extents.get(name)
        if extent is not None:
            searched[name] = [float(extent[0]), float(extent[1])]
        if extent is not None and name in ranges and name not in clamped:
            tensor_range = ranges[name]
            tensor_range.note = (
                f"the search's {WIDE_TYPE} range: the observed values' extent ({tensor_range.method} gave "
                f"[{tensor_range.min:.6g}, {tensor_range.max:.6g}])"
            )
            tensor_range.min, tensor_range.max = as_float32(extent[0]), as_float32(extent[1])
    ranges.metadata[WIDENED_OUTLIERS_KEY] = recorded
    ranges.metadata[SEARCH_RANGES_KEY] = searched
    return json.dumps(ranges.to_json(), indent=1, allow_nan=False) + "\n"


def _losses(conditions: Sequence[Condition], step: SearchStep) -> tuple[float, ...]:
    """Each condition's loss: what orders candidates whose shortfalls are both infinite (no loss allowed)."""
    return tuple(condition.loss(value) for condition, value in zip(conditions, step.values))


def _place(source: Path | None, target: str | os.PathLike[str], text: Callable[[], str]) -> None:
    """Copy a scratch file (or write text) to the user's path; '-' is stdout."""
    if os.fspath(target) == "-":
        sys.stdout.write(text())
    elif source is not None:
        shutil.copyfile(source, target)
    else:
        Path(target).write_text(text(), encoding="utf-8")


__all__ = ["SearchReport", "SearchStep", "channel_loss", "group_of", "rank_tensors", "search_target_cosine"]
