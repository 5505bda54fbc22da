"""A decomposed attention (MatMul, Softmax, MatMul found by what its axes mean: site.SiteLayout) rewritten as one
ONNX Attention node: its operands laid out as the op takes them, its mask steps built into one attn_mask (or
is_causal), attention sinks as one extra key, and the site's output and the shapes read from the tensors that go
away made by the new nodes."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..graph.emit import Emitter, float_dtype
from ..match import logit_ops
from ..site import SOFTCAP_ATTRIBUTE, AttentionSite, CausalKind
from ..site_names import site_scope
from . import key_blocks
from .layout import Dims, convert
from .qk_output import qk_output


def pattern_attention(graph: gs.Graph, tensors: dict, site: AttentionSite, meaning) -> gs.Node:
    """A decomposed attention, read by what its axes mean (site.layout), as one ONNX Attention node."""
    lay = site.layout
    if lay is None:
        raise ValueError(f"site {site.name} has no layout to rewrite from")
    logits_q = site.quant.logits if site.quant else None
    if logits_q is not None:
        raise ValueError(f"its logits are quantized inside the attention ({logits_q.dtype}, scale {logits_q.scale:.3g}): "
                         "a fused attention (and TensorRT's IAttention) computes them unquantized, so it would not "
                         "compute what this model computes")
    key_blocks.prepare(graph, tensors, site)  # Concat(K_i), Concat(V_i) of a key axis written in blocks
    emit = Emitter(graph, site_scope(site.name))
    dtype = float_dtype(site.dtype)
    dims = Dims(emit, tensors, lay.dims)
    q = convert(emit, tensors[lay.query], lay.q, (lay.batch, lay.heads, ("q",), ("d",)), dims)
    blocks = key_blocks.past_operands(graph, emit, tensors, site, dims)  # a cache and the new slice: the op's past
    past = blocks is not None
    if blocks is not None:
        (k, v), pasts = blocks
    else:
        k = convert(emit, tensors[lay.key], lay.k, (lay.batch, lay.kv_heads, ("k",), ("d",)), dims)
        v = convert(emit, tensors[lay.value], lay.v, (lay.batch, lay.kv_heads, ("k",), ("e",)), dims)
    if lay.batch_broadcast:  # a learned probe [1, ...] the products broadcast: the op takes one batch for all
        batch = emit("Concat", [dims.of(lay.batch), emit.const([1, 1, 1], np.int64)], {"axis": 0}, dtype=np.int64)
        q, k, v = (emit("Expand", [t, batch], dtype=dtype, name=f"{x}_over_batch") if x in lay.batch_broadcast else t
                   for x, t in zip("qkv", (q, k, v)))
    # a mode-2 qk output holds the mask: ONNX Runtime fills is_causal's with the lowest float, the graph's is -inf
    use_causal = (not past and meaning is not None and site.causal == CausalKind.UPPER_LEFT
                  and meaning.pattern == "causal" and not meaning.padding and not meaning.bias
                  and not any(s.op == "sink" for s in site.mask_steps) and site.qk_mode != 2)
    steps = [s for s in site.mask_steps if not (use_causal and logit_ops.unit(s).masks)]
    mask_emit = Emitter(graph, site_scope(site.name, "mask_operands"))
    built = logit_ops.build(graph, tensors, steps, site_scope(site.name, "mask"), dtype,
                            lambda t, step: convert(mask_emit, t, step.frame, lay.scores, dims, broadcast=True))
    if site.qk_mode == 2:  # the op's output holds the mask: ONNX Runtime fills a boolean one with the lowest float
        built.to_float(float("-inf"))  # where the graph's (returned.py: a -inf fill) is -inf
    mask = built.m
    for factor in built.q_scales:  # a per-head logit scale: [.., heads, 1, 1] broadcasts over Q's BNSH
        q = emit("Mul", [q, factor], dtype=dtype, name="q_head_scale")
    if built.sink is not None:
        k, v, mask = _with_sink(emit, q, k, v, built, dtype)
    if mask is not None:
        # over every key: a (1, 1) mask of a decode step broadcasts over them, which ONNX Runtime's op refuses; not
        # over a past's (key blocks): that mask spans the concatenated logits already, and the kv-cache form
        # refuses anything reading a past's length (its capacity there)
        mask = emit.full_query_rows(mask, q, None if past else emit.shape_slice(k, 2, 3))
    attrs = {"scale": float(lay.scale), "is_causal": int(use_causal)}
    if built.softcap:
        attrs[SOFTCAP_ATTRIBUTE] = float(built.softcap)
    if site.qk_output is not None:
        attrs["qk_matmul_output_mode"] = int(site.qk_mode or 0)
    y = emit("Attention", [q, k, v] + ([mask] if mask is not None else []), attrs, dtype=dtype, name="Attention")
    attention = graph.nodes[-1]
    if past:
        key_blocks.with_presents(attention, pasts)
    out = convert(emit, y, (lay.batch, lay.heads, ("q",), ("e",)), lay.out, dims)
    qk = qk_output(emit, attention, tensors, site, dims, dtype)
    shapes = [(tensors[name], _shape_read(emit, dims, tensors[name], frame)) for name, frame in lay.shape_reads]
    # nothing above changed the graph but add nodes; now the site's output and the shapes read from the
    # tensors that go away are made by the new nodes
    _produce(tensors[site.output], out)
    if qk is not None:
        _produce(tensors[site.qk_output], qk)
    for read, shape in shapes:
        if shape is not None:
            read.inputs[0].outputs.clear()
            _produce(read, shape)
    return attention


def _with_sink(emit: Emitter, q, k, v, built, dtype):
    """Attention sinks (match/logit_ops/sink.py) as one extra key: K and V get a zero row, the mask a column
    holding the sink's logit (softmax over a set of keys: where the column stands does not matter)."""
    i64 = lambda values: emit.const(values, np.int64)  # noqa: E731
    part = lambda t, lo, hi: emit("Slice", [emit("Shape", [t], dtype=np.int64), i64([lo]), i64([hi])],  # noqa: E731
                                  dtype=np.int64)
    zero = emit.const(0.0, dtype)

    def zero_row(t):
        shape = emit("Concat", [part(t, 0, 2), i64([1]), part(t, 3, 4)], {"axis": 0}, dtype=np.int64)
        return emit("Concat", [t, emit("Expand", [zero, shape], dtype=dtype)], {"axis": 2}, dtype=dtype, name="sink_key")

    built.to_float()
    scores = emit("Concat", [part(q, 0, 3), part(k, 2, 3)], {"axis": 0}, dtype=np.int64)
    column = emit("Concat", [part(q, 0, 3), i64([1])], {"axis": 0}, dtype=np.int64)
    m = emit("Expand", [built.m if built.m is not None else zero, scores], dtype=dtype)
    sink = emit("Expand", [built.sink, column], dtype=dtype)
    return zero_row(k), zero_row(v), emit("Concat", [m, sink], {"axis": 3}, dtype=dtype, name="sink_column")


def _produce(target: gs.Tensor, made: gs.Tensor) -> None:
    """`target` (a tensor the graph reads) is now computed by the node that made `made`."""
    node = made.inputs[0]
    target.inputs.clear()
    node.outputs = [target if o is made else o for o in node.outputs]


def _shape_read(emit: Emitter, dims: Dims, out: gs.Tensor, frame) -> gs.Tensor | None:
    """What a Shape node of a tensor that goes away reads, from the site's sizes."""
    shape_node = out.inputs[0] if out.inputs else None
    if shape_node is None or shape_node.op != "Shape":
        return None
    full = dims.shape(frame)
    start, end = shape_node.attrs.get("start"), shape_node.attrs.get("end")
    if start is not None or end is not None:
        rank = len(frame)
        lo = (start or 0) % rank if (start or 0) < 0 else (start or 0)
        hi = rank if end is None else (end % rank if end < 0 else min(end, rank))
        full = emit("Slice", [full, emit.const([lo], np.int64), emit.const([hi], np.int64)], dtype=np.int64)
    return full
