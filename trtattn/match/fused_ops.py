"""Attention ops that are already fused: read into sites like any other.

- ONNX Attention (opset 23/24): torch's dynamo exporter emits it for SDPA at opset >= 23,
  often with HF's GQA head repeat still in front of K and V (dropped here: GQA is native).
- com.microsoft Attention / MultiHeadAttention / GroupQueryAttention (ONNX Runtime's
  transformer optimizer output): described for the report; see fuse.py for what is rewritten.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from ..graph.view import GraphView
from ..site import (
    AttentionSite,
    CacheKind,
    CausalKind,
    MaskKind,
    MaskStep,
    Rope,
    RopeKind,
    ScalePlacement,
    SiteKind,
    SiteSource,
    attribute_softcap,
)
from .cache import CacheRole, find_cache, site_kind
from .errors import Unsupported
from .heads import heads_and_size, strip_repeat
from .logit_ops import kind_of
from .rope import find_rope

# every contrib attention is a site: converted, or listed with why (site.SiteSource names each)
MICROSOFT_OPS = {s.value.split(":", 1)[1] for s in SiteSource if s.is_contrib}


# the inputs ONNX Runtime's contrib ops take their masks at (their schemas' names): a padding mask (mask_index,
# key_padding_mask, mask) and an additive attention_bias
PADDING_MASK = {"Attention": 3, "QAttention": 5, "MultiHeadAttention": 4, "DecoderMaskedSelfAttention": 3,
                "DecoderMaskedMultiHeadAttention": 3, "QOrderedAttention": 17, "DecoderAttention": 5,
                "LongformerAttention": 3}
ATTENTION_BIAS = {"Attention": 5, "MultiHeadAttention": 5, "GroupQueryAttention": 10, "PackedAttention": 5,
                  "PackedMultiHeadAttention": 6, "DecoderMaskedSelfAttention": 5, "DecoderMaskedMultiHeadAttention": 4,
                  "QOrderedAttention": 19}


def is_fused_attention(n: gs.Node) -> bool:
    if n.op == "Attention" and n.domain in (None, "", "ai.onnx"):
        return True
    return n.domain == "com.microsoft" and n.op in MICROSOFT_OPS


def _opt(n: gs.Node, i: int) -> gs.Tensor | None:
    return n.inputs[i] if len(n.inputs) > i and n.inputs[i].name else None


def site_from_node(view: GraphView, n: gs.Node) -> AttentionSite:
    if n.domain == "com.microsoft":
        return _microsoft_site(view, n)
    return _onnx_attention_site(view, n)


def _onnx_attention_site(view: GraphView, n: gs.Node) -> AttentionSite:
    q, k, v = n.inputs[:3]
    mask, past_k, past_v = _opt(n, 3), _opt(n, 4), _opt(n, 5)
    rank = view.rank(q) or 4
    if rank == 3:
        q_heads = n.attrs.get("q_num_heads")
        kv_heads = n.attrs.get("kv_num_heads")
        hidden = view.dim(q, 2)
        head = hidden // q_heads if hidden and q_heads else None
        repeat = 1
    else:
        k_base, repeat = strip_repeat(view, view.skip_passthrough_up(k), 4)
        v_base, v_repeat = strip_repeat(view, view.skip_passthrough_up(v), 4)
        if repeat == v_repeat and repeat > 1:
            k, v = k_base, v_base
        else:
            repeat = 1
        q_heads, head = heads_and_size(view, q, None, 4)
        kv_heads, _ = heads_and_size(view, k, None, 4)
    scale = n.attrs.get("scale")
    if scale is None:
        if head is None:
            raise Unsupported(f"Attention {n.name}: the head size is unknown, so its default scale is too")
        scale = 1.0 / math.sqrt(head)
    steps = []
    if mask is not None:
        is_bool = view.dtype(mask) is not None and np.dtype(view.dtype(mask)) == np.bool_
        steps.append(MaskStep("where", operand=mask.name, value=float("-inf"), node=n.name) if is_bool
                     else MaskStep("add", operand=mask.name, node=n.name))
    softcap = attribute_softcap(n.attrs)
    notes = [f"GQA head repeat x{repeat} dropped"] if repeat > 1 else []
    qk = n.outputs[3].name if len(n.outputs) > 3 and n.outputs[3].name else None  # whatever the mode
    if qk is not None:
        notes.append(f"also returns its QK matmul ({qk}, qk_matmul_output_mode {qk_mode(n)})")
    if (past_k is None) != (past_v is None):  # the spec gives both or neither
        raise Unsupported(f"Attention {n.name} has only one of past_key and past_value")
    if past_k is not None and past_v is not None:
        role = CacheRole(CacheKind.CONCAT, past_k.name, past_v.name, k, v)
    else:  # the past concatenated in front of the op (dynamo's SDPA with HF's cache: Concat, then GQA repeat)
        seq_axis = 2 if rank == 4 else None
        role = find_cache(view, k, v, seq_axis, seq_axis)
    kind = site_kind(view, q, k, role)
    cache = role.kind
    if softcap:
        notes.append(f"softcap {softcap}")
    return AttentionSite(
        name=n.name,
        kind=kind,
        query=q.name, key=k.name, value=v.name, output=n.outputs[0].name,
        q_heads=q_heads, kv_heads=kv_heads, head_size=head, v_head_size=head,
        scale=float(scale), scale_placement=ScalePlacement.ATTRIBUTE,
        mask=kind_of(steps),
        mask_steps=tuple(steps),
        causal=CausalKind.UPPER_LEFT if n.attrs.get("is_causal", 0) else CausalKind.NONE,
        cache=cache,
        past_key=role.past_key,
        past_value=role.past_value,
        new_key=role.new_key.name if role.new_key is not None else None,
        new_value=role.new_value.name if role.new_value is not None else None,
        rope=find_rope(view, q, k, head) if rank == 4 else None,
        rank=rank, source=SiteSource.ONNX_ATTENTION, dtype=str(view.dtype(q) or "float32"),
        softcap=softcap, notes=tuple(notes), qk_output=qk, qk_mode=qk_mode(n) if qk is not None else None,
    )


def qk_mode(n: gs.Node) -> int:
    """Which logits an ONNX Attention node's qk_matmul_output holds (0: the scaled Q K^T, 1: with the mask added,
    2: soft-capped, 3: the softmax)."""
    return int(n.attrs.get("qk_matmul_output_mode", 0))


def _microsoft_site(view: GraphView, n: gs.Node) -> AttentionSite:
    heads = n.attrs.get("num_heads")
    kv_heads = n.attrs.get("kv_num_heads", heads)
    q = n.inputs[0]
    hidden = view.dim(q, -1)
    if n.op in ("Attention", "QAttention"):  # input is the hidden state; the op projects Q, K, V itself
        sizes = n.attrs.get("qkv_hidden_sizes")
        hidden = sizes[0] if sizes else (view.dim(n.inputs[1], 1) or 0) // 3 or None
    if n.op == "GroupQueryAttention" and _opt(n, 1) is None and hidden and heads:  # Q, K, V packed in one input
        hidden = hidden * heads // (heads + 2 * kv_heads)
    head = hidden // heads if hidden and heads else None
    scale = n.attrs.get("scale") or (1.0 / math.sqrt(head) if head else 1.0)
    past = {"Attention": (4, 4), "MultiHeadAttention": (6, 7), "GroupQueryAttention": (3, 4)}.get(n.op)
    past_k, past_v = (_opt(n, past[0]), _opt(n, past[1])) if past else (None, None)
    causal = CausalKind.NONE
    if n.op == "GroupQueryAttention" or (n.attrs.get("unidirectional", 0) and past_k is not None):
        causal = CausalKind.LOWER_RIGHT  # the past keys, then the new ones up to the query's own
    elif n.attrs.get("unidirectional", 0):
        causal = CausalKind.UPPER_LEFT
    padding = _opt(n, PADDING_MASK[n.op]) if n.op in PADDING_MASK else None
    bias = _opt(n, ATTENTION_BIAS[n.op]) if n.op in ATTENTION_BIAS else None
    cache = CacheKind.CONCAT if n.op == "GroupQueryAttention" or past_k is not None else \
        CacheKind.CROSS_STATIC if n.op == "MultiHeadAttention" and view.rank(_opt(n, 1) or q) == 4 else CacheKind.NONE
    return AttentionSite(
        name=n.name, kind=_microsoft_kind(view, n, cache),
        query=q.name, key=(_opt(n, 1) or q).name, value=(_opt(n, 2) or q).name, output=n.outputs[0].name,
        q_heads=heads, kv_heads=kv_heads, head_size=head, v_head_size=head, scale=float(scale),
        scale_placement=ScalePlacement.ATTRIBUTE, causal=causal, padding=padding is not None,
        mask=MaskKind.ADDITIVE if padding is not None or bias is not None else MaskKind.NONE,
        # the bias as the op reads it (not over the logits: GroupQueryAttention's columns are its kernel's)
        mask_steps=(MaskStep("add", operand=bias.name, node=n.name),) if bias is not None else (),
        softcap=attribute_softcap(n.attrs),
        window=int(n.attrs.get("local_window_size", -1)) if int(n.attrs.get("local_window_size", -1)) > 0 else None,
        rope=_inner_rope(view, n, head),
        cache=cache,
        past_key=past_k.name if past_k is not None else None, past_value=past_v.name if past_v is not None else None,
        source=SiteSource.contrib(n.op), notes=(f"{n.op} from com.microsoft",) + (
            ("present = Concat(past, new): ONNX Runtime's when each row's past fills past_key (fused for a "
             "buffer shared by past and present, as GenAI folders' are, it is written into that buffer as the kernel "
             "writes it)",)
            if n.op == "GroupQueryAttention" and past_k is not None else ()),
    )


# contrib ops that project Q, K and V from their one hidden-state input, or whose keys are by definition the
# query's tokens over a cache: self-attention whatever their inputs
SELF_OPS = {"Attention", "QAttention", "PackedAttention", "DecoderMaskedSelfAttention", "QOrderedAttention",
            "LongformerAttention", "GroupQueryAttention", "SparseAttention", "PagedAttention"}


def _microsoft_kind(view: GraphView, n: gs.Node, cache: CacheKind) -> SiteKind:
    """Self-attention for SELF_OPS, over a past, or with Q, K and V packed in the query input; DecoderAttention
    projects its query and key inputs itself (one tensor: self); the others (MultiHeadAttention and its
    kin take Q, K and V as given) as the projections in front of them say (cache.site_kind)."""
    key = _opt(n, 1)
    if n.op in SELF_OPS or cache == CacheKind.CONCAT or key is None:
        return SiteKind.SELF
    if n.op == "DecoderAttention":
        return SiteKind.SELF if key.name == n.inputs[0].name else SiteKind.CROSS
    return site_kind(view, n.inputs[0], key, CacheRole(cache))


def _inner_rope(view: GraphView, n: gs.Node, head: int | None) -> Rope | None:
    """GroupQueryAttention's rotary inside the op (do_rotary, its cos/sin tables at inputs 7 and 8)."""
    cos, sin = _opt(n, 7), _opt(n, 8)
    if n.op != "GroupQueryAttention" or not n.attrs.get("do_rotary", 0) or cos is None or sin is None:
        return None
    half = view.dim(cos, -1)
    interleaved = bool(n.attrs.get("rotary_interleaved", 0))
    return Rope(RopeKind.INTERLEAVED if interleaved else RopeKind.HALF_SPLIT, 2 * half if half else (head or 0),
                cos.name, sin.name, n.inputs[0].name, (_opt(n, 1) or n.inputs[0]).name,
                position_ids=getattr(_opt(n, 9), "name", None), interleaved=interleaved)
