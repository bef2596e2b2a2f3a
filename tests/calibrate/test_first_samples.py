"""The outlier-channel float run read off calibration's own pass (qconvert/calibrate/first_samples.py)."""

from __future__ import annotations

import numpy as np
from calibrate.test_channel_spread import _outlier_model

from qconvert.calibrate.channel_spread import OUTLIER_SPREAD, channel_maxima, float_run, last_axis_maxima
from qconvert.calibrate.collect import (
    augment_model,
    calibration_tensors,
    collect_passes,
    load_float_model,
)
from qconvert.calibrate.dataset import open_dataset
from qconvert.calibrate.first_samples import FirstSamples
from qconvert.calibrate.observers import MinMaxObserver


def _pass(loaded, data_path, tensors, first, workers=1):
    augmented = augment_model(loaded, tensors)
    dataset = open_dataset(data_path, loaded.model, 8)
    fresh = [lambda previous: {name: [MinMaxObserver()] for name in tensors}]
    return collect_passes(augmented, dataset, fresh, workers=workers, first=first)


def test_the_pass_gives_what_a_float_run_of_its_own_gives(tmp_path) -> None:
    model_path, data_path = _outlier_model(tmp_path)
    loaded = load_float_model(model_path)
    tensors = list(calibration_tensors(loaded.model))
    first = FirstSamples(loaded.model, samples=20)  # whole batches of 8: the first 3
    results = _pass(loaded, data_path, tensors, first)
    assert results[0].stats.samples_used == 64  # the pass itself still observes every batch
    assert first.complete
    read = first.float_run(tensors)
    ran = float_run(loaded, tensors, open_dataset(data_path, loaded.model, 8), samples=20)
    assert read.batch_sizes == ran.batch_sizes == [8, 8, 8]
    for mine, theirs in zip(read.outputs, ran.outputs, strict=True):
        assert mine.keys() == theirs.keys() == {"y"}
        assert all(np.array_equal(mine[name], theirs[name]) for name in mine)
    assert read.spreads == ran.spreads
    assert read.spreads["hidden"].spread >= OUTLIER_SPREAD and read.spreads["hidden"].channel == 7


def test_worker_processes_leave_it_unread(tmp_path) -> None:
    model_path, data_path = _outlier_model(tmp_path)
    loaded = load_float_model(model_path)
    tensors = list(calibration_tensors(loaded.model))
    first = FirstSamples(loaded.model)
    _pass(loaded, data_path, tensors, first, workers=2)
    assert not first.complete  # the caller then runs channel_spread.float_run


def test_last_axis_maxima_are_channel_maxima() -> None:
    rng = np.random.default_rng(4)
    values = rng.standard_normal((4, 6, 32)).astype(np.float32)
    values[..., 3] = -0.0  # a channel of negative zeros: 0.0, as |x| gives
    values[1, 2, 5] = -70.0
    cases = [values, values[..., ::2], np.moveaxis(values, -1, 1), values.astype(np.float16)]
    inf, nan = values.copy(), values.copy()
    inf[0, 0, 9], nan[2, 1, 4] = np.inf, np.nan
    for case in [*cases, inf, nan]:
        for axis in (-1, 1):
            expected = channel_maxima(case, axis)
            assert expected is not None
            got = last_axis_maxima(case, axis)
            assert got is not None and got.dtype == expected.dtype
            assert np.array_equal(got, expected) and not np.signbit(got).any()
    assert last_axis_maxima(np.ones(5, np.float32), -1) is None
