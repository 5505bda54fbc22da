"""Hand-built graphs of attention written one head at a time (SHA), as NPU toolchains export it
(shared/reference/graph-transforms-mha-to-sha.txt).

`sha_model(unpack=...)` writes `layers` blocks of
    x[B,T,D] -> Q,K,V projections -> [B,T,N,H] -> one piece per head (Split + Squeeze, Gather, Slice)
    -> per head: Q.K^T + mask -> Softmax -> P.V -> packed back (Unsqueeze + Concat, or Concat) -> out
with one additive mask made once (Equal -> Cast -> Mul) and added in every head of every layer.
`sha_folded_model()` folds the heads into the query axis over one KV head (the document's Gemma3 SHA);
`select_mask_model()` is the document's Select mask shared by layers with a transposed output (V^T . P^T).
Softmaxes that are not attention are in not_attention.py. Each model runs on ONNX Runtime with its
default session options.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from .graphs import _G

UNPACKS = ("split", "gather", "slice")


def _finish(g: _G, inputs: list, output: str, name: str, shape: list) -> onnx.ModelProto:
    graph = helper.make_graph(g.nodes, name, inputs,
                              [helper.make_tensor_value_info(output, TensorProto.FLOAT, shape)], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", g.opset)], producer_name="tests")
    model.ir_version = 8
    return model


def _inputs(dim: int, with_mask: bool) -> list:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", dim])
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq", "seq"])
    return [x, mask] if with_mask else [x]


def _mask(g: _G) -> str:
    """Mask -> Equal -> Cast -> Mul: the additive mask made once, read by every head (the document's)."""
    hole = g.op("Cast", [g.op("Equal", ["attention_mask", g.ints(0)])], to=TensorProto.FLOAT)
    return g.op("Mul", [hole, g.scalar(-10000.0)])


def _heads(g: _G, x: str, w: np.ndarray, heads: int, head: int) -> str:
    """x . w as [B, T, N, H]."""
    return g.op("Reshape", [g.op("MatMul", [x, g.init(w.astype(np.float32))]), g.ints([0, 0, heads, head])])


def _pieces(g: _G, t: str, heads: int, unpack: str) -> list[str]:
    """`t` [B, T, N, H] as one [B, T, H] tensor per head, along the heads axis (2)."""
    if unpack == "split":
        parts = g.op("Split", [t, g.ints([1] * heads)], outputs=heads, axis=2)
        return [g.op("Squeeze", [p, g.ints([2])]) for p in (parts if heads > 1 else [parts])]
    if unpack == "gather":
        return [g.op("Gather", [t, g.init(np.asarray(i, dtype=np.int64), "i")], axis=2) for i in range(heads)]
    if unpack == "slice":
        return [g.op("Squeeze", [g.op("Slice", [t, g.ints([i]), g.ints([i + 1]), g.ints([2])]), g.ints([2])])
                for i in range(heads)]
    raise ValueError(f"unknown unpack {unpack!r}: one of {UNPACKS}")


def _sha_layer(g: _G, x: str, mask: str | None, rng, *, heads: int, head: int, unpack: str, pack: str,
               order: list[int], scales: list[float]) -> str:
    d = heads * head
    q, k, v = (_pieces(g, _heads(g, x, rng.standard_normal((d, d)) / np.sqrt(d), heads, head), heads, unpack)
               for _ in range(3))
    outs = []
    for qi, ki, vi, scale in zip(q, k, v, scales):
        logits = g.op("MatMul", [g.op("Mul", [qi, g.scalar(scale)]), g.op("Transpose", [ki], perm=[0, 2, 1])])
        if mask is not None:
            logits = g.op("Add", [logits, mask])
        outs.append(g.op("MatMul", [g.op("Softmax", [logits], axis=-1), vi]))
    outs = [outs[i] for i in order]
    if pack == "unsqueeze":  # [B, T, N, H], then [B, T, D]
        merged = g.op("Reshape", [g.op("Concat", [g.unsqueeze(o, [2]) for o in outs], axis=2), g.ints([0, 0, d])])
    elif pack == "concat":  # [B, T, N*H] directly
        merged = g.op("Concat", outs, axis=-1)
    else:
        raise ValueError(f"unknown pack {pack!r}")
    out = g.op("MatMul", [merged, g.init((rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32))])
    return g.op("Add", [x, out])


def sha_model(*, unpack: str = "split", pack: str = "unsqueeze", layers: int = 2, heads: int = 4, head: int = 8,
              mask: bool = True, order: list[int] | None = None, scales: list[float] | None = None, opset: int = 17,
              seed: int = 0) -> onnx.ModelProto:
    """`layers` SHA blocks (module doc); `unpack` one of UNPACKS, `pack` "unsqueeze" or "concat". `order`: the
    heads in the order they are packed (default in order: a multi-head attention only then); `scales`: each
    head's softmax scale (default head ** -0.5 for all)."""
    rng = np.random.default_rng(seed)
    g = _G(opset)
    m = _mask(g) if mask else None
    x = "x"
    order = list(range(heads)) if order is None else order
    scales = [head ** -0.5] * heads if scales is None else scales
    for _ in range(layers):
        x = _sha_layer(g, x, m, rng, heads=heads, head=head, unpack=unpack, pack=pack, order=order, scales=scales)
    return _finish(g, _inputs(heads * head, mask), g.op("Identity", [x]), f"sha_{unpack}_{pack}",
                   ["batch", "seq", heads * head])


def _folded_layer(g: _G, x: str, mask: str, rng, *, heads: int, head: int, seq: int) -> str:
    """The document's Gemma3 SHA: heads folded into the query axis ([B, 1, N*T, H]) and split back into N
    queries of T rows, each over the one KV head ([B, 1, T, H]); the outputs concatenated over features."""
    d = heads * head
    w = lambda rows, cols: g.init((rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32))  # noqa: E731
    q = g.op("Reshape", [g.op("MatMul", [x, w(d, d)]), g.ints([0, 0, heads, head])])
    folded = g.op("Reshape", [g.op("Transpose", [q], perm=[0, 2, 1, 3]), g.ints([0, 1, heads * seq, head])])
    k = g.unsqueeze(g.op("MatMul", [x, w(d, head)]), [1])  # [B, 1, T, H]
    v = g.unsqueeze(g.op("MatMul", [x, w(d, head)]), [1])
    k_t = g.op("Transpose", [k], perm=[0, 1, 3, 2])
    outs = []
    for qi in g.op("Split", [folded, g.ints([seq] * heads)], outputs=heads, axis=2):
        logits = g.op("Add", [g.op("MatMul", [g.op("Mul", [qi, g.scalar(head ** -0.5)]), k_t]), mask])
        outs.append(g.op("MatMul", [g.op("Softmax", [logits], axis=-1), v]))
    merged = g.op("Reshape", [g.op("Concat", outs, axis=-1), g.ints([0, seq, d])])  # [B, 1, T, N*H] -> [B, T, D]
    return g.op("Add", [x, g.op("MatMul", [merged, w(d, d)])])


def sha_folded_model(*, layers: int = 2, heads: int = 4, head: int = 8, seq: int = 6, seed: int = 0) -> onnx.ModelProto:
    """`layers` blocks of heads folded into the query axis over one KV head (_folded_layer), at a static length
    `seq` (the split sizes are the query length), as NPU exports are."""
    rng = np.random.default_rng(seed)
    g = _G(17)
    m = g.unsqueeze(_mask(g), [1])  # [B, 1, T, S], as the logits
    x = "x"
    for _ in range(layers):
        x = _folded_layer(g, x, m, rng, heads=heads, head=head, seq=seq)
    d = heads * head
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", seq, d]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", seq, seq])]
    return _finish(g, inputs, g.op("Identity", [x]), "sha_folded", ["batch", seq, d])


