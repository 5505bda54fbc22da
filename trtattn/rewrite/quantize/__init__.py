"""quantize: FP8 / INT8 post-training quantization by NVIDIA ModelOpt, checked site by site.

    result = quantize(model, "fp8", load_calibration("calib.npz"))
    result.model            # Q/DQ model (ModelOpt's explicit quantization, opset >= 19)
    result.sites            # one SiteQuant per attention: its Q/DQ scales, or why there are none

calibration.py  the calibration arrays (ModelOpt's convention: samples along axis 0), checked
ptq.py          ModelOpt's ONNX PTQ on CPU, configured for TensorRT's fused FP8/INT8 attention
sites.py        where the Q/DQ landed around each attention's MatMuls and Softmax
reasons.py      why ModelOpt placed none, from its debug log (the one reader of its wording)
accuracy.py     the quantized model against the fp32 original through Polygraphy's Comparator
"""

from .accuracy import compare, quantize_checked
from .calibration import CalibrationError, check_calibration, load_calibration, stack_feeds
from .ptq import HIGH_PRECISION, SELECTIONS, QuantAccuracy, QuantizationError, QuantizeResult, QuantSummary, quantize
from .ptq import _modelopt as _modelopt  # not public: the tests ask it whether ModelOpt's ONNX quantization imports
from .sites import MODES, QDQ_DTYPES, QUANT_COLUMNS, SiteQuant

__all__ = ["quantize", "quantize_checked", "compare", "load_calibration", "check_calibration", "stack_feeds",
           "QuantizeResult", "QuantSummary", "QuantAccuracy", "SiteQuant", "CalibrationError", "QuantizationError",
           "QUANT_COLUMNS",
           "MODES", "QDQ_DTYPES", "HIGH_PRECISION", "SELECTIONS"]
