"""Every emitted module serializes to the TOSA flatbuffer (issue 19): tiny_encoder.qdq with --allow-float
(float TOSA ops: pow, reciprocal, exp with a float Softmax; tosa.intdiv and the integer Softmax's tables by
default; and --float-boundary's edge quantizes) through `tosa-opt --tosa-serialize`, every op of the text an
operator of the flatbuffer (same counts, decoded by tosa-tools' own schema), and the flatbuffer deserialized
back runs on the reference model to the same bits.

Measured beside this test, by hand: the corpus MiniLM QDQ (--allow-float, 4.8 MB flatbuffer) the same op
counts, as do digits_cnn QDQ (single, double rounding, --float-boundary) and QOperator, and
tiny_encoder.qop; every sample graph of the emulator (sample_graphs: every op we emit but tosa.tile, which
the last test here serializes and runs) serializes. The i16 / i48 conv modules run on the reference model,
so serialize, in test_qoperator_sources.py.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import require_tosa_python

from qconvert.backends.tosa import (
    TosaOptions,
    convert_to_tosa,
    describe_flatbuffers,
    deserialize,
    run_reference,
    serialize,
)
from qconvert.frontends.onnx import import_onnx
from qconvert.ir.printer import print_module

pytestmark = pytest.mark.engine

MODELS = Path(__file__).resolve().parents[3] / "models"


def _ops(text: str) -> Counter[str]:
    return Counter(re.findall(r'"tosa\.(\w+)"', text))


@pytest.mark.parametrize(
    ("integer_softmax", "float_boundary"),
    [(True, False), (False, False), (True, True)],
    ids=["integer_softmax", "float_softmax", "float_boundary"],
)
def test_tiny_encoder_allow_float_serializes_and_runs_from_the_flatbuffer(
    integer_softmax: bool, float_boundary: bool
) -> None:
    require_tosa_python()
    options = TosaOptions(allow_float=True, integer_softmax=integer_softmax, float_boundary=float_boundary)
    text = print_module(convert_to_tosa(import_onnx(str(MODELS / "tiny_encoder.qdq.onnx")), options))
    flatbuffer = serialize(text)
    (graph,) = describe_flatbuffers([flatbuffer])
    ops = _ops(text)
    assert Counter(operator["op"].lower() for operator in graph.operators) == ops
    assert ("intdiv" in ops) == integer_softmax and ("exp" in ops) == (not integer_softmax)
    assert {"pow", "reciprocal", "cast"} <= set(ops)  # the float LayerNormalization island's ops
    feeds = dict(np.load(MODELS / "tiny_encoder.inputs.npz"))
    arguments = [feeds["input_ids"].astype(np.int32)]
    from_text = run_reference(text, arguments)
    from_flatbuffer = run_reference(deserialize(flatbuffer), arguments)
    assert len(from_text) == len(from_flatbuffer) == 2
    for lhs, rhs in zip(from_text, from_flatbuffer, strict=True):
        assert np.array_equal(lhs, rhs)


def test_tile_serializes_and_runs() -> None:
    """tosa.tile (a broadcast the legalization cannot fold into a reshape), the one emitted op no sample graph
    holds."""
    require_tosa_python()
    text = """module {
  func.func @main(%arg0: tensor<2x4xi8>) -> tensor<2x12xi8> {
    %0 = "tosa.const_shape"() {values = dense<[1, 3]> : tensor<2xindex>} : () -> !tosa.shape<2>
    %1 = "tosa.tile"(%arg0, %0) : (tensor<2x4xi8>, !tosa.shape<2>) -> tensor<2x12xi8>
    return %1 : tensor<2x12xi8>
  }
}
"""
    (graph,) = describe_flatbuffers([serialize(text)])
    assert [operator["op"] for operator in graph.operators].count("TILE") == 1
    values = np.arange(-4, 4, dtype=np.int8).reshape(2, 4)
    (tiled,) = run_reference(text, [values])
    assert np.array_equal(tiled, np.tile(values, (1, 3)))
