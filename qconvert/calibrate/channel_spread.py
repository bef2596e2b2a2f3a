"""Outlier channels: activations whose largest channel dwarfs the others, widened to int16 by default.

NOTE: why and how. A transformer's residual stream and FFN output carry a few "massive" channels (the
real all-MiniLM-L6-v2: channel 99, ~200 against a median channel of ~1); an 8-bit scale that covers them
leaves the other channels two or three levels, and the sentence embedding's cosine falls to ~0.8. These
tensors are found cheaply, without a model run per candidate:
1. after the ranges are collected, one float run of the model on the first whole batches covering
   `OUTLIER_SAMPLES` calibration samples, exposing the activations that will be quantized (in the parent
   process: the decision is the same whatever `--workers` / `--executor`);
2. each tensor reduced to its per-channel absmax over those samples. The channel axis is the last one,
   except for tensors of rank >= 3 in a convolution's layout (NCHW: axis 1): the inputs and outputs of
   Conv-family ops (`CHANNEL_FIRST_OPS`) and what elementwise ops carry between them at the same rank;
3. spread = largest channel / median channel (channels that are all zero left out: a dead ReLU channel
   is exact at any scale; fewer than `MIN_CHANNELS` channels: no spread);
4. tensors with spread >= `OUTLIER_SPREAD` are widened to int16 symmetric (zero point 0, as TOSA's int16
   profile wants), largest spread first, at most `OUTLIER_SHARE` of the quantized activations (at least
   one; the sentinel guard's outliers, a cluster far from the rest, come first and count in that share).
The threshold was measured: on the real MiniLM the 18 FFN tensors (spread 27..208) lead, then the GELU
outputs (18.5-25) and the LayerNorm outputs (15-17); the CNN and speech models we have stay under 8. At 32 a
residual sum at 27x on other rows stayed 8-bit (held-out mean cosine 0.960); at 16 the cap, not the
threshold, decides on MiniLM (0.969-0.984 on two row sets, against 0.79 with nothing widened).
The float run's graph outputs are kept (`FloatRun.outputs`) for the comparison with the QDQ model
(`evaluate.py`), which then runs only the QDQ model on those batches.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from onnx import ModelProto

    from qconvert.calibrate.dataset import Dataset
    from qconvert.frontends.onnx.load import LoadedModel

OUTLIER_SPREAD = 16.0  # largest / median channel absmax from which a tensor is widened
OUTLIER_SAMPLES = 32  # the float run: the first whole batches covering this many calibration samples
OUTLIER_SHARE = 0.10  # at most this share of the quantized activations is widened
MIN_CHANNELS = 8  # fewer channels than this: no spread (a median of 3 values says little)
OUTLIER_POLICIES = ("widen", "off")

# Ops whose rank >= 3 inputs and outputs are channel-first (NCHW, NCW, NCDHW).
CHANNEL_FIRST_OPS = frozenset(
    {
        "Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool",
        "BatchNormalization", "InstanceNormalization", "Resize", "DepthToSpace", "SpaceToDepth",
    }
)  # fmt: skip
# Ops that keep their input's layout in their output (at the same rank): the channel axis carries through.
LAYOUT_PRESERVING_OPS = frozenset(
    {
        "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu",
        "Softplus", "Mish", "Gelu", "Erf", "Exp", "Neg", "Abs", "Sqrt", "Add", "Sub", "Mul", "Div", "Sum",
        "Max", "Min", "Mean", "Identity", "Dropout", "Cast", "Concat", "Pad", "Slice", "Split", "Where",
        "QuickGelu",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ChannelSpread:
    """One tensor's largest channel absmax over its median one, and where the largest is."""

    tensor: str
    spread: float
    channel: int
    axis: int  # the channel axis as measured (1 or -1)

    @property
    def note(self) -> str:
        return f"outlier channels: spread {self.spread:.0f}x (channel {self.channel})"


