"""Hand-built graphs of attention written in pieces (issue 32), from the diagrams of
shared/reference/graph-transforms-mha-to-sha.txt:

- `split_cache_model(form="mha")`: Gemma3's prefill over a cache split from the new slice. The heads are
  folded into the query axis ([B, 1, N*T, H] over one KV head); the cached K and the new K slice are two
  products whose logits are concatenated along the keys, the mask is added, the probabilities are sliced back
  into the cache part and the new part, each multiplied by its own V (the cached V stored transposed,
  [B, 1, H, KV_LEN], when `v_transposed`), and the two products are added. The new K and V slices are
  outputs too (what the caller writes into the cache).
- `split_cache_model(form="sha")`: the same with the query split into N single-head attentions over the split
  cache, packed back by a Concat.
- `shared_softmax_model()`: differential attention as exporters write it once they merged a layer's two
  identical softmaxes: one Softmax feeding two products with V1 and V2, whose outputs are subtracted.

Every model runs on ONNX Runtime with default session options; random weights from `seed`.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
END = 2 ** 62  # a Slice end past the axis: "to the end"


class _Builder:
    def __init__(self, seed: int):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self.n = 0

    def op(self, op: str, inputs: list[str], name: str | None = None, outputs: int = 1, **attrs):
        self.n += 1
        base = name or f"{op}_{self.n}"
        outs = [f"{base}_out{i}" if outputs > 1 else f"{base}_out" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=base, **attrs))
        return outs if outputs > 1 else outs[0]

    def const(self, value, dtype=np.int64) -> str:
        self.n += 1
        name = f"c{self.n}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def weight(self, rows: int, cols: int) -> str:
        return self.const(self.rng.standard_normal((rows, cols)) / np.sqrt(rows), np.float32)

    def slice(self, x: str, start: int, end: int, axis: int, name: str) -> str:
        return self.op("Slice", [x, self.const([start]), self.const([end]), self.const([axis])], name=name)


def _model(b: _Builder, inputs, outputs, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(b.nodes, name, inputs, outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _split_attention(b: _Builder, q: str, k_cache_t: str, k_new_t: str, v_cache: str, v_new: str, mask: str,
                     kv_len: int, tag: str, heads_folded: int = 0, seq: int = 0) -> str:
    """Q.[Kc | Kn]^T concatenated, masked, softmax, sliced back and summed over [Vc | Vn]: [B, 1, rows, H].
    `heads_folded`: the heads folded into the rows, unfolded to [B, N, T, ...] around the mask's Add."""
    s = b.op("Concat", [b.op("MatMul", [q, k_cache_t], name=f"{tag}/qk_cache"),
                        b.op("MatMul", [q, k_new_t], name=f"{tag}/qk_new")], name=f"{tag}/logits", axis=3)
    if heads_folded:
        s = b.op("Reshape", [s, b.const([0, heads_folded, seq, kv_len + seq])], name=f"{tag}/unfold")
    s = b.op("Add", [s, mask], name=f"{tag}/mask")
    if heads_folded:
        s = b.op("Reshape", [s, b.const([0, 1, heads_folded * seq, kv_len + seq])], name=f"{tag}/fold")
    p = b.op("Softmax", [s], name=f"{tag}/Softmax", axis=-1)
    o_cache = b.op("MatMul", [b.slice(p, 0, kv_len, 3, f"{tag}/p_cache"), v_cache], name=f"{tag}/pv_cache")
    o_new = b.op("MatMul", [b.slice(p, kv_len, END, 3, f"{tag}/p_new"), v_new], name=f"{tag}/pv_new")
    return b.op("Add", [o_cache, o_new], name=f"{tag}/sum")


