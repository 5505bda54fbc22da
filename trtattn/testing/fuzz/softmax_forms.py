"""A Softmax written without a Softmax op, as exporters and hand-written code spell it (issue 18, class 1).

`write_softmax(graph, softmax_node, form)` replaces one Softmax (before opset 13: one over the last axis only)
by the form; the last node
writes the original probabilities tensor. Used by the fuzzer's `softmax_written` kind and by the tests.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

# each equal to Softmax(x, axis); "sum_eps" adds a tiny epsilon to the sum: the same numbers in float32
# (the sum is >= 1), but nothing proves it equal to a Softmax, so it must be listed, never silent
FORMS = ("onnx_body", "plain", "mul_reciprocal", "reciprocal_first", "exp_logsoftmax", "exp_sub_logsumexp",
         "logsoftmax_body", "shifted_softmax")
UNPROVEN = ("sum_eps",)


def write_softmax(graph: gs.Graph, sm: gs.Node, form: str, tag: str | None = None) -> None:
    opset = int(graph.opset)
    axis = int(sm.attrs.get("axis", -1 if opset >= 13 else 1))  # before opset 13: the caller's is the last axis
    x, probs = sm.inputs[0], sm.outputs[0]
    tag = tag or f"{sm.name or probs.name}_as_{form}"
    count = [0]

    def op(kind, inputs, **attrs):
        count[0] += 1
        out = gs.Variable(f"{tag}/{kind}_{count[0]}_out", dtype=x.dtype)
        graph.nodes.append(gs.Node(kind, f"{tag}/{kind}_{count[0]}", attrs, list(inputs), [out]))
        return out

    def reduce(kind, t):
        if opset >= 18 or (kind == "ReduceSum" and opset >= 13):
            return op(kind, [t, gs.Constant(f"{tag}/axes_{count[0]}", np.asarray([axis], np.int64))], keepdims=1)
        return op(kind, [t], axes=[axis], keepdims=1)

    def shifted(t):
        return op("Sub", [t, reduce("ReduceMax", t)])

    sm.inputs.clear()
    sm.outputs.clear()
    graph.nodes.remove(sm)
    if form == "onnx_body":
        e = op("Exp", [shifted(x)])
        last = op("Div", [e, reduce("ReduceSum", e)])
    elif form == "plain":
        e = op("Exp", [x])
        last = op("Div", [e, reduce("ReduceSum", e)])
    elif form in ("mul_reciprocal", "reciprocal_first"):
        e = op("Exp", [shifted(x)])
        inv = op("Reciprocal", [reduce("ReduceSum", e)])
        last = op("Mul", [e, inv] if form == "mul_reciprocal" else [inv, e])
    elif form == "exp_logsoftmax":
        last = op("Exp", [op("LogSoftmax", [x], axis=axis)])
    elif form == "exp_sub_logsumexp":
        last = op("Exp", [op("Sub", [x, reduce("ReduceLogSumExp", x)])])
    elif form == "logsoftmax_body":  # ONNX's LogSoftmax function body, under an Exp
        y = shifted(x)
        last = op("Exp", [op("Sub", [y, op("Log", [reduce("ReduceSum", op("Exp", [y]))])])])
    elif form == "shifted_softmax":  # a Softmax of x - max(x) (gpt-oss, hand-written "safe" code)
        last = op("Softmax", [shifted(x)], axis=axis)
    elif form == "sum_eps":
        e = op("Exp", [shifted(x)])
        eps = gs.Constant(f"{tag}/eps", np.asarray(1e-30, np.float32))
        last = op("Div", [e, op("Add", [reduce("ReduceSum", e), eps])])
    else:
        raise ValueError(f"unknown softmax form {form}")
    node = last.inputs[0]
    node.outputs[0] = probs
    graph.toposort()


# ---------------------------------------------------------------- the fuzzer's kinds (issue 18: classes 1, 11, 12)
from onnx import TensorProto  # noqa: E402

from .graphops import Ctx, NotApplicable, kind, need  # noqa: E402

KEEP_ABOVE = -5000.0  # an additive mask's value above which a position is kept (masks write -1e4 and below)


@kind("softmax_written", preserving=True, variants=FORMS)
def softmax_written(ctx: Ctx):
    """The site's Softmax written without a Softmax op (ONNX's function body, x Reciprocal(sum), Exp(LogSoftmax)...)."""
    need(ctx.opset >= 13, "the forms are of a single-axis Softmax (opset >= 13)")
    need(ctx.site.probs not in ctx.graph.outputs, "the probabilities are a graph output")
    write_softmax(ctx.graph, ctx.site.softmax, ctx.variant, tag=ctx.fresh("softmax_written"))


def _depends_on(t: gs.Tensor, node: gs.Node) -> bool:
    """Whether `node` computes `t` or an ancestor of it, through any op (a Shape of the logits too)."""
    stack, seen = [t], set()
    while stack:
        x = stack.pop()
        if id(x) in seen or not x.inputs:
            continue
        seen.add(id(x))
        if x.inputs[0] is node:
            return True
        stack.extend(i for i in x.inputs[0].inputs if isinstance(i, gs.Variable))
    return False


def _kept(ctx: Ctx, before_logits: bool = False):
    """A float 0/1 tensor, 1 where the site's mask keeps a position, broadcasting to the logits (one that
    exists before the logits if `before_logits`: not built from their shape)."""
    for node, slot in ctx.masks():
        if before_logits and _depends_on(node.inputs[slot if node.op == "Add" else 0], ctx.site.bmm1):
            continue  # built from the logits (their shape): it cannot be applied before them
        if node.op == "Add":
            keep = ctx.op("Greater", [node.inputs[slot], ctx.const(KEEP_ABOVE)])
        elif node.op == "Where":
            keep = node.inputs[0] if ctx.path_operand(node) == 1 else ctx.op("Not", [node.inputs[0]])
        else:
            continue
        return ctx.op("Cast", [keep], to=TensorProto.FLOAT)
    raise NotApplicable("the site has no mask")


@kind("mask_reapplied", preserving=True, variants=("mul", "where", "where_not"))
def mask_reapplied(ctx: Ctx):
    """The site's mask applied again to the probabilities (Keras 3 / flax: P * mask; DeBERTa: masked_fill)."""
    m = _kept(ctx)
    zero = ctx.const(0.0)
    if ctx.variant == "mul":
        ctx.insert("probs", lambda p: ctx.op("Mul", [p, m]))
    elif ctx.variant == "where":
        ctx.insert("probs", lambda p: ctx.op("Where", [ctx.op("Cast", [m], to=TensorProto.BOOL), p, zero]))
    else:
        masked = ctx.op("Not", [ctx.op("Cast", [m], to=TensorProto.BOOL)])
        ctx.insert("probs", lambda p: ctx.op("Where", [masked, zero, p]))


