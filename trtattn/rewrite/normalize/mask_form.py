"""mask_form: exactly one masking op between the first MatMul and the Softmax.

What the exporters wrote between BMM1 and the Softmax (scales, several Adds, Where with various
fills, Swin's Reshape round trip) becomes one Where (boolean mask) or one Add (float mask or
bias). Masks are built once and shared by every site that had the same mask. A purely causal
(or sliding-window) mask is rebuilt as a comparison of Range indices, which is how TensorRT
recognises causality and skips the masked half.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ...graph.emit import Emitter, float_dtype
from ...match.logit_ops import fill_value, materialize
from ...site import AttentionSite, CausalKind, MaskKind
from ...site_names import site_scope

NEG_INF = float("-inf")


def _np_dtype(site: AttentionSite) -> np.dtype:
    return float_dtype(site.dtype)


def range_mask(graph: gs.Graph, site: AttentionSite, tensors: dict, prefix: str) -> gs.Tensor:
    """allowed[i, j] = j <= i + (Skv - Sq) [and j > i + (Skv - Sq) - window], from Range ops."""
    emit = Emitter(graph, prefix)
    q, kt = tensors[site.query], tensors[site.key_transposed]
    rank = site.rank
    sq, skv = emit.dim(q, rank - 2), emit.dim(kt, rank - 1)
    zero, one = emit.const(0, np.int64), emit.const(1, np.int64)
    qi = emit("Range", [zero, sq, one], dtype=np.int64, name="q_index")
    ki = emit("Range", [zero, skv, one], dtype=np.int64, name="k_index")
    if site.causal == CausalKind.LOWER_RIGHT:
        qi = emit("Add", [qi, emit("Sub", [skv, sq], dtype=np.int64)], dtype=np.int64, name="q_offset")
    qi = emit("Unsqueeze", [qi, emit.const([1], np.int64)], dtype=np.int64)
    ki = emit("Unsqueeze", [ki, emit.const([0], np.int64)], dtype=np.int64)
    allowed = emit("LessOrEqual", [ki, qi], dtype=np.bool_, name="causal")
    if site.window:
        low = emit("Sub", [qi, emit.const(site.window, np.int64)], dtype=np.int64)
        allowed = emit("And", [allowed, emit("Greater", [ki, low], dtype=np.bool_)], dtype=np.bool_, name="window")
    return allowed


class MaskCache:
    """Masks built once per distinct recipe, shared by every site that uses them."""

    def __init__(self):
        self.built: dict[tuple, tuple[gs.Tensor | None, MaskKind]] = {}


def masked_logits(graph: gs.Graph, tensors: dict, site: AttentionSite, meaning, logits: gs.Tensor,
                  cache: MaskCache, score_shape: gs.Tensor | None = None) -> tuple[gs.Tensor, str]:
    """logits -> (one Where or Add) -> [Cast]: returns (softmax input, description)."""
    emit = Emitter(graph, site_scope(site.name, "mask_form"))
    dtype = _np_dtype(site)
    pure = meaning is not None and meaning.pattern in ("causal", "window") and not meaning.padding and not meaning.bias
    if pure and site.causal != CausalKind.NONE:
        key: tuple = ("range", site.causal, site.window, site.rank)
        if key not in cache.built:
            cache.built[key] = (range_mask(graph, site, tensors, f"trtattn/masks/{len(cache.built)}"), MaskKind.BOOLEAN)
        mask, kind = cache.built[key]
        fill = NEG_INF
        desc = "causal (Range comparison)" + (f", window {site.window}" if site.window else "")
    else:
        steps = tuple(site.mask_steps)
        key = tuple((s.op, s.operand, s.value) for s in steps) + (str(dtype),)
        if key not in cache.built:
            cache.built[key] = materialize(graph, tensors, steps, f"trtattn/masks/{len(cache.built)}", dtype, score_shape)
        mask, kind = cache.built[key]
        found = fill_value(steps)
        fill = found if found is not None else float(np.finfo(dtype).min)
        desc = {MaskKind.NONE: "none", MaskKind.BOOLEAN: "Where (boolean)", MaskKind.ADDITIVE: "Add (float)"}[kind]
    if mask is None:
        out = logits
    elif kind == MaskKind.BOOLEAN:
        out = emit("Where", [mask, logits, emit.const(fill, dtype)], dtype=dtype, name="where_mask")
    else:
        out = emit("Add", [logits, mask], dtype=dtype, name="add_mask")
    if site.logits_cast is not None:
        out = emit("Cast", [out], {"to": site.logits_cast}, name="softmax_precision")
    return out, desc
