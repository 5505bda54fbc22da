"""How far two runs' values of one output are apart: the one measure verify/compare.py, verify/requant.py and the
conformance cases' reference check read (a leaf, so that compare and requant, which compare imports, share it)."""

from __future__ import annotations

import math

import numpy as np


def max_abs_error(reference, candidate) -> float:
    """max |reference - candidate| where equal infinities (a logit output masked with -inf in both), a logit masked
    with -inf against one masked with its type's lowest value (ONNX Runtime's Attention kernel writes lowest() in
    qk_matmul_output where the standard writes -inf) and NaN against NaN agree; NaN when NaN stands in one only."""
    ref, cand = np.asarray(reference), np.asarray(candidate)
    a, b = ref.astype(np.float64), cand.astype(np.float64)
    if a.shape != b.shape:
        return math.inf
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if (nan_a != nan_b).any():
        return math.nan
    same = (a == b) | nan_a | (_masked(a, ref.dtype) & _masked(b, cand.dtype))
    with np.errstate(invalid="ignore"):  # inf - inf where they agree: masked by `same`
        return float(np.max(np.where(same, 0.0, np.abs(a - b)), initial=0.0))


def worst_error(reference, candidate) -> float:
    """max_abs_error, with a NaN in one only as an infinite error: what a max over outputs or feeds keeps
    (Python's max(x, nan) is x, so a NaN would hide there)."""
    error = max_abs_error(reference, candidate)
    return math.inf if math.isnan(error) else error


def _masked(values: np.ndarray, dtype) -> np.ndarray:
    """Where `values` (of `dtype`) are -inf or the type's lowest finite value: a masked logit."""
    if not np.issubdtype(dtype, np.floating):
        return np.zeros(values.shape, bool)
    return values <= -float(np.finfo(dtype).max)
