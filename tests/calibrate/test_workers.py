"""Calibration split across processes or Ray tasks gives the statistics of one process, bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest
from conftest import require_module

from qconvert.calibrate.api import calibrate
from qconvert.calibrate.collect import AugmentedModel, augment_model, collect_passes, load_float_model
from qconvert.calibrate.dataset import Dataset, open_dataset
from qconvert.calibrate.observers import AlignedHistogramObserver, HistogramObserver, MinMaxObserver
from qconvert.calibrate.workers import Share, make_session, observe_share
from qconvert.errors import InputError

MODELS = Path(__file__).resolve().parents[2] / "models"


def encoder_setup(tmp_path: Path, samples: int = 14) -> tuple[AugmentedModel, Dataset]:
    """tiny_encoder (MatMul, Softmax, LayerNormalization, Erf) on 7 batches: odd, so the shares differ."""
    loaded = load_float_model(MODELS / "tiny_encoder.onnx")
    model = loaded.model
    path = tmp_path / "ids.npz"
    np.savez(path, input_ids=np.random.default_rng(9).integers(0, 32, (samples, 16), dtype=np.int64))
    return augment_model(loaded), open_dataset(path, model)


def minmax_then_histogram(augmented: AugmentedModel, dataset: Dataset, workers: int, engine: str = "local"):
    """Pass 1 exact min/max, pass 2 a 2048-bin histogram over that range and a |x| histogram."""

    def histograms(previous):
        table = {}
        for name, (extrema,) in previous.items():
            low, high = extrema.minimum, extrema.maximum
            table[name] = [
                HistogramObserver(low, high, 2048),
                HistogramObserver(0.0, max(abs(low), abs(high)), 128, absolute=True),
            ]
        return table

    first, second = collect_passes(
        augmented,
        dataset,
        [lambda _: {name: [MinMaxObserver()] for name in augmented.tensors}, histograms],
        workers=workers,
        engine=engine,
    )
    return first, second


def assert_identical(one, other) -> None:
    for name, (extrema,) in one[0].observers.items():
        (theirs,) = other[0].observers[name]
        assert (extrema.minimum, extrema.maximum, extrema.count) == (
            theirs.minimum,
            theirs.maximum,
            theirs.count,
        )
        for mine, their in zip(one[1].observers[name], other[1].observers[name]):
            assert (mine.low, mine.high) == (their.low, their.high)
            np.testing.assert_array_equal(mine.counts, their.counts, err_msg=name)


def test_two_processes_give_bit_identical_minmax_and_histograms(tmp_path: Path) -> None:
    augmented, dataset = encoder_setup(tmp_path)
    single = minmax_then_histogram(augmented, dataset, workers=1)
    split = minmax_then_histogram(augmented, dataset, workers=2)
    assert_identical(single, split)
    assert single[0].batches == split[0].batches == 7
    assert len(split[0].shares) == 2  # two processes did the work
    # Not vacuous: histograms hold every element of every batch.
    (extrema,) = single[0].observers["last_hidden_state"]
    assert single[1].observers["last_hidden_state"][0].total == extrema.count == 14 * 16 * 64


def two_worker_ranges(tmp_path: Path, method: str, engine: str = "local") -> list[dict]:
    """The ranges JSON of `calibrate` on digits_cnn (5 batches), with one worker and with two."""
    path = tmp_path / "images.npz"
    np.savez(path, image=np.random.default_rng(8).random((40, 1, 8, 8), dtype=np.float32))
    saved = []
    for workers in (1, 2):
        ranges = tmp_path / f"ranges{workers}.json"
        calibrate(
            MODELS / "digits_cnn.onnx",
            path,
            method=method,
            workers=workers,
            engine=engine,
            ranges_path=ranges,
        )
        saved.append(json.loads(ranges.read_text())["tensors"])
    assert len(saved[0]) == 9 and all(entry["method"] == method for entry in saved[0].values())
    return saved


@pytest.mark.engine
def test_ray_tasks_give_bit_identical_statistics_and_entropy_ranges(tmp_path: Path) -> None:
    ray = require_module("ray")
    augmented, dataset = encoder_setup(tmp_path, samples=6)
    single = minmax_then_histogram(augmented, dataset, workers=1)
    on_ray = minmax_then_histogram(augmented, dataset, workers=2, engine="ray")
    assert_identical(single, on_ray)
    assert len(on_ray[0].shares) == 2
    assert not ray.is_initialized()  # the local instance was shut down
    one, two = two_worker_ranges(tmp_path, "entropy", engine="ray")
    assert one == two
    assert not ray.is_initialized()


# Every method, through worker processes: exact observers make the ranges those of one process.
@pytest.mark.parametrize(
    "method", ["minmax", "moving-average", "percentile", "entropy", "mse", "distribution"]
)
def test_calibrate_with_two_workers_saves_the_same_ranges_json(method: str, tmp_path: Path) -> None:
    one, two = two_worker_ranges(tmp_path, method)
    assert one == two


def test_observer_threads_give_bit_identical_aligned_histograms(tmp_path: Path) -> None:
    """One process observes each batch's tensors on several threads: no batch is lost or observed twice,
    so 1 and 3 threads give the same state (every observer here is order-independent, so this cannot
    see a reordering; none of ours depends on the order)."""
    augmented, dataset = encoder_setup(tmp_path)
    states = []
    for threads in (1, 3):
        observers = {name: [AlignedHistogramObserver(max_bins=257)] for name in augmented.tensors}
        share = Share(dataset, observers, 0, 1)
        result = observe_share(make_session(augmented), share, lambda samples: None, threads)
        assert result.batches_run == 7
        states.append(
            {
                name: (o.minimum, o.maximum, o.count, o.exponent, o.first_bin, o.counts.tobytes())
                for name, (o,) in result.observers.items()
            }
        )
    assert states[0] == states[1]


class RecordingSession:
    """The real onnxruntime session; records, as each run starts, how many runs are in flight and how many
    outputs of earlier runs are still alive."""

    def __init__(self, session: object) -> None:
        self.session = session
        self.running = 0
        self.at_start: list[tuple[int, int]] = []  # (runs in flight, earlier outputs alive)
        self.outputs: list[weakref.ref[np.ndarray]] = []
        self.lock = threading.Lock()

    def run(self, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        with self.lock:
            self.running += 1
            self.at_start.append((self.running, sum(ref() is not None for ref in self.outputs)))
        try:
            outputs = self.session.run(names, feeds)  # type: ignore[attr-defined]
        finally:
            with self.lock:
                self.running -= 1
        self.outputs += [weakref.ref(output) for output in outputs]
        return outputs


@pytest.mark.parametrize("threads", [1, 3])
def test_one_batch_of_intermediates_is_alive_at_a_time(threads: int, tmp_path: Path) -> None:
    """Each run starts after the previous batch was observed and dropped: no two runs overlap and no
    output of an earlier run is still referenced, on one observing thread or several."""
    augmented, dataset = encoder_setup(tmp_path)
    observers = {name: [AlignedHistogramObserver(max_bins=257)] for name in augmented.tensors}
    session = RecordingSession(make_session(augmented))
    result = observe_share(session, Share(dataset, observers, 0, 1), lambda samples: None, threads)
    assert result.batches_run == 7
    assert len(session.outputs) == 7 * len(augmented.tensors)
    assert session.at_start == [(1, 0)] * 7


def test_a_lambda_cannot_go_to_worker_processes_and_says_so() -> None:
    images = np.zeros((8, 1, 8, 8), np.float32)
    with pytest.raises(InputError, match="cannot be sent to worker processes"):
        calibrate(MODELS / "digits_cnn.onnx", lambda: [{"image": images}], workers=2)


def test_a_data_error_found_in_worker_processes_comes_back_as_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "nan.npz"  # headers are fine: only reading the values (in the workers) finds it
    np.savez(path, image=np.full((16, 1, 8, 8), np.nan, np.float32))
    with pytest.raises(InputError, match=r"nan\.npz: all 16 samples contain NaN/Inf \('image': 16\)"):
        calibrate(MODELS / "digits_cnn.onnx", path, workers=2)


def test_a_script_without_a_main_guard_gets_told_why_its_workers_died(tmp_path: Path) -> None:
    """Spawned workers import the calling script again; one that calibrates at module level makes each
    worker fail to start. The error says so instead of blaming memory alone, and it comes: tiny_encoder
    (430 KB) used to leave this process waiting forever on a half-written spawn pipe. The workers stop
    before creating semaphores: killed mid-start, they could leave some for resource_tracker to warn of
    after this process's error (seen once in CI, about 1 run in 12 under load here)."""
    data = tmp_path / "ids.npz"
    np.savez(data, input_ids=np.zeros((16, 16), np.int64))
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from qconvert.calibrate import calibrate\n"
        f"calibrate({str(MODELS / 'tiny_encoder.onnx')!r}, {str(data)!r}, workers=2)\n"
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert 'outside `if __name__ == "__main__":`' in run.stderr.splitlines()[-1]
    assert "this worker process is running a script that calls calibrate" in run.stderr
    assert "leaked semaphore" not in run.stderr
