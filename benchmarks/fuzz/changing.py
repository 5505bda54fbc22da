"""Meaning-changing mutations. trtattn may fuse them (the fused model must then compute what the
*mutant* computes) or list them; it must never write a model that differs from its input. The oracle
checks that each one really changes the outputs on the fuzzer's inputs (else it is counted apart)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

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
    need(all(sh[axis] > 1 for sh in shapes), "that axis has one element")
    s.softmax.attrs["axis"] = axis


def _token_ids(ctx: Ctx, keys: int):
    roles = metadata(ctx.source).get("inputs", {})
    for t in ctx.graph.inputs:
        if roles.get(t.name, {}).get("kind") == "token_ids":
            shapes = ctx.facts.input_shapes.get(t.name)
            if shapes and all(len(s) == 2 and s[1] == k for s, k in zip(shapes, keys)):
                return t
    raise NotApplicable("no token-id input as long as the keys")


@kind("value_mask", preserving=False, variants=("keys_additive", "keys_where", "token_ids"))
def value_mask(ctx: Ctx):
    """A mask computed from values in a new way: from the keys (sum over the head dim > 0 gets a bias
    of -8, or finfo.min through a Where), or from the token ids (ids divisible by 3 masked)."""
    s = ctx.site
    r = ctx.rank(s.scores)
    need(ctx.dtype_is_f32(s.scores), "the scores are not float32")
    if ctx.variant == "token_ids":
        need(r == 4, "not 4-D attention")
        keys = [sh[-1] for sh in ctx.facts.shapes[s.scores.name]]
        ids = _token_ids(ctx, keys)
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
