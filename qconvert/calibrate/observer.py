"""The observer contract every calibration statistic follows: observe a batch, merge a partial result.

NOTE: an observer sees one tensor, one batch at a time, reduces it and keeps only the reduction, so
memory does not grow with the dataset. `merge` must make observing A then merging B's observer equal
observing A and B (bit for bit for exact statistics), so work splits across processes or a Ray
cluster. Observers are plain picklable objects (workers send them back to the parent).
"""

from __future__ import annotations

from typing import Protocol, Self

import numpy as np


class Observer(Protocol):
    def observe(self, values: np.ndarray) -> None:
        """Fold one batch of one tensor (any shape, float) into the statistic."""

    def merge(self, other: Self) -> None:
        """Fold another observer of the same tensor and kind, built on disjoint data, into this one."""