def select_mask_model(*, layers: int = 2, heads: int = 4, head: int = 8, seed: int = 0) -> onnx.ModelProto:
    """The document's multi-head attention with MaskedSoftmax via Select: one NotEqual of the reshaped mask
    (Not(Equal): ONNX has no NotEqual) shared by every layer's Where, and the output taken transposed,
    V^T . P^T ([B, N, H, T]), then back."""
    rng = np.random.default_rng(seed)
    g = _G(17)
    d = heads * head
    keep = g.op("Not", [g.op("Equal", [g.unsqueeze("attention_mask", [1]), g.ints(0)])])  # [B, 1, T, S]
    x = "x"
    for _ in range(layers):
        q, k, v = (_heads(g, x, rng.standard_normal((d, d)) / np.sqrt(d), heads, head) for _ in range(3))
        qt = g.op("Transpose", [g.op("Mul", [q, g.scalar(head ** -0.5)])], perm=[0, 2, 1, 3])  # [B, N, T, H]
        kt = g.op("Transpose", [k], perm=[0, 2, 3, 1])  # [B, N, H, S]
        vt = g.op("Transpose", [v], perm=[0, 2, 3, 1])  # [B, N, H, S]
        logits = g.op("Where", [keep, g.op("MatMul", [qt, kt]), g.scalar(-1e9)])
        probs_t = g.op("Transpose", [g.op("Softmax", [logits], axis=-1)], perm=[0, 1, 3, 2])  # [B, N, S, T]
        out = g.op("Transpose", [g.op("MatMul", [vt, probs_t])], perm=[0, 3, 1, 2])  # [B, N, H, T] -> [B, T, N, H]
        out = g.op("MatMul", [g.op("Reshape", [out, g.ints([0, 0, d])]),
                              g.init((rng.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32))])
        x = g.op("Add", [x, out])
    return _finish(g, _inputs(d, True), g.op("Identity", [x]), "select_mask", ["batch", "seq", d])
