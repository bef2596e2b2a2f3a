"""qconvert/onnx_semantics.py's shape rules (Reshape, Split, Squeeze, Unsqueeze, Transpose, Reduce*, the
Softmax family by opset, axes), each compared with what onnxruntime computes for the same node."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import TensorProto, helper

from qconvert import onnx_semantics as semantics


def _run(node: onnx.NodeProto, opset: int, x: np.ndarray, outputs: int = 1, **constants: np.ndarray) -> list:
    """The node's outputs on onnxruntime (graph optimizations off), `constants` as initializers."""
    ort = require_module("onnxruntime")
    initializers = [onnx.numpy_helper.from_array(value, name) for name, value in constants.items()]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(outputs)],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


X = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)


@pytest.mark.parametrize(
    ("target", "allowzero"), [([0, -1], False), ([4, 0, 2], False), ([-1], False), ([3, 0, 8], True)]
)
def test_reshape_target_matches_onnxruntime(target: list[int], allowzero: bool) -> None:
    x = np.zeros((0, 8), np.float32) if allowzero else X
    node = helper.make_node("Reshape", ["x", "shape"], ["y0"], allowzero=int(allowzero))
    (y,) = _run(node, 14, x, shape=np.array(target, np.int64))
    assert semantics.reshape_target(x.shape, target, allowzero) == list(y.shape)


def test_reshape_target_refuses_two_unknown_dims_and_a_wrong_count() -> None:
    with pytest.raises(ValueError, match="more than one -1"):
        semantics.reshape_target((2, 3), [-1, -1], False)
    with pytest.raises(ValueError, match="cannot make"):
        semantics.reshape_target((2, 3), [4, 2], False)


@pytest.mark.parametrize("axis", [0, 1, 3, -1, -3])
def test_flatten_matches_onnxruntime_up_to_the_rank_itself(axis: int) -> None:
    (y,) = _run(helper.make_node("Flatten", ["x"], ["y0"], axis=axis), 13, X)
    assert semantics.flattened_shape(X.shape, axis) == list(y.shape)


def test_flatten_refuses_an_axis_past_the_rank() -> None:
    with pytest.raises(ValueError, match=r"out of range \[-3, 3\]"):
        semantics.flattened_shape(X.shape, 4)


@pytest.mark.parametrize(("dim", "count"), [(7, 3), (8, 4), (5, 3)])
def test_split_num_outputs_matches_onnxruntime(dim: int, count: int) -> None:
    x = np.zeros((2, dim), np.float32)
    node = helper.make_node("Split", ["x"], [f"y{i}" for i in range(count)], axis=1, num_outputs=count)
    results = _run(node, 18, x, outputs=count)
    assert semantics.split_sizes(dim, count, None) == [r.shape[1] for r in results]


def test_split_sizes_given_and_not_adding_up() -> None:
    assert semantics.split_sizes(7, 2, [3, 4]) == [3, 4]
    with pytest.raises(ValueError, match="does not add up"):
        semantics.split_sizes(7, 2, [3, 3])


@pytest.mark.parametrize("axes", [None, [0], [-1]])
def test_squeeze_matches_onnxruntime(axes: list[int] | None) -> None:
    x = np.zeros((1, 3, 1), np.float32)
    inputs = ["x"] if axes is None else ["x", "axes"]
    constants = {} if axes is None else {"axes": np.array(axes, np.int64)}
    (y,) = _run(helper.make_node("Squeeze", inputs, ["y0"]), 13, x, **constants)
    removed = semantics.squeezed_axes(x.shape, axes)
    assert [d for i, d in enumerate(x.shape) if i not in removed] == list(y.shape)


@pytest.mark.parametrize("axes", [[0], [-1], [1, -1]])
def test_unsqueeze_matches_onnxruntime_old_and_new_opsets(axes: list[int]) -> None:
    old = helper.make_node("Unsqueeze", ["x"], ["y0"], axes=axes)
    (y_old,) = _run(old, 11, X)
    new = helper.make_node("Unsqueeze", ["x", "axes"], ["y0"])
    (y_new,) = _run(new, 13, X, axes=np.array(axes, np.int64))
    from_attribute = semantics.ints_from(None, axes)
    from_input = semantics.ints_from(np.array(axes, np.int64), None)
    assert semantics.unsqueezed_shape(X.shape, from_attribute) == list(y_old.shape)  # type: ignore[arg-type]
    assert semantics.unsqueezed_shape(X.shape, from_input) == list(y_new.shape)  # type: ignore[arg-type]


def test_ints_from_prefers_the_input() -> None:
    assert semantics.ints_from([1, 2], [3]) == [1, 2]
    assert semantics.ints_from(None, (3,)) == [3]
    assert semantics.ints_from(None, None) is None


def test_transpose_default_permutation_matches_onnxruntime() -> None:
    (y,) = _run(helper.make_node("Transpose", ["x"], ["y0"]), 13, X)
    assert list(np.transpose(X, semantics.transpose_permutation(3, None)).shape) == list(y.shape)
    assert semantics.transpose_permutation(3, [0, 2, 1]) == [0, 2, 1]


@pytest.mark.parametrize(("axes", "noop"), [(None, 0), ([], 1), ([-1, 0], 0), ([1], 0)])
def test_reduction_axes_match_onnxruntime(axes: list[int] | None, noop: int) -> None:
    inputs = ["x"] if axes is None else ["x", "axes"]
    constants = {} if axes is None else {"axes": np.array(axes, np.int64)}
    node = helper.make_node("ReduceSum", inputs, ["y0"], keepdims=1, noop_with_empty_axes=noop)
    (y,) = _run(node, 13, X, **constants)
    reduced = semantics.reduction_axes(X.ndim, axes, bool(noop))
    expected = X if reduced is None else X.sum(axis=tuple(reduced), keepdims=True)
    np.testing.assert_array_equal(expected, y)


@pytest.mark.parametrize(("opset", "axis"), [(11, None), (11, 1), (11, -1), (13, None), (13, 1)])
def test_softmax_by_opset_matches_onnxruntime(opset: int, axis: int | None) -> None:
    x = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32)
    attributes = {} if axis is None else {"axis": axis}
    (y,) = _run(helper.make_node("Softmax", ["x"], ["y0"], **attributes), opset, x)
    normalized = semantics.softmax_axis(axis, x.ndim, opset)
    matrix = semantics.softmax_matrix(x.shape, normalized, opset)
    rows = x if matrix is None else x.reshape(matrix)
    along = normalized if matrix is None else 1
    exponentials = np.exp(rows - rows.max(axis=along, keepdims=True))
    expected = (exponentials / exponentials.sum(axis=along, keepdims=True)).reshape(x.shape)
    np.testing.assert_allclose(expected, y, rtol=1e-6, atol=1e-7)


def test_normalize_axis_refuses_out_of_range_axes() -> None:
    assert semantics.normalize_axis(-1, 3) == 2
    assert semantics.normalize_axis(0, 0) == 0  # axis 0 of a scalar
    with pytest.raises(ValueError, match=r"axis 3 is out of range \[-3, 2\] for rank 3"):
        semantics.normalize_axis(3, 3)
    with pytest.raises(ValueError, match="out of range"):
        semantics.squeezed_axes((1, 2), [2])
    with pytest.raises(ValueError, match="out of range"):
        semantics.reduction_axes(2, [-3], False)
    with pytest.raises(ValueError, match="out of range"):
        semantics.softmax_axis(3, 3, 11)