@dataclass
class FloatRun:
    """The float model's graph outputs per batch of the run (for `evaluate`), and each tensor's spread."""

    batch_sizes: list[int] = field(default_factory=list)
    outputs: list[dict[str, np.ndarray]] = field(default_factory=list)
    spreads: dict[str, ChannelSpread] = field(default_factory=dict)


def keep_own_copies(run: FloatRun) -> None:
    """The run's outputs as arrays of their own: an array onnxruntime returned keeps its session's memory
    arena alive (on the real MiniLM ~230 MB more at the peak, through finalize)."""
    run.outputs[:] = [{name: np.array(values, copy=True) for name, values in o.items()} for o in run.outputs]


def channel_first_tensors(model: ModelProto) -> set[str]:
    """Tensors in a convolution's layout: rank >= 3 inputs/outputs of `CHANNEL_FIRST_OPS`, and the
    same-rank inputs/outputs of layout-preserving ops joined to them (to a fixed point)."""
    ranks = _ranks(model)
    marked = {
        name
        for node in model.graph.node
        if node.op_type in CHANNEL_FIRST_OPS
        for name in (*node.input[:1], *node.output[:1])
        if ranks.get(name, 0) >= 3
    }
    joined = [
        [name for name in (*node.input, *node.output) if name and ranks.get(name, 0) >= 3]
        for node in model.graph.node
        if node.op_type in LAYOUT_PRESERVING_OPS
    ]
    changed = True
    while changed:
        changed = False
        for names in joined:
            rank_of_marked = {ranks[name] for name in names if name in marked}
            for name in names:
                if name not in marked and ranks[name] in rank_of_marked:
                    marked.add(name)
                    changed = True
    return marked


def _ranks(model: ModelProto) -> dict[str, int]:
    graph = model.graph
    ranks = {}
    for info in (*graph.value_info, *graph.input, *graph.output):
        kind = info.type
        if kind.HasField("tensor_type") and kind.tensor_type.HasField("shape"):
            ranks[info.name] = len(kind.tensor_type.shape.dim)
    return ranks


def channel_maxima(values: np.ndarray, axis: int) -> np.ndarray | None:
    """Per-channel max |x| over the finite values (channels on `axis`), or None for a scalar/vector."""
    array = np.asarray(values)
    if array.ndim < 2 or not np.issubdtype(array.dtype, np.floating) or array.size == 0:
        return None
    moved = np.moveaxis(array, axis, -1).reshape(-1, array.shape[axis])
    magnitudes = np.abs(moved)
    magnitudes = np.where(np.isfinite(magnitudes), magnitudes, 0.0)
    return magnitudes.max(axis=0).astype(np.float64)


def last_axis_maxima(values: np.ndarray, axis: int) -> np.ndarray | None:
    """`channel_maxima(values, axis)`, the same array: for a C-contiguous float32 tensor with channels on
    the last axis and every value finite, max(max x, -min x) per channel (= max |x|; `+ 0` turns a -0.0
    into channel_maxima's 0.0); anything else goes to channel_maxima itself."""
    array = np.asarray(values)
    last = axis in (-1, array.ndim - 1)
    if not last or array.ndim < 2 or array.size == 0 or array.dtype != np.float32:
        return channel_maxima(values, axis)
    if not array.flags.c_contiguous:
        return channel_maxima(values, axis)
    rows = array.reshape(-1, array.shape[-1])
    high, low = rows.max(axis=0), rows.min(axis=0)
    if not (np.isfinite(high).all() and np.isfinite(low).all()):  # NaN or Inf somewhere: the slow path
        return channel_maxima(values, axis)
    return (np.maximum(high, -low) + np.float32(0)).astype(np.float64)


def spread_of(maxima: np.ndarray) -> tuple[float, int] | None:
    """(largest / median over the non-zero channels, the largest channel), or None (too few channels)."""
    live = maxima[maxima > 0]
    if maxima.size < MIN_CHANNELS or live.size < MIN_CHANNELS:
        return None
    return float(live.max() / np.median(live)), int(np.argmax(maxima))


