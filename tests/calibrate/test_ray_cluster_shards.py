"""Sharding, the data side of calibrating on a cluster: each share reads only its own files, rows or items,
and the merged observers are bit-identical to one process under any sharding (the Ray cluster itself:
test_ray_cluster.py)."""

from __future__ import annotations

import copy
import itertools
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from conftest import require_module
from onnx import TensorProto, helper

from qconvert.calibrate.api import calibrate
from qconvert.calibrate.collect import augment_model, collect, load_float_model
from qconvert.calibrate.dataset import DatasetStats, open_dataset, shard_datasets
from qconvert.calibrate.observers import AlignedHistogramObserver
from qconvert.calibrate.workers import Share, make_session, observe_share
from qconvert.errors import InputError

MODELS = Path(__file__).resolve().parents[2] / "models"
SAMPLE_BYTES = 1 * 8 * 8 * 4  # digits_cnn's image sample: f32[1, 8, 8]


@pytest.fixture(scope="module")
def digits() -> tuple[Any, Any, Any]:
    """digits_cnn (image f32[8,1,8,8], a fixed batch of 8), its augmented model and one session."""
    loaded = load_float_model(MODELS / "digits_cnn.onnx")
    augmented = augment_model(loaded)
    return loaded.model, augmented, make_session(augmented)


def ignore(samples: int) -> None:
    """A progress callback that drops the count."""


def images(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, (count, 1, 8, 8)).astype(np.float32)


def write_layout(layout: str, folder: Path, data: np.ndarray) -> Path:
    """The same samples as a folder of uneven .npy files, one .npy, one stored or compressed .npz."""
    folder.mkdir(parents=True, exist_ok=True)
    if layout == "folder":
        cuts = [0, 5, 29, 30, 71, 100, len(data)]  # ragged: files end inside batches
        for number, (low, high) in enumerate(itertools.pairwise(cuts)):
            np.save(folder / f"part{number:02}.npy", data[low:high])
        return folder
    if layout == "npy":
        np.save(folder / "all.npy", data)
        return folder / "all.npy"
    save = np.savez if layout == "npz" else np.savez_compressed
    save(folder / "all.npz", image=data)
    return folder / "all.npz"


def state(observers: dict[str, list[AlignedHistogramObserver]]) -> dict[str, tuple]:
    return {
        name: (o.minimum, o.maximum, o.count, o.exponent, o.first_bin, o.counts.tobytes())
        for name, (o,) in observers.items()
    }


def observe_in_shards(
    augmented: Any, session: Any, dataset: Any, count: int
) -> tuple[dict, list, DatasetStats]:
    """Every shard run here, one after the other (a worker each on a cluster), merged in shard order."""
    fresh = {name: [AlignedHistogramObserver(max_bins=257)] for name in augmented.tensors}
    shards = shard_datasets(dataset, count)
    assert shards is not None and len(shards) == count
    results = [
        observe_share(session, Share(shard, copy.deepcopy(fresh), index, count), ignore)
        for index, shard in enumerate(shards)
    ]
    merged, stats = copy.deepcopy(results[0].observers), DatasetStats()
    for result in results:
        stats.merge(result.stats)
    for result in results[1:]:
        for name, (mine,) in merged.items():
            mine.merge(result.observers[name][0])
    return merged, results, stats


@pytest.mark.parametrize("layout", ["folder", "npy", "npz", "npz-compressed"])
def test_each_shard_reads_only_its_rows_and_the_merge_is_bit_identical(
    layout: str, digits: tuple, tmp_path: Path
) -> None:
    model, augmented, session = digits
    data = images(131, seed=3)  # 16 batches of 8 and a tail of 3 the fixed batch cannot take
    dataset = open_dataset(write_layout(layout, tmp_path / "data", data), model)
    whole = observe_share(
        session,
        Share(dataset, {n: [AlignedHistogramObserver(max_bins=257)] for n in augmented.tensors}, 0, 1),
        ignore,
    )
    assert whole.bytes_read >= data.nbytes  # one process reads every sample once (a .npy: exactly)
    for count in (2, 3, 5, 20):  # 20 shards of 16 batches: some shards are empty
        merged, results, stats = observe_in_shards(augmented, session, dataset, count)
        assert state(merged) == state(whole.observers), count
        assert (stats.samples_read, stats.samples_used, stats.dropped_tail, stats.batches) == (
            131,
            128,
            3,
            16,
        )
        batches = [result.batches_run for result in results]
        assert sum(batches) == 16 and max(batches) - min(batches) <= 1  # contiguous, balanced batch ranges
        for result in results:
            samples = result.batches_run * 8 + result.stats.dropped_tail
            if layout == "npz-compressed":  # a compressed member streams up to the rows: at most a prefix
                assert result.bytes_read <= data.nbytes + (1 << 24)
            else:  # memory-mapped: exactly its own rows, no other sample's bytes
                assert result.bytes_read == samples * SAMPLE_BYTES, (count, result.batches_run)
        if layout != "npz-compressed":
            assert sum(result.bytes_read for result in results) == whole.bytes_read


