"""`qconvert.calibrate(...)`: dataset -> observers -> ranges -> sentinel guard -> finalize -> QDQ ONNX file.

NOTE: the steps are this package's modules, composed in this order:
1. `dataset.open_dataset` binds `data` to the model's inputs (names, dtypes, ranks, batch size);
2. `collect.collect_passes` runs the float model once per batch over the tensors onnxruntime's
   `quantize_static` calibrates (float inputs/outputs of the op types to quantize); a tensor that only
   rearranges another (Reshape, Transpose, ...: `collect.value_preserving_sources`) shares its observers.
   Every method here takes one pass (histogram methods bin at power-of-two widths, no range needed first),
   with a `sentinel.MagnitudeObserver` beside the method's observers (histogram methods' aligned
   histograms give the guard its per-octave view, so they need none unless a tensor may be clipped);
3. `sentinel.sentinel_guard` flags ranges a mask or padding value dominates and, by policy, keeps those
   tensors in float or clips their range; `methods` turns each tensor's observers into its range (MSE's
   searches on every core: `Method.parallel_ranges`);
4. `attach.attach_ranges` puts `!quant.calibrated` on the lifted IR, `finalize.finalize(scheme)` makes
   it `!quant.uniform` Q/DQ, `backends.onnx.save_onnx` writes the model (temp file, then rename).
`load_ranges` skips 1-3 and reuses a ranges JSON with the tensors it kept in float. Files are written
only after every step succeeded: the ranges JSON first, the model last.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from onnx import ModelProto

from qconvert.atomic_file import place_file, staging_folder, writes_through
from qconvert.calibrate.bias_correction import DEFAULT_BIAS_CORRECTION
from qconvert.calibrate.bias_correction import check_policy as check_bias_policy
from qconvert.calibrate.channel_spread import FloatRun, check_policy
from qconvert.calibrate.collect import (
    ObserverTable,
    ProgressCallback,
    augment_model,
    calibration_tensors,
    collect_passes,
    load_float_model,
    make_session,
    refuse_quantized,
    value_preserving_sources,
)
from qconvert.calibrate.dataset import AS_GIVEN, DatasetStats, DataSource, open_dataset
from qconvert.calibrate.evaluate import Agreement, evaluate, quantized_activations, tensor_losses
from qconvert.calibrate.first_samples import FirstSamples
from qconvert.calibrate.histograms import exported_histogram
from qconvert.calibrate.methods import METHODS, Method, make_method
from qconvert.calibrate.observers import MinMaxObserver
from qconvert.calibrate.outputs import TextOutput, check_output_paths, write_outputs
from qconvert.calibrate.ranges import CalibrationRanges, TensorRange
from qconvert.calibrate.scheme import Scheme, check_selection, check_tensor_names
from qconvert.calibrate.sentinel import (
    MagnitudeObserver,
    SentinelDecision,
    SentinelFinding,
    SentinelPolicy,
    needs_magnitude_observer,
    sentinel_guard,
)
from qconvert.did_you_mean import did_you_mean
from qconvert.errors import InputError

if TYPE_CHECKING:
    from qconvert.calibrate.search import SearchReport
    from qconvert.frontends.onnx.load import LoadedModel
    from qconvert.ir.dialects.builtin import ModuleOp

KEEP_FLOAT_KEY = "keep_float"  # ranges metadata: tensor -> why it stays float (reapplied by load_ranges)
# ranges metadata: tensor -> the guard's outlier note; an 8-bit activation there is widened to 16 bits
# (massive activations: int16 keeps the rest's precision where int8 would give it 2 or 3 levels)
WIDENED_OUTLIERS_KEY = "widened_outliers"
SEARCH_RANGES_KEY = "search_widened_ranges"  # ranges metadata: tensor -> [rmin, rmax] the search widened over
WIDER_STORAGE = {"int8": "int16", "uint8": "uint16"}  # the 8-bit storages an outlier is widened from
# Ops whose outputs take their input's Q/DQ parameters when it is quantized (placement.py's `shared`):
# widening such an output has no effect, so only their inputs are candidates.
SHARED_OUTPUT_OPS = frozenset({"Gather", "Split", "Resize", "Pad", "MaxPool"})
WIDE_OUTLIER_TYPE = "int16"  # symmetric (zero point 0: TOSA's int16 profile wants it), whatever the 8 bits


@dataclass
class CalibrationResult:
    """What `calibrate` computed and wrote."""

    ranges: CalibrationRanges
    method: str
    keep_float: dict[str, str] = field(default_factory=dict)  # tensor -> why it stays float
    warnings: list[str] = field(default_factory=list)  # sentinels, NaN/Inf samples, dropped tail
    notes: list[str] = field(default_factory=list)  # finalize's decisions
    stats: DatasetStats | None = None  # None when the ranges were loaded
    batch_size: int | str | None = None  # AS_GIVEN: each item of the data one run
    workers: int = 1
    engine: str = "local"
    seconds_collecting: float = 0.0
    seconds_total: float = 0.0
    output: Path | None = None
    ranges_path: Path | None = None
    agreement: Agreement | None = None  # the QDQ model against the float one (`evaluate_samples`)
    # tensor -> the histogram its method binned (histograms.py), for the report; empty for minmax
    histograms: dict[str, dict[str, object]] = field(default_factory=dict)
    # tensor -> the storage, scale and zero point written for it (its Q/DQ pair), when a model was written
    quantization: dict[str, dict[str, object]] = field(default_factory=dict)
    search: SearchReport | None = None  # --target-cosine's steps and decisions (search.py)
    # activation -> why it was widened to int16 (outlier channels, the guard's outliers; channel_spread.py)
    widened_outliers: dict[str, str] = field(default_factory=dict)
    # bias -> its layer and the shift --bias-correction added (bias_correction.py)
    bias_correction: dict[str, dict[str, object]] = field(default_factory=dict)

    def __repr__(self) -> str:
        """`CalibrationResult(minmax, 9 ranges, 16 samples, wrote out.onnx)`; `to_json()` holds everything."""
        parts = [self.method, f"{len(self.ranges)} ranges"]
        parts += [] if self.stats is None else [f"{self.stats.samples_used} {self.unit}s"]
        parts += [f"{len(self.keep_float)} kept float"] if self.keep_float else []
        parts += [f"{len(self.warnings)} warnings"] if self.warnings else []
        written = [str(path) for path in (self.output, self.ranges_path) if path is not None]
        parts += [f"wrote {', '.join(written)}"] if written else []
        return f"CalibrationResult({', '.join(parts)})"

    @property
    def unit(self) -> str:
        """What the stats count: samples, or runs of items fed as given."""
        return "run" if self.batch_size == AS_GIVEN else "sample"

    @property
    def samples_per_second(self) -> float | None:
        if self.stats is None or self.seconds_collecting <= 0:
            return None
        return self.stats.samples_read / self.seconds_collecting

    def to_json(self) -> dict[str, object]:
        stats = self.stats
        samples = None
        if stats is not None:
            samples = {
                "read": stats.samples_read,
                "used": stats.samples_used,
                "excluded_nonfinite": stats.excluded,
                "nonfinite_per_input": stats.nonfinite,
                "dropped_tail": stats.dropped_tail,
                "batches": stats.batches,
                "batch_size": self.batch_size,
            }
        return {
            "method": self.method,
            "output": None if self.output is None else str(self.output),
            "ranges_file": None if self.ranges_path is None else str(self.ranges_path),
            "samples": samples,
            "workers": self.workers,
            "engine": self.engine,
            "seconds": {"collecting": self.seconds_collecting, "total": self.seconds_total},
            "warnings": self.warnings,
            "notes": self.notes,
            "keep_float": self.keep_float,
            "widened_outliers": self.widened_outliers,
            **({"bias_correction": self.bias_correction} if self.bias_correction else {}),
            "agreement": None if self.agreement is None else self.agreement.to_json(),
            "ranges": self.ranges.to_json()["tensors"],
            "quantization": self.quantization,
            "histograms": self.histograms,
            **({} if self.search is None else {"search": self.search.to_json()}),
        }

    def json_text(self) -> str:
        """`to_json()` as the text `--json` writes."""
        return json.dumps(self.to_json(), indent=1, allow_nan=False) + "\n"


# Observing --------------------------------------------------------------------------------------------
@dataclass
class _Observed:
    ranges: dict[str, TensorRange]
    keep_float: dict[str, str]  # tensor -> the sentinel guard's warning
    warnings: list[str]
    stats: DatasetStats
    batch_size: int | str
    seconds: float
    histograms: dict[str, dict[str, object]] = field(default_factory=dict)
    widened: dict[str, str] = field(default_factory=dict)  # the guard's outliers -> their note


def _clipped(first: object, bounds: tuple[float, float]) -> object:
    """Pass 1's observer with its min/max replaced by the sentinel guard's robust bounds."""
    if not isinstance(first, MinMaxObserver):
        return first
    clipped = copy.copy(first)
    clipped.minimum, clipped.maximum = bounds
    return clipped


class _Passes:
    """The passes of one method, with the sentinel guard between pass 1 and pass 2."""

    def __init__(
        self,
        tensors: Sequence[str],
        sources: Mapping[str, str],
        method: Method,
        sentinel: SentinelPolicy | str,
        overrides: Mapping[str, str] | Sequence[str] | None,
    ) -> None:
        self.tensors = tensors  # observed; each of `sources` (tensor -> observed one) shares its observers
        self.sources = sources
        self.method = method
        self.sentinel = sentinel
        self.overrides = overrides
        self.findings: list[SentinelFinding] = []
        self.decision: SentinelDecision | None = None
        self.firsts: dict[str, object] = {}  # tensor -> pass 1's method observer (clipped if so decided)

    def first(self, _: Mapping[str, list] | None) -> ObserverTable:
        table: dict[str, list] = {}
        for name in self.tensors:
            observers = self.method.first_pass(name)
            if needs_magnitude_observer(observers, self.sentinel, self.overrides):
                observers = [*observers, MagnitudeObserver()]
            table[name] = observers
        return cast(ObserverTable, table)

    def with_sources(self, table: Mapping[str, list]) -> dict[str, list]:
        """`table` and, after its tensors, every tensor that shares one of their observers."""
        return {**table, **{name: table[source] for name, source in self.sources.items() if source in table}}

    def guard(self, first_pass: Mapping[str, list]) -> SentinelDecision:
        first_pass = self.with_sources(first_pass)
        self.findings, self.decision = sentinel_guard(first_pass, self.sentinel, self.overrides)
        for name, observers in first_pass.items():
            bounds = self.decision.clipped_ranges.get(name)
            self.firsts[name] = observers[0] if bounds is None else _clipped(observers[0], bounds)
        return self.decision

    def second(self, first_pass: Mapping[str, list] | None) -> ObserverTable:
        assert first_pass is not None
        decision = self.guard(first_pass)
        # A tensor kept in float needs no histogram; a clipped one gets it over the clipped range.
        return {
            name: self.method.next_pass(1, name, [self.firsts[name]])  # type: ignore[misc]
            for name in self.tensors
            if name not in decision.keep_float
        }

    def makers(self) -> list:
        return [self.first, self.second] if self.method.passes > 1 else [self.first]


def _observe(
    loaded: LoadedModel,
    data: DataSource,
    method: Method,
    scheme: Scheme,
    *,
    batch_size: int | str | None,
    workers: int,
    engine: str,
    ray_address: str | None = None,
    threads_per_worker: int | None = None,
    verbose: bool = False,
    sentinel: SentinelPolicy | str,
    sentinel_overrides: Mapping[str, str] | Sequence[str] | None,
    progress: ProgressCallback | None,
    first: FirstSamples | None = None,
) -> _Observed:
    model = loaded.model
    dataset = open_dataset(data, model, batch_size)
    op_types = scheme.quantized_op_types
    tensors = list(calibration_tensors(model, op_types))
    sources = value_preserving_sources(model, tensors)
    observed = [name for name in tensors if name not in sources]
    augmented = augment_model(loaded, observed, op_types=op_types)
    passes = _Passes(augmented.tensors, sources, method, sentinel, sentinel_overrides)
    started = time.perf_counter()
    results = collect_passes(
        augmented,
        dataset,
        passes.makers(),
        workers=workers,
        engine=engine,
        progress=progress,
        ray_address=ray_address,
        threads_per_worker=threads_per_worker,
        verbose=verbose,
        first=first,  # the outlier-channel run read off this pass (first_samples.py)
    )
    seconds = time.perf_counter() - started
    decision = passes.decision or passes.guard(results[0].observers)
    stats = results[0].stats
    reasons = {finding.tensor: finding.reason for finding in passes.findings}
    ranges: dict[str, TensorRange] = {}
    last_pass = passes.with_sources(results[-1].observers)
    observers: dict[str, tuple[list[object], list[object]]] = {}
    for name in tensors:
        first = passes.firsts[name]
        observers[name] = ([first], list(last_pass.get(name, [])) if len(results) > 1 else [first])
    # One range per distinct set of observers (a tensor sharing its source's observers shares its range),
    # on every core for a method whose searches gain from it.
    keys = {name: tuple(map(id, first + final)) for name, (first, final) in observers.items()}
    jobs: dict[tuple[int, ...], Future[TensorRange]] = {}
    threads = (os.cpu_count() or 1) if method.parallel_ranges else 1
    with ThreadPoolExecutor(threads, thread_name_prefix="range") as pool:
        for name, (first, final) in observers.items():
            if keys[name] not in jobs:
                jobs[keys[name]] = pool.submit(method.range, name, first, final)
    for name, (first, final) in observers.items():
        try:
            tensor_range = replace(jobs[keys[name]].result(), name=name)
        except InputError:
            if name not in decision.keep_float:
                method.range(name, first, final)  # raises, naming this tensor
                raise
            # No finite value at all (all Inf/NaN): it stays float. A placeholder range still attaches
            # the tensor's name to the IR, which is how finalize recognises it as kept in float.
            tensor_range = TensorRange(name, 0.0, 0.0, method=method.name)
        bounds = decision.clipped_ranges.get(name)
        if bounds is not None:  # a method that does not read pass 1's min/max (moving average): clip here
            tensor_range.min = max(tensor_range.min, bounds[0])
            tensor_range.max = min(tensor_range.max, bounds[1])
        tensor_range.samples = stats.samples_used
        tensor_range.sentinel = reasons.get(name)
        ranges[name] = tensor_range
    keep_float = {}
    for name in sorted(decision.keep_float):
        # The guard's warning is "NAME: left in float (--sentinel keep): why"; finalize prefixes its own.
        warning = next((w for w in decision.warnings if w.startswith(f"{name}: ")), f"{name}: by the guard")
        keep_float[name] = "sentinel " + warning[len(name) + 2 :].removeprefix("left in float ")
    warnings = [*stats.warnings(dataset.batch_size, dataset.unit), *decision.warnings]
    warnings += [
        f"{name}: {r.note}" for name, r in ranges.items() if r.note and name not in decision.keep_float
    ]
    batch = AS_GIVEN if dataset.as_given else dataset.batch_size
    histograms = {}  # the last pass's histogram (over a clipped range when the guard clipped it)
    for name, (first, final) in observers.items():
        histogram = exported_histogram([*final, *first])
        if histogram is not None:
            histograms[name] = histogram
    widened = {note.tensor: note.message for note in decision.outliers if note.tensor not in keep_float}
    return _Observed(ranges, keep_float, warnings, stats, batch, seconds, histograms, widened)


# The public function ----------------------------------------------------------------------------------
def refuse_unused_with_load_ranges(load_ranges: str | os.PathLike[str], given: Mapping[str, bool]) -> None:
    """InputError naming the options `given` (option -> whether it was given) that reused ranges ignore."""
    ignored = [name for name, present in given.items() if present]
    if ignored:
        raise InputError(
            f"--load-ranges {os.fspath(load_ranges)}: the ranges are reused as saved, so "
            f"{', '.join(ignored)} would have no effect; drop {'it' if len(ignored) == 1 else 'them'}"
        )


def make_scheme(scheme: Scheme | Mapping[str, object] | None) -> Scheme:
    if scheme is None:
        return Scheme()
    if isinstance(scheme, Scheme):
        return copy.deepcopy(scheme)
    try:
        return Scheme(**scheme)  # type: ignore[arg-type]
    except TypeError as error:
        raise InputError(f"scheme: {error}") from None


def _method(
    method: str | Method, scheme: Scheme, options: Mapping[str, object], initializers: Collection[str] = ()
) -> Method:
    if isinstance(method, Method):
        return method
    settings = dict(options)
    if method not in METHODS:  # before the scheme's checks below, which take the name as valid
        raise InputError(
            f"--method {method}: unknown calibration method (expected one of {', '.join(METHODS)})"
            + did_you_mean(str(method), METHODS)
        )
    if method == "mse" and scheme.activation_type == "float8e4m3fn":
        raise InputError(
            "--method mse searches integer storage ranges; float8e4m3fn activations take their scale "
            "from --method distribution (or, with --float8-scale max, from another method's range)"
        )
    if method != "distribution" and scheme.activation_type == "float8e4m3fn" and scheme.float8_scale == "std":
        raise InputError(
            f"--method {method}: onnxruntime's float8e4m3fn scales come from the standard deviation that "
            f"only --method distribution observes; use it, or --float8-scale max"
        )
    if method == "mse":  # the error to minimise is the one of the storage the scheme quantizes to
        storage = (scheme.activation_type, scheme.activation_symmetric)
        retyped = sorted(  # activations whose range mse would search for another storage than theirs
            name
            for name, override in scheme.tensor_overrides.items()
            if name not in initializers
            and override.scale is None
            and (scheme.activation_type_of(name), scheme.activation_symmetric_of(name)) != storage
        )
        if retyped:
            raise InputError(
                f"--method mse searches every range for the scheme's {scheme.activation_type} storage; "
                f"tensor overrides change the storage or symmetry of {retyped}: use another method for them"
            )
        settings.setdefault("quant_type", scheme.activation_type)
        settings.setdefault("symmetric", scheme.activation_symmetric)
    try:
        return make_method(method, **settings)
    except ValueError as error:
        raise InputError(f"--method {method}: {error}") from None


def calibrate(
    model: str | os.PathLike[str] | ModelProto,
    data: DataSource | None = None,
    *,
    method: str | Method = "minmax",
    method_options: Mapping[str, object] | None = None,
    scheme: Scheme | Mapping[str, object] | None = None,
    out: str | os.PathLike[str] | None = None,
    ranges_path: str | os.PathLike[str] | None = None,
    load_ranges: str | os.PathLike[str] | None = None,
    json_path: str | os.PathLike[str] | None = None,
    workers: int = 1,
    engine: str = "local",
    ray_address: str | None = None,
    threads_per_worker: int | None = None,
    verbose: bool = False,
    batch_size: int | str | None = None,
    sentinel: SentinelPolicy | str = SentinelPolicy.KEEP,
    sentinel_overrides: Mapping[str, str] | Sequence[str] | None = None,
    progress: ProgressCallback | None = None,
    evaluate_samples: int = 0,
    evaluate_tensors: bool = False,
    target_cosine: float | None = None,
    eval_data: DataSource | None = None,
    target_outputs: Sequence[str] = (),
    target_metrics: Sequence[str] = (),
    smooth_quant: float | str | None = None,
    outlier_channels: str = "widen",
    bias_correction: str | bool = DEFAULT_BIAS_CORRECTION,
) -> CalibrationResult:
    """Calibrate a float ONNX model on `data` and write the QDQ model to `out` (if given).

    `data`: a folder of .npz/.npy files, one .npz, `module:function`, a function or a list of
    {input: array} (see `dataset`), in runs of `batch_size` samples (None: the model's fixed batch dim,
    else 8), or each item as stored with `batch_size="given"`. `method`: minmax, moving-average,
    percentile, entropy, mse, distribution (options in `method_options`, e.g. {"percentile": 99.99}).
    `scheme`: a `Scheme` or its fields. `ranges_path`: also save the ranges JSON there. `load_ranges`:
    take the ranges from that JSON instead of calibrating (`data` then only feeds `evaluate_samples`).
    `json_path`: also write the result as JSON there (`CalibrationResult.to_json`). Every output path is
    checked first; all are written, or none.
    `workers`/`engine`: split the data across processes ("local") or Ray actors ("ray"), each reading only
    its share; `ray_address` (or $RAY_ADDRESS) joins that Ray cluster instead of starting a private
    instance (it implies "ray"); `threads_per_worker`: each worker's onnxruntime threads (default: its
    cores); `verbose`: let Ray's own log through. `sentinel`:
    keep (default), clip or off for ranges a mask dominates; `sentinel_overrides`: NAME=keep|clip|quantize.
    `progress(samples done, total or None)`. `evaluate_samples` > 0: run the QDQ model and the float one
    in onnxruntime on that many of the first samples and compare their outputs (`result.agreement`,
    `evaluate.py`); needs `out` and `data`. `evaluate_tensors`: also each quantized activation's own
    quantization loss on those samples (`result.agreement.tensors`). `target_cosine`: widen the fewest
    activations to int16 until the outputs' mean cosine on held-out data (`eval_data`, else the last quarter
    of `data`'s batches, then not calibrated on) reaches it (`search.py`; `result.search`); `target_outputs`:
    the outputs whose cosine counts (default: every float output).
    `smooth_quant`: SmoothQuant's alpha (`smoothquant.py`): MatMul/Gemm inputs' outlier channels migrated into
    the weights on the float model (maxima from `data`), which is then calibrated as given; "auto": alpha
    per input from a small grid (or none) by each product's own Q/DQ error (`search_alphas`).
    `outlier_channels`: "widen" (default) runs the float model on the first 32 samples and widens to int16
    symmetric the activations whose largest channel is >= 16x their median one (at most 10% of them, with
    the sentinel guard's outliers; `channel_spread.py`); "off" widens nothing.
    `bias_correction`: "on" adds E[x]·(W - W_q) to each MatMul(+Add)/Gemm/Conv bias before finalize (E[x]
    on the first 32 samples of `data`; `bias_correction.py`); "off" (default) does not.
    Raises InputError (nothing written) for bad data, a bad model, a bad scheme or an unwritable output.
    """
    started = time.perf_counter()
    # One name or condition as a plain string is one, not a sequence of characters (the API's users).
    target_outputs = [target_outputs] if isinstance(target_outputs, str) else target_outputs
    target_metrics = [target_metrics] if isinstance(target_metrics, str) else target_metrics
    target_cosine = _number("--target-cosine", target_cosine)
    if smooth_quant is not None:
        return _smoothed(model, data, smooth_quant, locals())
    if check_bias_policy(bias_correction) == "on" and (target_cosine is not None or target_metrics):
        raise InputError("--bias-correction on is not combined with --target-cosine/--target-metric yet")
    if check_bias_policy(bias_correction) == "on" and data is None:
        raise InputError("--bias-correction on needs --data: the layers' input means come from it")
    if target_cosine is not None or target_metrics:  # `target_metrics`: METRIC[:OUTPUT]>=X (search.py)
        return _search(model, data, target_cosine, eval_data, locals())
    if eval_data is not None or target_outputs:  # read by the search only: refused rather than ignored
        flag = "--eval-data" if eval_data is not None else "--target-output"
        raise InputError(
            f"{flag} is read by the accuracy search only; give --target-cosine or --target-metric too"
        )
    if evaluate_samples < 0:
        raise InputError(f"--evaluate {evaluate_samples}: give a number of samples, or 0 to skip")
    check_policy(outlier_channels)
    float_run: FloatRun | None = None  # the outlier-channel run's float outputs, reused by the comparison
    chosen = make_scheme(scheme)
    chosen.check()
    check_output_paths(
        {"--out": out, "--ranges": ranges_path, "--json": json_path},
        {"the model": model, "--data": data, "--load-ranges": load_ranges},
    )
    loaded = load_float_model(model)
    graph = loaded.model.graph
    node_names, op_types = [node.name for node in graph.node], [node.op_type for node in graph.node]
    check_selection(chosen, node_names, op_types, loaded.label)
    tensors = {name for node in graph.node for name in (*node.input, *node.output)}
    tensors |= {tensor.name for tensor in (*graph.input, *graph.initializer)}
    check_tensor_names(chosen.tensor_overrides, tensors, "tensor overrides", loaded.label)
    if out is not None:  # a model that cannot be written is refused before the data is read
        from qconvert.frontends.onnx.lift import Lifter

        try:
            Lifter(loaded.model).check_liftable()
        except InputError as error:
            raise InputError(f"{loaded.label}: {error.message}") from None
    result: CalibrationResult
    if load_ranges is not None:
        reads_data = evaluate_samples > 0 or check_bias_policy(bias_correction) == "on"
        given = {  # --data still serves the comparison with the float model (and --bias-correction's means)
            "--data": data is not None and not (reads_data and out is not None),
            "the method's options (--percentile, --num-bins, --num-quantized-bins)": bool(method_options),
            "--sentinel-override": bool(sentinel_overrides),
        }
        refuse_unused_with_load_ranges(load_ranges, given)
        if data is not None and evaluate_samples > 0:  # only for the comparison: checked before any work
            open_dataset(data, loaded.model, batch_size).count_samples()
        ranges = CalibrationRanges.load(load_ranges)
        stored = ranges.metadata.get(KEEP_FLOAT_KEY, {})
        keep_float = {str(k): str(v) for k, v in stored.items()} if isinstance(stored, dict) else {}
        where = f"--load-ranges {load_ranges}: its keep_float entries"
        check_tensor_names(keep_float, tensors, where, loaded.label)
        widened_before = ranges.metadata.get(WIDENED_OUTLIERS_KEY, {})  # checked as keep_float, not skipped
        if not isinstance(widened_before, dict):
            raise InputError(
                f"--load-ranges {load_ranges}: its {WIDENED_OUTLIERS_KEY} is not an object (tensor -> why)"
            )
        where = f"--load-ranges {load_ranges}: its {WIDENED_OUTLIERS_KEY} entries"
        check_tensor_names([str(name) for name in widened_before], tensors, where, loaded.label)
        result = CalibrationResult(
            ranges, str(ranges.metadata.get("method", "loaded")), keep_float=keep_float
        )
    else:
        if data is None:
            raise InputError("calibrate needs --data (or --load-ranges to reuse saved ranges)")
        initializers = {tensor.name for tensor in graph.initializer}
        chosen_method = _method(method, chosen, method_options or {}, initializers)
        first = FirstSamples(loaded.model) if outlier_channels == "widen" else None
        observed = _observe(
            loaded,
            data,
            chosen_method,
            chosen,
            batch_size=batch_size,
            workers=workers,
            engine=engine,
            ray_address=ray_address,
            threads_per_worker=threads_per_worker,
            verbose=verbose,
            sentinel=sentinel,
            sentinel_overrides=sentinel_overrides,
            progress=progress,
            first=first,
        )
        keep_float = observed.keep_float
        widened: dict[str, str] = {}
        if outlier_channels == "widen":
            float_run, widened = _outlier_channels(loaded, data, batch_size, chosen, observed, first)
        ranges = CalibrationRanges(
            metadata={
                "model": loaded.label,
                "method": chosen_method.name,
                "method_options": _options_json(chosen_method),
                "samples": observed.stats.samples_used,
                "batch_size": observed.batch_size,
                KEEP_FLOAT_KEY: keep_float,
                WIDENED_OUTLIERS_KEY: widened,
            }
        )
        for tensor_range in observed.ranges.values():
            ranges.add(tensor_range)
        result = CalibrationResult(
            ranges,
            chosen_method.name,
            keep_float=keep_float,
            warnings=observed.warnings,
            stats=observed.stats,
            batch_size=observed.batch_size,
            workers=workers,
            engine="ray" if ray_address is not None else engine,
            seconds_collecting=observed.seconds,
            histograms=observed.histograms,
        )
    texts = []
    if ranges_path is not None:
        texts.append(TextOutput("--ranges", ranges_path, ranges.save))
        result.ranges_path = Path(ranges_path)
    write_model: Callable[[], Path] | None = None
    if out is not None:
        from qconvert.backends.onnx import save_onnx
        from qconvert.calibrate.placement import ORT_BASIC_ADVICE

        means = None  # --bias-correction: each layer input's per-channel mean on the first samples
        if check_bias_policy(bias_correction) == "on":
            means = _bias_means(loaded, data, batch_size, chosen, result.warnings)
        try:
            module = _finalize(
                model, loaded, ranges, chosen, result, widen=outlier_channels == "widen", bias_means=means
            )
        except InputError as error:  # saved ranges that miss tensors: say which file, and the likely why
            if load_ranges is None or not error.message.startswith("no calibrated range for"):
                raise
            raise InputError(
                f"--load-ranges {load_ranges}: {error.message} (saved with other --op-types/--nodes, or "
                "without --smooth-quant or with other alphas?)",
                error.loc,
            ) from None
        result.output = Path(out)

        def write_and_compare() -> Path:
            """The model, then the comparison with the float model on the file as written."""
            if writes_through(out):  # '-', a FIFO, a device: compared on a staged copy, then copied there
                with tempfile.TemporaryDirectory(dir=staging_folder(out), prefix=".qconvert.") as scratch:
                    staged = save_onnx(module, Path(scratch) / "model.onnx", external_data=False)
                    compare(staged)
                    place_file(staged, out)
                return Path(out)
            path = save_onnx(module, out)
            compare(path)
            return path

        def compare(path: Path) -> None:
            if evaluate_samples > 0 and data is not None:
                needs_basic = any(ORT_BASIC_ADVICE in note for note in result.notes)
                options = (evaluate_samples, evaluate_tensors, load_ranges is None, needs_basic, float_run)
                try:
                    result.agreement = _agreement(path, model, loaded, module, data, batch_size, *options)
                except BaseException:  # bad data (or Ctrl-C): no model without its report
                    path.unlink(missing_ok=True)
                    raise
                result.warnings.extend(result.agreement.warnings)

        write_model = write_and_compare

    if json_path is not None:  # written after the model (with the comparison in it), or not at all

        def write_json(path: Path) -> None:
            result.seconds_total = time.perf_counter() - started
            path.write_text(result.json_text(), encoding="utf-8")

        texts.append(TextOutput("--json", json_path, write_json))
    write_outputs(texts, write_model)
    result.seconds_total = time.perf_counter() - started
    return result


def _smoothed(
    model: str | os.PathLike[str] | ModelProto,
    data: DataSource | None,
    alpha: float | str,
    given: Mapping[str, object],
) -> CalibrationResult:
    """`calibrate(..., smooth_quant=ALPHA)`: SmoothQuant on the float model, then calibrate that model."""
    import tempfile

    import numpy as np
    import onnx

    from qconvert.calibrate.smoothquant import (
        carry_overrides,
        observe_channel_maxima,
        search_alphas,
        smooth_quant,
        smoothable_inputs,
        smoothing_notes,
    )

    automatic = str(alpha).strip().lower() == "auto"
    try:
        value = 0.0 if automatic else float(alpha)
    except ValueError:
        raise InputError(f"--smooth-quant {alpha!r}: expected an alpha in [0, 1] or auto") from None
    if not 0.0 <= value <= 1.0:  # before any data is read
        raise InputError(f"--smooth-quant {alpha}: alpha must lie in [0, 1]")
    if data is None:
        raise InputError("--smooth-quant needs --data: the activations' channel maxima come from it")
    proto = model if isinstance(model, ModelProto) else onnx.load(os.fspath(model))
    label = "the model" if isinstance(model, ModelProto) else os.fspath(model)
    refuse_quantized(proto, label)  # before the smoothing's float run, naming the user's file
    check_output_paths(
        {"--out": given["out"], "--ranges": given["ranges_path"], "--json": given["json_path"]},
        {"the model": model, "--data": data, "--eval-data": given["eval_data"]},
    )
    dataset = open_dataset(data, proto, cast("int | str | None", given["batch_size"]))
    batches = (batch.arrays for batch in dataset.batches())
    samples: dict[str, np.ndarray] | None = {} if automatic else None
    maxima = observe_channel_maxima(proto, batches, smoothable_inputs(proto), samples)
    chosen = make_scheme(cast("Scheme | Mapping[str, object] | None", given["scheme"]))
    alphas = search_alphas(proto, maxima, samples, chosen.per_channel) if samples is not None else value
    smoothed, done = smooth_quant(proto, maxima, alphas, chosen.quantized_op_types)
    # an override naming a smoothed input means what its MatMuls read: now the inserted Mul's output
    chosen.tensor_overrides = carry_overrides(
        smoothed, done, chosen.tensor_overrides, chosen.quantized_op_types
    )
    options = {
        name: value for name, value in given.items() if name not in ("model", "started", "smooth_quant")
    }
    options["scheme"] = chosen
    options["json_path"] = None  # written below, with the smoothing notes (paths checked above)
    with tempfile.TemporaryDirectory(prefix="qconvert-smoothed-") as folder:
        # calibrate maps a file's weights (finalize's lift); a ModelProto's stay copied in memory
        path = Path(folder) / "smoothed.onnx"
        large = smoothed.ByteSize() > 1_800_000_000
        onnx.save(smoothed, path, save_as_external_data=large, location="smoothed.onnx.data")
        del smoothed, proto
        try:
            result = calibrate(str(path), **options)  # type: ignore[arg-type]
        except InputError as error:  # named as the user's model, not the temporary file
            if str(path) not in error.message:
                raise
            message = error.message.replace(str(path), f"{label} (smoothed)")
            raise InputError(message, error.loc) from None
    result.notes[:0] = smoothing_notes(done)  # where each input's 1/s went (the summary shows them)
    json_path = cast("str | os.PathLike[str] | None", given["json_path"])
    if json_path is not None:  # as calibrate writes it ('-': stdout), with the notes above in it
        text = result.json_text()
        output = TextOutput("--json", json_path, lambda target: target.write_text(text, encoding="utf-8"))
        write_outputs([output], None)
    return result


def _number(flag: str, value: object) -> float | None:
    """`value` as a float (a numeric string too, as the command line gives it), else InputError."""
    if value is None or isinstance(value, float):
        return value
    try:
        if isinstance(value, bool):
            raise TypeError
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InputError(f"{flag} {value!r}: expected a number") from None


@contextlib.contextmanager
def _naming_eval_data(data: DataSource | None, eval_data: DataSource | None) -> Iterator[None]:
    """An error about the held-out data names --eval-data: the data readers say --data (or the path alone)
    for a file, "data" for a list or a function (told apart from `data`'s when that is a file)."""
    on_disk = isinstance(eval_data, str | os.PathLike)
    if eval_data is None or (
        on_disk and isinstance(data, str | os.PathLike) and os.fspath(data) == os.fspath(eval_data)
    ):
        yield
        return
    if not on_disk:
        try:
            yield
        except InputError as error:
            if isinstance(data, str | os.PathLike) and error.message.startswith("data"):
                raise InputError("--eval-data" + error.message.removeprefix("data"), error.loc) from None
            raise
        return
    text = os.fspath(cast("str | os.PathLike[str]", eval_data))
    try:
        yield
    except InputError as error:
        message = error.message
        if message.startswith(f"--data {text}"):
            raise InputError("--eval-data" + message.removeprefix("--data"), error.loc) from None
        if message.startswith(text):
            raise InputError(f"--eval-data {message}", error.loc) from None
        raise


def _search(
    model: str | os.PathLike[str] | ModelProto,
    data: DataSource | None,
    target: float | None,
    eval_data: DataSource | None,
    given: Mapping[str, object],
) -> CalibrationResult:
    """`calibrate(..., target_cosine=X)`: the search of search.py, with calibrate's other keywords."""
    from qconvert.calibrate.search import search_target_cosine

    if data is None or given["load_ranges"] is not None:
        raise InputError(
            "--target-cosine/--target-metric calibrates: it needs --data and cannot reuse --load-ranges"
        )
    handled = {"model", "data", "target_cosine", "eval_data", "out", "ranges_path", "json_path", "batch_size"}
    handled |= {"target_outputs", "target_metrics", "load_ranges", "started", "smooth_quant"}
    handled |= {"evaluate_samples", "evaluate_tensors"}
    if given["evaluate_tensors"]:  # refused rather than dropped without a word
        raise InputError(
            "--worst-tensors is not combined with --target-cosine/--target-metric: the search ranks every "
            "activation by its own Q/DQ loss itself (--json: search.ranked)"
        )
    check_output_paths(  # before the search's work: it writes the model first, then the ranges and JSON
        {"--out": given["out"], "--ranges": given["ranges_path"], "--json": given["json_path"]},
        {"the model": model, "--data": data, "--eval-data": eval_data},
    )
    with _naming_eval_data(data, eval_data):
        return search_target_cosine(
            model,
            data,
            target,
            eval_data=eval_data,
            out=cast("str | None", given["out"]),
            ranges_path=cast("str | None", given["ranges_path"]),
            json_path=cast("str | None", given["json_path"]),
            batch_size=cast("int | str | None", given["batch_size"]),
            calibrate_options={name: value for name, value in given.items() if name not in handled},
            target_outputs=cast("Sequence[str]", given["target_outputs"]),
            target_metrics=cast("Sequence[str]", given["target_metrics"]),
        )


def _finalize(
    model: str | os.PathLike[str] | ModelProto,
    loaded: LoadedModel,
    ranges: CalibrationRanges,
    scheme: Scheme,
    result: CalibrationResult,
    widen: bool = True,
    bias_means: tuple[list, dict] | None = None,
) -> ModuleOp:
    """The lifted model with the ranges attached and finalized to Q/DQ (not written yet). The loaded
    model (weights detached) names the intermediate values, for attaching and for finalize's messages."""
    from qconvert.calibrate.attach import attach_ranges
    from qconvert.calibrate.finalize import finalize
    from qconvert.calibrate.tensor_names import tensor_values
    from qconvert.frontends.onnx import import_onnx
    from qconvert.ir.dialects.quant import DequantizeCastOp

    scheme.keep_float = {**result.keep_float, **scheme.keep_float}
    if widen:
        result.widened_outliers = _widen_outliers(scheme, ranges, loaded.model, result.notes)
    module = import_onnx(model, map_file=True)  # the weights viewed in place: -o is never the model
    values = tensor_values(module, loaded.model)
    if bias_means is not None:  # into the float biases, before finalize quantizes them
        from qconvert.calibrate.bias_correction import correct_biases, written_weights

        layers, means = bias_means
        written = written_weights(model, loaded, ranges, scheme, {layer.weight for layer in layers})
        result.bias_correction = correct_biases(module, values, layers, means, written, result.notes)
    attach_ranges(module, ranges, values=values)
    finalize(module, scheme, result.notes, value_names={value: name for name, value in values.items()})
    result.quantization = _written_parameters(module, {value: name for name, value in values.items()})
    if not any(isinstance(op, DequantizeCastOp) for op in module.walk()):  # weights have a dcast only
        result.warnings.append(
            "nothing was quantized: no tensor of the selected nodes and op types gets Q/DQ (the written "
            "model is the float one)"
        )
    return module


def _bias_means(
    loaded: LoadedModel,
    data: DataSource | None,
    batch_size: int | str | None,
    scheme: Scheme,
    warnings: list[str],
) -> tuple[list, dict]:
    """--bias-correction's layers and their inputs' per-channel means (one float run, bias_correction.py).
    Data that cannot be read again (a one-shot iterator) corrects nothing, with a warning."""
    from qconvert.calibrate.bias_correction import correctable_layers, input_means

    assert data is not None  # calibrate refuses --bias-correction on without --data first
    layers = correctable_layers(loaded.model, scheme.quantized_op_types)
    if not layers:
        return layers, {}
    try:
        return layers, input_means(loaded, layers, open_dataset(data, loaded.model, batch_size))
    except InputError as error:
        warnings.append(
            f"--bias-correction did not run ({error.message}; a one-shot iterator?): no bias corrected"
        )
        return layers, {}


def _touched(scheme: Scheme, model: ModelProto) -> set[str]:
    """The tensors a selected node reads or writes (those that may get Q/DQ)."""
    selected = scheme.quantized_op_types
    return {
        name
        for node in model.graph.node
        if node.op_type in selected
        and (scheme.nodes_to_quantize is None or node.name in scheme.nodes_to_quantize)
        and node.name not in (scheme.nodes_to_exclude or ())
        for name in (*node.input, *node.output)
    }


def _outlier_channels(
    loaded: LoadedModel,
    data: DataSource,
    batch_size: int | str | None,
    scheme: Scheme,
    observed: _Observed,
    first: FirstSamples | None = None,
) -> tuple[FloatRun | None, dict[str, str]]:
    """The activations to widen to int16 (tensor -> why): the guard's outliers, then those whose channel
    spread on the first samples is an outlier's (`channel_spread.py`), at most OUTLIER_SHARE of them all;
    and the float run, whose outputs the comparison reuses."""
    from qconvert.calibrate.channel_spread import choose_widened, keep_own_copies
    from qconvert.calibrate.channel_spread import float_run as run_float

    if first is not None:  # onnxruntime's arrays would keep the pass's memory arena alive until the end
        keep_own_copies(first.run)
    model = loaded.model
    touched = _touched(scheme, model)
    constants = {tensor.name for tensor in model.graph.initializer}  # ranged, but not activations
    constants |= {name for node in model.graph.node if node.op_type == "Constant" for name in node.output}
    quantized = [
        name
        for name in observed.ranges
        if name in touched and name not in observed.keep_float and name not in constants
    ]
    followers = set(value_preserving_sources(model, list(observed.ranges)))  # they take their source's Q/DQ
    followers |= {
        name for node in model.graph.node if node.op_type in SHARED_OUTPUT_OPS for name in node.output
    }
    widened = {name: note for name, note in observed.widened.items() if name in touched}
    candidates = [
        name
        for name in quantized
        if name not in widened
        and name not in followers
        and name not in scheme.tensor_overrides
        and name not in scheme.keep_float
        and scheme.activation_type in WIDER_STORAGE
    ]
    if not candidates:
        return None, widened
    try:
        if first is not None and first.complete:  # read off calibration's pass: no run of its own
            run = first.float_run(candidates)
        else:
            run = run_float(loaded, candidates, open_dataset(data, model, batch_size))
    except InputError as error:  # data that cannot be read again (a one-shot iterator): nothing widened
        observed.warnings.append(
            f"the outlier-channel run did not run ({error.message}): nothing widened for outlier channels "
            "(--outlier-channels off skips it)"
        )
        return None, widened
    for found in choose_widened(run.spreads, candidates, len(quantized), already=len(widened)):
        widened[found.tensor] = found.note
    return run, widened


def _widen_outliers(
    scheme: Scheme, ranges: CalibrationRanges, model: ModelProto, notes: list[str]
) -> dict[str, str]:
    """The ranges' widened outliers (the guard's and the outlier channels) at int16 symmetric where the
    scheme gives them 8 bits and no override names them; only those a selected node reads or writes (a
    16-bit override raises the whole model to opset 21, so none is added for a tensor that gets no Q/DQ).
    Each gets a note; returns tensor -> why."""
    from qconvert.calibrate.overrides import TensorOverride

    touched = _touched(scheme, model)
    stored = ranges.metadata.get(WIDENED_OUTLIERS_KEY, {})
    extents = ranges.metadata.get(SEARCH_RANGES_KEY, {})  # a searched model's ranges: what it widened over
    extents = extents if isinstance(extents, dict) else {}
    widened: dict[str, str] = {}
    for name, why in (stored if isinstance(stored, dict) else {}).items():
        name = str(name)
        if name not in touched or name in scheme.tensor_overrides or name in scheme.keep_float:
            continue
        if scheme.activation_type_of(name) not in WIDER_STORAGE:
            continue
        extent = extents.get(name)
        low, high = extent if isinstance(extent, list) and len(extent) == 2 else (None, None)
        scheme.tensor_overrides[name] = TensorOverride(
            quant_type=WIDE_OUTLIER_TYPE, symmetric=True, rmin=low, rmax=high
        )
        reason = (
            str(why)
            if str(why).startswith(("outlier channels", "widened", "the search"))
            else "outliers far from its other values"
        )
        widened[name] = reason
        notes.append(f"{name}: widened to {WIDE_OUTLIER_TYPE} symmetric ({reason})")
    return widened


def _written_parameters(module: ModuleOp, names: Mapping[object, str]) -> dict[str, dict[str, object]]:
    """Each quantized activation's storage, scale and zero point as finalize wrote them (its qcast), by the
    tensor the written QuantizeLinear reads (a Relu the quantize absorbs gives its name to the tensor)."""
    from qconvert.ir.dialects.onnx import node_name
    from qconvert.ir.dialects.quant import QuantizeCastOp
    from qconvert.ir.quant_types import UniformQuantizedType
    from qconvert.ir.types import element_type_of

    written: dict[str, dict[str, object]] = {}
    for op in module.walk():
        if not isinstance(op, QuantizeCastOp):
            continue
        quant_type = element_type_of(op.result.type)
        label = node_name(op) or ""
        name = (
            label.removesuffix("_QuantizeLinear")
            if label.endswith("_QuantizeLinear")
            else names.get(op.input)
        )
        if name is not None and isinstance(quant_type, UniformQuantizedType):
            written[name] = {
                "storage": quant_type.storage_type_spelling,
                "scale": quant_type.scale,
                "zero_point": quant_type.zero_point,
            }
    return written


def _agreement(
    written: Path,
    model: str | os.PathLike[str] | ModelProto,
    loaded: LoadedModel,
    module: ModuleOp,
    data: DataSource,
    batch_size: int | str | None,
    samples: int,
    tensors: bool,
    read_before: bool,
    needs_basic: bool,
    float_run: FloatRun | None = None,
) -> Agreement:
    """The written model against the float model in onnxruntime; with `tensors`, each quantized
    activation's own loss too (the float model exposing them, as calibration ran it). Data read once
    already (`read_before`) that cannot be read again (a one-shot iterator) skips the comparison. The
    outlier-channel run's float outputs (`float_run`) stand for the float model's on its batches."""
    reference = model.SerializeToString() if isinstance(model, ModelProto) else os.fspath(model)
    dataset = open_dataset(data, loaded.model, batch_size)
    computed = [] if float_run is None else list(zip(float_run.batch_sizes, float_run.outputs))
    try:
        agreement = evaluate(reference, os.fspath(written), dataset, samples, needs_basic, computed)
        if tensors:
            activations = quantized_activations(module)
            session = make_session(augment_model(loaded, list(activations)), threads=0)
            agreement.tensors = tensor_losses(session, activations, dataset, samples)
    except InputError as error:
        if not read_before:
            raise
        reason = f"reading --data again failed ({error.message}; a one-shot iterator?): --evaluate 0 skips it"
        return Agreement("not run", 0, [], [f"the comparison with the float model did not run: {reason}"])
    return agreement


def _options_json(method: Method) -> dict[str, object]:
    from dataclasses import asdict, is_dataclass

    return asdict(method) if is_dataclass(method) else {}


__all__ = ["CalibrationResult", "calibrate", "make_scheme", "refuse_unused_with_load_ranges"]
