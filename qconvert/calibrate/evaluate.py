"""How close the written QDQ model stays to the float model: both run by onnxruntime on the first samples.

NOTE: this is the check a user would otherwise script by hand after every calibration, and the one that
catches what no range table shows: a folded Relu over a symmetric range, a saturating float8 scale, a
masked tensor quantized to nothing. The samples are the first `samples` the data gives when read again
(whole batches, NaN/Inf ones left out as in calibration): the calibration samples for files, and for a
function whatever it returns the second time. They are not held-out data: a broken model shows, an
overfitted range does not. onnxruntime runs the QDQ model at its default graph optimizations
(ORT_ENABLE_ALL), as a user would, or at ORT_ENABLE_BASIC where finalize says the model needs it; where
it cannot run the QDQ model at ALL (4-bit MaxPool) the comparison falls back to BASIC and says why. The
float model runs with optimizations off, as calibration runs it; its outputs on the first batches are
those of calibrate's outlier-channel run when there was one (`channel_spread.py`), not run twice.

Per graph output, batch by batch (nothing is kept but per-sample figures): per sample (a row of the batch
axis; the whole output when it has none, `batch_axis`, and for each run fed as given), the cosine of the
float and quantized values over the elements finite in both (none for a sample of one element: ±1 says
nothing), the largest |difference| over those elements, and a count of the elements finite in one model
and not in the other (or NaN in one and ±Inf in the other), which the cosine cannot show and a warning
reports. Integer and boolean outputs report the share of equal elements instead.

Per quantized activation (`tensor_losses`, opt-in: it runs the float model with every such tensor exposed):
the relative error ‖x - x̂‖ / ‖x‖ of its float values x against their quantize-dequantize x̂ with its own
Q/DQ parameters (`numerics.quantize` and `dequantize`, onnxruntime's arithmetic), per sample. That is what
the tensor's scale alone costs, apart from the error it inherits upstream: the tensors to keep in float or
recalibrate come first. (Not a cosine: a range clipped too tight scales the values down, which a cosine
does not see.)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from qconvert.calibrate.dataset import Batch, Dataset
from qconvert.errors import QConvertError
from qconvert.numerics import Rounding, UniformParams, dequantize, quantize

if TYPE_CHECKING:
    from qconvert.ir.dialects.builtin import ModuleOp

ALL, BASIC = "ORT_ENABLE_ALL", "ORT_ENABLE_BASIC"
# The float model, the reference, runs as calibration runs it (no fused kernels' rounding): the same
# figures whether its outputs come from calibrate's outlier-channel run or from its own session here.
REFERENCE_LEVEL = "ORT_DISABLE_ALL"


@dataclass(frozen=True, slots=True)
class OutputAgreement:
    """One graph output: cosines over samples and the largest error (float outputs), or the share of
    equal elements; elements whose finiteness differs between the models are counted apart."""

    name: str
    mean_cosine: float | None = None
    lowest_cosine: float | None = None
    max_abs_error: float | None = None
    nonfinite_mismatches: int = 0
    matching: float | None = None  # integer/boolean outputs


@dataclass(frozen=True, slots=True)
class TensorLoss:
    """One quantized activation: the relative error of its quantize-dequantize, mean and largest over
    samples (None when no sample was finite)."""

    name: str
    mean_relative_error: float | None
    largest_relative_error: float | None


@dataclass
class Agreement:
    """The comparison as run: onnxruntime's optimization level, samples, one entry per graph output, and
    (when asked for) one per quantized activation in graph order."""

    level: str
    samples: int
    outputs: list[OutputAgreement]
    warnings: list[str] = field(default_factory=list)
    tensors: list[TensorLoss] | None = None

    def to_json(self) -> dict[str, object]:
        tensors = None if self.tensors is None else [asdict(t) for t in self.tensors]
        outputs = [asdict(o) for o in self.outputs]
        return {"level": self.level, "samples": self.samples, "outputs": outputs, "tensors": tensors}

    def worst_tensors(self, count: int) -> list[TensorLoss]:
        """The `count` tensors whose own quantization loses the most (largest mean relative error first)."""
        ranked = [t for t in self.tensors or [] if t.mean_relative_error is not None]
        return sorted(ranked, key=lambda t: (-(t.mean_relative_error or 0.0), t.name))[:count]


def batch_axis(declared: Sequence[object], array: np.ndarray, batch: Batch, dataset: Dataset) -> bool:
    """Whether axis 0 of an output is the batch axis: declared symbolic (or the model's fixed batch size)
    and as long as the batch. An output without one (a weight, a reduction), and any output of a run fed
    as given (its batch axis, if any, is unknown), is one row per batch."""
    if dataset.as_given or array.ndim == 0 or array.shape[0] != batch.size or not declared:
        return False
    first = declared[0]
    return not isinstance(first, int) or (dataset.fixed_batch and first == dataset.batch_size)


def _rows(array: np.ndarray, per_sample: bool) -> np.ndarray:
    return array.astype(np.float64).reshape(array.shape[0] if per_sample else 1, -1)


def sample_cosines(reference: np.ndarray, candidate: np.ndarray, per_sample: bool) -> np.ndarray:
    """The cosine of each row's values finite in both (rows: samples, or the whole array), float64; NaN
    for a row of at most one such element, 1.0 where both are zero, 0.0 where one is."""
    left, right = _rows(reference, per_sample), _rows(candidate, per_sample)
    finite = np.isfinite(left) & np.isfinite(right)
    left, right = np.where(finite, left, 0.0), np.where(finite, right, 0.0)
    left_norm, right_norm = np.linalg.norm(left, axis=1), np.linalg.norm(right, axis=1)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        cosines = np.einsum("ij,ij->i", left, right) / (left_norm * right_norm)
    cosines = np.where((left_norm == 0) != (right_norm == 0), 0.0, cosines)
    cosines = np.where((left_norm == 0) & (right_norm == 0), 1.0, cosines)
    return np.where(finite.sum(axis=1) > 1, cosines, np.nan)


def sample_relative_errors(reference: np.ndarray, candidate: np.ndarray, per_sample: bool) -> np.ndarray:
    """‖reference - candidate‖ / ‖reference‖ per row (as `sample_cosines`), float64; 0 where both are
    zero, NaN for a row holding Inf or NaN."""
    left, right = _rows(reference, per_sample), _rows(candidate, per_sample)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        errors = np.linalg.norm(left - right, axis=1)
        relative = errors / np.linalg.norm(left, axis=1)
    return np.where(errors == 0, 0.0, relative)


def nonfinite_mismatches(reference: np.ndarray, candidate: np.ndarray) -> int:
    """Elements finite in one array and not the other, or non-finite in both but different (NaN vs ±Inf,
    +Inf vs -Inf)."""
    left, right = np.asarray(reference), np.asarray(candidate)
    left_finite, right_finite = np.isfinite(left), np.isfinite(right)
    same = (left == right) | (np.isnan(left) & np.isnan(right))
    return int(np.count_nonzero((left_finite != right_finite) | (~left_finite & ~right_finite & ~same)))


class _OutputTally:
    """One output's figures, batch by batch."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cosines: list[np.ndarray] = []
        self.max_abs_error: float | None = None
        self.mismatches = 0
        self.equal = self.elements = 0
        self.integer = False

    def add(self, reference: np.ndarray, candidate: np.ndarray, per_sample: bool) -> None:
        reference, candidate = np.asarray(reference), np.asarray(candidate)
        if not np.issubdtype(reference.dtype, np.floating):
            self.integer = True
            self.equal += int(np.count_nonzero(reference == candidate))
            self.elements += reference.size
            return
        self.cosines.append(sample_cosines(reference, candidate, per_sample))
        self.mismatches += nonfinite_mismatches(reference, candidate)
        finite = np.isfinite(reference) & np.isfinite(candidate)
        if finite.any():
            error = float(np.abs(reference[finite].astype(np.float64) - candidate[finite]).max())
            self.max_abs_error = max(error, self.max_abs_error or 0.0)

    def result(self) -> OutputAgreement:
        if self.integer:
            return OutputAgreement(self.name, matching=self.equal / self.elements if self.elements else 1.0)
        cosines = _finite(self.cosines)
        return OutputAgreement(
            self.name,
            mean_cosine=float(cosines.mean()) if cosines.size else None,
            lowest_cosine=float(cosines.min()) if cosines.size else None,
            max_abs_error=self.max_abs_error,
            nonfinite_mismatches=self.mismatches,
        )


def evaluate(
    float_model: str | bytes,
    quantized_model: str,
    dataset: Dataset,
    samples: int,
    needs_basic: bool = False,
    reference_outputs: Sequence[tuple[int, Mapping[str, np.ndarray]]] = (),
) -> Agreement:
    """Run both models on the dataset's first `samples` samples (whole batches) and compare every output;
    at ORT_ENABLE_BASIC when `needs_basic` (finalize's advice) or when ALL cannot run the QDQ model.
    `reference_outputs`: the float model's outputs already computed for the first batches (batch size,
    output name -> array; calibrate's outlier-channel run, `channel_spread.py`): the float model runs
    only on the batches after those."""
    warnings: list[str] = []
    for level in (BASIC,) if needs_basic else (ALL, BASIC):
        try:
            quantized = onnxruntime_session(quantized_model, level)
            reference = _LazySession(float_model, REFERENCE_LEVEL)
            tallies, count = _compare(quantized, reference, dataset, samples, reference_outputs)
        except QConvertError:  # bad data: the user's to fix, not onnxruntime's
            raise
        except Exception as error:  # onnxruntime's own exception types
            warnings.append(f"onnxruntime ({level}) cannot run the written model: {_first_line(error)}")
            continue
        outputs = [tally.result() for tally in tallies]
        for output in outputs:
            if output.nonfinite_mismatches:
                warnings.append(
                    f"output '{output.name}': {output.nonfinite_mismatches} element(s) are Inf/NaN in one "
                    f"model and not the other (the cosines and errors leave them out)"
                )
        return Agreement(level, count, outputs, warnings)
    return Agreement("not run", 0, [], warnings)


class _LazySession:
    """The float model's session, made on its first run (not at all when every batch was computed)."""

    def __init__(self, model: str | bytes, level: str) -> None:
        self.model, self.level = model, level
        self.session: Any = None

    def run(self, names: list[str], arrays: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        if self.session is None:
            self.session = onnxruntime_session(self.model, self.level)
        return self.session.run(names, arrays)


def onnxruntime_session(model: str | bytes, level: str = "ORT_DISABLE_ALL") -> Any:
    """onnxruntime on the CPU at this graph optimization level (off by default: the figures onnxruntime's
    reference path gives, and a QDQ session that starts in a fraction of the optimized one's time)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.log_severity_level = 4  # fatal only: its errors reach us as exceptions, named once by us
    # No spinning between ops (as calibration's session): the same wall time alone, less CPU, and on a
    # shared machine faster (MiniLM's 4 QDQ runs: 0.66 against 0.82 s of CPU quiet, 1.3 against 1.7 s loaded)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def _batches(dataset: Dataset, samples: int) -> Iterator[Batch]:
    """Whole batches until `samples` samples are covered."""
    done = 0
    for batch in dataset.batches():
        if done >= samples:
            return
        yield batch
        done += batch.size


def _compare(
    quantized: Any,
    reference: Any,
    dataset: Dataset,
    samples: int,
    computed: Sequence[tuple[int, Mapping[str, np.ndarray]]] = (),
) -> tuple[list[_OutputTally], int]:
    outputs = quantized.get_outputs()
    names = [output.name for output in outputs]
    tallies = [_OutputTally(name) for name in names]
    count = 0
    for index, batch in enumerate(_batches(dataset, samples)):
        got = quantized.run(names, batch.arrays)
        known = computed[index] if index < len(computed) else None
        if known is not None and known[0] == batch.size and all(name in known[1] for name in names):
            want = [known[1][name] for name in names]
        else:
            want = reference.run(names, batch.arrays)
        for tally, output, expected, actual in zip(tallies, outputs, want, got):
            tally.add(expected, actual, batch_axis(output.shape, np.asarray(expected), batch, dataset))
        count += batch.size
    return tallies, count


def quantized_activations(module: ModuleOp) -> dict[str, UniformParams]:
    """ONNX name -> Q/DQ parameters of every activation the finalized module quantizes (its `quant.qcast`s;
    weights are stored constants, not qcasts), in graph order."""
    from qconvert.calibrate.tensor_names import TENSOR_NAME_ATTR
    from qconvert.ir.attributes import StringAttr
    from qconvert.ir.dialects.quant import QuantizeCastOp
    from qconvert.ir.quant_types import UniformQuantizedType, uniform_params
    from qconvert.ir.types import element_type_of

    activations = {}
    for op in module.walk():
        name = op.attributes.get(TENSOR_NAME_ATTR)
        if isinstance(op, QuantizeCastOp) and isinstance(name, StringAttr):
            quant_type = element_type_of(op.result.type)
            if isinstance(quant_type, UniformQuantizedType):
                activations.setdefault(name.value, uniform_params(quant_type))
    return activations


def tensor_losses(
    session: Any, activations: Mapping[str, UniformParams], dataset: Dataset, samples: int
) -> list[TensorLoss]:
    """Each activation's float values (from `session`, the float model exposing them) against their
    quantize-dequantize with its parameters, per sample, on the first `samples` samples (whole batches)."""
    names = list(activations)
    declared = {output.name: output.shape for output in session.get_outputs()}
    errors: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for batch in _batches(dataset, samples):
        for name, values in zip(names, session.run(names, batch.arrays)):
            params = activations[name]
            restored = dequantize(quantize(values, params, Rounding.ONNX), params, Rounding.ONNX)
            per_sample = batch_axis(declared.get(name, ()), values, batch, dataset)
            errors[name].append(sample_relative_errors(values, restored, per_sample))
    losses = []
    for name in names:
        found = _finite(errors[name])
        mean, largest = (float(found.mean()), float(found.max())) if found.size else (None, None)
        losses.append(TensorLoss(name, mean, largest))
    return losses


def _finite(figures: list[np.ndarray]) -> np.ndarray:
    """The finite values of per-batch figures, in one array (a row of one value or none is NaN)."""
    values = np.concatenate(figures) if figures else np.zeros(0)
    return values[np.isfinite(values)]


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


__all__ = [
    "Agreement",
    "OutputAgreement",
    "TensorLoss",
    "batch_axis",
    "evaluate",
    "nonfinite_mismatches",
    "onnxruntime_session",
    "quantized_activations",
    "sample_cosines",
    "sample_relative_errors",
    "tensor_losses",
]
