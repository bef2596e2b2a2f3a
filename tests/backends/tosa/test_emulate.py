"""The numpy emulation of TOSA graphs (backends/tosa/emulate.py) against the TOSA reference model: every op
it emulates, on generated inputs with the edges (sample_graphs), bit for bit, dtype and shape included;
graphs the spec leaves undefined are refused as the reference model refuses them."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require_tosa_python

from qconvert.backends.tosa import (
    SUPPORTED_OPS,
    ReferenceJob,
    SampleGraph,
    emulate_tosa,
    parse_tosa,
    run_reference_jobs,
    sample_graphs,
)
from qconvert.backends.tosa.emulate import FLOAT_ULPS, ulps_apart
from qconvert.backends.tosa.samples import function_text, tensor_type
from qconvert.errors import InputError
from qconvert.numerics.tosa import TosaErrorIf, TosaUnpredictable

GRAPHS = {graph.name: graph for graph in sample_graphs()}


@pytest.fixture(scope="module")
def reference_outputs() -> dict[str, tuple[np.ndarray, ...]]:
    """Every sample graph run once on the reference model (one worker process for all)."""
    require_tosa_python()
    graphs = list(GRAPHS.values())
    results = run_reference_jobs([ReferenceJob(inputs=graph.inputs, mlir=graph.mlir) for graph in graphs])
    for graph, result in zip(graphs, results, strict=True):
        assert result.status == "TOSA_VALID", (graph.name, result.status, result.messages)
    return {graph.name: result.outputs for graph, result in zip(graphs, results, strict=True)}


@pytest.mark.engine
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_emulation_is_bit_exact_with_the_reference_model(
    name: str, reference_outputs: dict[str, tuple[np.ndarray, ...]]
) -> None:
    graph = GRAPHS[name]
    emulated = emulate_tosa(graph.mlir, graph.inputs)
    expected = reference_outputs[name]
    assert len(emulated) == len(expected)
    for ours, theirs in zip(emulated, expected, strict=True):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape, (ours.dtype, theirs.dtype)
        if ours.dtype == np.float32 and name.endswith("_f32"):  # float functions: within the spec's bound
            ulps = int(ulps_apart(ours, theirs).max())
            assert ulps <= FLOAT_ULPS, f"{name}: {ulps} ulps off the reference model"
            continue
        mismatches = int(np.count_nonzero(ours != theirs))
        assert mismatches == 0, f"{name}: {mismatches} of {ours.size} elements differ"


def test_samples_cover_every_emulated_op() -> None:
    used = {op.name for graph in GRAPHS.values() for op in parse_tosa(graph.mlir).walk()}
    assert set(SUPPORTED_OPS) - used == set()


def test_samples_reach_rounding_ties_and_saturation() -> None:
    """The inputs are not easy ones: the single-round RESCALE by 0.5 meets ties (odd inputs) and saturates."""
    graph = GRAPHS["rescale_i8_single_tie"]
    (x,) = graph.inputs
    centred = x.astype(np.int64) + 128  # input_zp -128
    assert np.any(centred % 2 == 1)
    (y,) = emulate_tosa(graph.mlir, graph.inputs)
    assert y.max() == 127  # saturated: output_zp 127 plus anything positive


def _binary(name: str, op: str, a: np.ndarray, b: np.ndarray) -> SampleGraph:
    out_type = tensor_type(np.broadcast_shapes(a.shape, b.shape), "i32")
    types = f"{tensor_type(a.shape, 'i32')}, {tensor_type(b.shape, 'i32')}"
    line = f'%y = "tosa.{op}"(%arg0, %arg1) : ({types}) -> {out_type}'
    return SampleGraph(name, function_text([a, b], [line], [("y", out_type)]), (a, b))


@pytest.mark.engine
def test_undefined_results_are_refused_like_the_reference_model() -> None:
    """i32 ADD / SUB / REDUCE_SUM overflow: the reference model's REQUIRE fails (UNPREDICTABLE), and ours."""
    require_tosa_python()
    top = np.array([[2**31 - 1, -(2**31), 5], [1, -1, 0]], np.int32)
    reduce_type = tensor_type((1, 3), "i32")
    top_type = tensor_type(top.shape, "i32")
    reduce_line = f'%y = "tosa.reduce_sum"(%arg0) <{{axis = 0 : i32}}> : ({top_type}) -> {reduce_type}'
    graphs = [
        _binary("add", "add", top, np.array([[1, -1, 0], [0, 0, 0]], np.int32)),
        _binary("sub", "sub", top, np.array([[-1, 1, 0], [0, 0, 0]], np.int32)),
        SampleGraph("reduce_sum", function_text([top], [reduce_line], [("y", reduce_type)]), (top,)),
    ]
    results = run_reference_jobs([ReferenceJob(inputs=g.inputs, mlir=g.mlir) for g in graphs])
    for graph, result in zip(graphs, results, strict=True):
        assert result.status == "TOSA_UNPREDICTABLE", (graph.name, result.status)
        with pytest.raises(TosaUnpredictable):
            emulate_tosa(graph.mlir, graph.inputs)


