"""Cross-validation against onnxruntime: every node per node, every output end to end beside the noise floor.

The verdict (report.py): PASSED only when every node and every output ran and passed; INCOMPLETE when
something was not run (unless `allow_not_run`); FAILED when anything failed.

- **Per node.** onnxruntime runs the source model with graph optimizations disabled (the spec oracle, one
  thread), every intermediate tensor exposed as a graph output (oracle.py), on the first batch of the
  data. Every node is then cut out as a one-node model, fed the very inputs onnxruntime gave it, lifted
  with `import_onnx` and run by the backend (nodes.py, backends.py), all cases side by side in one module.
  Quantization nodes (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinear*, *Integer,
  com.microsoft QLinear* / QGemm / DynamicQuantizeMatMul / DynamicQuantizeLSTM) must be bit-exact; every
  other node must be within the float32 bound of its op family (bounds.py; reductions scaled by the op
  run by onnxruntime on |inputs|). With the interpreter backend, Q/DQ lift to `quant.qcast` /
  `quant.dcast` and QLinear* / *Integer / QGemm ... to quant-typed `qconvert.*` ops, all run on
  `qconvert.numerics`; nodes the frontend keeps generic (`onnx.*`) run on the interpreter's kernels, and
  the report says so (`evaluated_by`). With the stablehlo backend the cases are converted to StableHLO
  and run on the chosen engine, and each `DequantizeLinear* -> op -> QuantizeLinear` group the
  `quantized` form fuses into one quantized op is checked too (its runner: backends/stablehlo/check.py).
  A node whose inputs onnxruntime's Python API cannot return (int4, bf16, float8 e5m2, ...), or that the
  backend cannot lower or run, is "not run" with the reason, never passed.
- **End to end.** The whole lifted module runs on every batch of the data (streamed: one batch in memory;
  the metrics are sums and maxima that merge); each graph output is compared with the oracle (elements,
  mismatches, max abs diff, max difference in quantization steps, SQNR, cosine), beside the noise floor:
  onnxruntime with default optimizations against itself with them disabled, same inputs, same metrics.
  An output far below the floor fails by default (report.py says how far); user tolerances add to that.
  A whole model the backend cannot convert or run is "not run" end to end.
- **A stripped model against its source** (`check_against`, against.py; `qconvert check OUT --against
  MODEL`): both in onnxruntime, the boundary's storage compared bit for bit, optimizations off and on.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import ModelProto, NodeProto, numpy_helper

from qconvert.calibrate.dataset import DataSource
from qconvert.check.against import AgainstReport, check_against
from qconvert.check.backends import (
    CheckBackend,
    InterpreterBackend,
    NotRun,
    backend_choices,
    make_backend,
    quiet_float_warnings,
)
from qconvert.check.feeds import Feed, model_feeds
from qconvert.check.nodes import (
    DeferredValues,
    NodeCase,
    broadcast_scale,
    case_batches,
    cut_model,
    dequantize_slices,
    is_quantization_node,
    judge,
    magnitude_cases,
    merge_results,
    node_cases,
    node_names,
    node_scale,
    side_by_side,
    split_outputs,
)
from qconvert.check.oracle import (
    WEIGHT_SLICE_ELEMENTS,
    CheckModel,
    deferred_dequantizes,
    dequantize_on_demand,
    element_types,
    float8_views,
    load_for_check,
    ort_session,
    random_inputs,
    run_oracle,
    run_session,
    typed_for_lift,
)
from qconvert.check.report import (
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
    OutputResult,
    Tolerances,
    compare,
    tolerance_failures,
)
from qconvert.errors import InputError
from qconvert.public_api import make_callable


def check(
    model_path: str | os.PathLike[str],
    inputs: DataSource | Mapping[str, np.ndarray] | None = None,
    backend: str = "interpreter",
    tolerances: Tolerances | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    show_progress: bool = False,
    engine: str | None = None,
    allow_not_run: bool = False,
    max_samples: int | None = None,
    batch_size: int | None = None,
    **backend_options: Any,
) -> CheckReport:
    """Check `model_path` against onnxruntime: every node per node, and every output end to end.

    `inputs`: the same sources as `calibrate`'s `--data` (a folder of .npz/.npy, one .npz with samples
    on the batch axis, `module:function`, a list of {input: array} dicts), streamed in batches of
    `batch_size` samples (default: the model's fixed batch dim, else 8) and at most `max_samples`
    samples (whole batches when the batch dim is fixed); a dict of arrays by input name (one run as
    given); or None for seeded random inputs. The per-node check uses the first batch; end to end streams
    every batch, merging the metrics. Dynamic model inputs take their static shapes from the first
    batch's arrays (`input_shapes` fixes them by hand).
    `backend`: `interpreter`, or a backend of `qconvert.backends` that has engines; `engine` and
    `backend_options` (None or False: not given) choose how it runs, e.g. stablehlo's `engine`
    (interpreter | xla), `form` (quantized | integer), `semantics` (onnx | stablehlo), defaults xla,
    quantized, onnx; the interpreter backend takes none. `fuse_arithmetic` (stablehlo, quantized form):
    the conversion also fuses add / dot_general / convolution, and each such fused
    `DequantizeLinear* -> Conv/MatMul/Gemm/Add -> QuantizeLinear` group is a layer of its own in the
    per-node verdict.
    `allow_not_run`: accept nodes or outputs that were not run (verdict "PASSED (N not run, accepted)"
    instead of INCOMPLETE). `show_progress` draws progress bars on stderr. Raises `InputError` for a bad
    model, bad inputs, an unknown backend or an option the backend does not take.
    """
    from qconvert.frontends.onnx.load import override_input_shapes, read_model

    tolerances = tolerances or Tolerances()
    runner = make_backend(backend, engine, **backend_options)
    if max_samples is not None and max_samples < 1:
        raise InputError(f"--max-samples {max_samples}: expected 1 or more")
    header, _ = read_model(model_path)
    if input_shapes:
        override_input_shapes(header, input_shapes)
    feeds, inputs_source, notes = model_feeds(header, inputs, max_samples, batch_size)
    first = next(feeds)
    dynamic = _dynamic_inputs(header)
    del header  # the weights again come with `load`
    pinned = _shapes_for(first.arrays, dynamic, input_shapes)
    loaded = load_for_check(model_path, pinned)
    model, inference_error, weights = loaded.model, loaded.inference_error, loaded.weights
    types = element_types(model)
    deferred = deferred_dequantizes(model, weights)
    hidden = [node.output[0] for node in deferred]
    try:
        values, unreturnable = run_oracle(model, {**first.arrays, **weights}, types, str(model_path), hidden)
    except InputError as error:
        from_data = {
            name: shape for name, shape in (pinned or {}).items() if name not in (input_shapes or {})
        }
        if not from_data:
            raise
        shapes = ", ".join(f"{name}={'x'.join(map(str, shape))}" for name, shape in from_data.items())
        raise InputError(
            f"{error.message}\n(the model's dynamic inputs were pinned to the shapes of the data's arrays, "
            f"{shapes}: does the data fit the model, e.g. a sequence longer than its positions?)"
        ) from None
    values.update(first.arrays)
    values.update({t.name: numpy_helper.to_array(t) for t in model.graph.initializer})
    values.update(weights)
    values = DeferredValues(
        values,
        {
            node.output[0]: dequantize_on_demand(model, node, values, types, str(model_path))
            for node in deferred
        },
    )
    constants = {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    report = CheckReport(
        model=str(model_path),
        backend=runner.name,
        engine=runner.engine,
        form=runner.form,
        semantics=runner.semantics,
        tolerances=tolerances,
        layers={},
        outputs={},
        inputs_source=inputs_source,
        allow_not_run=allow_not_run,
        node_samples=first.samples,
    )
    if inference_error is not None:
        report.notes.append(f"{inference_error.message}; types from onnxruntime")

    cases = node_cases(
        model, values, types, constants, unreturnable, runner.feeds_weights, runner.fused_groups(), hidden
    )
    runnable = [case for case in cases if case.reason is None and not case.deferred]
    if not weights:  # mapped weights (a model over 2 GB): each batch's magnitudes with it, |weights| once
        _magnitudes(runnable, str(model_path))
    # Judged batch by batch (`case_batches`): the backend's outputs of one batch are alive at a time.
    judged: dict[str, LayerResult] = {}
    with _progress(show_progress) as bar:
        task = bar.add_task("per node", total=len(runnable))
        for batch in case_batches(runnable):
            if weights:
                _magnitudes(batch, str(model_path))
            runs = runner.run_cases(batch, lambda done: bar.advance(task, done))
            for case in batch:
                run = runs.get(case.name)
                if isinstance(run, NotRun):
                    judged[case.name] = case.result()
                    judged[case.name].reason = str(run)
                elif run is not None:
                    predicted = runner.predicted_mismatches(case, values) if case.quantization else None
                    judged[case.name] = judge(case, run.outputs, values, run.evaluated_by, predicted)
                if weights:
                    case.magnitude = None
            del runs
        for case in cases:  # one deferred value alive at a time (models over 2 GB)
            if case.deferred and case.reason is None:
                judged[case.name] = _judge_deferred(
                    case, runner, model, values, types, constants, str(model_path)
                )
                loaded.release_pages()
    for case in cases:
        if runner.keep_case(case):
            report.layers[case.name] = judged.get(case.name) or case.result()
    report.notes.extend(runner.notes(cases, report.layers))
    del cases, runnable, judged

    end_to_end = _EndToEnd(report, runner, model_path, types, tolerances, dynamic, input_shapes, loaded)
    loaded.release_pages()
    end_to_end.start(model, first, values)
    del values, model
    with _progress(show_progress) as bar:
        task = bar.add_task("end to end", total=None)
        bar.advance(task, first.samples)
        for feed in feeds:
            if not end_to_end.add(feed):
                break
            bar.advance(task, feed.samples)
    end_to_end.finish()
    report.notes.extend(notes)
    return report


def _dynamic_inputs(model: ModelProto) -> set[str]:
    """Graph inputs with a dynamic (or unknown) dim: their static shapes come from the data."""
    initializers = {t.name for t in model.graph.initializer}
    dynamic = set()
    for info in model.graph.input:
        if info.name in initializers or not info.type.HasField("tensor_type"):
            continue
        dims = info.type.tensor_type.shape.dim
        if not info.type.tensor_type.HasField("shape") or any(not d.HasField("dim_value") for d in dims):
            dynamic.add(info.name)
    return dynamic


def _shapes_for(
    arrays: Mapping[str, np.ndarray],
    dynamic: set[str],
    input_shapes: Mapping[str, Sequence[int]] | None,
) -> dict[str, Sequence[int]] | None:
    """The user's `--input-shape`s, and the shapes of the arrays fed to the inputs that are dynamic."""
    shapes: dict[str, Sequence[int]] = dict(input_shapes or {})
    shapes.update({name: tuple(arrays[name].shape) for name in dynamic if name in arrays})
    return shapes or None


def _judge_deferred(
    case: NodeCase,
    runner: CheckBackend,
    model: ModelProto,
    values: DeferredValues,
    types: Mapping[str, int],
    constants: set[str],
    label: str,
) -> LayerResult:
    """A case of a deferred value, alone: a weight's DequantizeLinear judged slice by slice against
    onnxruntime on the same slice (`dequantize_slices`); any other case (the weight's consumer) cut out
    with the value computed once, run and judged, then dropped."""
    if case.compared and all(name in values.deferred for name in case.compared) and len(case.nodes) == 1:
        total: LayerResult | None = None
        for part, part_values in dequantize_slices(
            case, model, values, types, constants, WEIGHT_SLICE_ELEMENTS
        ):
            assert part.model is not None
            reference = float8_views(run_session(ort_session(part.model, False, label), part.feeds), types)
            part_values.update(reference)
            total = merge_results(total, _judge_run(part, runner, part_values))
        assert total is not None
        return total
    case.model, case.feeds = cut_model(
        model, case.nodes, case.compared, values, types, constants, runner.feeds_weights
    )
    _magnitudes([case], label)
    try:
        return _judge_run(case, runner, values)
    finally:
        case.model, case.feeds, case.magnitude = None, {}, None
        values.release()


def _judge_run(case: NodeCase, runner: CheckBackend, values: Mapping[str, np.ndarray]) -> LayerResult:
    """`case` run by the backend alone, and judged (not run: the backend's reason)."""
    run = runner.run_cases([case], lambda done: None).get(case.name)
    if isinstance(run, NotRun) or run is None:
        result = case.result()
        result.reason = str(run) if run is not None else result.reason
        return result
    predicted = runner.predicted_mismatches(case, values) if case.quantization else None
    return judge(case, run.outputs, values, run.evaluated_by, predicted)


def _magnitudes(cases: Sequence[NodeCase], label: str) -> None:
    """For every reduction node (MatMul, Conv, ReduceSum ...): onnxruntime's value of the node on
    |inputs|, which scales its float bound (bounds.py); all in one session. A node left without one is
    judged by the looser normalization bound, and its rule says so."""
    magnitudes = magnitude_cases(cases)
    if not magnitudes:
        return
    try:
        model, feeds = side_by_side(magnitudes)
        session = ort_session(model, optimized=False, label=label)
        results = run_session(session, feeds)
    except InputError:
        return
    by_name = {case.name: case for case in cases}
    for name, outputs in split_outputs(magnitudes, results).items():
        by_name[name].magnitude = outputs


@dataclass(slots=True)
class _Shapes:
    """What end to end runs for one set of input shapes: the model pinned to them, onnxruntime sessions
    (optimizations off: the reference; default: the noise floor), and ours (or why it cannot run)."""

    signature: tuple[tuple[str, tuple[int, ...]], ...]
    model: ModelProto | None  # until the reference session is made (a second batch of these shapes)
    optimized: Any
    ours: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]] | NotRun
    reference: Any = None

    def reference_session(self, label: str) -> Any:
        if self.reference is None:
            assert self.model is not None
            self.reference, self.model = ort_session(self.model, optimized=False, label=label), None
        return self.reference


