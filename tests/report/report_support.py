"""Helpers of tests/report: the sample model's files, reading a result, where screenshots go."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

MODELS = Path(__file__).resolve().parents[2] / "models"
DIGITS = MODELS / "digits_cnn.onnx"
DIGITS_QDQ = MODELS / "digits_cnn.qdq.onnx"
DIGITS_INPUTS = MODELS / "digits_cnn.inputs.npz"


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def screenshot_folder(tmp_path: Path) -> Path:
    """Where screenshots go: the test's tmp dir, or $QCONVERT_ARTIFACTS (CI keeps that folder)."""
    folder = Path(os.environ.get("QCONVERT_ARTIFACTS", tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder
