"""Meaning-preserving mutations: rewrites exporters and converters write around attention. Each must
leave the model's outputs unchanged (the oracle checks it on ONNX Runtime: a preserving mutation that
changes them is a fuzzer bug, counted as an invalid mutation)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto, version_converter

from .graphops import F32_MIN, Ctx, NotApplicable, kind, need, replace_input, scalar

EDGES = ("q", "k", "v", "logits", "scores", "probs")


@kind("baseline", preserving=True, variants=("as_exported",), whole_model=True)
def baseline(model: onnx.ModelProto, variant: str) -> onnx.ModelProto:
    """No mutation: the source as it is (what every other kind's numbers stand on)."""
    return model


@kind("identity", preserving=True, variants=EDGES)
def identity(ctx: Ctx):
    """An Identity on one edge of the site."""
    ctx.insert(ctx.variant, lambda t: ctx.op("Identity", [t]))


@kind("cast_roundtrip", preserving=True, variants=[f"{e}:{via}" for e in EDGES for via in ("f64", "f32")])
def cast_roundtrip(ctx: Ctx):
    """fp32 -> fp64 -> fp32 (exact: fp64 holds every fp32), or a Cast to the type it already has."""
    edge, via = ctx.variant.split(":")
    need(ctx.dtype_is_f32(ctx.edge(edge)[1]), f"the {edge} are not float32")
    if via == "f64":
        ctx.insert(edge, lambda t: ctx.op("Cast", [ctx.op("Cast", [t], to=TensorProto.DOUBLE)], to=TensorProto.FLOAT))
    else:
        ctx.insert(edge, lambda t: ctx.op("Cast", [t], to=TensorProto.FLOAT))


@kind("fp16_products", preserving=True, variants=("both",), precision="fp16")
def fp16_products(ctx: Ctx):
    """Both products run in fp16 between Casts, as torch.autocast writes them on CUDA: their operands cast to
    fp16, their results back to fp32, the softmax in fp32. The same attention at fp16's precision. (One
    product alone in fp16 is listed: Q, K and V in two precisions, which one fused op cannot take.)"""
    products = [ctx.site.bmm1, ctx.site.bmm2]
    for node in products:
        need(node.op == "MatMul" and all(ctx.dtype_is_f32(t) for t in (*node.inputs, node.outputs[0])),
             f"{node.name} is not a float32 MatMul")
    for node in products:
        for i, t in enumerate(list(node.inputs)):
            node.inputs[i] = ctx.op("Cast", [t], to=TensorProto.FLOAT16)
        result = node.outputs[0]
        half = gs.Variable(ctx.fresh("fp16_product"))
        node.outputs[0] = half
        ctx.graph.nodes.append(gs.Node("Cast", ctx.fresh("Cast"), {"to": TensorProto.FLOAT}, [half], [result]))


def _letters(rank: int) -> str:
    return "bn"[: rank - 2] if rank <= 4 else "abcefg"[: rank - 2]


def _einsum(ctx: Ctx, node: gs.Node, equation: str, inputs=None):
    node.op, node.attrs = "Einsum", {"equation": equation}
    if inputs is not None:
        for i, t in enumerate(inputs):
            node.inputs[i] = t


def _absorb(ctx: Ctx, node: gs.Node, slot: int, own: str) -> tuple[str, gs.Tensor]:
    """Letters of the tensor a Transpose feeding `node` reads, so an Einsum can read it directly."""
    t = node.inputs[slot]
    need(t.inputs and t.inputs[0].op == "Transpose", f"{t.name} is not a Transpose's output")
    perm = t.inputs[0].attrs.get("perm")
    need(perm is not None and len(perm) == len(own), "the Transpose has no explicit perm of the same rank")
    src = [""] * len(perm)
    for axis, p in enumerate(perm):
        src[p] = own[axis]
    return "".join(src), t.inputs[0].inputs[0]


@kind("einsum", preserving=True, variants=("bmm1", "bmm2", "both", "bmm1_absorb", "bmm2_absorb"))
def einsum(ctx: Ctx):
    """A batched MatMul written as the equivalent Einsum; `_absorb` also reads K (or V) before its
    Transpose, as diffusers-style code writes `einsum('bnid,bnjd->bnij', q, k)`."""
    s = ctx.site
    need(ctx.opset >= 12, "Einsum needs opset 12")
    need(s.bmm1.op == "MatMul" and s.bmm2.op == "MatMul" and s.probs_slot == 0, "not two MatMuls")
    r = ctx.rank(s.logits)
    need(ctx.rank(s.q) == r and ctx.rank(s.kt) == r and ctx.rank(s.v) == r, "operands of different ranks")
    need(ctx.facts.same_shape(s.q, s.kt, slice(0, r - 2)) and ctx.facts.same_shape(s.probs, s.v, slice(0, r - 2)),
         "batch dims broadcast")
    b = _letters(r)
    if ctx.variant in ("bmm1", "both"):
        _einsum(ctx, s.bmm1, "...ij,...jk->...ik")
    if ctx.variant in ("bmm2", "both"):
        _einsum(ctx, s.bmm2, "...ij,...jk->...ik")
    if ctx.variant == "bmm1_absorb":
        src, k = _absorb(ctx, s.bmm1, 1, b + "dj")
        _einsum(ctx, s.bmm1, f"{b}id,{src}->{b}ij", [s.q, k])
    if ctx.variant == "bmm2_absorb":
        src, v = _absorb(ctx, s.bmm2, 1, b + "jd")
        _einsum(ctx, s.bmm2, f"{b}ij,{src}->{b}id", [s.bmm2.inputs[0], v])


SCALE_PLACES = ("to_q", "to_k", "sqrt_qk", "after_bmm1", "div_after")


@kind("scale_move", preserving=True, variants=SCALE_PLACES)
def scale_move(ctx: Ctx):
    """The softmax scale taken from where the exporter put it and put on Q, on K, split as sqrt on
    both, multiplied after BMM1 or divided by its inverse after BMM1."""
    scales = ctx.scales()
    need(scales, "no constant scale")
    total = float(np.prod([f for _, _, f in scales]))
    for node, keep, _ in scales:
        ctx.bypass(node, keep)
    mul = lambda f: (lambda t: ctx.op("Mul", [t, ctx.const(f)]))  # noqa: E731
    if ctx.variant == "to_q":
        ctx.insert("q", mul(total))
    elif ctx.variant == "to_k":
        ctx.insert("k", mul(total))
    elif ctx.variant == "sqrt_qk":
        need(total > 0, "a negative scale has no square root")
        ctx.insert("q", mul(np.sqrt(total)))
        ctx.insert("k", mul(np.sqrt(total)))
    elif ctx.variant == "after_bmm1":
        ctx.insert("logits", mul(total))
    else:
        ctx.insert("logits", lambda t: ctx.op("Div", [t, ctx.const(1.0 / total)]))


@kind("div_mul", preserving=True, variants=("swap",))
def div_mul(ctx: Ctx):
    """Div by s written as Mul by 1/s and Mul by s as Div by 1/s, for every scale of the site."""
    scales = ctx.scales()
    need(scales, "no constant scale")
    for node, keep, factor in scales:
        node.op = "Div" if node.op == "Mul" else "Mul"
        value = 1.0 / factor if node.op == "Div" else factor
        node.inputs[1 - keep] = ctx.const(np.float32(value))
        if node.op == "Div" and keep != 0:
            node.inputs[0], node.inputs[1] = node.inputs[1], node.inputs[0]


@kind("scale_shape", preserving=True, variants=("rank1", "full_rank"))
def scale_shape(ctx: Ctx):
    """The scale constant as a [1] tensor or as [1, 1, 1, 1] instead of a scalar (exporters write all)."""
    scales = ctx.scales()
    need(scales, "no constant scale")
    for node, keep, _ in scales:
        value = np.asarray(scalar(ctx.facts, node.inputs[1 - keep]), np.float32)
        shape = [1] if ctx.variant == "rank1" else [1] * ctx.rank(node.outputs[0])
        node.inputs[1 - keep] = ctx.const(value.reshape(shape))


def _shape_back(ctx: Ctx, x, like):
    return ctx.op("Reshape", [x, ctx.op("Shape", [like])])


def _to_3d(ctx: Ctx, t):
    return ctx.op("Reshape", [t, ctx.op("Concat", [ctx.ints([-1]), ctx.shape_of(t, -2)], axis=0)])


@kind("heads_3d", preserving=True, variants=("softmax", "bmm1", "bmm2", "all"))
def heads_3d(ctx: Ctx):
    """Heads merged into the batch, [B, N, S, T] -> [B*N, S, T]: around the softmax (and back), or
    for the batched MatMuls (older exports, baddbmm-style code)."""
    s = ctx.site
    need(ctx.rank(s.logits) == 4 and ctx.rank(s.scores) == 4, "not 4-D attention")
    if ctx.variant in ("softmax", "all"):
        need(s.softmax.attrs.get("axis", -1 if ctx.opset >= 13 else 1) in (-1, 3), "softmax not over the last axis")
        scores, probs = s.scores, s.probs
        flat = _to_3d(ctx, scores)
        s.softmax.inputs[0] = flat
        s.softmax.attrs["axis"] = 2
        new = gs.Variable(ctx.fresh("probs3d"))
        s.softmax.outputs[0] = new
        ctx.graph.nodes.append(gs.Node("Reshape", ctx.fresh("Reshape"), {}, [new, ctx.op("Shape", [scores])], [probs]))
    for which in (("bmm1", "bmm2") if ctx.variant == "all" else (ctx.variant,) if ctx.variant != "softmax" else ()):
        node = s.bmm1 if which == "bmm1" else s.bmm2
        need(node.op == "MatMul" and ctx.rank(node.inputs[0]) == 4 and ctx.rank(node.inputs[1]) == 4, "not 4-D MatMul")
        need(ctx.facts.same_shape(node.inputs[0], node.inputs[1], slice(0, 2)), "batch dims broadcast")
        a, b = node.inputs[0], node.inputs[1]
        out = node.outputs[0]
        shape = ctx.op("Concat", [ctx.shape_of(a, 0, 3), ctx.shape_of(b, 3, 4)], axis=0)
        y3 = gs.Variable(ctx.fresh("bmm3d"))
        node.inputs[0], node.inputs[1] = _to_3d(ctx, a), _to_3d(ctx, b)
        node.outputs[0] = y3
        ctx.graph.nodes.append(gs.Node("Reshape", ctx.fresh("Reshape"), {}, [y3, shape], [out]))


@kind("flatten_softmax", preserving=True, variants=("flatten",))
def flatten_softmax(ctx: Ctx):
    """Flatten -> Softmax -> Reshape, what ONNX's version converter writes for an opset < 13 Softmax."""
    s = ctx.site
    r = ctx.rank(s.scores)
    need(s.softmax.attrs.get("axis", -1 if ctx.opset >= 13 else 1) in (-1, r - 1), "softmax not over the last axis")
    need(s.probs not in ctx.graph.outputs, "the probabilities are a graph output")
    scores, probs = s.scores, s.probs
    flat = ctx.op("Flatten", [scores], axis=r - 1)
    s.softmax.inputs[0] = flat
    s.softmax.attrs["axis"] = 1
    new = gs.Variable(ctx.fresh("probs2d"))
    s.softmax.outputs[0] = new
    ctx.graph.nodes.append(gs.Node("Reshape", ctx.fresh("Reshape"), {}, [new, ctx.op("Shape", [scores])], [probs]))


@kind("shape_consumer", preserving=True, variants=("probs", "logits", "scores"))
def shape_consumer(ctx: Ctx):
    """The attention output reshaped to a target read from Shape(probs | logits | scores): the
    probabilities or logits gain a consumer that only reads their shape."""
    s = ctx.site
    y = s.bmm2.outputs[0]
    src = {"probs": s.probs, "logits": s.logits, "scores": s.scores}[ctx.variant]
    r = ctx.rank(y)
    need(ctx.rank(src) == r and ctx.facts.same_shape(src, y, slice(0, r - 1)), "shapes do not line up")
    need(y not in ctx.graph.outputs, "the attention output is a graph output")
    consumers = list(y.outputs)
    target = ctx.op("Concat", [ctx.shape_of(src, 0, r - 1), ctx.shape_of(y, r - 1, r)], axis=0)
    y2 = ctx.op("Reshape", [y, target])
    for c in consumers:
        replace_input(c, y, y2)


@kind("mask_form", preserving=True, variants=("where_to_add", "add_to_where"))
def mask_form(ctx: Ctx):
    """A boolean mask Where(m, x, fill) written as x + (1 - m) * finfo.min, or an additive mask that
    is Where(m, finfo.min, b) written as the boolean Where(m, finfo.min, x + b)."""
    for node, _ in ctx.masks():
        x_slot = ctx.path_operand(node)
        if ctx.variant == "where_to_add" and node.op == "Where" and x_slot in (1, 2):
            fill = scalar(ctx.facts, node.inputs[3 - x_slot])
            if fill is None or fill > -1e4:
                continue
            x, cond = node.inputs[x_slot], node.inputs[0]
            need(ctx.dtype_is_f32(x), "the logits are not float32")
            m = ctx.op("Cast", [cond], to=TensorProto.FLOAT)
            if x_slot == 1:  # True keeps
                m = ctx.op("Sub", [ctx.const(1.0), m])
            node.op, node.attrs = "Add", {}
            node.inputs.clear()
            node.inputs.extend([x, ctx.op("Mul", [m, ctx.const(F32_MIN)])])
            return
        if ctx.variant == "add_to_where" and node.op == "Add":
            x, mask = node.inputs[x_slot], node.inputs[1 - x_slot]
            if not mask.inputs or mask.inputs[0].op != "Where":
                continue
            where = mask.inputs[0]
            fills = [scalar(ctx.facts, where.inputs[i]) for i in (1, 2)]
            slot = next((i for i, f in zip((1, 2), fills) if f is not None and f <= -1e4), None)
            if slot is None:
                continue
            other = where.inputs[3 - slot]
            kept = x if scalar(ctx.facts, other) == 0.0 else ctx.op("Add", [x, other])
            branches = [where.inputs[slot], kept] if slot == 1 else [kept, where.inputs[slot]]
            node.op, node.attrs = "Where", {}
            node.inputs.clear()
            node.inputs.extend([where.inputs[0], *branches])
            return
    raise NotApplicable(f"no mask of the form {ctx.variant} reads")


COMMUTATIVE = {"Add", "Mul", "And", "Or", "Xor", "Equal", "Max", "Min", "Sum"}


@kind("commute", preserving=True, variants=("chain", "mask"))
def commute(ctx: Ctx):
    """Operands of commutative ops swapped: on the logits' path and the Q/K scales (chain), or in the
    mask's own subgraph, three nodes deep (mask)."""
    s, nodes = ctx.site, []
    if ctx.variant == "chain":
        nodes = [n for n in s.pre if n.op in COMMUTATIVE]
        nodes += [t.inputs[0] for t in (s.q, s.kt) if t.inputs and t.inputs[0].op in COMMUTATIVE]
    else:
        frontier = [n.inputs[i] for n, i in ctx.masks()]
        for _ in range(3):
            producers = [t.inputs[0] for t in frontier if t.inputs]
            nodes += [n for n in producers if n.op in COMMUTATIVE]
            frontier = [i for n in producers for i in n.inputs if not isinstance(i, gs.Constant)]
    nodes = [n for i, n in enumerate(nodes) if len(n.inputs) == 2 and all(n is not m for m in nodes[:i])]
    need(nodes, f"no commutative op in the {ctx.variant}")
    for n in nodes:
        a, b = n.inputs[0], n.inputs[1]
        n.inputs[0], n.inputs[1] = b, a


@kind("dropout", preserving=True, variants=("probs", "probs_ratio", "probs_mask_output"))
def dropout(ctx: Ctx):
    """An inference Dropout where the modelling code has it: on the probabilities as BMM2 reads them
    (after a NaN guard, if any); plain, with ratio and training_mode=False inputs, or with its mask
    output."""
    if ctx.variant == "probs":
        ctx.insert("p", lambda t: ctx.op("Dropout", [t]))
    elif ctx.variant == "probs_ratio":
        need(ctx.opset >= 12, "Dropout takes ratio as an input from opset 12")
        ctx.insert("p", lambda t: ctx.op("Dropout", [t, ctx.const(0.1), ctx.const(False, np.bool_)]))
    else:
        ctx.insert("p", lambda t: ctx.op("Dropout", [t], outputs=2)[0])


@kind("softmax_axis_sign", preserving=True, variants=("positive", "negative"))
def softmax_axis_sign(ctx: Ctx):
    """Softmax over the last axis written as axis=rank-1 or as axis=-1."""
    s = ctx.site
    r = ctx.rank(s.scores)
    axis = s.softmax.attrs.get("axis", -1 if ctx.opset >= 13 else 1)
    need(axis in (-1, r - 1), "softmax not over the last axis")
    s.softmax.attrs["axis"] = r - 1 if ctx.variant == "positive" else -1


@kind("transpose_split", preserving=True, variants=("k", "v", "q", "k_merge"))
def transpose_split(ctx: Ctx):
    """The Transpose giving K^T (V, Q) written as two (swap of heads and sequence first, then the
    rest), or two consecutive Transposes of K merged into one (k_merge)."""
    consumer, t = ctx.edge(ctx.variant[0])
    need(t.inputs and t.inputs[0].op == "Transpose" and "perm" in t.inputs[0].attrs, f"the {ctx.variant[0]} "
         "do not come from a Transpose")
    node = t.inputs[0]
    perm = list(node.attrs["perm"])
    src = node.inputs[0]
    if ctx.variant == "k_merge":
        need(src.inputs and src.inputs[0].op == "Transpose" and "perm" in src.inputs[0].attrs, "one Transpose only")
        inner = list(src.inputs[0].attrs["perm"])
        merged = [inner[p] for p in perm]
        replace_input(consumer, t, ctx.op("Transpose", [src.inputs[0].inputs[0]], perm=merged))
        return
    r = len(perm)
    need(r >= 3, "rank below 3")
    first = list(range(r))
    first[r - 3], first[r - 2] = first[r - 2], first[r - 3]
    inverse = [first.index(a) for a in range(r)]
    second = [inverse[p] for p in perm]
    replace_input(consumer, t, ctx.op("Transpose", [ctx.op("Transpose", [src], perm=first)], perm=second))


@kind("mask_expand", preserving=True, variants=("expand",))
def mask_expand(ctx: Ctx):
    """The mask (or its Where condition) explicitly Expanded to the logits' shape."""
    masks = ctx.masks()
    need(masks, "no mask")
    node, i = masks[0]
    x = node.inputs[ctx.path_operand(node)]
    node.inputs[i] = ctx.op("Expand", [node.inputs[i], ctx.op("Shape", [x])])


@kind("opset", preserving=True, variants=("12", "13", "17", "21", "23"), whole_model=True)
def opset(model: onnx.ModelProto, variant: str) -> onnx.ModelProto:
    """The whole model converted by ONNX's version converter (down to 17, 13, 12; up to 21, 23)."""
    target = int(variant)
    current = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    need(target != current, "already at that opset")
    try:
        converted = version_converter.convert_version(model, target)
    except Exception as e:
        raise NotApplicable(f"the version converter cannot: {str(e).splitlines()[0][:120]}") from None
    del converted.metadata_props[:]
    converted.metadata_props.extend(model.metadata_props)
    return converted


__all__ = ["NotApplicable"]