@kind("mask_multiplied", preserving=True, variants=("mul", "where"))
def mask_multiplied(ctx: Ctx):
    """The site's mask applied once more to the raw logits by multiplication and an offset, as tf2onnx and
    hand-written paddle code write it: x * m + (1 - m) * -1e9, or Where(m, x, 0) + (1 - m) * -1e9."""
    m = _kept(ctx, before_logits=True)
    offset = ctx.op("Mul", [ctx.op("Sub", [ctx.const(1.0), m]), ctx.const(-1e9)])
    if ctx.variant == "mul":
        ctx.insert("logits", lambda x: ctx.op("Add", [ctx.op("Mul", [x, m]), offset]))
    else:
        cond = ctx.op("Cast", [m], to=TensorProto.BOOL)
        ctx.insert("logits", lambda x: ctx.op("Add", [ctx.op("Where", [cond, x, ctx.const(0.0)]), offset]))


@kind("sink", preserving=False, variants=("last", "first", "shifted"))
def sink(ctx: Ctx):
    """Attention sinks (gpt-oss): a learned per-head logit column concatenated to the scores before the
    softmax, its probabilities sliced off after ("shifted": then the max subtracted, as gpt-oss does)."""
    s = ctx.site
    r = ctx.rank(s.scores)
    need(s.softmax.attrs.get("axis", -1 if ctx.opset >= 13 else 1) in (-1, r - 1), "softmax not over the last axis")
    need(s.probs not in ctx.graph.outputs, "the probabilities are a graph output")
    shape = ctx.facts.shape(s.scores)
    heads = shape[1] if shape is not None and r == 4 and isinstance(shape[1], int) else 1  # unknown: one sink for all
    sinks = ctx.const(np.linspace(-1.0, 2.0, heads).reshape((1, heads) + (1,) * (r - 2)))
    column = ctx.op("Expand", [sinks, ctx.op("Concat", [ctx.shape_of(s.scores, 0, r - 1), ctx.ints([1])], axis=0)])
    first = ctx.variant == "first"
    scores = s.scores
    wide = ctx.op("Concat", [column, scores] if first else [scores, column], axis=-1)
    if ctx.variant == "shifted":
        top = ctx.op("ReduceMax", [wide, ctx.ints([-1])], keepdims=1) if ctx.opset >= 18 else \
            ctx.op("ReduceMax", [wide], axes=[-1], keepdims=1)
        wide = ctx.op("Sub", [wide, top])
    s.softmax.inputs[0] = wide
    probs = s.probs
    out = gs.Variable(ctx.fresh("probs_with_sink"))
    s.softmax.outputs[0] = out
    start, end = ([1], [2 ** 62]) if first else ([0], [-1])
    ctx.graph.nodes.append(gs.Node("Slice", ctx.fresh("drop_sink"), {},
                                   [out, ctx.ints(start), ctx.ints(end), ctx.ints([-1])], [probs]))
