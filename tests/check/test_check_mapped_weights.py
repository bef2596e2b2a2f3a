"""check on a model whose weights are external data (issue 23, models over 2 GB): the weights are fed from one
memory mapping of the data file, a weight's large float dequantize is computed on demand (never returned by
the oracle run) and its DequantizeLinear judged slice by slice. The verdicts are those of the same model
with its weights inline, here on a small model with the thresholds lowered so that every path runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import qconvert.check as check_module
from qconvert.check import check, oracle


def qdq_matmul_model() -> onnx.ModelProto:
    """x -> Q/DQ -> MatMul(DQ(int8 weight, per column)) -> Relu -> MatMul(DQ(int8 weight, per tensor))."""
    rng = np.random.default_rng(5)
    initializers = [
        numpy_helper.from_array(np.array(1 / 16, np.float32), "act_s"),
        numpy_helper.from_array(np.array(0, np.int8), "act_z"),
        numpy_helper.from_array(rng.integers(-127, 128, (16, 48)).astype(np.int8), "w1"),
        numpy_helper.from_array(rng.uniform(0.005, 0.02, 48).astype(np.float32), "w1_s"),
        numpy_helper.from_array(np.zeros(48, np.int8), "w1_z"),
        numpy_helper.from_array(rng.integers(-127, 128, (48, 8)).astype(np.int8), "w2"),
        numpy_helper.from_array(np.array(0.01, np.float32), "w2_s"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "act_s", "act_z"], ["xq"], name="q"),
        helper.make_node("DequantizeLinear", ["xq", "act_s", "act_z"], ["xd"], name="dq"),
        helper.make_node("DequantizeLinear", ["w1", "w1_s", "w1_z"], ["w1d"], name="dq_w1", axis=1),
        helper.make_node("MatMul", ["xd", "w1d"], ["h"], name="mm1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("DequantizeLinear", ["w2", "w2_s"], ["w2d"], name="dq_w2"),
        helper.make_node("MatMul", ["r", "w2d"], ["y"], name="mm2"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def summary(report: Any) -> dict[str, tuple]:
    layers = {
        # the SQNR sums to 12 digits: summed slice by slice, their last bit follows the order
        name: (
            r.verdict,
            r.elements,
            r.mismatches,
            r.max_lsb_diff,
            r.max_abs_diff,
            f"{r.signal:.12g}",
            r.noise,
        )
        for name, r in report.layers.items()
    }
    outputs = {
        name: (o.verdict, o.ours.mismatches if o.ours else None, o.ours.max_abs_diff if o.ours else None)
        for name, o in report.outputs.items()
    }
    return {"verdict": report.verdict, **layers, **outputs}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("mapped")
    inline, external = folder / "inline.onnx", folder / "external.onnx"
    onnx.save_model(qdq_matmul_model(), str(inline))
    # every initializer external, the scales and zero points too (they are read back inline: IR constants)
    onnx.save_model(
        qdq_matmul_model(),
        str(external),
        save_as_external_data=True,
        location="external.data",
        size_threshold=0,
    )
    return {"inline": inline, "external": external}


def test_mapped_weights_give_the_inline_verdicts(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    hidden: list[list[str]] = []
    real_run_oracle = check_module.run_oracle

    def recording(*arguments: Any, **keywords: Any) -> Any:
        hidden.append(list(arguments[4]) if len(arguments) > 4 else list(keywords.get("hidden", [])))
        return real_run_oracle(*arguments, **keywords)

    monkeypatch.setattr(check_module, "run_oracle", recording)
    inline = summary(check(models["inline"]))
    assert hidden and not any(hidden)
    mapped = check(models["external"])
    assert summary(mapped) == inline
    assert inline["verdict"] == "PASSED"
    loaded = oracle.load_for_check(models["external"])
    assert sorted(loaded.weights) == ["w1", "w2"]  # mapped; the scales and zero points read inline
    assert isinstance(loaded.weights["w1"].base, np.memmap) or isinstance(loaded.weights["w1"], np.memmap)

    # the weights' dequantizes deferred (not returned by the oracle run), their cases judged in slices
    monkeypatch.setattr(oracle, "DEFERRED_ELEMENTS", 1)
    monkeypatch.setattr(check_module, "WEIGHT_SLICE_ELEMENTS", 100)
    hidden.clear()
    deferred = check(models["external"])
    assert hidden[0] == ["w1d", "w2d"]
    assert summary(deferred) == inline
    assert deferred.layers["dq_w1"].elements == 16 * 48 and deferred.layers["mm1"].elements == 2 * 48
