"""The `--target-cosine` search on what a new user tries first (issue 26's review): a model whose widened
copy cannot be mixed in memory (digits: a Relu folded at 8 bits), a target no model can reach (cosine 1,
max |error| 0) written as JSON, the saved ranges giving back the searched model, and the summary's counts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from calibrate.search_support import write_crushed_channels_model
from conftest import require_module
from onnx import TensorProto, helper

from qconvert.calibrate.api import calibrate
from qconvert.calibrate.target_metric import parse_condition
from qconvert.errors import InputError

DIGITS = Path(__file__).resolve().parents[2] / "models" / "digits_cnn.onnx"


@pytest.fixture(scope="module")
def digits_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """128 digit images (as models/build_cnn.py feeds them) in batches of 8: 16 batches, 4 held out."""
    pixels, _ = require_module("sklearn.datasets").load_digits(return_X_y=True)
    images = (np.asarray(pixels, np.float32) / 16.0).reshape(-1, 1, 8, 8)
    data = tmp_path_factory.mktemp("search_fixes") / "digits.npz"
    np.savez(data, image=images[:128])
    return data


def test_a_model_that_cannot_be_mixed_is_searched_by_finalizing_each_candidate(
    digits_data: Path, tmp_path: Path
) -> None:
    """digits' widened model holds an initializer its base lacks: the search falls back to finalizing
    candidates (it raised AttributeError: no attribute 'tied' there) and says why."""
    out = tmp_path / "digits.qdq.onnx"
    result = calibrate(DIGITS, digits_data, out=out, batch_size=8, target_cosine=0.99999)
    search = result.search
    assert search is not None and search.candidates.startswith("finalized one by one (initializer ")
    assert search.final is not None and search.final.widened == len(search.widened)
    assert {len(step.values) for step in search.steps} == {1} and out.exists()
    assert all(search.why[name] for name in search.widened)


@pytest.mark.parametrize("condition", ["cosine>=1", "max-abs<=0"])
def test_a_target_allowing_no_loss_is_written_as_json_and_said_not_reached(
    digits_data: Path, tmp_path: Path, condition: str
) -> None:
    """No loss allowed: a miss's shortfall is infinite, which JSON cannot hold (`--json` failed with
    ValueError); it is written null, the summary warns 'not reached', and the candidate closest to the
    target (by its loss) is the one written."""
    report = tmp_path / "search.json"
    result = calibrate(DIGITS, digits_data, batch_size=8, target_metrics=[condition], json_path=report)
    search = json.loads(report.read_text())["search"]
    assert search["reached"] is False and search["steps"] and search["final"] is None
    assert all(step["shortfall"] is None and not step["passed"] for step in search["steps"])
    assert any("not reached" in warning for warning in result.warnings)
    assert result.search is not None
    conditions = result.search.conditions
    written = min(
        result.search.steps, key=lambda step: conditions[0].loss(step.values[0])
    )  # the closest measured candidate
    assert written.widened == len(result.search.widened)


@pytest.fixture(scope="module")
def outlier_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """x -> MatMul -> h -> MatMul -> y, half of h's channels ~50x the others and ignored by the second
    MatMul: int8 on h crushes what y is made of (test_target_cosine.py's model)."""
    return write_crushed_channels_model(tmp_path_factory.mktemp("search_fixes_outlier"))


def initializers(path: Path) -> dict[str, bytes]:
    return {tensor.name: tensor.SerializeToString() for tensor in onnx.load(path).graph.initializer}


def int16_zero_points(path: Path) -> set[str]:
    return {
        tensor.name
        for tensor in onnx.load(path).graph.initializer
        if tensor.name.endswith("_zero_point") and tensor.data_type == TensorProto.INT16
    }


def test_the_ranges_a_search_saves_give_back_the_searched_model(
    outlier_model: tuple[Path, Path], digits_data: Path, tmp_path: Path
) -> None:
    """`--ranges` after a search records the tensors it widened (and the extent it widened them over), so
    `--load-ranges` writes the same model, initializer for initializer (it gave back the base: corpus
    MiniLM 71 int16 zero points, 7 on load). On digits the widened Relu outputs keep the method's range in
    the file (their inputs take it at 8 bits) and the extent in the metadata, which the load reapplies."""
    model, data = outlier_model
    cases = [
        (model, data, {"scheme": {"per_channel": True}, "target_cosine": 0.99}),
        (DIGITS, digits_data, {"batch_size": 8, "target_cosine": 0.99999}),
    ]
    for index, (path, rows, options) in enumerate(cases):
        searched, ranges = tmp_path / f"searched{index}.onnx", tmp_path / f"searched{index}.json"
        result = calibrate(path, rows, method="percentile", out=searched, ranges_path=ranges, **options)
        assert result.search is not None and result.search.widened
        reloaded = tmp_path / f"reloaded{index}.onnx"
        calibrate(path, None, load_ranges=ranges, out=reloaded, scheme=options.get("scheme"))
        assert int16_zero_points(searched) and int16_zero_points(reloaded) == int16_zero_points(searched)
        assert initializers(reloaded) == initializers(searched)
        if path == model:
            assert result.search.widened == ["h"]
        metadata = json.loads(ranges.read_text())["metadata"]
        assert set(result.search.widened) <= set(metadata["widened_outliers"])
        assert set(metadata["search_widened_ranges"]) == set(result.search.widened)


def test_the_summary_counts_activations_the_search_widened_and_all_int16(
    digits_data: Path, tmp_path: Path
) -> None:
    """The widened line counts the search's additions and every int16 activation of the written model
    (as its zero points say), no '0 groups' when no group was measured, and no '1 samples'."""
    out = tmp_path / "digits.qdq.onnx"
    result = calibrate(DIGITS, digits_data, batch_size=8, target_cosine=0.99999, out=out)
    search = result.search
    assert search is not None and not search.groups
    written = onnx.load(out)
    kinds = {tensor.name: tensor.data_type for tensor in written.graph.initializer}
    int16 = [  # the Q/DQ pairs of activations (not of constants) with int16 zero points
        node.input[0]
        for node in written.graph.node
        if node.op_type == "QuantizeLinear"
        and node.input[0] not in kinds
        and kinds[node.input[2]] == TensorProto.INT16
    ]
    line = next(line for line in search.lines() if line.startswith("search: widened to int16"))
    assert f"(int16 activations in all: {len(int16)})" in line and search.to_json()[
        "int16_activations"
    ] == len(int16)
    text = "\n".join(search.lines())
    assert " 0 groups" not in text and "8-bit tensors ranked by their own per-channel loss;" in text
    one = type(search.steps[0])("base", 0, (0.5,), 2.0, False, 1, 0.0)
    search.steps, search.eval_samples = [one], 1
    assert "(misses; 1 sample, " in "\n".join(search.lines()) and "1 held-out sample (" in search.lines()[0]


def test_target_refusals_name_the_flag_the_model_and_the_nearest_metric(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("ArgMax", ["x"], ["label"], keepdims=0)],
        "int_output",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"])],
    )
    model = tmp_path / "argmax.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    rows = tmp_path / "rows.npz"
    np.savez(rows, x=np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32))
    with pytest.raises(
        InputError, match=r"--target-cosine: .*argmax\.onnx has no float output .*label \(tensor\(int64\)\)"
    ):
        calibrate(model, rows, batch_size=2, target_cosine=0.99)
    for typo, meant in (("top-1", "top1"), ("mincosine", "min-cosine"), ("Cosine", "cosine")):
        with pytest.raises(InputError, match=f"unknown metric '{typo}'; did you mean '{meant}'"):
            parse_condition(f"{typo}>=0.9")