def test_a_shard_opens_only_the_files_its_rows_are_in(digits: tuple, tmp_path: Path) -> None:
    model, _, _ = digits
    dataset = open_dataset(write_layout("folder", tmp_path / "data", images(131, seed=4)), model)
    shards = shard_datasets(dataset, 4)
    assert shards is not None
    files = [[Path(name).name for name in shard.source.files or ()] for shard in shards]
    # 16 batches: 4 per shard, samples [0, 32), [32, 64), [64, 96), [96, 131): cuts at 5, 29, 30, 71, 100.
    assert files == [
        ["part00.npy", "part01.npy", "part02.npy", "part03.npy"],
        ["part03.npy"],
        ["part03.npy", "part04.npy"],
        ["part04.npy", "part05.npy"],
    ]


def dense_model(path: Path) -> Path:
    """y = Relu(x @ W), x f32[N, 16] with a dynamic batch: every usable sample runs, no tail is dropped."""
    weight = helper.make_tensor("W", TensorProto.FLOAT, [16, 8], np.linspace(-1, 1, 128, dtype=np.float32))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8])],
        [weight],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_nan_samples_are_counted_once_across_shards(tmp_path: Path) -> None:
    """Left-out samples shift a shard's batches, but the exact observers see the same values."""
    loaded = load_float_model(dense_model(tmp_path / "dense.onnx"))
    augmented = augment_model(loaded)
    session = make_session(augmented)
    data = np.random.default_rng(5).normal(0, 1, (101, 16)).astype(np.float32)
    data[[3, 40, 41, 90], 7] = np.nan
    np.save(tmp_path / "x.npy", data)
    dataset = open_dataset(tmp_path / "x.npy", loaded.model)
    fresh = {name: [AlignedHistogramObserver(max_bins=257)] for name in augmented.tensors}
    whole = observe_share(session, Share(dataset, copy.deepcopy(fresh), 0, 1), ignore)
    for count in (2, 3, 7):
        merged, _, stats = observe_in_shards(augmented, session, dataset, count)
        assert state(merged) == state(whole.observers)
        assert stats.excluded == whole.stats.excluded == 4
        assert stats.nonfinite == whole.stats.nonfinite == {"x": 4}
        assert (stats.samples_read, stats.samples_used) == (101, 97)


def test_a_function_taking_shard_arguments_is_called_once_per_shard_for_its_share(
    digits: tuple, tmp_path: Path
) -> None:
    model, augmented, session = digits
    calls: list[tuple[int, int]] = []
    data = images(64, seed=6)

    def batches(shard_index: int = 0, num_shards: int = 1):
        calls.append((shard_index, num_shards))
        for number in range(shard_index, 8, num_shards):  # batch k belongs to shard k mod num_shards
            yield {"image": data[number * 8 : (number + 1) * 8]}

    dataset = open_dataset(batches, model)
    whole = observe_share(
        session,
        Share(dataset, {n: [AlignedHistogramObserver(max_bins=257)] for n in augmented.tensors}, 0, 1),
        ignore,
    )
    merged, results, stats = observe_in_shards(augmented, session, dataset, 3)
    assert calls == [(0, 1), (0, 3), (1, 3), (2, 3)]
    assert state(merged) == state(whole.observers)
    assert [result.batches_run for result in results] == [3, 3, 2] and stats.batches == 8


def test_two_local_processes_read_disjoint_shards(digits: tuple, tmp_path: Path) -> None:
    """Through `collect` and spawned worker processes: each share reads only its half of the .npy, and
    each worker's session runs on its share of the cores, or on --threads-per-worker."""
    model, augmented, _ = digits
    data = images(256, seed=7)
    dataset = open_dataset(write_layout("npy", tmp_path, data), model)
    fresh = {name: [AlignedHistogramObserver(max_bins=257)] for name in augmented.tensors}
    one = collect(augmented, dataset, copy.deepcopy(fresh))
    two = collect(augmented, dataset, copy.deepcopy(fresh), workers=2)
    assert state(two.observers) == state(one.observers)
    assert [result.bytes_read for result in two.share_results] == [data.nbytes // 2] * 2
    # (The pool may run both shares in one process when the other is still starting: shares, not pids.)
    assert two.stats.samples_read == 256 and two.stats.batches == 32
    default = max(1, (os.cpu_count() or 1) // 2)  # each worker's share of the cores
    assert [result.threads for result in two.share_results] == [default] * 2
    assert [result.threads for result in one.share_results] == [os.cpu_count() or 1]
    three = collect(augmented, dataset, copy.deepcopy(fresh), threads_per_worker=3)  # in this process
    assert [result.threads for result in three.share_results] == [3]  # --threads-per-worker
    assert state(three.observers) == state(one.observers)


def test_an_address_where_no_cluster_answers_is_refused_at_once(digits: tuple, tmp_path: Path) -> None:
    """Not half a minute of Ray's connection retries, a warning a second: one line naming the address."""
    require_module("ray")
    np.save(tmp_path / "x.npy", images(8, seed=8))
    with pytest.raises(InputError, match=r"--ray-address 127\.0\.0\.1:1: no Ray cluster answers there"):
        calibrate(
            MODELS / "digits_cnn.onnx", tmp_path / "x.npy", ray_address="127.0.0.1:1", evaluate_samples=0
        )
