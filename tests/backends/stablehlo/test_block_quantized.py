"""onnxruntime's n-bit block-quantized weights (frontends/onnx/blockwise.py) against onnxruntime itself.

- blocked int4 / uint4 DequantizeLinear (opset 21) with negative and zero scales, as onnxruntime's symmetric
  MatMulNBitsQuantizer writes them in QDQ format: the dequantized weight is bit-exact (bytes compared, so
  signed zeros count) on qconvert's interpreter and on XLA and StableHLO's interpreter in every form;
- com.microsoft MatMulNBits (4 and 8 bits, zero points packed or absent, bias, a K that is not a multiple
  of the block, whose padding rows are sliced off): onnxruntime dequantizes B and runs MLAS's float32 GEMM
  in its own summation order, so the product is compared within the float32 bound of a K-term sum,
  2 (K + 2) eps sum_k |a_k w_k|, with w the weight dequantized here in float64 from the node's own inputs
  (not from qconvert's unpacking).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import require_module
from frontend.test_qoperator import MS, onnxruntime_outputs
from onnx import TensorProto, helper, numpy_helper

from qconvert.errors import InputError
from qconvert.frontends.onnx import import_onnx
from qconvert.interpret import interpret

pytestmark = pytest.mark.engine

EPS = float(np.finfo(np.float32).eps)
FORMS = ("quantized", "integer", "qdq")


def run_forms(model: onnx.ModelProto, inputs: dict[str, np.ndarray], engine: str) -> dict[str, np.ndarray]:
    """Convert `model` in each StableHLO form and run it on `engine`: {form: first output}."""
    from qconvert.backends.stablehlo import run
    from qconvert.backends.stablehlo.convert import stablehlo_text

    module = import_onnx(model, {name: array.shape for name, array in inputs.items()})
    results = {}
    for form in FORMS:
        text = stablehlo_text(module, form=form, inline_weights=True)
        results[form] = np.asarray(run.run(text, list(inputs.values()), engine=engine)[0])
    return results


def assert_bit_exact(label: str, actual: np.ndarray, expected: np.ndarray) -> None:
    """Bytes compared, so that -0.0 against 0.0 counts as a difference."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (label, actual.dtype)
    mismatches = int(np.sum(actual.view(np.uint32) != expected.view(np.uint32)))
    assert mismatches == 0, f"{label}: {mismatches} of {expected.size} elements differ from onnxruntime"


