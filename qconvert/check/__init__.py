"""Cross-validation against onnxruntime: per quantization node bit-exact, end to end beside the noise floor.

Two verdicts, both in the `CheckReport` (report.py):

- **Per node (decides pass/fail).** onnxruntime runs the source model with graph optimizations
  disabled (the spec oracle), every intermediate tensor exposed as a graph output (oracle.py). Each
  quantization node (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, QLinear*, *Integer,
  com.microsoft QLinear* / QGemm / DynamicQuantizeMatMul) is then cut out as a one-node model, fed the
  very inputs onnxruntime gave it, lifted with `import_onnx` and run by the backend (nodes.py,
  backends.py). Its outputs must be bit-exact. With the interpreter backend, Q/DQ lift to
  `quant.qcast` / `quant.dcast` and QLinear* / *Integer / QGemm ... to quant-typed `qconvert.*` ops, all
  run on `qconvert.numerics`; nodes the frontend keeps generic (`onnx.*`) run on onnx's reference
  implementation, and the report says so (`evaluated_by`). With the stablehlo backend each case is
  converted to StableHLO and run on the chosen engine, and each `DequantizeLinear* -> op ->
  QuantizeLinear` group the `quantized` form fuses into one quantized op is checked too
  (stablehlo.py). A node whose inputs onnxruntime's Python API cannot return (int4, bf16, float8
  e5m2, ...), or that the backend cannot lower or run, is "not run" with the reason, never passed.
- **End to end (reported; fails only with a tolerance).** The whole lifted module runs on the inputs;
  each graph output is compared with the oracle (elements, mismatches, max abs diff, max difference in
  quantization steps, SQNR, cosine), beside the noise floor: onnxruntime with default optimizations
  against itself with them disabled, same inputs, same metrics.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from onnx import ModelProto, numpy_helper

from qconvert.check.backends import BACKENDS, CheckBackend, NotRun, make_backend
from qconvert.check.nodes import (
    NodeCase,
    broadcast_scale,
    cut_model,
    dequantize_lsb,
    is_quantization_node,
    judge,
    node_cases,
    node_names,
)
from qconvert.check.oracle import (
    RANDOM_SEED,
    check_arrays,
    element_types,
    float8_views,
    load_inputs,
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
    NOT_RUN,
    PASS,
    CheckReport,
    Comparison,
    LayerResult,
    OutputResult,
    Tolerances,
    compare,
    tolerance_failures,
)


def check(
    model_path: str | os.PathLike[str],
    inputs: str | os.PathLike[str] | Mapping[str, np.ndarray] | None = None,
    backend: str = "interpreter",
    tolerances: Tolerances | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    show_progress: bool = False,
    engine: str | None = None,
    form: str | None = None,
    semantics: str | None = None,
    fuse_arithmetic: bool = False,
) -> CheckReport:
    """Check `model_path` against onnxruntime, per quantization node (bit-exact) and end to end.

    `inputs`: an `.npz` path, a dict of arrays by graph input name, or None for seeded random inputs.
    `engine` (interpreter | xla), `form` (quantized | integer) and `semantics` (onnx | stablehlo) choose
    how the stablehlo backend runs (defaults xla, quantized, onnx); the interpreter backend takes none.
    `fuse_arithmetic` (stablehlo, quantized form): the conversion also fuses add / dot_general /
    convolution, and each such fused `DequantizeLinear* -> Conv/MatMul/Gemm/Add -> QuantizeLinear` group
    is a layer of its own in the per-node verdict.
    `show_progress` draws a progress bar on stderr over the nodes. Raises `InputError` for a bad model,
    bad inputs, an unknown backend or an option the backend does not take.
    """
    from qconvert.frontends.onnx.load import load

    tolerances = tolerances or Tolerances()
    runner = make_backend(backend, engine, form, semantics, fuse_arithmetic)
    model, inference_error = load(model_path, input_shapes)
    if isinstance(inputs, (str, os.PathLike)):
        feeds, inputs_source = load_inputs(model, inputs), str(inputs)
    elif inputs is not None:
        feeds, inputs_source = {k: np.asarray(v) for k, v in inputs.items()}, "arrays given"
        check_arrays(model, feeds)
    else:
        feeds, inputs_source = random_inputs(model), f"random (seed {RANDOM_SEED})"
    types = element_types(model)
    values, unreturnable = run_oracle(model, feeds, types, str(model_path))
    values.update(feeds)
    values.update({t.name: numpy_helper.to_array(t) for t in model.graph.initializer})
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
    )
    if inference_error is not None:
        report.notes.append(f"{inference_error.message}; types from onnxruntime")

    # Every fused group holds Q/DQ nodes: no case at all means the model has no quantization node.
    cases = node_cases(
        model, values, types, constants, unreturnable, runner.feeds_weights, runner.fused_groups()
    )
    if not cases:
        report.notes.append("the model has no quantization node: nothing was checked per node")
    runnable = [case for case in cases if case.reason is None]
    with _progress(show_progress) as bar:
        task = bar.add_task("per node", total=len(runnable))
        runs = runner.run_cases(runnable, lambda done: bar.advance(task, done))
    for case in cases:
        if not runner.keep_case(case):
            continue
        run = runs.get(case.name)
        if run is None or isinstance(run, NotRun):
            result = case.result()
            if run is not None:
                result.reason = str(run)
            report.layers[case.name] = result
            continue
        predicted = runner.predicted_mismatches(case, values)
        report.layers[case.name] = judge(case, run.outputs, values, run.evaluated_by, predicted)
    if fuse_arithmetic:
        report.notes.append(_arithmetic_note(cases, report))

    _end_to_end(report, runner, model, feeds, values, types, tolerances)
    return report


ARITHMETIC_OPS = frozenset({"Conv", "MatMul", "Gemm", "Add"})  # what --fuse-arithmetic fuses


def _arithmetic_note(cases: Sequence[NodeCase], report: CheckReport) -> str:
    """How many arithmetic groups were fused and checked as layers, and how many were left unfused."""
    candidates = [case for case in cases if case.group is not None and case.op_type in ARITHMETIC_OPS]
    fused = [case for case in candidates if case.name in report.layers]
    note = (
        f"--fuse-arithmetic: {len(fused)} of {len(candidates)} DequantizeLinear -> Conv/MatMul/Gemm/Add ->"
        " QuantizeLinear groups fused and checked as layers (the others' nodes are checked one by one)"
    )
    if report.engine == "interpreter" and any(case.op_type == "Conv" for case in fused):
        note += "; jaxlib's StableHLO interpreter wraps i8 convolutions (a known bug): fused Convs fail on it"
    return note


def _end_to_end(
    report: CheckReport,
    runner: CheckBackend,
    model: ModelProto,
    feeds: Mapping[str, np.ndarray],
    values: Mapping[str, np.ndarray],
    types: Mapping[str, int],
    tolerances: Tolerances,
) -> None:
    """Every graph output: the backend's value against the oracle, beside the noise floor."""
    producers = {o: n for n in model.graph.node for o in n.output}
    session = ort_session(model, optimized=True, label=report.model)
    optimized = float8_views(run_session(session, feeds), types)
    try:
        ours: dict[str, np.ndarray] | None = runner.run_model(typed_for_lift(model, values, types), feeds)
        reason = None
    except NotRun as error:
        ours, reason = None, str(error)
    for output in model.graph.output:
        reference = values[output.name]
        producer = producers.get(output.name)
        lsb = dequantize_lsb(producer, values, reference.shape) if producer is not None else None
        floor = compare(reference, optimized[output.name], lsb)
        if ours is None:
            report.outputs[output.name] = OutputResult(
                name=output.name, ours=None, noise_floor=floor, reason=reason
            )
            continue
        comparison = compare(reference, np.asarray(ours[output.name]), lsb, tolerances.atol, tolerances.rtol)
        report.outputs[output.name] = OutputResult(
            name=output.name,
            ours=comparison,
            noise_floor=floor,
            failed_tolerances=tolerance_failures(comparison, tolerances),
        )


def _progress(enabled: bool) -> Any:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = Console(stderr=True)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console,
        transient=True,
        disable=not enabled,
    )


__all__ = [
    "BACKENDS",
    "EVALUATED_BY_NUMERICS",
    "EVALUATED_BY_REFERENCE",
    "FAIL",
    "NOT_RUN",
    "PASS",
    "CheckReport",
    "Comparison",
    "LayerResult",
    "OutputResult",
    "Tolerances",
    "broadcast_scale",
    "check",
    "compare",
    "cut_model",
    "is_quantization_node",
    "load_inputs",
    "node_names",
    "random_inputs",
]
