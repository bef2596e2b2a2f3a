"""Calibration memory does not grow with the number of samples: each batch is observed, reduced, dropped.

Peak RSS of a fresh process (ru_maxrss) calibrating digits_cnn on 64 samples and on 16384: the second
would hold about 16384 × 14 KB of intermediates if anything kept them (onnxruntime's calibrators do).
benchmarks/calibrate.py measures the same on a BERT encoder beside onnxruntime.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from qconvert.calibrate.collect import augment_model, load_float_model
from qconvert.calibrate.workers import make_session

MODEL = Path(__file__).resolve().parents[2] / "models" / "digits_cnn.onnx"
BATCH = 8
PEAK_RSS = """
import resource, sys
from qconvert.calibrate.api import calibrate
calibrate(sys.argv[1], sys.argv[2], method="entropy", batch_size=int(sys.argv[3]))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024))
"""


def peak_rss_bytes(tmp_path: Path, samples: int) -> int:
    data = tmp_path / f"images_{samples}.npz"
    np.savez(data, image=np.random.default_rng(samples).random((samples, 1, 8, 8), dtype=np.float32))
    command = [sys.executable, "-c", PEAK_RSS, str(MODEL), str(data), str(BATCH)]
    done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
    return int(done.stdout.split()[-1])


def intermediate_bytes_per_sample() -> float:
    """What the calibrated tensors of one sample take: what a calibrator keeping them stores per sample."""
    augmented = augment_model(load_float_model(MODEL))
    session = make_session(augmented)
    image = np.zeros((BATCH, 1, 8, 8), dtype=np.float32)
    outputs = session.run(list(augmented.tensors), {"image": image})
    return sum(output.nbytes for output in outputs) / BATCH


def test_peak_memory_stays_flat_from_64_to_16384_samples(tmp_path: Path) -> None:
    few, many = peak_rss_bytes(tmp_path, 64), peak_rss_bytes(tmp_path, 16384)
    kept_if_stored = (16384 - 64) * intermediate_bytes_per_sample()
    assert kept_if_stored > 150 * 2**20  # the check below can tell
    assert many - few < kept_if_stored / 10, (few / 2**20, many / 2**20)
