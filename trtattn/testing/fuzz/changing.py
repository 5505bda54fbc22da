"""Meaning-changing mutations. trtattn may fuse them (the fused model must then compute what the
*mutant* computes) or list them; it must never write a model that differs from its input. The oracle
checks that each one really changes the outputs on the fuzzer's inputs (else it is counted apart)."""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto

from trtattn.graph.roles import RoleKind, role_kind

from .graphops import F32_MIN, INT64_MAX, Ctx, NotApplicable, kind, need, replace_input
from .sources import metadata


@kind("wrong_scale", preserving=False, variants=("x1.01", "x2", "const_x1.01", "const_x2"))
def wrong_scale(ctx: Ctx):
    """The logits multiplied by 1.01 or 2 more than the model says: by an extra Mul after BMM1, or by
    changing the scale constant itself (const_)."""
    factor = float(ctx.variant.split("x")[-1])
    if not ctx.variant.startswith("const_"):
        ctx.insert("logits", lambda t: ctx.op("Mul", [t, ctx.const(factor)]))
        return
    scales = ctx.scales()
    need(scales, "no constant scale")
    node, keep, f = scales[0]
    value = f * factor if node.op == "Mul" else 1.0 / (f * factor)
    node.inputs[1 - keep] = ctx.const(np.float32(value))


def _roll(ctx: Ctx, t, axis: int):
    """t rolled by one position along `axis` (the mask shifted: position i gets i + 1's value)."""
    head = ctx.op("Slice", [t, ctx.ints([1]), ctx.ints([INT64_MAX]), ctx.ints([axis])])
    tail = ctx.op("Slice", [t, ctx.ints([0]), ctx.ints([1]), ctx.ints([axis])])
    return ctx.op("Concat", [head, tail], axis=axis)


@kind("mask_shift", preserving=False, variants=("keys", "queries"))
def mask_shift(ctx: Ctx):
    """The mask nearest the softmax (an additive mask or a Where's condition) shifted by one key
    (or query) position."""
    masks = ctx.masks()
    need(masks, "no mask")
    need(ctx.opset >= 10, "Slice with inputs needs opset 10")
    node, i = masks[0]
    axis = -1 if ctx.variant == "keys" else -2
    need(axis in ctx.facts.varies.get(node.inputs[i].name, ()), f"the mask does not vary along the {ctx.variant}")
    node.inputs[i] = _roll(ctx, node.inputs[i], axis)


@kind("softmax_axis", preserving=False, variants=("-2", "1"))
def softmax_axis(ctx: Ctx):
    """Softmax over the query axis (-2) or the heads (1) instead of the keys."""
    s = ctx.site
    r = ctx.rank(s.scores)
    axis = int(ctx.variant)
    need(axis == -2 or r == 4, "no heads axis")
    shapes = ctx.facts.shapes.get(s.scores.name)
    assert shapes is not None  # facts() records every site's scores
    need(all(sh[axis] > 1 for sh in shapes), "that axis has one element")
    s.softmax.attrs["axis"] = axis


def _token_ids(ctx: Ctx, scores: list[tuple]):
    """A [batch, keys] input of token ids."""
    roles = metadata(ctx.source).get("inputs", {})
    for t in ctx.graph.inputs:
        if t.name in roles and role_kind(roles[t.name], t.name) is RoleKind.TOKEN_IDS:
            shapes = ctx.facts.input_shapes.get(t.name)
            if shapes and all(len(s) == 2 and (s[0], s[1]) == (sc[0], sc[-1]) for s, sc in zip(shapes, scores)):
                return t
    raise NotApplicable("no [batch, keys] token-id input")


@kind("value_mask", preserving=False, variants=("keys_additive", "keys_where", "token_ids"))
def value_mask(ctx: Ctx):
    """A mask computed from values in a new way: from the keys (sum over the head dim > 0 gets a bias
    of -8, or finfo.min through a Where), or from the token ids (ids divisible by 3 masked)."""
    s = ctx.site
    r = ctx.rank(s.scores)
    need(ctx.dtype_is_f32(s.scores), "the scores are not float32")
    if ctx.variant == "token_ids":
        need(r == 4, "not 4-D attention")
        ids = _token_ids(ctx, ctx.facts.shapes[s.scores.name])
        masked = ctx.op("Equal", [ctx.op("Mod", [ids, ctx.ints(3)]), ctx.ints(0)])
        masked = ctx.unsqueeze(masked, [1, 2])
        ctx.insert("scores", lambda t: ctx.op("Where", [masked, ctx.const(F32_MIN), t]))
        return
    need(ctx.rank(s.kt) == r, "K and the scores differ in rank")
    summed = ctx.reduce_sum(s.kt, [-2])  # [..., 1, T]: one value per key
    positive = ctx.op("Greater", [summed, ctx.const(0.0)])
    if ctx.variant == "keys_additive":
        penalty = ctx.op("Mul", [ctx.op("Cast", [positive], to=TensorProto.FLOAT), ctx.const(-8.0)])
        ctx.insert("scores", lambda t: ctx.op("Add", [t, penalty]))
    else:
        ctx.insert("scores", lambda t: ctx.op("Where", [positive, ctx.const(F32_MIN), t]))


@kind("drop_mask", preserving=False, variants=("nearest",))
def drop_mask(ctx: Ctx):
    """The mask (or bias) nearest the softmax removed."""
    masks = ctx.masks()
    need(masks, "no mask")
    node, i = masks[0]
    need(node.inputs[i].name not in ctx.facts.trivial, "the mask masks nothing on the fuzzer's inputs")
    ctx.bypass(node, ctx.path_operand(node))


