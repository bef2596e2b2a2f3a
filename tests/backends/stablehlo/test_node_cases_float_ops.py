"""ONNX's own backend node tests of every op the float lowerings handle (onnx_elementwise, onnx_nn,
onnx_reduce, onnx_shape, onnx_math, onnx_logic, onnx_norm, onnx_resize, onnx_index, onnx_layout,
onnx_reduce_more, onnx_einsum, onnx_misc, onnx_grid_sample, onnx_pool_indices, onnx_spectral), run on
XLA:CPU and compared with onnxruntime.

Each single-node case (`onnx.backend.test.case.node.collect_testcases`, in memory) keeps its first input
as a graph input and makes the others initializers (what a real model has: Resize's scales, Pad's pads,
TopK's k...). The cases of one opset run as one graph (one compile). The oracle is onnxruntime on that
graph, or, where onnxruntime cannot run it (opset 28, types it lacks), the suite's expected outputs.
Integer and boolean outputs match exactly; float32 ones within `RELATIVE` and `ABSOLUTE` (a few float32
ulps: the engines' transcendental functions and sum orders differ), other float types within 1e-3.

A case StableHLO here cannot express is listed in `REFUSED` with the reason its conversion must give,
so the list cannot rot: a case that starts converting fails until it moves out of the list.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import helper, numpy_helper

pytestmark = pytest.mark.engine

RELATIVE, ABSOLUTE = 1e-5, 1e-6
MODULES = ("elementwise", "nn", "reduce", "shape")
MODULES += (
    "math",
    "logic",
    "norm",
    "resize",
    "index",
    "layout",
    "reduce_more",
    "einsum",
    "misc",
    "grid_sample",
    "pool_indices",
    "spectral",
)
BACKEND = Path(__file__).resolve().parents[3] / "backends" / "stablehlo"

DATA_DEPENDENT = "output shape depends on the input values|shapes unknown at conversion time"
REFUSED: dict[str, str] = {
    "test_batchnorm_example_training_mode": "training_mode=1",
    "test_batchnorm_epsilon_training_mode": "training_mode=1",
    "test_nonzero_example": DATA_DEPENDENT,
}
REFUSED_PATTERNS: dict[str, str] = {
    r"test_cast(like)?_.*_to_(FLOAT8|FLOAT4|U?INT4|U?INT2)": "without float8",
    r"test_training_dropout": "training mode",
    r"test_identity_(sequence|opt)": "static shapes needed",
    r"test_unique_": DATA_DEPENDENT,
    r"test_resize_.*antialias": "antialias",
    r"test_gridsample_bicubic": "mode='cubic'",
    r"test_dft_irfft": "inverse=1 and onesided=1",
    r"test_(hann|hamming|blackman)window": "computed at run time",  # the size is the graph input here
    r"test_gridsample_volumetric": "4-D float32 is lowered",
    r"test_resize_tf_crop_and_resize": "tf_crop_and_resize",
}
# Where onnxruntime and ONNX's reference disagree, the oracle is onnxruntime; these cases record it.
ONNXRUNTIME_DIFFERS = {
    # Downsampling with align_corners: the reference samples other points than onnxruntime's kernel
    # (and the ONNX formula) does: [1, 3.14] for onnxruntime's [1, 4].
    "test_resize_downsample_scales_linear_align_corners",
    "test_resize_downsample_scales_cubic_align_corners",
    # MaxUnpool with output_shape: onnxruntime scatters to the flat indices of the output shape, the
    # reference to those of the default shape, then pads.
    "test_maxunpool_export_with_output_shape",
}
# bfloat16 Celu: onnxruntime has no bfloat16 kernel; the reference rounds its intermediates to bfloat16.
LOOSER = {"test_celu_bfloat16": 4e-3}


# Not run: string tensors (StableHLO has none; lifting a string constant fails in the IR's printer, a
# TypeError instead of an InputError, reported to the frontend's owners).
NOT_RUN = {"test_equal_string", "test_equal_string_broadcast"}


def refusal(name: str) -> str | None:
    if name in REFUSED:
        return REFUSED[name]
    return next((reason for pattern, reason in REFUSED_PATTERNS.items() if re.match(pattern, name)), None)


@functools.cache
def lowered_ops() -> frozenset[str]:
    names: set[str] = set()
    for module in MODULES:
        names |= set(re.findall(r'"onnx\.([A-Za-z]+)"', (BACKEND / f"onnx_{module}.py").read_text()))
    return frozenset(names)


@functools.cache
def cases() -> dict[str, object]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = collect_testcases(None)
    return {
        c.name: c
        for c in found
        if len(c.model.graph.node) == 1
        and c.model.graph.node[0].op_type in lowered_ops()
        and c.data_sets
        and c.name not in NOT_RUN
    }


def _array(value: object) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def one_case_model(case: object) -> tuple[onnx.ModelProto, np.ndarray]:
    """The case's model with inputs after the first as initializers, and the first input's value."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)  # type: ignore[attr-defined]
    inputs, _ = case.data_sets[0]  # type: ignore[attr-defined]
    graph = model.graph
    for info, value in list(zip(graph.input, inputs))[1:]:
        graph.initializer.append(numpy_helper.from_array(_array(value), info.name))
    del graph.input[1:]
    return model, _array(inputs[0])


