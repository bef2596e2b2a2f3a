"""IREE (iree-compile --iree-input-type=tosa, llvm-cpu, in process) on the same TOSA graphs as the reference
model and the numpy emulation: all three agree bit for bit on every sample graph (backends/tosa/iree.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import require_module, require_tosa_python

from qconvert.backends.tosa import (
    EngineError,
    ReferenceJob,
    compile_iree,
    emulate_tosa,
    run_iree,
    run_reference_jobs,
    sample_graphs,
)
from qconvert.backends.tosa.emulate import FLOAT_ULPS, ulps_apart

GRAPHS = {graph.name: graph for graph in sample_graphs() if "iree" in graph.engines}


@pytest.fixture(scope="module")
def reference_outputs() -> dict[str, tuple[np.ndarray, ...]]:
    require_tosa_python()
    graphs = list(GRAPHS.values())
    results = run_reference_jobs([ReferenceJob(inputs=graph.inputs, mlir=graph.mlir) for graph in graphs])
    return {graph.name: result.outputs for graph, result in zip(graphs, results, strict=True)}


@pytest.mark.engine
@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_iree_reference_model_and_emulation_agree(
    name: str, reference_outputs: dict[str, tuple[np.ndarray, ...]]
) -> None:
    require_module("iree.runtime")
    require_module("iree.compiler")
    graph = GRAPHS[name]
    from_iree = run_iree(graph.mlir, graph.inputs)
    emulated = emulate_tosa(graph.mlir, graph.inputs)
    reference = reference_outputs[name]
    assert len(from_iree) == len(emulated) == len(reference) == 1
    for engine, ours, theirs in zip(from_iree, emulated, reference, strict=True):
        assert engine.dtype == ours.dtype == theirs.dtype and engine.shape == ours.shape == theirs.shape
        if ours.dtype == np.float32 and name.endswith("_f32"):  # float functions: within the spec's bound
            for other, what in ((engine, "IREE"), (theirs, "the reference model")):
                ulps = int(ulps_apart(ours, other).max())
                assert ulps <= FLOAT_ULPS, f"{name}: {what} is {ulps} ulps off the emulation"
            continue
        assert int(np.count_nonzero(engine != theirs)) == 0, f"{name}: IREE differs from the reference model"
        assert int(np.count_nonzero(ours != theirs)) == 0, f"{name}: the emulation differs"


@pytest.mark.engine
def test_a_compiled_binary_runs_many_inputs() -> None:
    require_module("iree.runtime")
    graph = GRAPHS["rescale_i8_double"]
    binary = compile_iree(graph.mlir)
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.integers(-128, 128, size=graph.inputs[0].shape).astype(np.int8)
        (y,) = run_iree(binary, (x,))
        assert np.array_equal(y, emulate_tosa(graph.mlir, (x,))[0])


@pytest.mark.engine
def test_a_module_iree_refuses_is_an_engine_error() -> None:
    require_module("iree.compiler")
    with pytest.raises(EngineError, match="iree-compile"):
        compile_iree(
            'func.func @main(%x: tensor<2xi8>) -> () {\n  "tosa.nonsense"(%x) : (tensor<2xi8>) -> ()\n}'
        )
