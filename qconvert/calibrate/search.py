"""`--target-cosine X`: widen the fewest activations to int16 until held-out outputs reach that cosine.

NOTE: the search, in the order it runs:
1. the data is read once into whole batches; without `eval_data` the last quarter of them (at least one
   batch) is held out and never calibrated on, so the figure that decides is not the calibration set's;
2. one calibration on the rest (the caller's method, scheme and sentinel guard), its ranges saved, and
   every quantized activation ranked by a cheap bound of its own Q/DQ loss, no model run per candidate:
   one run of the float model exposing them all (the first 32 calibration samples), each tensor's values
   quantize-dequantized with its own parameters (`numerics`), and the relative error taken per channel of
   the last axis, then averaged over channels (`channel_loss`). A whole-tensor relative error hides an
   outlier channel (its norm is the tensor's, so the crushed small channels barely count); per channel,
   each crushed channel counts fully;
3. candidates: the first k of that list widened to int16 (per-tensor overrides; weights stay int8, every
   op keeps its Q/DQ), the ranges reused as saved (`load_ranges`), each candidate written and run by
   onnxruntime (optimizations off: the QDQ session starts fast) on all held-out samples, whole batches,
   against the float model's outputs computed once. The metric is the lowest, over float outputs, of the
   mean per-sample cosine. k = 0 first, then k = every tensor, then bisection between: the fewest widened
   tensors that pass, if passing grows with k (log2(n) evaluations);
4. when int16 everywhere does not reach the target, the same search over keeping the first k in float
   (the rest int16);
5. the chosen candidate is written to `out`, and compared on the held-out samples (`result.agreement`);
   every step is in `result.search` (JSON `search`) and in the summary's notes.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qconvert.errors import InputError

if TYPE_CHECKING:
    from onnx import ModelProto

    from qconvert.calibrate.api import CalibrationResult
    from qconvert.calibrate.dataset import DataSource
    from qconvert.numerics import UniformParams

HELD_OUT_FRACTION = 0.25  # of --data's batches, when no --eval-data is given
RANKING_SAMPLES = 32  # the ranking's float run: the first whole batches of the calibration data up to this
WIDE_TYPE = "int16"
_STORAGE = {"i8": (np.int8, -128, 127), "u8": (np.uint8, 0, 255), "i16": (np.int16, -32768, 32767)}
_STORAGE["u16"] = (np.uint16, 0, 65535)


@dataclass(frozen=True, slots=True)
class SearchStep:
    """One evaluated candidate: how many ranked tensors it widens (or keeps in float), and the metric."""

    widened: int
    kept_float: int
    mean_cosine: float
    lowest_cosine: float
    passed: bool
    seconds: float


@dataclass
class SearchReport:
    """The search as run: target, where the held-out data came from, the ranking and every step."""

    target: float
    eval_source: str
    eval_samples: int
    calibration_samples: int
    ranked: list[tuple[str, float]] = field(default_factory=list)  # tensor -> channel loss, worst first
    steps: list[SearchStep] = field(default_factory=list)
    widened: list[str] = field(default_factory=list)
    kept_float: list[str] = field(default_factory=list)
    reached: bool = False
    seconds: float = 0.0
    outputs: list[str] = field(default_factory=list)  # the outputs whose cosine decides

    def to_json(self) -> dict[str, object]:
        return {
            "target_cosine": self.target,
            "outputs": self.outputs,
            "eval_source": self.eval_source,
            "eval_samples": self.eval_samples,
            "calibration_samples": self.calibration_samples,
            "ranked": [{"tensor": name, "channel_loss": loss} for name, loss in self.ranked],
            "steps": [asdict(step) for step in self.steps],
            "widened_to_int16": self.widened,
            "kept_float": self.kept_float,
            "reached": self.reached,
            "seconds": self.seconds,
        }

    def lines(self) -> list[str]:
        """The summary's notes: where the data came from, each step, the decision."""
        total = len(self.ranked)
        lines = [
            f"--target-cosine {self.target}: evaluated on {self.eval_samples} held-out samples "
            f"({self.eval_source}); calibrated on {self.calibration_samples}; the lowest mean cosine of "
            f"{', '.join(self.outputs)} decides; {total} activations ranked by their own per-channel loss"
        ]
        for step in self.steps:
            what = f"{step.widened} of {total} int16" + (
                f", {step.kept_float} float" if step.kept_float else ""
            )
            verdict = "reaches" if step.passed else "misses"
            lines.append(
                f"--target-cosine: {what}: mean cosine {step.mean_cosine:.5f}, "
                f"lowest {step.lowest_cosine:.5f} "
                f"({verdict} {self.target}, {step.seconds:.1f} s)"
            )
        loss = dict(self.ranked)
        chosen = ", ".join(f"{name} (channel loss {loss[name]:.3g})" for name in self.widened) or "none"
        lines.append(f"--target-cosine: widened to int16: {chosen}")
        if self.kept_float:
            lines.append(f"--target-cosine: kept in float: {', '.join(self.kept_float)}")
        if not self.reached:
            lines.append(
                f"--target-cosine {self.target}: not reached, even with every ranked activation float; "
                f"the best candidate evaluated is written"
            )
        return lines


