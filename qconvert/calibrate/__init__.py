"""Calibration: datasets, mergeable observers, `!quant.calibrated` ranges, finalize to `!quant.uniform`."""
