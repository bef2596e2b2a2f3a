"""The `--target-cosine` search on what a new user tries first (issue 26's review): a model whose widened
copy cannot be mixed in memory (digits: a Relu folded at 8 bits), a target no model can reach (cosine 1,
max |error| 0) written as JSON, the saved ranges giving back the searched model, and the summary's counts."""

from __future__ import annotations

import json
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
