"""Hand-built graphs of softmaxes beside attention that are not attention, and one that is though it is
written with integers (issue 32). Each model has two layers, each an ordinary multi-head attention followed
by the part named, so that what is said of the part must be said identically in both layers:
- "router": a mixture of experts' router, softmax over the experts (a weight's axis), weighing the experts'
  outputs;
- "nystrom": Nystromformer's three kernels over landmarks, the middle one feeding a pseudo-inverse
  iteration (its probabilities multiplied by values made from themselves);
- "linear": linear "efficient attention", softmax of Q over features, of K over positions, then
  Q' (K'^T V): no product of Q and K feeds either softmax;
- "integer": I-BERT's quant mode: Q.K^T, then an integer exp and normalisation (no Softmax op, no float
  exp), then P.V: attention, which the tool cannot fuse and must list.
Each runs on ONNX Runtime with its default session options.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from .graphs import _G

KINDS = ("router", "nystrom", "linear", "integer")
SEQ, DIM, HEADS, EXPERTS, LANDMARKS = 8, 16, 2, 4, 4


def _w(g: _G, rng, rows: int, cols: int) -> str:
    return g.init((rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32))


def _attention(g: _G, x: str, rng) -> str:
    """An ordinary multi-head self-attention block with its residual."""
    head = DIM // HEADS
    q, k, v = (g.op("Transpose", [g.op("Reshape", [g.op("MatMul", [x, _w(g, rng, DIM, DIM)]),
                                                   g.ints([0, 0, HEADS, head])])], perm=[0, 2, 1, 3])
               for _ in range(3))
    logits = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]), g.scalar(head ** -0.5)])
    out = g.op("MatMul", [g.op("Softmax", [logits], axis=-1), v])
    out = g.op("Reshape", [g.op("Transpose", [out], perm=[0, 2, 1, 3]), g.ints([0, 0, DIM])])
    return g.op("Add", [x, g.op("MatMul", [out, _w(g, rng, DIM, DIM)])])


def _router(g: _G, x: str, rng) -> str:
    """Dense mixture of experts: softmax(x . W_router) over the experts weighs their outputs."""
    probs = g.op("Softmax", [g.op("MatMul", [x, _w(g, rng, DIM, EXPERTS)])], axis=-1)  # [B, T, E]
    experts = g.op("Concat", [g.unsqueeze(g.op("MatMul", [x, _w(g, rng, DIM, DIM)]), [2]) for _ in range(EXPERTS)],
                   axis=2)  # [B, T, E, D]
    mixed = g.op("MatMul", [g.unsqueeze(probs, [2]), experts])  # [B, T, 1, E] . [B, T, E, D]
    return g.op("Add", [x, g.op("Squeeze", [mixed, g.ints([2])])])


def _pinv(g: _G, m: str, iterations: int = 3) -> str:
    """Nystromformer's iterative Moore-Penrose inverse of `m` [B, L, L] (its own initialisation)."""
    eye = g.init(np.eye(LANDMARKS, dtype=np.float32), "eye")
    a = g.op("Abs", [m])
    norm = g.op("Mul", [g.op("ReduceMax", [g.reduce_sum(a, [-2])], keepdims=0),
                        g.op("ReduceMax", [g.reduce_sum(a, [-1])], keepdims=0)])
    z = g.op("Div", [g.op("Transpose", [m], perm=[0, 2, 1]), norm])
    for _ in range(iterations):
        kv = g.op("MatMul", [m, z])
        inner = g.op("Sub", [g.op("Mul", [eye, g.scalar(7.0)]), kv])
        inner = g.op("Sub", [g.op("Mul", [eye, g.scalar(15.0)]), g.op("MatMul", [kv, inner])])
        inner = g.op("Sub", [g.op("Mul", [eye, g.scalar(13.0)]), g.op("MatMul", [kv, inner])])
        z = g.op("MatMul", [g.op("Mul", [z, g.scalar(0.25)]), inner])
    return z


