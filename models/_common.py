"""Helpers shared by the sample-model build scripts (run as `python models/build_*.py`)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

HERE = Path(__file__).resolve().parent

# onnxruntime's own defaults for quantize_static (1.32): int8 activations (asymmetric, full [-128, 127])
# and int8 weights (symmetric, zero point 0), MinMax calibration. Written out so the README can say so.
ACTIVATION_TYPE = QuantType.QInt8
WEIGHT_TYPE = QuantType.QInt8


class ListDataReader(CalibrationDataReader):
    """Feeds a fixed list of input dicts to the calibrator, once."""

    def __init__(self, batches: Sequence[dict[str, np.ndarray]]) -> None:
        self._batches = list(batches)
        self._it: Iterator[dict[str, np.ndarray]] = iter(self._batches)

    # onnxruntime annotates `-> dict` but ends calibration on None, as this does.
    def get_next(self) -> dict[str, np.ndarray] | None:  # pyright: ignore[reportIncompatibleMethodOverride]
        return next(self._it, None)

    def __len__(self) -> int:
        return len(self._batches)

    def rewind(self) -> None:
        self._it = iter(self._batches)


def quantize(
    float_path: Path,
    out_path: Path,
    batches: Sequence[dict[str, np.ndarray]],
    quant_format: QuantFormat,
    op_types_to_quantize: list[str] | None = None,
) -> None:
    """quantize_static with per-channel weights and onnxruntime's default types and calibration."""
    # The calibrator writes an augmented model next to a temporary file; keep it out of models/.
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            quantize_static(
                str(float_path),
                str(out_path),
                ListDataReader(batches),
                quant_format=quant_format,
                op_types_to_quantize=op_types_to_quantize,
                per_channel=True,
                reduce_range=False,
                activation_type=ACTIVATION_TYPE,
                weight_type=WEIGHT_TYPE,
            )
        finally:
            os.chdir(cwd)
    model = onnx.load(str(out_path))
    onnx.checker.check_model(model, full_check=True)


def finish_export(float_path: Path, script: str, infer_shapes: bool = True) -> None:
    """Rewrite torch.onnx.export's file: named after its build script, shapes inferred (strict), checked."""
    model = onnx.load(str(float_path))
    model.producer_name = f"qconvert/models/{script} (torch.onnx.export)"
    if infer_shapes:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(float_path))


def session(path: Path) -> ort.InferenceSession:
    """A single-threaded CPU session with graph optimizations disabled (the spec oracle)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def op_counts(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def describe(path: Path) -> str:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    return f"{path.name}: {path.stat().st_size} bytes, sha256 {digest}…"


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a = a.astype(np.float64).ravel()
    b = b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
