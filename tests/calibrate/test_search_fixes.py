"""The `--target-cosine` search on what a new user tries first (issue 26's review): a model whose widened
copy cannot be mixed in memory (digits: a Relu folded at 8 bits), a target no model can reach (cosine 1,
max |error| 0) written as JSON, the saved ranges giving back the searched model, and the summary's counts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import require_module

from qconvert.calibrate.api import calibrate

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