def _nystrom(g: _G, x: str, rng) -> str:
    """One-head Nystrom attention: landmarks are segment means of Q and K; kernel 2 feeds the pseudo-inverse."""
    q, k, v = (g.op("MatMul", [x, _w(g, rng, DIM, DIM)]) for _ in range(3))  # [B, T, D]
    land = lambda t: g.op("ReduceMean", [g.op("Reshape", [t, g.ints([0, LANDMARKS, SEQ // LANDMARKS, DIM])])],  # noqa: E731
                          axes=[2], keepdims=0)
    q_l, k_l = land(q), land(k)
    tr = lambda t: g.op("Transpose", [t], perm=[0, 2, 1])  # noqa: E731
    k1 = g.op("Softmax", [g.op("MatMul", [q, tr(k_l)])], axis=-1)  # [B, T, L]
    k2 = g.op("Softmax", [g.op("MatMul", [q_l, tr(k_l)])], axis=-1)  # [B, L, L]
    k3 = g.op("Softmax", [g.op("MatMul", [q_l, tr(k)])], axis=-1)  # [B, L, T]
    out = g.op("MatMul", [g.op("MatMul", [k1, _pinv(g, k2)]), g.op("MatMul", [k3, v])])
    return g.op("Add", [x, g.op("MatMul", [out, _w(g, rng, DIM, DIM)])])


def _linear(g: _G, x: str, rng) -> str:
    """Efficient attention: softmax(Q) over features, softmax(K) over positions, Q' (K'^T V)."""
    q = g.op("Softmax", [g.op("MatMul", [x, _w(g, rng, DIM, DIM)])], axis=-1)
    k = g.op("Softmax", [g.op("MatMul", [x, _w(g, rng, DIM, DIM)])], axis=1)
    v = g.op("MatMul", [x, _w(g, rng, DIM, DIM)])
    context = g.op("MatMul", [g.op("Transpose", [k], perm=[0, 2, 1]), v])  # [B, D, D]
    return g.op("Add", [x, g.op("MatMul", [g.op("MatMul", [q, context]), _w(g, rng, DIM, DIM)])])


def _integer(g: _G, x: str, rng) -> str:
    """I-BERT's integer softmax between the products: the logits quantized to int32, a polynomial exp in
    integers, normalised by an integer division, dequantized for P.V."""
    q, k, v = (g.op("MatMul", [x, _w(g, rng, DIM, DIM)]) for _ in range(3))
    logits = g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 2, 1])])
    ints = g.op("Cast", [g.op("Round", [g.op("Mul", [logits, g.scalar(16.0)])])], to=TensorProto.INT32)
    shifted = g.op("Sub", [ints, g.op("ReduceMax", [ints], axes=[-1], keepdims=1)])  # <= 0
    clipped = g.op("Max", [shifted, g.init(np.asarray(-64, dtype=np.int32), "i")])
    c = g.op("Add", [clipped, g.init(np.asarray(64, dtype=np.int32), "i")])  # in [0, 64]
    exp = g.op("Mul", [c, c])  # an integer polynomial in place of exp
    total = g.reduce_sum(exp, [-1])
    probs = g.op("Div", [g.op("Mul", [exp, g.init(np.asarray(256, dtype=np.int32), "i")]), g.unsqueeze(total, [-1])])
    p = g.op("Mul", [g.op("Cast", [probs], to=TensorProto.FLOAT), g.scalar(1 / 256)])
    return g.op("Add", [x, g.op("MatMul", [g.op("MatMul", [p, v]), _w(g, rng, DIM, DIM)])])


PARTS = {"router": _router, "nystrom": _nystrom, "linear": _linear, "integer": _integer}


def not_attention_model(kind: str, *, layers: int = 2, attention: bool = True, seed: int = 0) -> onnx.ModelProto:
    """`layers` blocks of an attention (unless not `attention`) and then the part `kind` (one of KINDS: module
    doc), at a static length."""
    if kind not in PARTS:
        raise ValueError(f"unknown kind {kind!r}: one of {KINDS}")
    rng = np.random.default_rng(seed)
    g = _G(17)
    x = "x"
    for _ in range(layers):
        x = PARTS[kind](g, _attention(g, x, rng) if attention else x, rng)
    out = g.op("Identity", [x])
    graph = helper.make_graph(g.nodes, f"not_attention_{kind}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", SEQ, DIM])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["batch", SEQ, DIM])], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tests")
    model.ir_version = 8
    return model