def _signed_scales(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Block scales of both signs, one of them exactly zero (an all-zero block)."""
    scale = (rng.uniform(0.01, 0.1, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)
    scale.reshape(-1)[1] = 0.0
    return scale


# Blocked DequantizeLinear with negative scales --------------------------------------------------------
@pytest.mark.parametrize(
    ("storage", "axis", "zero_point"),
    [("int4", 0, False), ("int4", 1, True), ("uint4", 0, True)],
)
def test_blocked_dequantize_negative_scales_bit_exact(storage: str, axis: int, zero_point: bool) -> None:
    require_module("jax")
    rng = np.random.default_rng(21)
    shape, block = (64, 24), 32 if axis == 0 else 8
    low, high = (-8, 8) if storage == "int4" else (0, 16)
    onnx_type = TensorProto.INT4 if storage == "int4" else TensorProto.UINT4
    q = rng.integers(low, high, shape)
    q[0, 0] = low  # -8 in a negative block: its folded value would not fit int4
    scale_shape = (shape[0] // block, shape[1]) if axis == 0 else (shape[0], shape[1] // block)
    initializers = [
        helper.make_tensor("w", onnx_type, shape, q.reshape(-1).tolist()),
        numpy_helper.from_array(_signed_scales(rng, scale_shape), "s"),
    ]
    dq_inputs = ["w", "s"]
    if zero_point:
        zeros = rng.integers(low, high, scale_shape)
        initializers.append(helper.make_tensor("z", onnx_type, scale_shape, zeros.reshape(-1).tolist()))
        dq_inputs.append("z")
    nodes = [
        helper.make_node("DequantizeLinear", dq_inputs, ["wf"], name="dq", axis=axis, block_size=block),
        helper.make_node("Mul", ["wf", "one"], ["y"], name="times_one"),  # exact: keeps -0.0
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("one", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    inputs = {"one": np.ones(1, np.float32)}
    expected = np.asarray(onnxruntime_outputs(model, inputs)[0])
    assert np.signbit(expected[expected == 0]).any(), "the case must hold a -0.0 from a negative scale"
    module = import_onnx(model)
    names = [op.name for op in module.walk()]  # type: ignore[attr-defined]
    assert "quant.dcast" in names and "onnx.DequantizeLinear" not in names, names
    assert_bit_exact("interpreter", interpret(module, inputs)["y"], expected)
    for engine in ("xla", "interpreter"):
        for form, outputs in run_forms(model, inputs, engine).items():
            assert_bit_exact(f"{engine}, {form}", outputs, expected)


# com.microsoft MatMulNBits ---------------------------------------------------------------------------
def _pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Rows of `bits`-wide unsigned values -> uint8 bytes, lowest bits first (MatMulNBits' layout)."""
    per_byte = 8 // bits
    pad = (-values.shape[-1]) % per_byte
    values = np.concatenate([values, np.zeros((*values.shape[:-1], pad), values.dtype)], axis=-1)
    grouped = values.reshape(*values.shape[:-1], -1, per_byte).astype(np.uint16)
    packed = sum(grouped[..., i] << (bits * i) for i in range(per_byte))
    return packed.astype(np.uint8)


def matmul_nbits_model(
    rng: np.random.Generator, *, k: int, n: int, bits: int, block: int, zero_points: bool, bias: bool
) -> tuple[onnx.ModelProto, np.ndarray]:
    """A MatMulNBits model as onnxruntime's quantizer lays it out, and its weight dequantized in float64."""
    blocks = -(-k // block)
    q = rng.integers(0, 1 << bits, (n, blocks * block))
    q[:, k:] = 0  # the padding of a ragged last block
    scales = _signed_scales(rng, (n, blocks))
    zeros = rng.integers(0, 1 << bits, (n, blocks)) if zero_points else np.full((n, blocks), 1 << (bits - 1))
    weight = (q[:, :k] - np.repeat(zeros, block, axis=1)[:, :k]) * np.repeat(scales, block, axis=1)[:, :k]
    initializers = [
        numpy_helper.from_array(_pack(q, bits).reshape(n, blocks, block * bits // 8), "b"),
        numpy_helper.from_array(scales.reshape(-1), "scales"),
    ]
    names = ["a", "b", "scales"]
    if zero_points:
        initializers.append(numpy_helper.from_array(_pack(zeros, bits).reshape(-1), "zeros"))
    names.append("zeros" if zero_points else "")
    if bias:
        initializers.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias"))
        names += ["", "bias"]
    node = helper.make_node(
        "MatMulNBits", names, ["y"], name="mm", domain=MS, K=k, N=n, bits=bits, block_size=block
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 3, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, n])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model, weight.T  # [K, N]


@pytest.mark.parametrize(
    ("bits", "zero_points", "bias", "k"),
    [
        (4, False, False, 96),
        (4, True, True, 96),
        (8, True, False, 64),
        (8, False, True, 64),
        (4, True, False, 80),
    ],
)
def test_matmul_nbits_within_float32_bound(bits: int, zero_points: bool, bias: bool, k: int) -> None:
    require_module("jax")
    rng = np.random.default_rng(bits * 10 + zero_points * 2 + bias)
    model, weight = matmul_nbits_model(
        rng, k=k, n=20, bits=bits, block=32, zero_points=zero_points, bias=bias
    )
    a = rng.standard_normal((2, 3, k)).astype(np.float32)
    inputs = {"a": a}
    expected = np.asarray(onnxruntime_outputs(model, inputs)[0])
    magnitude = np.abs(a.astype(np.float64)) @ np.abs(weight)
    bound = 2 * (k + 2) * EPS * magnitude + float(np.finfo(np.float32).tiny)
    if bias:
        bound += 4 * EPS * np.abs(expected)
    module = import_onnx(model, {"a": a.shape})
    names = [op.name for op in module.walk()]  # type: ignore[attr-defined]
    assert "quant.dcast" in names and "onnx.MatMul" in names, names
    results = {"qconvert interpreter": interpret(module, inputs)["y"]}
    for engine in ("xla", "interpreter"):
        for form, outputs in run_forms(model, inputs, engine).items():
            results[f"{engine}, {form}"] = outputs
    for label, actual in results.items():
        assert actual.shape == expected.shape, label
        over = np.abs(actual.astype(np.float64) - expected) > bound
        assert not over.any(), f"{label}: {int(over.sum())} elements outside the float32 bound"


def test_matmul_nbits_accuracy_level_4_is_refused_by_name() -> None:
    rng = np.random.default_rng(4)
    model, _ = matmul_nbits_model(rng, k=64, n=8, bits=4, block=32, zero_points=False, bias=False)
    model.graph.node[0].attribute.append(helper.make_attribute("accuracy_level", 4))
    with pytest.raises(InputError, match=r"'mm'.*accuracy_level 4"):
        import_onnx(model, {"a": (1, 3, 64)})
