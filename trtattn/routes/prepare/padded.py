"""padded form: where a site's mask is causal (or nothing) plus padding, IAttention gets a causal kind and
per-row key/value lengths instead of a dense mask, so the fused kernel can skip what is masked.

The lengths are the padding mask's row sums, so the padding mask is read as right padding (each row's
valid tokens first): the form says exactly that in ONNX, a boolean mask built from the lengths, which ONNX
Runtime verifies against the original; the engine does the same through IAttention's key_value_lengths
and causal kind (lowering.py). Sites whose padding mask is declared left-padded or True at padding,
or whose mask depends on anything else, keep their dense mask. The form model records the inputs it reads as lengths
(metadata `trtattn.form`), so that runtimes refuse a left-padded mask instead of answering wrongly.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...graph.dependence import value_inputs
from ...graph.emit import Emitter
from ...graph.shapes import tensor_types
from ...site import CacheKind
from .lowering import AttentionLowering
from .mask_axes import key_flag_masks


def right_padded_masks(model: onnx.ModelProto) -> set[str]:
    """The [batch, seq] padding-mask inputs that may be read as lengths: 1 = a token, right-padded."""
    from ...graph.roles import RoleKind, input_specs

    return {s.name for s in input_specs(model) if s.kind is RoleKind.PADDING_MASK and not s.left_padded
            and not s.true_at_padding and len(s.shape) == 2}


def lengths_of(emit: Emitter, mask: gs.Tensor) -> gs.Tensor:
    """[B] int64: a right-padded mask's row sums, named after it (what the plan and the sidecar show)."""
    lengths = emit("ReduceSum", [emit.cast(mask, np.int64), emit.const([1], np.int64)], {"keepdims": 0},
                   dtype=np.int64, name="lengths")
    lengths.name = f"{mask.name}/lengths"
    return lengths


def padding_to_lengths(graph: gs.Graph, model: onnx.ModelProto, reports, dims=None
                       ) -> tuple[list[AttentionLowering], list[str], list[str]]:
    """Rewrite the masks of the sites that qualify (see module doc). Returns their lowerings, the
    padding-mask inputs now read as lengths, and notes naming the sites whose 2-D mask input is, by its
    axes, a general mask (mask_axes.py): IAttention takes that as its mask."""
    right_padded = right_padded_masks(model)
    ranks = {name: len(shape) for name, (_, shape) in tensor_types(model).items() if shape is not None}
    inputs = {t.name for t in graph.inputs}
    nodes = {n.name: n for n in graph.nodes}
    candidates: dict[str, str] = {}  # Attention node -> the 2-D mask input its mask's values come from
    for r in reports:
        site, attn = r.site, nodes.get(r.attention_node)
        if attn is None or attn.op != "Attention":  # written out in TensorRT's implicit form (implicit.py)
            continue
        if not (r.padding and r.pattern in ("none", "causal") and not r.bias and not site.window
                and site.cache == CacheKind.NONE and len(attn.inputs) > 3 and attn.inputs[3].name
                and not attn.attrs.get("is_causal", 0)):
            continue
        q, k = attn.inputs[0], attn.inputs[1]
        if ranks.get(q.name) != 4 or ranks.get(k.name) != 4:
            continue
        sources = value_inputs(attn.inputs[3], inputs)
        if len(sources) == 1 and sources <= right_padded:
            candidates[attn.name] = next(iter(sources))
    key_flags = key_flag_masks(graph, model, candidates, dims)
    notes = [f"Attention {node}: its mask input {mask} is not read as [batch, key] padding (by its axes); "
             "IAttention takes it as a general mask" for node, mask in sorted(candidates.items())
             if node not in key_flags]
    emit = Emitter(graph, "trtattn/padded")
    lengths: dict[str, gs.Tensor] = {}
    lowerings = []
    for r in reports:
        attn = nodes.get(r.attention_node)
        if attn is None or attn.name not in key_flags:
            continue
        mask_input = candidates[attn.name]
        if mask_input not in lengths:
            lengths[mask_input] = lengths_of(emit, next(t for t in graph.inputs if t.name == mask_input))
        causal = r.pattern == "causal"
        attn.inputs[3] = emit.full_query_rows(allowed_keys(emit, attn.inputs[0], attn.inputs[1], lengths[mask_input],
                                                           causal), attn.inputs[0])
        lowerings.append(AttentionLowering(attn.name, (attn.name,), "upper_left" if causal else "none",
                                           kv_lengths=lengths[mask_input].name))
    return lowerings, sorted({s for s in lengths}), notes


def allowed_keys(emit: Emitter, q: gs.Tensor, k: gs.Tensor, lengths: gs.Tensor, causal: bool) -> gs.Tensor:
    """[B, 1, Sq | 1, Skv] booleans: key j < the row's length (and j <= i when causal, upper-left)."""
    i64 = np.int64
    j = emit("Range", [emit.const(0, i64), emit.dim(k, 2), emit.const(1, i64)], dtype=i64, name="key_positions")
    j = emit("Unsqueeze", [j, emit.const([0, 1, 2], i64)], dtype=i64)  # [1, 1, 1, Skv]
    n = emit("Unsqueeze", [lengths, emit.const([1, 2, 3], i64)], dtype=i64)  # [B, 1, 1, 1]
    allowed = emit("Less", [j, n], dtype=np.bool_, name="within_length")
    if causal:
        i = emit("Range", [emit.const(0, i64), emit.dim(q, 2), emit.const(1, i64)], dtype=i64, name="query_positions")
        i = emit("Unsqueeze", [i, emit.const([0, 1, 3], i64)], dtype=i64)  # [1, 1, Sq, 1]
        allowed = emit("And", [allowed, emit("LessOrEqual", [j, i], dtype=np.bool_)], dtype=np.bool_, name="causal")
    return allowed