@kind("swap_kv", preserving=False, variants=("swap",))
def swap_kv(ctx: Ctx):
    """K and V exchanged: the logits read V^T, the probabilities multiply K."""
    s = ctx.site
    r = ctx.rank(s.kt)
    need(ctx.rank(s.v) == r, "K and V differ in rank")
    shapes_k, shapes_v = ctx.facts.shapes[s.kt.name], ctx.facts.shapes[s.v.name]
    need(all(k[-2:] == v[-2:][::-1] and k[:-2] == v[:-2] for k, v in zip(shapes_k, shapes_v)),
         "K and V shapes do not swap")
    perm = list(range(r - 2)) + [r - 1, r - 2]
    kt, v = s.kt, s.v
    replace_input(s.bmm1, kt, ctx.op("Transpose", [v], perm=perm))
    s.bmm2.inputs[s.v_slot] = ctx.op("Transpose", [kt], perm=perm)


def _after_scale(ctx: Ctx) -> str | gs.Node:
    """Where Gemma-2-style logit transforms sit: after the scale, before any mask."""
    s = ctx.site
    scaled = [n for n in s.pre[: next((i for i, n in enumerate(s.pre) if n.op in ("Add", "Sub", "Where")), len(s.pre))]
              if n.op in ("Mul", "Div")]
    return scaled[-1] if scaled else "logits"


def _insert_after(ctx: Ctx, where, make) -> None:
    if isinstance(where, str):
        ctx.insert(where, make)
        return
    out = where.outputs[0]
    consumer = next(c for c in out.outputs if any(c is p for p in ctx.path_nodes()))
    replace_input(consumer, out, make(out))


@kind("softcap", preserving=False, variants=("cap2", "cap5"))
def softcap(ctx: Ctx):
    """Logit soft-capping, tanh(x / cap) * cap after the scale (Gemma 2; issue 10, class 3): ONNX
    Attention-23 has a softcap attribute for it."""
    cap = float(ctx.variant[3:])
    need(ctx.dtype_is_f32(ctx.site.logits), "the logits are not float32")
    _insert_after(ctx, _after_scale(ctx), lambda t: ctx.op("Mul", [ctx.op("Tanh", [ctx.op("Div", [t, ctx.const(cap)])]),
                                                                    ctx.const(cap)]))


@kind("position_bias", preserving=False, variants=("alibi",))
def position_bias(ctx: Ctx):
    """An ALiBi-style bias computed in the graph: -slope_h * |i - j| from Range ops over the scores'
    shape (queries aligned to the last keys), added before the softmax (issue 10, class 3)."""
    s = ctx.site
    need(ctx.rank(s.scores) == 4 and ctx.dtype_is_f32(s.scores), "not 4-D float32 attention")
    heads = {sh[1] for sh in ctx.facts.shapes[s.scores.name]}
    need(len(heads) == 1, "the head count varies")
    n = heads.pop()
    shape = ctx.op("Shape", [s.scores])
    q_len = ctx.op("Squeeze", [ctx.slice(shape, -2, -1, 0), ctx.ints([0])]) if ctx.opset >= 13 else \
        ctx.op("Squeeze", [ctx.slice(shape, -2, -1, 0)], axes=[0])
    k_len = ctx.op("Squeeze", [ctx.slice(shape, -1, INT64_MAX, 0), ctx.ints([0])]) if ctx.opset >= 13 else \
        ctx.op("Squeeze", [ctx.slice(shape, -1, INT64_MAX, 0)], axes=[0])
    qi = ctx.unsqueeze(ctx.op("Range", [ctx.op("Sub", [k_len, q_len]), k_len, ctx.ints(1)]), [1])
    kj = ctx.unsqueeze(ctx.op("Range", [ctx.ints(0), k_len, ctx.ints(1)]), [0])
    distance = ctx.op("Cast", [ctx.op("Abs", [ctx.op("Sub", [qi, kj])])], to=TensorProto.FLOAT)
    slopes = ctx.const((-(2.0 ** (-8.0 * (np.arange(n) + 1) / n))).reshape(n, 1, 1))
    bias = ctx.op("Mul", [distance, slopes])
    ctx.insert("scores", lambda t: ctx.op("Add", [t, bias]))


@kind("qdq", preserving=False, variants=("q", "k", "v", "probs"))
def qdq(ctx: Ctx):
    """A QuantizeLinear -> DequantizeLinear pair (static int8, per tensor, as ONNX Runtime's
    quantization tools write) on Q, K, V, or uint8 on the probabilities BMM2 reads (issue 10, class 6)."""
    need(ctx.opset >= 10, "QuantizeLinear needs opset 10")
    edge = "p" if ctx.variant == "probs" else ctx.variant  # the probabilities as BMM2 reads them
    _, t = ctx.edge(edge)
    need(ctx.dtype_is_f32(t), f"the {ctx.variant} are not float32")
    if ctx.variant == "probs":
        scale, zero = 1.0 / 255, np.uint8(0)
    else:
        peak = ctx.facts.absmax.get(t.name) or 0.0
        need(peak, f"no runtime range for the {ctx.variant}")
        scale, zero = peak / 127, np.int8(0)
    ctx.insert(edge, lambda x: ctx.op("DequantizeLinear", [
        ctx.op("QuantizeLinear", [x, ctx.const(scale), ctx.const(zero, zero.dtype)]), ctx.const(scale),
        ctx.const(zero, zero.dtype)]))
