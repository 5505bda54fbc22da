"""Grouped-query attention with rotary tables given as graph inputs, shaped as onnxscript's GQA fusion tests write it
(built here by hand with onnx.helper): the fused form (com.microsoft GroupQueryAttention with do_rotary, seqlens_k and
the total length from the inputs' shapes) and the unfused one (com.microsoft RotaryEmbedding at positions
Range(past, past + new), the past concatenated, the key/value heads expanded, an explicit causal mask, MatMul,
Softmax, MatMul). Inputs: query [B, S, H*Dh] (packed: [B, S, (H + 2 Hkv) Dh]), key and value [B, S, Hkv*Dh],
past_key/past_value [B, Hkv, P, Dh], cos/sin [max_seqlen, Dh / 2]. ONNX Runtime runs both at batch 1 over a past and
max_seqlen >= P + S: what the dims search has to find (graph/op_dims.py)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HEADS, KV_HEADS, HEAD = 4, 2, 16


def _inputs(packed: bool) -> list[onnx.ValueInfoProto]:
    width, kv = HEADS * HEAD, KV_HEADS * HEAD
    qkv = [helper.make_tensor_value_info("query", TensorProto.FLOAT, ["B", "S", width + 2 * kv])] if packed else [
        helper.make_tensor_value_info("query", TensorProto.FLOAT, ["B", "S", width]),
        helper.make_tensor_value_info("key", TensorProto.FLOAT, ["B", "S", kv]),
        helper.make_tensor_value_info("value", TensorProto.FLOAT, ["B", "S", kv])]
    return qkv + [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", KV_HEADS, "P", HEAD])
                  for n in ("past_key", "past_value")] + \
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["max_seqlen", HEAD // 2]) for n in ("cos", "sin")]


def _model(nodes, inputs, inits, name: str) -> onnx.ModelProto:
    outputs = [helper.make_tensor_value_info("attention", TensorProto.FLOAT, ["B", "S", HEADS * HEAD])] + \
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", KV_HEADS, "T", HEAD])
         for n in ("present_key", "present_value")]
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, inits), opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def fused_rotary_gqa(packed: bool = False) -> onnx.ModelProto:
    """GroupQueryAttention with do_rotary=1 on the cos/sin inputs; total = P + S and seqlens_k = total - 1 per row,
    both from the inputs' shapes."""
    nodes = [helper.make_node("Shape", ["query"], ["new"], start=1, end=2),
             helper.make_node("Shape", ["past_key"], ["past"], start=2, end=3),
             helper.make_node("Add", ["past", "new"], ["total"]),
             helper.make_node("Cast", ["total"], ["total_int32"], to=TensorProto.INT32),
             helper.make_node("Sub", ["total_int32", "one"], ["last"]),
             helper.make_node("Shape", ["query"], ["batch"], start=0, end=1),
             helper.make_node("Tile", ["last", "batch"], ["seqlens_k"]),
             helper.make_node("GroupQueryAttention", [
                 "query", "" if packed else "key", "" if packed else "value", "past_key", "past_value", "seqlens_k",
                 "total_int32", "cos", "sin"], ["attention", "present_key", "present_value"], name="gqa",
                 domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS, do_rotary=1)]
    return _model(nodes, _inputs(packed), [_const("one", np.array([1], np.int32))], "fused_rotary_gqa")


