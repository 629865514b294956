"""Post-training INT8 quantization: calibration (minmax, entropy, percentile, MSE), the calibration cache,
per-channel weight scales, simulated quantization with Q/DQ and the per-layer sensitivity search."""

from .cache import read_cache, write_cache
from .calibration import (
    CalibrationStatistics,
    CalibrationTable,
    TensorRange,
    calibrate,
    collect_histograms,
    load_calibration_data,
    table_from_histograms,
)
from .calibrators import CALIBRATORS
from .fingerprint import file_fingerprint, model_fingerprint
from .layers import QuantLayer, quantizable_layers
from .sensitivity import (
    COMPARED_CALIBRATORS,
    LayerSensitivity,
    MixedPrecisionResult,
    ResidualRounding,
    Target,
    best_calibrator,
    calibrator_label,
    layer_sensitivity,
    mixed_precision,
    residual_rounding,
)
from .simulate import InsertQDQ, simulate_quantized

__all__ = [
    "CALIBRATORS",
    "COMPARED_CALIBRATORS",
    "CalibrationStatistics",
    "CalibrationTable",
    "InsertQDQ",
    "LayerSensitivity",
    "MixedPrecisionResult",
    "QuantLayer",
    "ResidualRounding",
    "Target",
    "TensorRange",
    "best_calibrator",
    "calibrate",
    "calibrator_label",
    "collect_histograms",
    "file_fingerprint",
    "layer_sensitivity",
    "load_calibration_data",
    "mixed_precision",
    "model_fingerprint",
    "quantizable_layers",
    "read_cache",
    "residual_rounding",
    "simulate_quantized",
    "table_from_histograms",
    "write_cache",
]
