"""Corpus models with QOperator and dynamic quantization on XLA, node by node: every quantized / integer
node whose inputs are bit-equal in onnxruntime's run and ours must give bit-equal outputs, in each
StableHLO form (tests/backends/stablehlo/test_integer_ops.py's `compare_model`; what a float op between
two such nodes may change, and how the outputs are judged, is said there)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest

pytestmark = pytest.mark.engine

ENTRIES = {  # entry -> nodes that must be judged (all of mobilenet_fpn's; minilm's after float ops vary)
    "mobilenet_fpn.qop": 27,
    "minilm.dynamic": 20,
}


def integer_ops_tests() -> ModuleType:
    """tests/backends/stablehlo/test_integer_ops.py, loaded by path (the package `backends` is the code's)."""
    path = Path(__file__).resolve().parents[1] / "backends" / "stablehlo" / "test_integer_ops.py"
    spec = importlib.util.spec_from_file_location("stablehlo_test_integer_ops", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_corpus_quantized_nodes_are_bit_exact_on_xla(corpus_dir, entry: str) -> None:
    tests = integer_ops_tests()
    model = onnx.load(corpus_dir / f"{entry}.onnx")
    data = np.load(corpus_dir / f"{entry.split('.')[0]}.inputs.npz")
    inputs = {i.name: data[i.name] for i in model.graph.input}
    judged = tests.compare_model(model, inputs)
    nodes = sum(n.op_type in tests.JUDGED_OP_TYPES for n in model.graph.node)
    assert all(count >= min(ENTRIES[entry], nodes) for count in judged.values()), (judged, nodes)
