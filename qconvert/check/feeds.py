"""What `check` and `check --against` feed a model: its data (`--data`), arrays given, or seeded random
inputs, as lazy runs of one batch each (memory holds one batch)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
from onnx import ModelProto

from qconvert.calibrate.dataset import DatasetStats, DataSource, open_dataset
from qconvert.check.oracle import RANDOM_SEED, check_arrays, random_inputs


@dataclass(slots=True)
class Feed:
    """One run of the model: arrays by input name, and how many samples they hold."""

    arrays: dict[str, np.ndarray]
    samples: int


def model_feeds(
    header: ModelProto,
    inputs: DataSource | Mapping[str, np.ndarray] | None,
    max_samples: int | None,
    batch_size: int | None,
) -> tuple[Iterator[Feed], str, list[str]]:
    """The runs to feed, lazily, what to call their source, and the dataset's warnings (filled as read)."""
    notes: list[str] = []
    if inputs is None:
        arrays = random_inputs(header)
        return iter([Feed(arrays, samples_in(arrays))]), f"random (seed {RANDOM_SEED})", notes
    if isinstance(inputs, Mapping):
        arrays = {name: np.asarray(value) for name, value in inputs.items()}
        check_arrays(header, arrays)
        return iter([Feed(arrays, samples_in(arrays))]), "arrays given", notes
    dataset = open_dataset(inputs, header, batch_size)
    label = dataset.label if isinstance(inputs, (str, os.PathLike)) else "data given"

    def batches() -> Iterator[Feed]:
        stats = DatasetStats()
        used = 0
        for batch in dataset.batches(stats):
            if max_samples is not None and used >= max_samples:
                notes.append(f"--max-samples {max_samples}: the rest of {dataset.label} was not read")
                break
            arrays = batch.arrays
            size = batch.size
            if max_samples is not None and used + size > max_samples and not dataset.fixed_batch:
                size = max_samples - used
                arrays = {name: array[:size] for name, array in arrays.items()}
            used += size
            yield Feed(arrays, size)
        else:
            notes.extend(stats.warnings(dataset.batch_size))

    return batches(), label, notes


def samples_in(arrays: Mapping[str, np.ndarray]) -> int:
    """Samples in one run given as arrays: the first input's batch dim (1 for a scalar)."""
    first = next(iter(arrays.values()), None)
    return int(first.shape[0]) if first is not None and first.ndim else 1


__all__ = ["Feed", "model_feeds", "samples_in"]
