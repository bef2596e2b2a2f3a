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
Both fold the maxima with channel_spread.ChannelMaximaByTensor.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import numpy as np

from qconvert.calibrate.channel_spread import OUTLIER_SAMPLES, ChannelMaximaByTensor, FloatRun

if TYPE_CHECKING:
    from onnx import ModelProto


class FirstSamples:
    """workers.FirstBatches for the outlier-channel statistics: `float_run()` once the pass is done."""

    def __init__(self, model: ModelProto, samples: int = OUTLIER_SAMPLES) -> None:
        self.samples = samples
        self.outputs = tuple(output.name for output in model.graph.output)
        self.run = FloatRun()
        self.maxima = ChannelMaximaByTensor(model)
        self.covered = 0  # samples of the batches read

    def add_outputs(self, size: int, outputs: dict[str, np.ndarray]) -> None:
        self.run.batch_sizes.append(size)
        self.run.outputs.append(dict(outputs))
        self.covered += size

    def add_tensor(self, name: str, values: np.ndarray) -> None:
        """One batch of one tensor (one thread per tensor at a time): its channel maxima folded in."""
        self.maxima.fold(name, values)

    @property
    def complete(self) -> bool:
        """Whether the pass read its batches (the data may hold fewer samples than `samples`)."""
        return bool(self.run.batch_sizes)

    def float_run(self, tensors: Collection[str]) -> FloatRun:
        """The run's graph outputs and the spreads of `tensors` (in their order), as float_run gives."""
        self.run.spreads.update(self.maxima.spreads(tensors))
        return self.run


__all__ = ["FirstSamples"]
