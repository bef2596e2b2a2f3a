"""How close the QDQ model stays to the float model: both run by onnxruntime on the first calibration samples.

NOTE: this is the check a user would otherwise script by hand after every calibration, and the one that
catches what no range table shows: a folded Relu over a symmetric range, a saturating float8 scale, a
masked tensor quantized to nothing. The samples are calibration samples (the first `samples` the dataset
gives, NaN/Inf ones left out as in calibration), not held-out data: a broken model shows, an overfitted
range does not. onnxruntime runs both models at its default graph optimizations (ORT_ENABLE_ALL), as a
user would; where it cannot run the QDQ model there (4-bit MaxPool), the comparison runs at
ORT_ENABLE_BASIC and says why. Per graph output and per sample (a row of the batch axis; the whole output
when it has none): the cosine of the flattened float and quantized values, in float64 (1.0 when both are
zero, 0.0 when one is; none for a sample holding Inf or NaN) and the largest |difference| over the elements
finite in both; integer and boolean outputs report the fraction of equal elements instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from qconvert.calibrate.dataset import Dataset
from qconvert.errors import QConvertError

LEVELS = ("ORT_ENABLE_ALL", "ORT_ENABLE_BASIC")


@dataclass(frozen=True, slots=True)
class OutputAgreement:
    """One graph output: cosines over samples (float outputs) or the fraction of equal elements."""

    name: str
    mean_cosine: float | None = None
    lowest_cosine: float | None = None
    max_abs_error: float | None = None
    matching: float | None = None  # integer/boolean outputs


@dataclass
class Agreement:
    """The comparison as run: onnxruntime's optimization level, samples, one entry per graph output."""

    level: str
    samples: int
    outputs: list[OutputAgreement]
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"level": self.level, "samples": self.samples, "outputs": [asdict(o) for o in self.outputs]}


def sample_cosines(reference: np.ndarray, candidate: np.ndarray, batch: int) -> np.ndarray:
    """The cosine of each sample's flattened values (rows of axis 0 when it is the batch axis), float64;
    NaN for a sample holding Inf or NaN."""
    rows = batch if reference.ndim and reference.shape[0] == batch else 1
    left = reference.astype(np.float64).reshape(rows, -1)
    right = candidate.astype(np.float64).reshape(rows, -1)
    left_norm, right_norm = np.linalg.norm(left, axis=1), np.linalg.norm(right, axis=1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        cosines = np.einsum("ij,ij->i", left, right) / (left_norm * right_norm)
    cosines = np.where((left_norm == 0) != (right_norm == 0), 0.0, cosines)
    return np.where((left_norm == 0) & (right_norm == 0), 1.0, cosines)


def evaluate(float_model: str | bytes, quantized_model: bytes, dataset: Dataset, samples: int) -> Agreement:
    """Run both models on the dataset's first `samples` samples (whole batches) and compare every output."""
    import onnxruntime as ort

    warnings: list[str] = []
    for level in LEVELS:
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        options.log_severity_level = 3
        try:
            quantized = ort.InferenceSession(quantized_model, options, providers=["CPUExecutionProvider"])
            runs = list(_runs(quantized, dataset, samples))
        except QConvertError:  # bad data: the user's to fix, not onnxruntime's
            raise
        except Exception as error:  # onnxruntime's own exception types
            warnings.append(f"onnxruntime ({level}) cannot run the written model: {_first_line(error)}")
            continue
        reference = ort.InferenceSession(float_model, options, providers=["CPUExecutionProvider"])
        names = [output.name for output in quantized.get_outputs()]
        expected = [(reference.run(names, feeds), size) for feeds, size, _ in runs]
        outputs = [
            _compare(name, [(want[k], got[k], size) for (want, size), (_, _, got) in zip(expected, runs)])
            for k, name in enumerate(names)
        ]
        return Agreement(level, sum(size for _, size, _ in runs), outputs, warnings)
    return Agreement("not run", 0, [], warnings)


def _runs(session: Any, dataset: Dataset, samples: int) -> Iterator[tuple[dict[str, np.ndarray], int, list]]:
    """(feeds, batch size, the session's outputs) for whole batches until `samples` are covered."""
    done = 0
    names = [output.name for output in session.get_outputs()]
    for batch in dataset.batches():
        if done >= samples:
            return
        yield batch.arrays, batch.size, session.run(names, batch.arrays)
        done += batch.size


def _compare(name: str, pairs: list[tuple[np.ndarray, np.ndarray, int]]) -> OutputAgreement:
    if not all(np.issubdtype(np.asarray(want).dtype, np.floating) for want, _, _ in pairs):
        equal = sum(int(np.count_nonzero(np.asarray(want) == np.asarray(got))) for want, got, _ in pairs)
        total = sum(np.asarray(want).size for want, _, _ in pairs)
        return OutputAgreement(name, matching=equal / total if total else 1.0)
    # Samples holding Inf/NaN (in either model) have no cosine; None when no sample has one.
    cosines = np.concatenate([sample_cosines(want, got, size) for want, got, size in pairs])
    cosines = cosines[np.isfinite(cosines)]
    with np.errstate(invalid="ignore"):  # Inf - Inf: such elements have no error, as NaN ones
        errors = np.concatenate(
            [np.abs(want.astype(np.float64) - got.astype(np.float64)).ravel() for want, got, _ in pairs]
        )
    errors = errors[np.isfinite(errors)]
    return OutputAgreement(
        name,
        mean_cosine=float(cosines.mean()) if cosines.size else None,
        lowest_cosine=float(cosines.min()) if cosines.size else None,
        max_abs_error=float(errors.max()) if errors.size else None,
    )


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


__all__ = ["Agreement", "OutputAgreement", "evaluate", "sample_cosines"]
