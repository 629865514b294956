"""Post-training INT8 quantization: calibration (minmax, entropy, percentile, MSE), the calibration cache,
per-channel weight scales, simulated quantization with Q/DQ and the per-layer sensitivity search."""
