"""Attention-like softmaxes, found independently of trtattn's matcher (issue 10's definition): a
Softmax whose input comes from a product of two activations and whose output reaches a product with
a third, through element-wise and layout ops. The fuzzer counts them in every mutant and in every
fused output, and mutations work on the anchors recorded here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from .sources import run

PRODUCTS = {"MatMul", "Einsum"}
BACKWARD = {"Add", "Sub", "Mul", "Div", "Where", "Cast", "CastLike", "Identity", "Dropout", "Reshape", "Flatten",
            "Squeeze", "Unsqueeze", "Transpose", "Expand", "Tanh", "Clip", "Max", "Min", "Neg", "QuantizeLinear",
            "DequantizeLinear", "Concat"}  # Concat: a sink column before the softmax
FORWARD = {"Cast", "CastLike", "Identity", "Dropout", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose",
           "Expand", "Where", "Mul", "QuantizeLinear", "DequantizeLinear", "Slice"}  # Slice: a sink's column dropped
# fused attention ops a model may already hold (each one an attention)
ATTENTION_OPS = {("", "Attention"), ("com.microsoft", "Attention"), ("com.microsoft", "MultiHeadAttention"),
                 ("com.microsoft", "GroupQueryAttention")}


class Activations:
    """Which tensors depend on a graph input (activations) and which are constants."""

    def __init__(self, graph: gs.Graph):
        self.inputs = {t.name for t in graph.inputs}
        self.memo: dict[str, bool] = {}

    def __call__(self, t: gs.Tensor) -> bool:
        stack = [(t, False)]
        while stack:  # iterative post-order: exported graphs are deep
            x, ready = stack.pop()
            if isinstance(x, gs.Constant) or x.name in self.memo:
                continue
            if x.name in self.inputs or not x.inputs:
                self.memo[x.name] = x.name in self.inputs
                continue
            sources = [i for i in x.inputs[0].inputs if not isinstance(i, gs.Constant)]
            if ready:
                self.memo[x.name] = any(self.memo.get(i.name, False) for i in sources)
            else:
                stack.append((x, True))
                stack.extend((i, False) for i in sources if i.name not in self.memo)
        return self.memo.get(t.name, False)


@dataclass
class Site:
    index: int
    softmax: gs.Node
    bmm1: gs.Node
    bmm2: gs.Node
    pre: list[gs.Node] = field(default_factory=list)  # bmm1 -> softmax, in order, both excluded
    post: list[gs.Node] = field(default_factory=list)  # softmax -> bmm2
    probs_slot: int = 0  # which input of bmm2 the probabilities reach

    @property
    def name(self) -> str:
        return self.softmax.name

    @property
    def q(self):
        return self.bmm1.inputs[0]

    @property
    def kt(self):
        return self.bmm1.inputs[1]

    @property
    def v_slot(self) -> int:
        return 1 - self.probs_slot

    @property
    def v(self):
        return self.bmm2.inputs[self.v_slot]

    @property
    def logits(self):
        return self.bmm1.outputs[0]

    @property
    def scores(self):
        return self.softmax.inputs[0]

    @property
    def probs(self):
        return self.softmax.outputs[0]

    def path_tensor(self, node: gs.Node) -> gs.Tensor:
        """The input of a `pre` node that carries the logits."""
        chain = [self.bmm1] + self.pre
        i = chain.index(node)
        return chain[i - 1].outputs[0]

    def tensors(self) -> list[gs.Tensor]:
        """Every tensor the site's nodes read or write (for runtime shapes and values)."""
        out = []
        for n in [self.bmm1, *self.pre, self.softmax, *self.post, self.bmm2]:
            for t in n.inputs + n.outputs:
                out.append(t)
                if t.inputs and t in n.inputs:  # and one level up: Q/K scales, a mask's Where
                    out += t.inputs[0].inputs
        return [t for t in out if not isinstance(t, gs.Constant) and t.name]


def _producer_op(t) -> str | None:
    return t.inputs[0].op if t.inputs else None


def _written_softmax_input(n: gs.Node):
    """The logits of a softmax written without a Softmax op that ends at `n`, else None: Exp(y) / sum,
    Exp(y) * Reciprocal(sum), Exp(LogSoftmax(y)), Exp(y - ReduceLogSumExp | Log(sum)) (issue 18, class 1)."""
    if n.op in ("Div", "Mul") and len(n.inputs) == 2:
        for e, other in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
            if _producer_op(e) == "Exp" and (
                    _producer_op(other) in ("ReduceSum", "Add") if n.op == "Div" else _producer_op(other) == "Reciprocal"):
                return e.inputs[0].inputs[0]
    if n.op == "Exp" and n.inputs[0].inputs:
        p = n.inputs[0].inputs[0]
        if p.op == "LogSoftmax":
            return p.inputs[0]
        if p.op == "Sub" and _producer_op(p.inputs[1]) in ("ReduceLogSumExp", "Log"):
            return p.inputs[0]
    return None


