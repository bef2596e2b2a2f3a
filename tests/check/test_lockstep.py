"""The interpreter's lockstep replay (qconvert/check/lockstep.py): onnxruntime's step is taken only at a
one-step flip whose input agrees with onnxruntime's to within TIE_WINDOW of a step; nothing else is hidden."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qconvert.check.lockstep import TIE_WINDOW, replay
from qconvert.frontends.onnx import import_onnx

SCALE = 0.5


def qdq_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], name="quantize"),
        helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], name="dequantize"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [
            numpy_helper.from_array(np.array(SCALE, np.float32), "s"),
            numpy_helper.from_array(np.array(0, np.int8), "zp"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def oracle_for(x_ours: np.ndarray, x_theirs: np.ndarray, q_theirs: np.ndarray) -> dict[str, np.ndarray]:
    """What onnxruntime would have computed upstream (its own input to the QuantizeLinear) and there."""
    return {
        "x": x_theirs,
        "q": q_theirs.astype(np.int8),
        "s": np.array(SCALE, np.float32),
        "zp": np.array(0, np.int8),
    }


@pytest.mark.parametrize(
    ("drift_in_steps", "step_difference", "taken"),
    [
        (TIE_WINDOW / 4, 1, True),  # a near-tie: float rounding upstream decided the step
        (0.3, 1, False),  # the input itself is off by a third of a step: a real difference, kept
        (TIE_WINDOW / 4, 2, False),  # two steps apart: no rounding of a near-equal input does that
    ],
)
def test_only_near_tie_flips_are_taken(drift_in_steps: float, step_difference: int, taken: bool) -> None:
    model = qdq_model()
    x_ours = np.array([0.75, 1.0, -2.0, 3.0], np.float32)  # 0.75 / 0.5 = 1.5: a tie, rounds to 2
    ours_q = np.array([2, 2, -4, 6])
    q_theirs = ours_q.copy()
    q_theirs[0] -= step_difference  # onnxruntime's input sat on the other side of the tie
    x_theirs = x_ours.copy()
    x_theirs[0] -= np.float32(drift_in_steps * SCALE)
    lockstep = replay(import_onnx(model), model, {"x": x_ours}, oracle_for(x_ours, x_theirs, q_theirs))
    expected_first = q_theirs[0] * SCALE if taken else ours_q[0] * SCALE
    assert lockstep.outputs["y"][0] == np.float32(expected_first)
    np.testing.assert_array_equal(lockstep.outputs["y"][1:], (ours_q[1:] * SCALE).astype(np.float32))
    assert lockstep.flips == (1 if taken else 0)
    assert lockstep.nodes == (["quantize"] if taken else [])