def channel_loss(values: np.ndarray, restored: np.ndarray) -> float:
    """Mean over channels (last axis) of ‖x_c - x̂_c‖ / ‖x_c‖ over the channel's finite values (0 for a
    channel of zeros restored exactly): a crushed small channel beside an outlier one counts fully."""
    left = np.asarray(values, np.float64).reshape(-1, values.shape[-1] if values.ndim else 1)
    right = np.asarray(restored, np.float64).reshape(left.shape)
    finite = np.isfinite(left) & np.isfinite(right)
    left, right = np.where(finite, left, 0.0), np.where(finite, right, 0.0)
    errors = np.linalg.norm(left - right, axis=0)
    norms = np.linalg.norm(left, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        relative = np.where(errors == 0, 0.0, errors / norms)
    relative = np.where(np.isfinite(relative), relative, 1.0)  # error on a channel of zeros: all lost
    return float(relative.mean()) if relative.size else 0.0


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


def rank_tensors(
    model: str | os.PathLike[str] | ModelProto,
    quantization: Mapping[str, Mapping[str, object]],
    batches: list[dict[str, np.ndarray]],
) -> list[tuple[str, float]]:
    """Each quantized activation's channel loss on `batches` (one float run exposing all), worst first."""
    from qconvert.calibrate.collect import augment_model, load_float_model, make_session
    from qconvert.numerics import Rounding, dequantize, quantize

    loaded = load_float_model(model)
    known = {name for node in loaded.model.graph.node for name in node.output}
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


def _read_batches(
    data: DataSource, model: ModelProto, batch_size: int | str | None
) -> list[dict[str, np.ndarray]]:
    from qconvert.calibrate.dataset import open_dataset

    return [dict(batch.arrays) for batch in open_dataset(data, model, batch_size).batches()]


def _first_samples(batches: list[dict[str, np.ndarray]], count: int) -> list[dict[str, np.ndarray]]:
    """The first whole batches covering `count` samples."""
    chosen: list[dict[str, np.ndarray]] = []
    while len(chosen) < len(batches) and _samples(chosen) < count:
        chosen.append(batches[len(chosen)])
    return chosen


def _samples(batches: list[dict[str, np.ndarray]]) -> int:
    return sum(len(next(iter(arrays.values()))) for arrays in batches if arrays)


class HeldOut:
    """The held-out batches and the float model's outputs on them, computed once for every candidate."""

    def __init__(
        self, float_model: str | bytes, batches: list[dict[str, np.ndarray]], outputs: Sequence[str] = ()
    ) -> None:
        self.batches = batches
        session = _session(float_model)
        floating = [o.name for o in session.get_outputs() if o.type in ("tensor(float)", "tensor(double)")]
        unknown = [name for name in outputs if name not in floating]
        if unknown:
            raise InputError(
                f"--target-output {', '.join(unknown)}: not a float output of the model (its float outputs: "
                f"{', '.join(floating) or 'none'})"
            )
        self.names = list(outputs) or floating
        if not self.names:
            raise InputError("--target-cosine: the model has no float output whose cosine can be measured")
        # Rows per sample where axis 0 is as long as the batch, else the whole output one row.
        self.expected = [session.run(self.names, arrays) for arrays in batches]
        self.per_sample = [
            [np.ndim(v) > 0 and len(v) == _samples([arrays]) for v in values]
            for arrays, values in zip(batches, self.expected)
        ]

    def metric(self, path: Path) -> tuple[float, float]:
        """(lowest mean cosine over float outputs, lowest per-sample cosine) of the QDQ model at `path`."""
        from qconvert.calibrate.evaluate import sample_cosines

        session = _session(os.fspath(path))
        cosines: list[list[np.ndarray]] = [[] for _ in self.names]
        for arrays, expected, rows in zip(self.batches, self.expected, self.per_sample):
            for index, (want, got) in enumerate(zip(expected, session.run(self.names, arrays))):
                cosines[index].append(sample_cosines(want, got, rows[index]))
        means, lows = [], []
        for found in cosines:
            values = np.concatenate(found)
            values = values[np.isfinite(values)]
            means.append(float(values.mean()) if values.size else 0.0)
            lows.append(float(values.min()) if values.size else 0.0)
        return min(means), min(lows)


def _session(model: str | bytes) -> Any:
    """onnxruntime with graph optimizations off (the figures onnxruntime's own reference path gives, and
    a QDQ session that starts in a fraction of the optimized one's time)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def search_target_cosine(
    model: str | os.PathLike[str] | ModelProto,
    data: DataSource,
    target: float,
    *,
    eval_data: DataSource | None = None,
    out: str | os.PathLike[str] | None = None,
    ranges_path: str | os.PathLike[str] | None = None,
    json_path: str | os.PathLike[str] | None = None,
    batch_size: int | str | None = None,
    calibrate_options: Mapping[str, Any] | None = None,
    target_outputs: Sequence[str] = (),
) -> CalibrationResult:
    """Calibrate on `data` (less its held-out quarter when `eval_data` is None), then widen the fewest ranked
    activations to int16 (else keep them in float) until the outputs' mean cosine on the held-out samples
    reaches `target`; write that model to `out`. `target_outputs`: the outputs whose cosine counts (default:
    every float output, the lowest mean decides). `calibrate_options`: the rest of `calibrate`'s keywords."""
    from qconvert.calibrate.api import calibrate, make_scheme
    from qconvert.calibrate.collect import load_float_model
    from qconvert.calibrate.overrides import TensorOverride

    started = time.perf_counter()
    if not 0.0 < target <= 1.0:
        raise InputError(f"--target-cosine {target}: give a cosine in (0, 1]")
    options = dict(calibrate_options or {})
    options.pop("evaluate_samples", None)
    options.pop("evaluate_tensors", None)
    loaded = load_float_model(model)
    reference: str | bytes = (
        model.SerializeToString() if not isinstance(model, str | os.PathLike) else os.fspath(model)
    )
    batches = _read_batches(data, loaded.model, batch_size)
    if eval_data is None:
        if len(batches) < 2:
            raise InputError(
                "--target-cosine: --data holds one batch; a held-out split needs two or more "
                "(or give --eval-data)"
            )
        held = max(1, round(len(batches) * HELD_OUT_FRACTION))
        calibration, held_out = batches[:-held], batches[-held:]
        source = f"the last {held} of --data's {len(batches)} batches, not used for calibration"
    else:
        calibration, held_out = batches, _read_batches(eval_data, loaded.model, batch_size)
        source = "--eval-data"
        if not held_out:
            raise InputError("--eval-data: no samples")
    scheme = make_scheme(options.pop("scheme", None))
    report = SearchReport(target, source, _samples(held_out), _samples(calibration))
    evaluation = HeldOut(reference, held_out, target_outputs)
    report.outputs = evaluation.names
    with tempfile.TemporaryDirectory(prefix="qconvert-search.") as scratch:
        saved = Path(scratch) / "ranges.json"
        first = calibrate(
            model, calibration, scheme=scheme, out=Path(scratch) / "base.onnx", ranges_path=saved,
            batch_size=batch_size, **options,
        )  # fmt: skip
        report.ranked = rank_tensors(model, first.quantization, _first_samples(calibration, RANKING_SAMPLES))
        ranked = [name for name, _ in report.ranked if name not in scheme.tensor_overrides]

        def candidate(widened: int, kept: int) -> Any:
            chosen = make_scheme(scheme)
            for name in ranked[kept:widened]:
                chosen.tensor_overrides[name] = TensorOverride(quant_type=WIDE_TYPE)
            for name in ranked[:kept]:
                chosen.keep_float[name] = (
                    "--target-cosine: kept in float (int16 everywhere misses the target)"
                )
            return chosen

        evaluated: dict[tuple[int, int], SearchStep] = {}

        def step(widened: int, kept: int = 0) -> bool:
            if (widened, kept) in evaluated:
                return evaluated[(widened, kept)].passed
            begun = time.perf_counter()
            path = Path(scratch) / f"candidate_{widened}_{kept}.onnx"
            calibrate(model, None, load_ranges=saved, scheme=candidate(widened, kept), out=path)
            mean, lowest = evaluation.metric(path)
            path.unlink(missing_ok=True)
            result = SearchStep(widened, kept, mean, lowest, mean >= target, time.perf_counter() - begun)
            evaluated[(widened, kept)] = result
            report.steps.append(result)
            return result.passed

        count = len(ranked)
        widened, kept = 0, 0
        if not step(0):
            if step(count):
                widened = _fewest(lambda k: step(k), count)
            else:
                kept = _fewest(lambda k: step(count, k), count) if step(count, count) else count
                widened = count
        if (widened, kept) not in evaluated or not evaluated[(widened, kept)].passed:  # not reached: the best
            best = max(report.steps, key=lambda s: (s.mean_cosine, -s.kept_float, -s.widened))
            widened, kept = best.widened, best.kept_float
        report.reached = evaluated[(widened, kept)].passed
        report.widened = ranked[kept:widened]
        report.kept_float = ranked[:kept]
        result = calibrate(  # compared on the held-out samples (only when a model is written)
            model, held_out if out is not None else None, load_ranges=saved, scheme=candidate(widened, kept),
            out=out, evaluate_samples=_samples(held_out) if out is not None else 0,
        )  # fmt: skip
        if ranges_path is not None:
            _place(saved, ranges_path, lambda: saved.read_text(encoding="utf-8"))
    result.stats, result.batch_size = first.stats, first.batch_size
    result.seconds_collecting, result.method = first.seconds_collecting, first.method
    result.histograms = first.histograms
    result.warnings = list(dict.fromkeys([*first.warnings, *result.warnings]))
    report.seconds = time.perf_counter() - started
    result.search = report
    result.notes.extend(report.lines())
    result.seconds_total = report.seconds
    if json_path is not None:
        _place(None, json_path, result.json_text)
    return result


def _fewest(passes: Callable[[int], bool], count: int) -> int:
    """The least k in 1..count for which `passes(k)` holds, given that `passes(0)` fails and `passes(count)`
    holds: bisection, log2(count) evaluations (exact when passing grows with k)."""
    low, high = 0, count  # low fails, high passes
    while high - low > 1:
        middle = (low + high) // 2
        if passes(middle):
            high = middle
        else:
            low = middle
    return high


def _place(source: Path | None, target: str | os.PathLike[str], text: Callable[[], str]) -> None:
    """Copy a scratch file (or write text) to the user's path; '-' is stdout."""
    if os.fspath(target) == "-":
        sys.stdout.write(text())
    elif source is not None:
        shutil.copyfile(source, target)
    else:
        Path(target).write_text(text(), encoding="utf-8")


__all__ = ["SearchReport", "SearchStep", "channel_loss", "rank_tensors", "search_target_cosine"]
