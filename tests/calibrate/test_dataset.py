"""Calibration datasets: the three `--data` forms, the rank rule, batching, streaming, NaN/Inf, bad input."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qconvert.calibrate import dataset as dataset_module
from qconvert.calibrate.dataset import DatasetStats, open_dataset
from qconvert.errors import InputError

MODELS = Path(__file__).resolve().parents[2] / "models"
DIGITS = onnx.load(str(MODELS / "digits_cnn.onnx"))  # image f32[8,1,8,8]
ENCODER = onnx.load(str(MODELS / "tiny_encoder.onnx"))  # input_ids i64[2,16]


def images(count: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((count, 1, 8, 8), dtype=np.float32)


def all_batches(data: object, model: onnx.ModelProto, batch_size: int | None = None) -> list[np.ndarray]:
    return [b.arrays for b in open_dataset(data, model, batch_size).batches()]  # type: ignore[arg-type]


def two_input_model(batch: int | str = "N") -> onnx.ModelProto:
    """y = x + Cast(m): inputs x f32[batch,3], m i32[batch,3]."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["m"], ["mf"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["x", "mf"], ["y"]),
        ],
        "two_inputs",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3]),
            helper.make_tensor_value_info("m", TensorProto.INT32, [batch, 3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def dynamic_sequence_model() -> onnx.ModelProto:
    """y = Relu(x), x f32[N, L] with both dims dynamic."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "dynamic",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "L"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "L"])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# The three forms and the rank rule ----------------------------------------------------------------------
def test_folder_mixes_samples_batches_and_stacks_in_file_order_with_fixed_batch(tmp_path: Path) -> None:
    data = images(3 + 1 + 12 + 2)
    np.savez(tmp_path / "a.npz", image=data[:3])  # rank R: 3 samples
    np.save(tmp_path / "b.npy", data[3])  # rank R-1: one sample
    np.savez_compressed(tmp_path / "c.npz", image=data[4:16].reshape(3, 4, 1, 8, 8))  # rank R+1: 3x4
    np.save(tmp_path / "d.npy", data[16:18])
    (tmp_path / "notes.txt").write_text("ignored")
    dataset = open_dataset(tmp_path, DIGITS)
    assert (dataset.batch_size, dataset.fixed_batch) == (8, True)
    assert dataset.count_samples() == 18
    stats = DatasetStats()
    batches = list(dataset.batches(stats))
    assert [b.arrays["image"].shape for b in batches] == [(8, 1, 8, 8), (8, 1, 8, 8)]
    np.testing.assert_array_equal(np.concatenate([b.arrays["image"] for b in batches]), data[:16])
    assert (stats.samples_read, stats.samples_used, stats.dropped_tail) == (18, 16, 2)
    assert "the last 2 samples do not fill a batch of 8" in stats.warnings(8)[0]


def test_single_npz_is_streamed_in_small_pieces_with_the_same_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = images(40)
    for save in (np.savez, np.savez_compressed):
        path = tmp_path / f"{save.__name__}.npz"
        save(path, image=data)
        whole = all_batches(path, DIGITS)
        monkeypatch.setattr(dataset_module, "CHUNK_BYTES", 100)  # a piece is less than one sample
        pieces = all_batches(path, DIGITS)
        monkeypatch.undo()
        assert len(whole) == len(pieces) == 5
        for a, b in zip(whole, pieces):
            np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(np.concatenate([b["image"] for b in pieces]), data)


def test_function_from_a_python_file_and_from_an_importable_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = (
        "import numpy as np\n"
        "def sequences():\n"
        "    rng = np.random.default_rng(5)\n"
        "    for _ in range(3):\n"
        "        yield {'input_ids': rng.integers(0, 32, (16,), dtype=np.int64)}\n"  # one sample each
        "    yield {'input_ids': rng.integers(0, 32, (3, 16), dtype=np.int64)}\n"  # three samples
    )
    (tmp_path / "calib_source.py").write_text(source)
    expected_rng = np.random.default_rng(5)
    expected = np.concatenate(
        [expected_rng.integers(0, 32, (1, 16), dtype=np.int64) for _ in range(3)]
        + [expected_rng.integers(0, 32, (3, 16), dtype=np.int64)]
    )
    from_file = all_batches(f"{tmp_path / 'calib_source.py'}:sequences", ENCODER)
    monkeypatch.syspath_prepend(str(tmp_path))
    from_module = all_batches("calib_source:sequences", ENCODER)
    sys.modules.pop("calib_source", None)
    for batches in (from_file, from_module):
        assert [b["input_ids"].shape for b in batches] == [(2, 16)] * 3
        np.testing.assert_array_equal(np.concatenate([b["input_ids"] for b in batches]), expected)


def test_a_list_of_mappings_is_a_dataset_too() -> None:
    data = images(8)
    batches = all_batches([{"image": data[:5]}, {"image": data[5:]}], DIGITS)
    np.testing.assert_array_equal(batches[0]["image"], data)


def test_dynamic_batch_takes_batch_size_a_short_tail_and_splits_at_a_shape_change() -> None:
    rng = np.random.default_rng(1)
    short, long = rng.random((5, 4), dtype=np.float32), rng.random((2, 6), dtype=np.float32)
    batches = all_batches([{"x": short}, {"x": long}], dynamic_sequence_model(), batch_size=2)
    assert [b["x"].shape for b in batches] == [(2, 4), (2, 4), (1, 4), (2, 6)]
    np.testing.assert_array_equal(np.concatenate([b["x"] for b in batches[:3]]), short)
    default = open_dataset([{"x": short}], dynamic_sequence_model())
    assert (default.batch_size, default.fixed_batch) == (dataset_module.DEFAULT_BATCH_SIZE, False)


def test_nan_and_inf_samples_are_counted_per_input_and_excluded() -> None:
    x = np.arange(30, dtype=np.float32).reshape(10, 3)
    x[2, 1] = np.nan
    x[7, 0] = -np.inf
    m = np.zeros((10, 3), dtype=np.int32)
    stats = DatasetStats()
    batches = list(open_dataset([{"x": x, "m": m}], two_input_model(), batch_size=4).batches(stats))
    kept = np.concatenate([b.arrays["x"] for b in batches])
    np.testing.assert_array_equal(kept, x[[0, 1, 3, 4, 5, 6, 8, 9]])
    assert stats.nonfinite == {"x": 2, "m": 0}
    assert (stats.excluded, stats.samples_used) == (2, 8)
    assert "2 of 10 samples contain NaN/Inf and were excluded ('x': 2)" in stats.warnings(4)[0]


# Bad input: each error names the input, the file or sample, and the mismatch ---------------------------
def expect_error(
    data: object, model: onnx.ModelProto, *fragments: str, batch_size: int | None = None
) -> None:
    with pytest.raises(InputError) as caught:
        all_batches(data, model, batch_size)
    for fragment in fragments:
        assert fragment in caught.value.message, caught.value.message


def test_wrong_input_name_names_the_file_and_both_sides(tmp_path: Path) -> None:
    np.savez(tmp_path / "x.npz", pixels=images(8))
    expect_error(
        tmp_path / "x.npz", DIGITS, "x.npz", "missing input(s) ['image']", "unknown array(s) ['pixels']"
    )


def test_wrong_dtype_names_input_and_types(tmp_path: Path) -> None:
    np.savez(tmp_path / "x.npz", image=images(8).astype(np.float64))
    expect_error(tmp_path / "x.npz", DIGITS, "x.npz['image']", "dtype float64", "float32[8,1,8,8]")


def test_wrong_rank_and_wrong_static_dim_are_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "rank.npy", np.zeros((8, 8), dtype=np.float32))
    expect_error(tmp_path / "rank.npy", DIGITS, "rank.npy", "'image' has rank 2", "give rank 3")
    np.save(tmp_path / "dim.npy", np.zeros((8, 1, 8, 7), dtype=np.float32))
    expect_error(
        tmp_path / "dim.npy",
        DIGITS,
        "dim.npy",
        "shape [8, 1, 8, 7], read as 8 samples of shape [1, 8, 7]",
        "dim 3",
    )
    np.save(tmp_path / "one.npy", np.zeros((1, 8, 7), dtype=np.float32))
    expect_error(tmp_path / "one.npy", DIGITS, "read as one sample of shape [1, 8, 7]", "dim 3 differs")
    np.save(tmp_path / "stack.npy", np.zeros((2, 4, 1, 8, 7), dtype=np.float32))
    expect_error(tmp_path / "stack.npy", DIGITS, "read as 2 batches of 4 samples of shape [1, 8, 7]")


def test_npy_for_a_two_input_model_asks_for_npz(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((4, 3), dtype=np.float32))
    expect_error(tmp_path / "x.npy", two_input_model(), "one unnamed array", "['x', 'm']")


def test_inputs_of_one_file_must_hold_the_same_number_of_samples() -> None:
    data = [{"x": np.zeros((4, 3), np.float32), "m": np.zeros((3, 3), np.int32)}]
    expect_error(data, two_input_model(), "data item 0", "different numbers of samples")


def test_empty_folder_empty_arrays_and_missing_path_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    expect_error(tmp_path / "empty", DIGITS, "dataset is empty")
    np.savez(tmp_path / "none.npz", image=np.zeros((0, 1, 8, 8), np.float32))
    expect_error(tmp_path / "none.npz", DIGITS, "dataset is empty")
    expect_error(tmp_path / "missing", DIGITS, "no such file or folder")


def test_all_nan_data_is_refused_with_counts() -> None:
    expect_error(
        [{"image": np.full((8, 1, 8, 8), np.nan, np.float32)}], DIGITS, "all 8 samples contain NaN/Inf"
    )


def test_too_few_samples_for_the_fixed_batch_and_a_clashing_batch_size() -> None:
    expect_error([{"image": images(5)}], DIGITS, "5 usable samples do not fill one batch of 8")
    expect_error([{"image": images(8)}], DIGITS, "--batch-size 4", "fixed batch dim of 8", batch_size=4)


def test_function_errors_name_the_function_and_item(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text(
        "import numpy as np\n"
        "def items():\n    yield {'image': np.float32(1.0)}\n"
        "def fails():\n    raise ValueError('no data here')\n"
    )
    expect_error(f"{tmp_path / 'broken.py'}:fails", DIGITS, "broken.py:fails", "no data here")
    expect_error(f"{tmp_path / 'broken.py'}:items", DIGITS, "item 0", "'image' has rank 0")
    expect_error(f"{tmp_path / 'broken.py'}:absent", DIGITS, "has no function 'absent'")


def test_a_bare_iterator_is_refused_as_it_cannot_be_read_twice() -> None:
    expect_error(iter([{"image": images(8)}]), DIGITS, "an iterator can be read only once")


def test_a_single_dict_is_refused_saying_a_list_of_dicts_is_expected(tmp_path: Path) -> None:
    """A dict iterates over its keys: it must not read as a stream (nor as an iterator) of batches."""
    from qconvert.calibrate.api import calibrate

    expect_error({"image": images(8)}, DIGITS, "data: got one dict ('image'); expected a list of such dicts")
    out = tmp_path / "out.onnx"
    with pytest.raises(InputError, match=r"got one dict \('image'\).*wrap it as \[data\]"):
        calibrate(MODELS / "digits_cnn.onnx", {"image": images(8)}, out=out)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
    assert calibrate(MODELS / "digits_cnn.onnx", [{"image": images(8)}]).stats.samples_used == 8  # type: ignore[union-attr]


def test_fortran_ordered_arrays_read_in_sample_order(tmp_path: Path) -> None:
    data = np.asfortranarray(images(8))
    np.savez(tmp_path / "f.npz", image=data)
    np.save(tmp_path / "f.npy", data)
    for path in (tmp_path / "f.npz", tmp_path / "f.npy"):
        np.testing.assert_array_equal(all_batches(path, DIGITS)[0]["image"], data)
