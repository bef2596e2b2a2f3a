"""`--target-metric` / `--target-cosine`: what the search must reach on held-out data, and measuring it.

NOTE: a target is `METRIC[:OUTPUT]>=VALUE` or `METRIC[:OUTPUT]<=VALUE`, given once per condition (all must
hold). Metrics, each per graph output over the held-out samples (a sample: a row of the output's batch
axis, the whole output when it has none):
- `cosine` (>=): the mean over samples of the cosine to the float model's output;
- `min-cosine` (>=): the lowest such cosine;
- `top1` (>=): the share of samples whose largest element (last axis) is at the float model's place
  (a classifier's agreement);
- `max-abs` (<=): the largest |quantized - float| over every element;
- `mean-abs` (<=): the mean |quantized - float|.
Without `:OUTPUT` the condition holds for every float output (the worst decides). `--target-cosine X` is
`cosine>=X` on `--target-output`'s outputs (default every float one).

The search compares candidates through one scalar, the `shortfall`: per condition the loss over the loss
allowed (1 - value over 1 - threshold for `>=`, value over threshold for `<=`), the largest over conditions;
a candidate passes when every condition holds (shortfall <= 1). Losses of this kind add up roughly over
independently quantized tensors, which is what the search's group sensitivities assume.

The float model's outputs on the held-out samples are computed once; the held-out batches are run in
chunks of up to `CHUNK_SAMPLES` samples of one shape (onnxruntime runs one large batch faster than several
small ones), each candidate in one onnxruntime session at optimizations off (the QDQ session starts fast).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from qconvert.calibrate.evaluate import onnxruntime_session
from qconvert.did_you_mean import did_you_mean
from qconvert.errors import InputError

CHUNK_SAMPLES = 32
METRICS = {"cosine": ">=", "min-cosine": ">=", "top1": ">=", "max-abs": "<=", "mean-abs": "<="}
_SPEC = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*(?::\s*(.+?))?\s*(>=|<=)\s*(\S+)\s*$")


@dataclass(frozen=True, slots=True)
class Condition:
    """One condition: a metric of one output (None: every float output), compared with a threshold."""

    metric: str
    output: str | None
    threshold: float

    @property
    def spelled(self) -> str:
        where = f":{self.output}" if self.output else ""
        return f"{self.metric}{where}{METRICS[self.metric]}{self.threshold:g}"

    def holds(self, value: float) -> bool:
        return value >= self.threshold if METRICS[self.metric] == ">=" else value <= self.threshold

    def loss(self, value: float) -> float:
        """How far `value` is from perfect (1 - value for `>=`, value for `<=`); inf when not finite."""
        if not math.isfinite(value):
            return math.inf
        return 1.0 - value if METRICS[self.metric] == ">=" else value

    def shortfall(self, value: float) -> float:
        """The loss over the loss allowed (<= 1 when the condition holds; inf when missed and no loss is
        allowed: cosine 1, max-abs 0)."""
        if not math.isfinite(value):
            return math.inf
        allowed, lost = (
            1.0 - self.threshold if METRICS[self.metric] == ">=" else self.threshold,
            self.loss(value),
        )
        if allowed <= 0:
            return 0.0 if lost <= 0 else math.inf
        return max(lost, 0.0) / allowed


def parse_condition(text: str) -> Condition:
    """`top1:logits>=0.99` -> Condition; InputError saying what is wrong."""
    found = _SPEC.match(text)
    if found is None:
        raise InputError(
            f"--target-metric {text!r}: expected METRIC[:OUTPUT]>=VALUE or <=VALUE (metrics: "
            f"{', '.join(f'{name} {way}' for name, way in METRICS.items())})"
        )
    metric, output, way, number = found.groups()
    if metric not in METRICS:
        raise InputError(
            f"--target-metric {text!r}: unknown metric {metric!r}{did_you_mean(metric, METRICS)} "
            f"(known: {', '.join(METRICS)})"
        )
    if way != METRICS[metric]:
        raise InputError(f"--target-metric {text!r}: {metric} is a target to reach with {METRICS[metric]}")
    try:
        threshold = float(number)
    except ValueError:
        raise InputError(f"--target-metric {text!r}: {number!r} is not a number") from None
    bounded = metric in ("cosine", "min-cosine", "top1")
    if not math.isfinite(threshold) or (bounded and not 0.0 < threshold <= 1.0) or threshold < 0:
        limits = "in (0, 1]" if bounded else "finite and >= 0"
        raise InputError(f"--target-metric {text!r}: the threshold must be {limits}")
    return Condition(metric, output, threshold)


def conditions_of(
    target_cosine: float | None, target_outputs: Sequence[str], target_metrics: Sequence[str | Condition]
) -> list[Condition]:
    """The conditions from `--target-cosine`, `--target-metric` (a condition naming no output: on
    `--target-output`'s outputs, else every float output)."""
    conditions = [c if isinstance(c, Condition) else parse_condition(c) for c in target_metrics]
    if target_cosine is not None:
        if not 0.0 < target_cosine <= 1.0:
            raise InputError(f"--target-cosine {target_cosine}: give a cosine in (0, 1]")
        conditions.append(Condition("cosine", None, float(target_cosine)))
    if target_outputs:  # a condition naming no output: on each of these
        conditions = [
            c if c.output else Condition(c.metric, output, c.threshold) for c in conditions for output in
            ([c.output] if c.output else target_outputs)
        ]  # fmt: skip
    if not conditions:
        raise InputError("the search needs --target-cosine X or --target-metric METRIC[:OUTPUT]>=VALUE")
    return conditions


@dataclass(frozen=True, slots=True)
class Measurement:
    """One candidate on the held-out samples: each condition's value, whether all hold, the shortfall."""

    values: tuple[float, ...]
    passed: bool
    shortfall: float


def _chunks(batches: Sequence[Mapping[str, np.ndarray]], limit: int) -> list[dict[str, np.ndarray]]:
    """Consecutive batches of one shape joined into runs of up to `limit` samples."""
    runs: list[list[Mapping[str, np.ndarray]]] = []
    for arrays in batches:
        last = runs[-1] if runs else None
        same = last is not None and all(
            np.shape(last[0][name])[1:] == np.shape(value)[1:] for name, value in arrays.items()
        )
        if last is not None and same and sum(_size(part) for part in last) + _size(arrays) <= limit:
            last.append(arrays)
        else:
            runs.append([arrays])
    return [
        {
            name: np.concatenate([part[name] for part in run]) if len(run) > 1 else run[0][name]
            for name in run[0]
        }
        for run in runs
    ]


def _size(arrays: Mapping[str, np.ndarray]) -> int:
    return len(next(iter(arrays.values()))) if arrays else 0


class HeldOut:
    """The held-out samples, the float model's outputs on them (computed once), and the conditions."""

    def __init__(
        self,
        float_model: str | bytes,
        batches: Sequence[Mapping[str, np.ndarray]],
        conditions: Sequence[Condition],
        batch_size: int | None = None,
        label: str = "the model",
    ) -> None:
        reference = onnxruntime_session(float_model)
        floating = [o.name for o in reference.get_outputs() if o.type in ("tensor(float)", "tensor(double)")]
        unknown = sorted({c.output for c in conditions if c.output is not None and c.output not in floating})
        if unknown:
            raise InputError(
                f"--target-output/--target-metric {', '.join(unknown)}: not a float output of the model "
                f"(its float outputs: {', '.join(floating) or 'none'})"
            )
        if not floating:
            outputs = ", ".join(f"{o.name} ({o.type})" for o in reference.get_outputs())
            flags = "/".join(
                dict.fromkeys(
                    "--target-cosine" if c.metric == "cosine" else "--target-metric" for c in conditions
                )
            )
            raise InputError(
                f"{flags or '--target-cosine'}: {label} has no float output to compare with the quantized "
                f"model's (its outputs: {outputs or 'none'})"
            )
        # Each condition on each output it names (None: every float output).
        self.pairs = [(index, c.output or name) for index, c in enumerate(conditions) for name in floating
                      if c.output in (None, name)]  # fmt: skip
        self.conditions = list(conditions)
        self.names = list(dict.fromkeys(name for _, name in self.pairs))
        fixed = batch_size is not None  # a fixed batch dim: the batches as they are
        self.runs = [dict(b) for b in batches] if fixed else _chunks(batches, CHUNK_SAMPLES)
        self.samples = sum(_size(arrays) for arrays in self.runs)
        self.expected = [reference.run(self.names, arrays) for arrays in self.runs]

    def subset(self, samples: int) -> HeldOut:
        """The first runs covering `samples` samples (a cheaper, noisier measurement)."""
        chosen = copy_of(self)
        count, taken = 0, 0
        while taken < len(self.runs) and count < samples:
            count += _size(self.runs[taken])
            taken += 1
        chosen.runs, chosen.expected, chosen.samples = self.runs[:taken], self.expected[:taken], count
        return chosen

    def measure(self, model: str | bytes) -> Measurement:
        """Run the candidate (a path or serialized bytes) on every held-out run and compare."""
        candidate = onnxruntime_session(model)
        got = [candidate.run(self.names, arrays) for arrays in self.runs]
        by_output: dict[str, tuple[list[np.ndarray], list[np.ndarray], list[int]]] = {
            name: ([], [], []) for name in self.names
        }
        for arrays, want, have in zip(self.runs, self.expected, got):
            for name, expected, actual in zip(self.names, want, have):
                by_output[name][0].append(np.asarray(expected))
                by_output[name][1].append(np.asarray(actual))
                by_output[name][2].append(_size(arrays))
        values = [-math.inf if METRICS[c.metric] == "<=" else math.inf for c in self.conditions]
        for index, name in self.pairs:
            value = _metric(self.conditions[index].metric, *by_output[name])
            pick = max if METRICS[self.conditions[index].metric] == "<=" else min
            values[index] = pick(values[index], value)
        passed = all(c.holds(v) for c, v in zip(self.conditions, values))
        shortfall = max(c.shortfall(v) for c, v in zip(self.conditions, values))
        return Measurement(tuple(values), passed, shortfall)


def copy_of(held: HeldOut) -> HeldOut:
    chosen = HeldOut.__new__(HeldOut)
    chosen.__dict__.update(held.__dict__)
    return chosen


def _metric(metric: str, expected: list[np.ndarray], actual: list[np.ndarray], sizes: list[int]) -> float:
    """One metric of one output over the held-out runs (NaN/Inf elements left out of cosines)."""
    from qconvert.calibrate.evaluate import sample_cosines

    if metric in ("cosine", "min-cosine"):
        cosines = np.concatenate(
            [
                sample_cosines(want, got, np.ndim(want) > 0 and len(want) == size)
                for want, got, size in zip(expected, actual, sizes)
            ]
        )
        cosines = cosines[np.isfinite(cosines)]
        if not cosines.size:
            return 0.0
        return float(cosines.mean() if metric == "cosine" else cosines.min())
    if metric == "top1":
        agree = [
            np.argmax(want.reshape(-1, want.shape[-1]), axis=1)
            == np.argmax(got.reshape(-1, got.shape[-1]), axis=1)
            for want, got in zip(expected, actual)
            if np.ndim(want) > 0 and want.shape[-1] > 0
        ]
        return float(np.concatenate(agree).mean()) if agree else 0.0
    errors = [np.abs(np.asarray(want, np.float64) - got).ravel() for want, got in zip(expected, actual)]
    joined = np.concatenate(errors) if errors else np.zeros(0)
    if not joined.size:
        return 0.0
    if not np.isfinite(joined).all():
        return math.inf
    return float(joined.max() if metric == "max-abs" else joined.mean())


__all__ = ["METRICS", "Condition", "HeldOut", "Measurement", "conditions_of", "parse_condition"]