def test_gather_index_out_of_range_is_unpredictable() -> None:
    """REQUIRE(0 <= index < K). Not run on the reference model: its process aborts on such an index."""
    values = np.zeros((1, 4, 2), np.int8)
    indices = np.array([[0, 4]], np.int32)
    out_type = tensor_type((1, 2, 2), "i8")
    line = (
        f'%y = "tosa.gather"(%arg0, %arg1) : ({tensor_type(values.shape, "i8")}, '
        f"{tensor_type(indices.shape, 'i32')}) -> {out_type}"
    )
    with pytest.raises(TosaUnpredictable, match="index"):
        emulate_tosa(function_text([values, indices], [line], [("y", out_type)]), (values, indices))


def test_mul_shift_on_i8_is_an_error_if() -> None:
    """TOSA 1.0 allows a MUL shift only for i32 inputs (the reference model ignores it on i8; we refuse)."""
    a = np.full((2, 3), 3, np.int8)
    out_type = tensor_type((2, 3), "i32")
    lines = [
        '%s = "tosa.const"() <{values = dense<1> : tensor<1xi8>}> : () -> tensor<1xi8>',
        f'%y = "tosa.mul"(%arg0, %arg1, %s) : ({tensor_type(a.shape, "i8")}, {tensor_type(a.shape, "i8")}, '
        f"tensor<1xi8>) -> {out_type}",
    ]
    with pytest.raises(TosaErrorIf, match="shift"):
        emulate_tosa(function_text([a, a], lines, [("y", out_type)]), (a, a))


def test_unknown_op_is_an_input_error_naming_it() -> None:
    x = np.zeros((2,), np.int8)
    line = '%y = "tosa.sin"(%arg0) : (tensor<2xi8>) -> tensor<2xi8>'
    with pytest.raises(InputError, match=r"tosa\.sin"):
        emulate_tosa(function_text([x], [line], [("y", "tensor<2xi8>")]), (x,))


def test_inputs_of_the_wrong_type_or_shape_are_input_errors() -> None:
    graph = GRAPHS["clamp_i8"]
    (x,) = graph.inputs
    with pytest.raises(InputError, match="expected int8"):
        emulate_tosa(graph.mlir, (x.astype(np.int32),))
    with pytest.raises(InputError, match="shape"):
        emulate_tosa(graph.mlir, (x[:1],))
    with pytest.raises(InputError, match="takes 1 inputs"):
        emulate_tosa(graph.mlir, (x, x))
    # uint8 storage is read as the i8 bits it is (TOSA tensors are signless).
    (y,) = emulate_tosa(graph.mlir, (x.view(np.uint8),))
    assert np.array_equal(y, np.clip(x, -101, 100))
