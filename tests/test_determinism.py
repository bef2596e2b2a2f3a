"""The same command on the same input writes the same bytes (issue 23): each verb is run twice, in two
processes with different PYTHONHASHSEED (so any set or hash order leaking into an output shows), and, for
calibrate, with --workers 1 and 2; every file it writes and its stdout are compared byte for byte.

Only wall-clock timings are removed before comparing: calibrate --json's "seconds" (and its "workers"
field when the worker counts differ on purpose). check --json holds no timing, so it is compared whole.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

MODELS = Path(__file__).resolve().parents[1] / "models"
DIGITS_QDQ = str(MODELS / "digits_cnn.qdq.onnx")
DIGITS_FLOAT = str(MODELS / "digits_cnn.onnx")
ENCODER_QDQ = str(MODELS / "tiny_encoder.qdq.onnx")
ENCODER_QOP = str(MODELS / "tiny_encoder.qop.onnx")


@dataclass(frozen=True)
class Run:
    """A command (after `qconvert`), the files it writes (relative to its folder), and per-run flags."""

    arguments: tuple[str, ...]
    files: tuple[str, ...] = ()
    first: tuple[str, ...] = ()  # added to the first run only
    second: tuple[str, ...] = ()  # added to the second run only
    drop_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)  # JSON file -> top-level keys removed


DATA = "{data}"  # replaced by a seeded 32-sample file (4 batches of the model's fixed 8) in the test's folder
CALIBRATE = ("calibrate", DIGITS_FLOAT, "--data", DATA, "--quiet")
CALIBRATE_FILES = ("model.qdq.onnx", "ranges.json", "result.json")
CALIBRATE_OUTPUTS = ("-o", "model.qdq.onnx", "--ranges", "ranges.json", "--json", "result.json")

RUNS: dict[str, Run] = {
    "import digits": Run(("import", DIGITS_QDQ)),
    "import tiny_encoder qdq": Run(("import", ENCODER_QDQ, "-o", "out.mlir"), ("out.mlir",)),
    "import tiny_encoder qop": Run(("import", ENCODER_QOP)),
    "inspect tiny_encoder": Run(("inspect", ENCODER_QDQ)),
    "inspect --json": Run(("inspect", ENCODER_QOP, "--json", "summary.json"), ("summary.json",)),
    "convert stablehlo quantized": Run(("convert", ENCODER_QDQ, "--to", "stablehlo")),
    "convert stablehlo integer": Run(("convert", ENCODER_QDQ, "--form", "integer")),
    "convert stablehlo qdq": Run(("convert", ENCODER_QDQ, "--form", "qdq", "--semantics", "stablehlo")),
    "convert stablehlo fused inline": Run(
        ("convert", DIGITS_QDQ, "--fuse-arithmetic", "--inline-weights", "-o", "out.mlir"), ("out.mlir",)
    ),
    "convert onnx": Run(("convert", ENCODER_QDQ, "--to", "onnx", "-o", "out.onnx"), ("out.onnx",)),
    "convert onnx-storage": Run(
        ("convert", ENCODER_QOP, "--to", "onnx-storage", "-o", "out.onnx"), ("out.onnx", "out.quant.json")
    ),
    "convert onnx-storage qoperator": Run(
        ("convert", DIGITS_QDQ, "--to", "onnx-storage", "--form", "qoperator", "-o", "s.onnx"),
        ("s.onnx", "s.quant.json"),
    ),
    "convert tosa": Run(("convert", DIGITS_QDQ, "--to", "tosa")),
    "check --json": Run(("check", ENCODER_QDQ, "--quiet", "--json", "report.json"), ("report.json",)),
    "calibrate": Run(
        (*CALIBRATE, *CALIBRATE_OUTPUTS), CALIBRATE_FILES, drop_keys={"result.json": ("seconds",)}
    ),
    "calibrate --workers 1 and 2": Run(
        (*CALIBRATE, "--method", "percentile", *CALIBRATE_OUTPUTS),
        CALIBRATE_FILES,
        first=("--workers", "1"),
        second=("--workers", "2"),
        drop_keys={"result.json": ("seconds", "workers")},
    ),
}


def _run(run: Run, folder: Path, hash_seed: str, extra: tuple[str, ...]) -> dict[str, bytes]:
    """Run the command in `folder` (outputs named relative to it); stdout and each written file."""
    folder.mkdir()
    environment = {**os.environ, "PYTHONHASHSEED": hash_seed}
    arguments = [str(folder.parent / "data.npz") if a == DATA else a for a in (*run.arguments, *extra)]
    command = [sys.executable, "-m", "qconvert", *arguments]
    result = subprocess.run(
        command, cwd=folder, env=environment, capture_output=True, timeout=600, check=False
    )
    assert result.returncode == 0, result.stderr.decode()
    outputs = {"<stdout>": result.stdout}
    for name in run.files:
        data = (folder / name).read_bytes()
        keys = run.drop_keys.get(name, ())
        if keys:
            document = json.loads(data)
            for key in keys:
                assert key in document, f"{name} has no {key!r}: nothing to remove"
                del document[key]
            data = json.dumps(document, sort_keys=False).encode()
        outputs[name] = data
    return outputs


@pytest.mark.slow
@pytest.mark.parametrize("case", list(RUNS))
def test_two_runs_write_the_same_bytes(case: str, tmp_path: Path) -> None:
    run = RUNS[case]
    image = np.random.default_rng(23).standard_normal((32, 1, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "data.npz", image=image)
    with ThreadPoolExecutor(2) as pool:  # the two processes side by side
        first = pool.submit(_run, run, tmp_path / "a", "1", run.first)
        second = pool.submit(_run, run, tmp_path / "b", "4242", run.second)
        one, two = first.result(), second.result()
    assert one.keys() == two.keys()
    assert any(len(data) > 0 for data in one.values())  # something was written to compare
    for name in one:
        assert one[name] == two[name], f"{case}: {name} differs between the two runs"