def split_cache_model(*, form: str = "mha", batch: int = 1, seq: int = 4, heads: int = 4, head: int = 8,
                      kv_len: int = 6, v_transposed: bool = True, seed: int = 0) -> onnx.ModelProto:
    """The Gemma3 split-cache prefill (module doc) in `form` "mha" or "sha"."""
    if form not in ("mha", "sha"):
        raise ValueError(f"form is 'mha' or 'sha', not {form!r}")
    b = _Builder(seed)
    f32 = TensorProto.FLOAT
    v_cache_shape = [batch, 1, head, kv_len] if v_transposed else [batch, 1, kv_len, head]
    inputs = [helper.make_tensor_value_info("rope_out", f32, [batch, seq, heads, head]),
              helper.make_tensor_value_info("k_slice", f32, [batch, seq, 1, head]),
              helper.make_tensor_value_info("v_slice", f32, [batch, seq, 1, head]),
              helper.make_tensor_value_info("k_cache", f32, [batch, 1, kv_len, head]),
              helper.make_tensor_value_info("v_cache", f32, v_cache_shape),
              helper.make_tensor_value_info("mask", f32, [batch, 1, seq, kv_len + seq])]
    scale = b.const(head ** -0.5, np.float32)
    rope = b.op("Mul", ["rope_out", scale], name="q_scale") if form == "mha" else "rope_out"
    folded = b.op("Reshape", [b.op("Transpose", [rope], name="q_heads", perm=[0, 2, 1, 3]),
                              b.const([0, 1, heads * seq, head])], name="q_fold")  # [B, 1, N*T, H]
    k_new = b.op("Reshape", ["k_slice", b.const([0, 1, seq, head])], name="k_new")  # [B, 1, T, H]: an output
    k_cache_t = b.op("Transpose", ["k_cache"], name="k_cache_t", perm=[0, 1, 3, 2])
    k_new_t = b.op("Transpose", [k_new], name="k_new_t", perm=[0, 1, 3, 2])
    if v_transposed:  # the cache and the new slice stored [B, 1, H, len]
        v_new_stored = b.op("Transpose", ["v_slice"], name="v_new", perm=[0, 2, 3, 1])
        v_cache = b.op("Transpose", ["v_cache"], name="v_cache_t", perm=[0, 1, 3, 2])
        v_new = b.op("Transpose", [v_new_stored], name="v_new_t", perm=[0, 1, 3, 2])
    else:
        v_new_stored = v_new = b.op("Reshape", ["v_slice", b.const([0, 1, seq, head])], name="v_new")
        v_cache = "v_cache"
    if form == "mha":
        o = _split_attention(b, folded, k_cache_t, k_new_t, v_cache, v_new, "mask", kv_len, "attn", heads, seq)
        o = b.op("Transpose", [b.op("Reshape", [o, b.const([0, heads, seq, head])], name="out_unfold")],
                 name="out_heads", perm=[0, 2, 1, 3])
        out = b.op("Reshape", [o, b.const([0, seq, heads * head])], name="fc_in")
    else:
        parts = b.op("Split", [folded, b.const([seq] * heads)], name="q_split", outputs=heads, axis=2)
        outs = [_split_attention(b, b.op("Mul", [q, scale], name=f"sha{i}/q_scale"), k_cache_t, k_new_t, v_cache,
                                 v_new, "mask", kv_len, f"sha{i}") for i, q in enumerate(parts)]
        out = b.op("Reshape", [b.op("Concat", outs, name="sha_pack", axis=3), b.const([0, seq, heads * head])],
                   name="fc_in")
    outputs = [helper.make_tensor_value_info(out, f32, [batch, seq, heads * head]),
               helper.make_tensor_value_info(k_new, f32, [batch, 1, seq, head]),
               helper.make_tensor_value_info(v_new_stored, f32, [batch, 1, head, seq] if v_transposed
                                             else [batch, 1, seq, head])]
    return _model(b, inputs, outputs, f"split_cache_{form}")


def shared_softmax_model(*, batch: int = 2, seq: int = 5, heads: int = 2, head: int = 8, lam: float = 0.4,
                         seed: int = 0) -> onnx.ModelProto:
    """Differential attention with its two identical softmaxes merged (module doc): x [B, S, D] -> out [B, S, D]."""
    b = _Builder(seed)
    f32, d = TensorProto.FLOAT, heads * head

    def heads_of(name: str, perm: list[int]) -> str:
        x = b.op("MatMul", ["x", b.weight(d, d)], name=f"{name}_proj")
        return b.op("Transpose", [b.op("Reshape", [x, b.const([0, 0, heads, head])], name=f"{name}_split")],
                    name=f"{name}_heads", perm=perm)

    q, k = heads_of("q", [0, 2, 1, 3]), heads_of("k", [0, 2, 3, 1])
    v1, v2 = heads_of("v1", [0, 2, 1, 3]), heads_of("v2", [0, 2, 1, 3])
    logits = b.op("Mul", [b.op("MatMul", [q, k], name="qk"), b.const(head ** -0.5, np.float32)], name="scale")
    p = b.op("Softmax", [b.op("Add", [logits, "mask"], name="mask_add")], name="attn/Softmax", axis=-1)
    o1, o2 = b.op("MatMul", [p, v1], name="pv1"), b.op("MatMul", [p, v2], name="pv2")
    o = b.op("Sub", [o1, b.op("Mul", [o2, b.const(lam, np.float32)], name="lambda")], name="differential")
    merged = b.op("Reshape", [b.op("Transpose", [o], name="out_heads", perm=[0, 2, 1, 3]), b.const([0, 0, d])],
                  name="out_merge")
    out = b.op("MatMul", [merged, b.weight(d, d)], name="out_proj")
    inputs = [helper.make_tensor_value_info("x", f32, [batch, seq, d]),
              helper.make_tensor_value_info("mask", f32, [batch, 1, seq, seq])]
    return _model(b, inputs, [helper.make_tensor_value_info(out, f32, [batch, seq, d])], "shared_softmax")


__all__ = ["split_cache_model", "shared_softmax_model"]