def merged_model(names: list[str]) -> tuple[onnx.ModelProto, list[np.ndarray], list[tuple[str, str]]]:
    """One graph holding every case of `names` (same opset), tensors prefixed by the case name; returns
    the model, its input values and (case, output name) per graph output."""
    nodes, inputs, outputs, initializers, values, owners = [], [], [], [], [], []
    opsets: dict[str, int] = {}
    for name in names:
        model, first = one_case_model(cases()[name])
        graph = model.graph
        for opset in model.opset_import:
            opsets[opset.domain] = max(opsets.get(opset.domain, 0), opset.version)

        def renamed(tensor: str, case: str = name) -> str:
            return f"{case}__{tensor}" if tensor else ""

        node = onnx.NodeProto()
        node.CopyFrom(graph.node[0])
        node.input[:] = [renamed(t) for t in node.input]
        node.output[:] = [renamed(t) for t in node.output]
        nodes.append(node)
        for tensor in graph.initializer:
            copy = onnx.TensorProto()
            copy.CopyFrom(tensor)
            copy.name = renamed(tensor.name)
            initializers.append(copy)
        first_input = onnx.ValueInfoProto()
        first_input.CopyFrom(graph.input[0])
        first_input.name = renamed(first_input.name)
        inputs.append(first_input)
        values.append(first)
        for info in graph.output:
            copy = onnx.ValueInfoProto()
            copy.CopyFrom(info)
            copy.name = renamed(info.name)
            outputs.append(copy)
            owners.append((name, info.name))
    graph = helper.make_graph(nodes, "node_cases", inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    model.ir_version = 10
    return model, values, owners


def run_onnxruntime(model: onnx.ModelProto, values: list[np.ndarray]) -> list[np.ndarray] | None:
    import onnxruntime as ort

    try:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return session.run(None, {i.name: v for i, v in zip(session.get_inputs(), values)})
    except Exception:  # onnxruntime cannot run the case (type, opset): the suite's outputs decide
        return None


def compare(
    label: str, actual: np.ndarray, expected: np.ndarray, tolerance: float | None = None, sums: bool = False
) -> None:
    """Exact for integers and booleans; floats within RELATIVE / ABSOLUTE, or `tolerance`; `sums`: each
    output element is a sum over the whole input (DFT bins), so its error scales with the largest |output|."""
    assert actual.shape == expected.shape, f"{label}: shape {actual.shape} != {expected.shape}"
    if expected.dtype.kind in "biu":
        np.testing.assert_array_equal(actual, expected, err_msg=label)
        return
    relative, absolute = (RELATIVE, ABSOLUTE) if expected.dtype == np.float32 else (1e-3, 1e-3)
    if tolerance is not None:
        relative = absolute = tolerance
    if sums:
        absolute = RELATIVE * max(float(np.abs(expected).max()), 1.0)
    np.testing.assert_allclose(
        actual.astype(np.float64), expected.astype(np.float64), rtol=relative, atol=absolute,
        equal_nan=True, err_msg=label,
    )  # fmt: skip


def groups() -> dict[int, list[str]]:
    """Cases that must convert, grouped by their default-domain opset."""
    by_opset: dict[int, list[str]] = defaultdict(list)
    for name, case in sorted(cases().items()):
        if refusal(name) is None:
            opset = max(o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx"))  # type: ignore[attr-defined]
            by_opset[opset].append(name)
    return dict(by_opset)


def test_the_suite_has_cases_for_the_lowered_ops() -> None:
    assert len(cases()) > 900, len(cases())
    covered = {c.model.graph.node[0].op_type for c in cases().values()}  # type: ignore[attr-defined]
    assert {"Resize", "BatchNormalization", "GatherND", "ScatterND", "Pad", "Einsum", "TopK"} <= covered


@pytest.mark.slow  # about a minute in all: one XLA compile of up to ~200 nodes per opset
@pytest.mark.parametrize("opset", sorted(groups()))
def test_node_cases_run_on_xla_as_onnxruntime_computes_them(opset: int) -> None:
    require_module("jax")
    from qconvert.backends.stablehlo import run
    from qconvert.backends.stablehlo.convert import stablehlo_text
    from qconvert.frontends.onnx import import_onnx

    names = groups()[opset]
    model, values, owners = merged_model(names)
    text = stablehlo_text(import_onnx(model), form="qdq", inline_weights=True)
    actual = run.run(text, values, engine="xla")
    from_onnxruntime = run_onnxruntime(model, values)
    per_case: dict[str, list[np.ndarray]] = defaultdict(list)
    for (name, _), value in zip(owners, actual, strict=True):
        per_case[name].append(np.asarray(value))
    position = 0
    for name in names:
        outputs = per_case[name]
        if from_onnxruntime is not None:
            expected = from_onnxruntime[position : position + len(outputs)]
        else:
            expected = [_array(v) for v in cases()[name].data_sets[0][1]]  # type: ignore[attr-defined]
        position += len(outputs)
        for index, (a, e) in enumerate(zip(outputs, expected, strict=True)):
            sums = re.match(r"test_(dft|stft)", name) is not None
            compare(f"{name} output {index}", a, np.asarray(e), LOOSER.get(name), sums)


@pytest.mark.parametrize("name", sorted(n for n in cases() if refusal(n) is not None))
def test_refused_case_still_cannot_be_converted(name: str) -> None:
    require_module("jax")
    from qconvert.backends.stablehlo.convert import stablehlo_text
    from qconvert.errors import InputError
    from qconvert.frontends.onnx import import_onnx

    model, _ = one_case_model(cases()[name])
    with pytest.raises(InputError, match=refusal(name)):
        stablehlo_text(import_onnx(model), form="qdq")


def test_onnxruntime_differs_from_the_reference_where_listed() -> None:
    """The listed cases are where onnxruntime (our oracle) and ONNX's reference disagree: if they agree
    again, the entry goes."""
    for name in ONNXRUNTIME_DIFFERS:
        model, first = one_case_model(cases()[name])
        from_onnxruntime = run_onnxruntime(model, [first])
        assert from_onnxruntime is not None, name
        reference = [_array(v) for v in cases()[name].data_sets[0][1]]  # type: ignore[attr-defined]
        assert not all(np.allclose(a, r) for a, r in zip(from_onnxruntime, reference)), name
