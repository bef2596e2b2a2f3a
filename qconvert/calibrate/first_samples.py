"""The outlier-channel float run (channel_spread.py), read off calibration's own pass instead of run again.

NOTE: `channel_spread.float_run` runs the float model once more, in a session of its own, on the first
whole batches covering `OUTLIER_SAMPLES` samples, for two things: each activation's per-channel absmax
(its spread) and the graph outputs (the float reference of the default comparison, evaluate.py). With one
worker in this process, calibration's pass has already run the same model (optimizations off, as that
run's session) on the same batches, with every activation exposed: `FirstSamples` takes both from it
(workers.FirstBatches: the graph outputs fetched beside the observed tensors on those batches, each
tensor's channel maxima taken on the observers' threads). No second session (its copy of the weights)
and no second run: on the real all-MiniLM-L6-v2, 0.4-0.5 s and ~0.3 GB of peak less. The result is the
`FloatRun` float_run gives (same batches, same per-channel maxima: max is exact in any order), with
spreads for every observed activation (the caller picks its candidates among them). Other engines
(`--workers N`, Ray) leave it unread (`complete` False): the caller then runs float_run.
The channel maxima of a finite float32 tensor on its last axis take two reductions (`last_axis_maxima`)
instead of channel_maxima's |x| and finite-mask copies: 4-5x less CPU, the same values.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np

from qconvert.calibrate.channel_spread import (
    OUTLIER_SAMPLES,
    ChannelSpread,
    FloatRun,
    channel_first_tensors,
    channel_maxima,
    spread_of,
)

if TYPE_CHECKING:
    from onnx import ModelProto


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


class FirstSamples:
    """workers.FirstBatches for the outlier-channel statistics: `float_run()` once the pass is done."""

    def __init__(self, model: ModelProto, samples: int = OUTLIER_SAMPLES) -> None:
        self.samples = samples
        self.outputs = tuple(output.name for output in model.graph.output)
        self.channel_first = channel_first_tensors(model)
        self.run = FloatRun()
        self.maxima: dict[str, np.ndarray] = {}
        self.axes: dict[str, int] = {}
        self.covered = 0  # samples of the batches read

    def add_outputs(self, size: int, outputs: dict[str, np.ndarray]) -> None:
        self.run.batch_sizes.append(size)
        self.run.outputs.append(dict(outputs))
        self.covered += size

    def add_tensor(self, name: str, values: np.ndarray) -> None:
        """One batch of one tensor (one thread per tensor at a time): its channel maxima folded in."""
        axis = 1 if name in self.channel_first and np.ndim(values) >= 3 else -1
        found = last_axis_maxima(values, axis)
        if found is None:
            return
        previous = self.maxima.get(name)
        if previous is None or previous.shape != found.shape or self.axes[name] != axis:
            self.maxima[name], self.axes[name] = found, axis
        else:
            np.maximum(previous, found, out=previous)

    @property
    def complete(self) -> bool:
        """Whether the pass read its batches (the data may hold fewer samples than `samples`)."""
        return bool(self.run.batch_sizes)

    def float_run(self, tensors: Collection[str]) -> FloatRun:
        """The run's graph outputs and the spreads of `tensors` (in their order), as float_run gives."""
        for name in tensors:
            found = self.maxima.get(name)
            measured = None if found is None else spread_of(found)
            if measured is not None:
                self.run.spreads[name] = ChannelSpread(name, measured[0], measured[1], self.axes[name])
        return self.run


__all__ = ["FirstSamples", "last_axis_maxima"]