def _signature(arrays: Mapping[str, np.ndarray]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(sorted((name, tuple(array.shape)) for name, array in arrays.items()))


class _EndToEnd:
    """Every graph output over every batch: ours and onnxruntime optimized, each against the oracle,
    merged across batches (SQNR, cosine and the differences are sums and maxima). Memory holds one
    batch; a batch of other shapes (a smaller last batch of a dynamic model) pins the model anew."""

    def __init__(
        self,
        report: CheckReport,
        runner: CheckBackend,
        model_path: str | os.PathLike[str],
        types: Mapping[str, int],
        tolerances: Tolerances,
        dynamic: set[str],
        input_shapes: Mapping[str, Sequence[int]] | None,
        loaded: CheckModel,
    ) -> None:
        self.report, self.runner, self.model_path = report, runner, model_path
        self.loaded = loaded  # its weights: fed to every run of `loaded.model` (models over 2 GB)
        self.types, self.tolerances = types, tolerances
        self.dynamic, self.input_shapes = dynamic, input_shapes
        self.ours: dict[str, Comparison | None] = {}
        self.floor: dict[str, Comparison] = {}
        self.reason: str | None = None
        self.scales: dict[str, tuple[NodeProto, np.ndarray]] = {}
        self.outputs: list[str] = []
        self.shapes: _Shapes | None = None
        self.pinned = 0
        # the interpreter's lockstep replay (check/lockstep.py): per output, merged over the batches
        self.lockstep: dict[str, Comparison] = {}
        self.tie_flips = 0
        self.tie_nodes: dict[str, None] = {}  # the QuantizeLinear nodes that flipped, in order, once each
        self.lift_model: ModelProto | None = None  # the model the interpreter lifted, for its replay

    def _pin(
        self, model: ModelProto, values: Mapping[str, np.ndarray], arrays: Mapping[str, np.ndarray]
    ) -> _Shapes:
        lift_model = typed_for_lift(model, values, self.types)
        self.lift_model = lift_model if isinstance(self.runner, InterpreterBackend) else None
        try:
            ours: Any = self.runner.prepare_model(lift_model)
        except NotRun as error:
            ours = error
        self.pinned += 1
        return _Shapes(
            signature=_signature(arrays),
            model=model,
            # mapped weights: the optimized session (its own mapping and packed weights) made per batch,
            # gone before ours runs, so that the two never hold the weights together
            optimized=None if self.loaded.weights else self._optimized_session(),
            ours=ours,
        )

    def _optimized_session(self) -> Any:
        return ort_session(
            self.loaded.source, optimized=True, label=self.report.model, base_dir=self.loaded.base_dir
        )

    def start(self, model: ModelProto, first: Feed, values: dict[str, np.ndarray]) -> None:
        """The first batch, whose oracle values the per-node check already computed. `values` is emptied
        before ours runs (memory: every intermediate of the model); a lockstep replay computes it again."""
        self.outputs = [o.name for o in model.graph.output]
        producers = {o: n for n in model.graph.node for o in n.output}
        for name in self.outputs:
            producer = producers.get(name)
            if (
                producer is not None
                and producer.op_type == "DequantizeLinear"
                and len(producer.input) > 1
                and producer.input[1] in values
            ):
                self.scales[name] = (producer, np.asarray(values[producer.input[1]]))
        reference = {name: values[name] for name in self.outputs}
        untyped = {
            name: values[name]
            for n in model.graph.node
            for name in n.output
            if name not in self.types and name in values  # typed first: a deferred value is not computed
        }
        values.clear()
        self.shapes = self._pin(model, untyped, first.arrays)
        del untyped
        self._compare(first, reference)

    def add(self, feed: Feed) -> bool:
        """One more batch; False when there is no point reading more (ours cannot run)."""
        assert self.shapes is not None
        if isinstance(self.shapes.ours, NotRun):
            return False
        if _signature(feed.arrays) != self.shapes.signature:
            self.shapes = None  # one set of sessions at a time: memory stays flat
            self.loaded = load_for_check(
                self.model_path, _shapes_for(feed.arrays, self.dynamic, self.input_shapes)
            )
            model, weights = self.loaded.model, self.loaded.weights
            hidden = [node.output[0] for node in deferred_dequantizes(model, weights)]
            values, _ = run_oracle(model, {**feed.arrays, **weights}, self.types, self.report.model, hidden)
            values.update(feed.arrays)
            self.shapes = self._pin(model, values, feed.arrays)
            reference = {name: values[name] for name in self.outputs}
            self._compare(feed, float8_views(reference, self.types), values)
            return self.reason is None
        reference = run_session(
            self.shapes.reference_session(self.report.model), {**feed.arrays, **self.loaded.weights}
        )
        self.loaded.release_pages()
        self._compare(feed, float8_views(reference, self.types))
        return self.reason is None

    def _replay(self, feed: Feed, oracle: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray] | None:
        """The interpreter's run of this batch in lockstep with onnxruntime (check/lockstep.py)."""
        from qconvert.check.lockstep import replay
        from qconvert.frontends.onnx import import_onnx

        model = self.lift_model
        if model is None:
            return None
        feeds = {**feed.arrays, **self.loaded.weights}
        if oracle is None:  # a later batch of the same shapes: its every value, as the first batch's
            hidden = [node.output[0] for node in deferred_dequantizes(model, self.loaded.weights)]
            oracle, _ = run_oracle(model, feeds, self.types, self.report.model, hidden)
            oracle.update(feeds)
            oracle.update({t.name: numpy_helper.to_array(t) for t in model.graph.initializer})
        try:
            with quiet_float_warnings():
                lockstep = replay(import_onnx(model), model, feeds, oracle)
        except InputError:
            return None
        self.tie_flips += lockstep.flips
        self.tie_nodes.update(dict.fromkeys(lockstep.nodes))
        return lockstep.outputs

    def _compare(
        self, feed: Feed, reference: Mapping[str, np.ndarray], oracle: Mapping[str, np.ndarray] | None = None
    ) -> None:
        assert self.shapes is not None
        session = self.shapes.optimized or self._optimized_session()
        optimized = float8_views(run_session(session, feed.arrays), self.types)
        del session
        ours: dict[str, np.ndarray] | None = None
        if isinstance(self.shapes.ours, NotRun):
            self.reason = str(self.shapes.ours)
        elif self.reason is None:
            try:
                ours = self.shapes.ours({**feed.arrays, **self.loaded.weights})
                self.loaded.release_pages()
            except NotRun as error:
                self.reason = str(error)
        self.report.samples += feed.samples
        replayed: dict[str, np.ndarray] | None = None
        if ours is not None and any(not np.array_equal(reference[n], ours[n]) for n in self.outputs):
            replayed = self._replay(feed, oracle)
        for name in self.outputs:
            ref = reference[name]
            lsb = None
            if name in self.scales:
                node, scale = self.scales[name]
                lsb = node_scale(node, scale, ref.shape)
            floor = compare(ref, optimized[name], lsb)
            self.floor[name] = self.floor[name].merged(floor) if name in self.floor else floor
            if ours is None:
                self.ours[name] = None
                continue
            tol = self.tolerances
            comparison = compare(ref, np.asarray(ours[name]), lsb, tol.atol, tol.rtol)
            if name not in self.ours:
                self.ours[name] = comparison
            elif (previous := self.ours[name]) is not None:
                self.ours[name] = previous.merged(comparison)
            if replayed is not None:
                comparison = compare(ref, np.asarray(replayed[name]), lsb)
            previous_replay = self.lockstep.get(name)
            self.lockstep[name] = (
                comparison if previous_replay is None else previous_replay.merged(comparison)
            )

    def finish(self) -> None:
        for name in self.outputs:
            comparison = self.ours.get(name)
            result = OutputResult(
                name=name,
                ours=comparison,
                noise_floor=self.floor.get(name),
                reason=self.reason if comparison is None else None,
                samples=self.report.samples,
            )
            if comparison is not None:
                result.failed_tolerances = tolerance_failures(comparison, self.tolerances)
                if self.tie_flips:
                    result.lockstep, result.tie_flips = self.lockstep.get(name), self.tie_flips
            self.report.outputs[name] = result
            if result.explained_by_ties:
                assert result.lockstep is not None
                nodes = list(self.tie_nodes)
                listed = ", ".join(nodes[:3]) + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
                self.report.notes.append(
                    f"end to end: output '{name}' ({_sqnr(comparison)} against onnxruntime) differs by "
                    f"{self.tie_flips} near-tie quantization flip(s) in {len(nodes)} QuantizeLinear node(s) "
                    f"({listed}): replayed with onnxruntime's step there, it is at {_sqnr(result.lockstep)}, "
                    "within the noise floor's rule (float summation order decides a near-tie; see "
                    "qconvert/check/lockstep.py)"
                )
        if self.pinned > 1:
            self.report.notes.append(
                f"end to end: the model was pinned to {self.pinned} sets of input shapes (batches of "
                "other shapes: each set is lifted and compiled anew)"
            )


def _sqnr(comparison: Comparison | None) -> str:
    if comparison is None:
        return "not run"
    return "exact" if comparison.sqnr_db == math.inf else f"SQNR {comparison.sqnr_db:.1f} dB"


def _progress(enabled: bool) -> Any:
    from rich.console import Console
    from rich.progress import Progress, TextColumn

    from qconvert.stdout_console import progress_columns

    console = Console(stderr=True)
    return Progress(  # an unknown total (end to end streams the data): a count and a rate, no bar
        TextColumn("{task.description}"),
        *progress_columns(),
        console=console,
        transient=True,
        disable=not enabled,
    )


__all__ = [
    "AgainstReport",
    "EVALUATED_BY_NUMERICS",
    "EVALUATED_BY_REFERENCE",
    "FAIL",
    "FAILED",
    "INCOMPLETE",
    "NOT_RUN",
    "PASS",
    "PASSED",
    "CheckReport",
    "Comparison",
    "LayerResult",
    "OutputResult",
    "Tolerances",
    "backend_choices",
    "broadcast_scale",
    "check",
    "check_against",
    "compare",
    "cut_model",
    "is_quantization_node",
    "node_names",
    "random_inputs",
]

# `qconvert.check(...)` runs check() (qconvert/public_api.py: this package shares the verb's name)
make_callable(__name__, __name__, "check", "check")