def unfused_rotary_gqa() -> onnx.ModelProto:
    """The same attention written out: heads split, RotaryEmbedding on Q and K at positions P .. P + S - 1, past
    concatenated, key/value heads repeated, a causal mask over the past and new keys, softmax attention."""
    groups = HEADS // KV_HEADS
    inits = [_const("heads_split", np.array([0, 0, -1, HEAD], np.int64)),
             _const("merge", np.array([0, 0, -1], np.int64)), _const("axis2", np.array([2], np.int64)),
             _const("axis0", np.array([0], np.int64)), _const("step", np.array(1, np.int64)),
             _const("zero", np.array(0, np.int64)), _const("kv_groups", np.array([1, 1, groups, 1, 1], np.int64)),
             _const("heads_shape", np.array([0, HEADS, -1, HEAD], np.int64)),
             _const("low", np.array(-1e9, np.float32)), _const("column", np.array([-1, 1], np.int64)),
             _const("scale", np.array(HEAD ** -0.5, np.float32))]
    nodes = [helper.make_node("Shape", ["past_key"], ["past1"], start=2, end=3),
             helper.make_node("Shape", ["query"], ["new1"], start=1, end=2),
             helper.make_node("Squeeze", ["past1"], ["past"]), helper.make_node("Squeeze", ["new1"], ["new"]),
             helper.make_node("Add", ["past", "new"], ["total"]),
             helper.make_node("Range", ["past", "total", "step"], ["positions1"]),
             helper.make_node("Unsqueeze", ["positions1", "axis0"], ["positions"])]
    for t in ("query", "key", "value"):
        nodes += [helper.make_node("Reshape", [t, "heads_split"], [f"{t}_bshd"]),
                  helper.make_node("Transpose", [f"{t}_bshd"], [f"{t}_bhsd"], perm=[0, 2, 1, 3])]
    for t in ("query", "key"):
        nodes.append(helper.make_node("RotaryEmbedding", [f"{t}_bhsd", "positions", "cos", "sin"], [f"{t}_rope"],
                                      domain="com.microsoft"))
    for t, new in (("key", "key_rope"), ("value", "value_bhsd")):
        nodes += [helper.make_node("Concat", [f"past_{t}", new], [f"present_{t}"], axis=2),
                  helper.make_node("Unsqueeze", [f"present_{t}", "axis2"], [f"{t}_1"]),
                  helper.make_node("Tile", [f"{t}_1", "kv_groups"], [f"{t}_groups"]),
                  helper.make_node("Reshape", [f"{t}_groups", "heads_shape"], [f"{t}_all"])]
    nodes += [helper.make_node("Range", ["zero", "total", "step"], ["key_positions"]),
              helper.make_node("Reshape", ["positions1", "column"], ["query_positions"]),
              helper.make_node("Greater", ["key_positions", "query_positions"], ["future"]),
              helper.make_node("Cast", ["future"], ["future_float"], to=TensorProto.FLOAT),
              helper.make_node("Mul", ["future_float", "low"], ["mask"]),
              helper.make_node("Transpose", ["key_all"], ["key_t"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["query_rope", "key_t"], ["scores"]),
              helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
              helper.make_node("Add", ["scaled", "mask"], ["masked"]),
              helper.make_node("Softmax", ["masked"], ["weights"], axis=-1),
              helper.make_node("MatMul", ["weights", "value_all"], ["context"]),
              helper.make_node("Transpose", ["context"], ["context_bshd"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["context_bshd", "merge"], ["attention"])]
    return _model(nodes, _inputs(False), inits, "unfused_rotary_gqa")


def rotary_gqa_feeds(*, batch: int = 1, new: int = 8, past: int = 6, rows: int | None = None, packed: bool = False,
                     seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    width, kv = HEADS * HEAD, KV_HEADS * HEAD
    qkv = {"query": rng.standard_normal((batch, new, width + 2 * kv))} if packed else {
        "query": rng.standard_normal((batch, new, width)), "key": rng.standard_normal((batch, new, kv)),
        "value": rng.standard_normal((batch, new, kv))}
    angles = np.arange(rows or past + new)[:, None] / (10000 ** (np.arange(0, HEAD, 2) / HEAD))[None]
    feeds = {**qkv, "past_key": rng.standard_normal((batch, KV_HEADS, past, HEAD)),
             "past_value": rng.standard_normal((batch, KV_HEADS, past, HEAD)), "cos": np.cos(angles),
             "sin": np.sin(angles)}
    return {k: v.astype(np.float32) for k, v in feeds.items()}
