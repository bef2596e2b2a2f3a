"""weight_params_per_channel (one reduction for all channels) is each slice's weight_params, bit for bit."""

from __future__ import annotations

import itertools

import numpy as np

from qconvert.numerics import calibration as cal


def test_every_channel_is_its_slice_alone() -> None:
    rng = np.random.default_rng(11)
    weight = rng.standard_normal((6, 5, 3, 4)).astype(np.float32)
    weight[1] = 0.0  # an all-zero channel (scale 1, zero point 0)
    weight[2] = 1e-30  # a scale below the smallest normal
    weight[3, 0, 0, 0] = -0.0
    weight[4] = np.abs(weight[4])  # one-sided: the range takes zero in
    options = itertools.product(
        (weight, weight.astype(np.float16)),
        (0, 1, 3, -1),
        ("int8", "uint8", "int16", "int4"),
        (False, True),  # symmetric
        (False, True),  # reduce_range
        (None, 0.01),  # min_real_range
    )
    for data, axis, quant_type, symmetric, reduce_range, min_real_range in options:
        scales, zero_points = cal.weight_params_per_channel(
            data, axis, quant_type, symmetric, reduce_range, min_real_range
        )
        slices = [
            cal.weight_params(data.take(i, axis).ravel(), quant_type, symmetric, reduce_range, min_real_range)
            for i in range(data.shape[axis])
        ]
        expected = np.array([pair.scale for pair in slices], dtype=np.asarray(slices[0].scale).dtype)
        assert scales.dtype == expected.dtype and scales.tobytes() == expected.tobytes()
        assert zero_points.dtype == np.int64
        assert zero_points.tolist() == [pair.zero_point for pair in slices]