class ChannelMaximaByTensor:
    """Each tensor's per-channel max |x| over the batches folded in (channel axis: 1 for a convolution's
    layout, else the last), and the spreads they give."""

    def __init__(self, model: ModelProto) -> None:
        self.channel_first = channel_first_tensors(model)
        self.maxima: dict[str, np.ndarray] = {}
        self.axes: dict[str, int] = {}

    def fold(self, name: str, values: np.ndarray) -> None:
        """One batch of one tensor (one thread per tensor at a time)."""
        axis = 1 if name in self.channel_first and np.ndim(values) >= 3 else -1
        found = last_axis_maxima(values, axis)
        if found is None:
            return
        previous = self.maxima.get(name)
        if previous is None or previous.shape != found.shape or self.axes[name] != axis:
            self.maxima[name], self.axes[name] = found, axis
        else:
            np.maximum(previous, found, out=previous)

    def spreads(self, tensors: Collection[str]) -> dict[str, ChannelSpread]:
        """The spreads of `tensors` that have one, in their order."""
        spreads: dict[str, ChannelSpread] = {}
        for name in tensors:
            found = self.maxima.get(name)
            measured = None if found is None else spread_of(found)
            if measured is not None:
                spreads[name] = ChannelSpread(name, measured[0], measured[1], self.axes[name])
        return spreads


def float_run(
    loaded: LoadedModel,
    tensors: Sequence[str],
    dataset: Dataset,
    samples: int = OUTLIER_SAMPLES,
) -> FloatRun:
    """One run of the float model on the first whole batches covering `samples`, exposing `tensors`:
    their spreads, and the graph outputs per batch."""
    from qconvert.calibrate.collect import augment_model, make_session

    graph_outputs = [output.name for output in loaded.model.graph.output]
    session = make_session(augment_model(loaded, list(tensors)), threads=0)
    names = [*graph_outputs, *(name for name in tensors if name not in graph_outputs)]
    maxima = ChannelMaximaByTensor(loaded.model)
    run = FloatRun()
    done = 0
    for batch in dataset.batches():
        if done >= samples:
            break
        results = dict(zip(names, session.run(names, batch.arrays)))
        run.batch_sizes.append(batch.size)
        run.outputs.append({name: np.array(results[name], copy=True) for name in graph_outputs})
        for name in tensors:
            maxima.fold(name, results[name])
        results.clear()  # else the next run's outputs are allocated before these are released
        done += batch.size
    run.spreads.update(maxima.spreads(maxima.maxima))
    return run


def choose_widened(
    spreads: Mapping[str, ChannelSpread],
    candidates: Collection[str],
    quantized: int,
    already: int = 0,
    threshold: float = OUTLIER_SPREAD,
    share: float = OUTLIER_SHARE,
) -> list[ChannelSpread]:
    """The `candidates` with spread >= threshold, largest first, at most share * quantized in all (at
    least one: a small model's one outlier tensor is widened), `already` of them the guard's outliers."""
    room = max(0, max(1, math.floor(share * quantized + 1e-9)) - already)
    found = [spreads[name] for name in candidates if name in spreads and spreads[name].spread >= threshold]
    return sorted(found, key=lambda item: (-item.spread, item.tensor))[:room]


def check_policy(policy: str) -> str:
    from qconvert.did_you_mean import did_you_mean
    from qconvert.errors import InputError

    if policy not in OUTLIER_POLICIES:
        raise InputError(
            f"--outlier-channels {policy}: expected one of {', '.join(OUTLIER_POLICIES)}"
            + did_you_mean(str(policy), OUTLIER_POLICIES)
        )
    return policy


__all__ = [
    "CHANNEL_FIRST_OPS",
    "MIN_CHANNELS",
    "OUTLIER_POLICIES",
    "OUTLIER_SAMPLES",
    "OUTLIER_SHARE",
    "OUTLIER_SPREAD",
    "ChannelSpread",
    "FloatRun",
    "channel_first_tensors",
    "ChannelMaximaByTensor",
    "channel_maxima",
    "check_policy",
    "choose_widened",
    "float_run",
    "keep_own_copies",
    "last_axis_maxima",
    "spread_of",
]
