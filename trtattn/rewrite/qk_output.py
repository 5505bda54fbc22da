"""The fused Attention op's fourth output, qk_matmul_output: the logits or probabilities the model returns, in the
mode the matcher read from where they stand (match/returned.py), made by the op instead of beside it."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ..graph.emit import Emitter
from ..site import AttentionSite
from .layout import Dims, convert


def qk_output(emit: Emitter, attention: gs.Node, tensors: dict, site: AttentionSite, dims: Dims, dtype):
    """The site's returned tensor as the op's own qk_matmul_output ([batch, heads, q, k] in the op's precision), in
    the tensor's frame and type; None when the site returns none."""
    if site.qk_output is None or site.layout is None:
        return None
    qk = gs.Variable(f"{attention.name}_qk_matmul_output", dtype=dtype)
    attention.outputs += [gs.Variable.empty(), gs.Variable.empty(), qk]
    lay, target = site.layout, tensors[site.qk_output]
    for kv in attention.inputs[1:3]:  # a graph input or output keeps the shape the model declares
        if kv.inputs and not any(kv is t for t in emit.graph.outputs):
            _static_key_length(kv, lay.dims, dtype)
    out = convert(emit, qk, lay.scores, lay.qk, dims)
    want = target.dtype if target.dtype is not None else lay.qk_dtype
    return emit.cast(out, want) if want is not None else out


def _static_key_length(key: gs.Tensor, recipes: tuple, dtype) -> None:
    """ONNX's shape inference of Attention gives qk_matmul_output a key length of 0 where it does not know K's and
    V's (onnx 1.23), which a model declaring that length fails under strict inference: where the key length is static
    (match/find.py: _dims), the op's K (and V) say so."""
    length = next((r[1] for g, r in recipes if tuple(g) == ("k",) and r[0] == "static"), None)
    shape = list(key.shape) if key.shape is not None and len(key.shape) == 4 else [None] * 4
    if isinstance(length, int) and not isinstance(shape[2], int):
        shape[2] = length
        key.shape, key.dtype = shape, key.dtype or dtype  # K and V have the op's type (T1)
