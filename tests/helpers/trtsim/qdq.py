"""IQuantizeLayer / IDequantizeLayer in numpy: per-tensor, per-axis and block scales, symmetric (NvInfer.h)."""

from __future__ import annotations

import numpy as np

from . import dtypes
from .errors import ExecutionError, NotEmulatedError


def _expand_scale(st, scale: np.ndarray, shape) -> np.ndarray:
    """Per-tensor (scalar), per-axis (1-D along `axis`) or block (same rank, repeated per block)."""
    scale = scale.astype(np.float64)
    if scale.size == 1:
        return scale.reshape(())
    if scale.ndim == 1:
        axis = st.props.get("axis")
        if axis is None:
            raise NotEmulatedError(f"{st.kind} '{st.name}': a 1-D scale needs the `axis` property set")
        view = [1] * len(shape)
        view[axis] = scale.size
        return scale.reshape(view)
    if scale.ndim == len(shape):
        for d, (n, s) in enumerate(zip(shape, scale.shape)):
            if s != n:
                scale = np.repeat(scale, n // s, axis=d)
        return scale
    raise ExecutionError(f"{st.kind} '{st.name}': scale of shape {scale.shape} does not fit input {tuple(shape)}")


# IQuantizeLayer: output = clamp(round(input / scale)), ties to even; clamp ranges from NvInfer.h.
QUANT_RANGE = {"INT8": (-128, 127, True), "FP8": (-448, 448, False), "INT4": (-8, 7, True), "FP4": (-6, 6, False)}


def quantize(x: np.ndarray, scale: np.ndarray, to_type: str) -> np.ndarray:
    lo, hi, integer = QUANT_RANGE[to_type]
    y = x.astype(np.float64) / scale
    if integer:
        y = np.rint(y)
    return np.clip(y, lo, hi).astype(dtypes.NUMPY[to_type])


def quantize_layer(st, inputs, real):
    x, scale = inputs[0], inputs[1]
    if len(inputs) > 2 and inputs[2] is not None and np.any(inputs[2].astype(np.float64) != 0):
        raise ExecutionError(f"IQuantizeLayer '{st.name}': only zero zero-points are supported (symmetric quantization)")
    return [quantize(x, _expand_scale(st, scale, x.shape), st.props["to_type"].name)]


def dequantize_layer(st, inputs, real):
    x, scale = inputs[0], inputs[1]
    y = x.astype(np.float64) * _expand_scale(st, scale, x.shape)
    return [y.astype(dtypes.to_numpy(st.props["to_type"]))]


# --------------------------------------------------------------------------- attention