def _backward(softmax: gs.Node, act: Activations, depth: int = 12):
    start = softmax.inputs[0] if softmax.op == "Softmax" else _written_softmax_input(softmax)
    queue: deque = deque([(start, [])])
    seen: set = set()
    while queue:
        t, path = queue.popleft()
        if t.name in seen or not t.inputs or len(path) > depth:
            continue
        seen.add(t.name)
        n = t.inputs[0]
        if n.op in PRODUCTS and len(n.inputs) == 2 and all(act(i) for i in n.inputs):
            return n, list(reversed(path))
        if n.op in BACKWARD:
            for i in n.inputs:
                if act(i):
                    queue.append((i, path + [n]))
    return None, None


def _forward(softmax: gs.Node, act: Activations, depth: int = 6):
    queue: deque = deque([(softmax.outputs[0], [])])
    seen: set = set()
    while queue:
        t, path = queue.popleft()
        if t.name in seen or len(path) > depth:
            continue
        seen.add(t.name)
        for c in t.outputs:
            if c.op in PRODUCTS and len(c.inputs) == 2:
                slot = next(i for i, x in enumerate(c.inputs) if x is t)
                if act(c.inputs[1 - slot]):
                    return c, path, slot
            elif c.op in FORWARD and c.outputs:
                queue.append((c.outputs[0], path + [c]))
    return None, None, 0


def locate(graph: gs.Graph) -> list[Site]:
    act = Activations(graph)
    sites: list[Site] = []
    for n in graph.nodes:
        if n.op != "Softmax" and _written_softmax_input(n) is None:
            continue
        bmm1, pre = _backward(n, act)
        if bmm1 is None:
            continue
        bmm2, post, slot = _forward(n, act)
        if bmm2 is None:
            continue
        sites.append(Site(len(sites), n, bmm1, bmm2, pre, post, slot))
    return sites


def count_attention(model: onnx.ModelProto) -> tuple[int, int]:
    """(attention-like softmaxes still decomposed, fused attention ops) in a model."""
    graph = gs.import_onnx(model)
    fused = sum((n.domain or "", n.op) in ATTENTION_OPS for n in graph.nodes)
    return len(locate(graph)), fused


# ------------------------------------------------------------------ runtime facts
@dataclass
class Facts:
    """What the source computes at each site's tensors, on both of the fuzzer's input sets."""

    shapes: dict[str, list[tuple]]  # tensor -> shape per input set
    dtypes: dict[str, np.dtype]
    values: dict[str, np.ndarray]  # small tensors whose value is the same on every input set
    input_shapes: dict[str, list[tuple]]  # graph input -> shape per input set
    varies: dict[str, set]  # tensor -> the axes (-1, -2) along which a shift by one changes it
    trivial: set  # tensors that are all zero (float) or all True (bool) on every input set
    absmax: dict[str, float]  # float tensor -> its largest magnitude over the input sets

    def shape(self, t) -> tuple | None:
        s = self.shapes.get(t.name if hasattr(t, "name") else t)
        return s[0] if s else None

    def same_shape(self, a, b, axes: slice) -> bool:
        sa, sb = self.shapes.get(a.name), self.shapes.get(b.name)
        return bool(sa and sb) and all(x[axes] == y[axes] for x, y in zip(sa or [], sb or []))

    def value(self, t) -> np.ndarray | None:
        if isinstance(t, gs.Constant):
            return np.asarray(t.values)
        return self.values.get(t.name)


def facts(model: onnx.ModelProto, sites: list[Site], feed_sets: list[dict]) -> Facts:
    names = sorted({t.name for s in sites for t in s.tensors()} - {o.name for o in model.graph.output}
                   - {i.name for i in model.graph.input})
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in names)
    runs = [run(probe, f) | f for f in feed_sets]
    shapes = {k: [tuple(r[k].shape) for r in runs] for k in runs[0]}
    dtypes = {k: runs[0][k].dtype for k in runs[0]}
    values = {k: runs[0][k] for k in runs[0]
              if runs[0][k].size <= 16 and all(r[k].shape == runs[0][k].shape and np.array_equal(r[k], runs[0][k])
                                               for r in runs[1:])}
    varies = {k: {ax for ax in (-1, -2) if any(r[k].ndim >= -ax and not np.array_equal(np.roll(r[k], 1, ax), r[k])
                                               for r in runs)} for k in runs[0]}
    trivial = {k for k in runs[0] if all(not r[k].any() if r[k].dtype != np.bool_ else r[k].all() for r in runs)}
    absmax = {k: max(float(np.abs(r[k]).max(initial=0)) for r in runs) for k in runs[0]
              if np.issubdtype(runs[0][k].dtype, np.floating)}
    return Facts(shapes, dtypes, values, {k: [f[k].shape for f in feed_sets] for k in feed_sets[0]}, varies, trivial,
                 absmax)
