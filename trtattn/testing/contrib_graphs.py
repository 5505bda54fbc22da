"""Hand-built graphs of ONNX Runtime's contrib attention ops with caches and linked inputs (tests of
rewrite/microsoft.py, rewrite/group_query.py and the dims search): ONNX Runtime runs them on CPU.

- `group_query_model`: GroupQueryAttention with past_key/past_value and its integer inputs seqlens_k and
  total_sequence_length as graph inputs, optionally after RotaryEmbedding with position_ids [1, S]
  (broadcast over the batch: the model runs at batch 1 only).
- `cache_model`: MultiHeadAttention (past_key/past_value -> present_key/present_value) or Attention
  (past [2, B, N, P, H] -> present), unidirectional or not.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


_RANKS = {"y": 3, "present": 5}  # the outputs' ranks (the others: a present key or value, BNSH)


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    """A model strict ONNX accepts too: its outputs have a rank (dims unnamed)."""
    graph = helper.make_graph(nodes, "contrib", inputs, [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * _RANKS.get(n, 4)) for n in outputs], list(inits))
    model = helper.make_model(graph, opset_imports=_OPSETS)
    model.ir_version = 8
    return model


def rotary_tables(head: int, positions: int = 64) -> list[onnx.TensorProto]:
    angles = np.arange(positions)[:, None] / (10000 ** (np.arange(0, head, 2) / head))[None]
    return [numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos_cache"),
            numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin_cache")]


def group_query_model(*, heads=4, kv_heads=2, head=8, rotary=False, packed=False, **attributes) -> onnx.ModelProto:
    """`packed`: Q, K and V in one input [B, S, (N + 2 Nkv) H] (the key and value inputs left out).
    `attributes`: more of the op's own (Gemma 2's local_window_size=8, softcap=50.0)."""
    if packed:
        qkv = [helper.make_tensor_value_info("query", TensorProto.FLOAT, ["b", "s", (heads + 2 * kv_heads) * head])]
    else:
        qkv = [helper.make_tensor_value_info("query", TensorProto.FLOAT, ["b", "s", heads * head]),
               helper.make_tensor_value_info("key", TensorProto.FLOAT, ["b", "s", kv_heads * head]),
               helper.make_tensor_value_info("value", TensorProto.FLOAT, ["b", "s", kv_heads * head])]
    inputs = [*qkv,
              helper.make_tensor_value_info("past_key", TensorProto.FLOAT, ["b", kv_heads, "past", head]),
              helper.make_tensor_value_info("past_value", TensorProto.FLOAT, ["b", kv_heads, "past", head]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["b"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    nodes, inits, q, k = [], [], "query", "key"
    if rotary:
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "s"]))
        inits = rotary_tables(head)
        nodes = [helper.make_node("RotaryEmbedding", [t, "position_ids", "cos_cache", "sin_cache"], [f"{t}_rotated"],
                                  domain="com.microsoft", num_heads=n) for t, n in ((q, heads), (k, kv_heads))]
        q, k = "query_rotated", "key_rotated"
    k, value = ("", "") if packed else (k, "value")
    nodes.append(helper.make_node("GroupQueryAttention", [q, k, value, "past_key", "past_value", "seqlens_k",
                                                          "total_sequence_length"], ["y", "present_key", "present_value"],
                                  domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads, name="gqa", **attributes))
    return _model(nodes, inputs, ["y", "present_key", "present_value"], inits)


def group_query_feeds(rows: int, new: int, past: int, seqlens=None, seed: int = 0,
                      packed: bool = False) -> dict[str, np.ndarray]:
    """Feeds of group_query_model (4/2 heads of 8) that ONNX Runtime runs: seqlens_k = total - 1 per row
    unless given."""
    rng = np.random.default_rng(seed)
    qkv = {"query": rng.standard_normal((rows, new, 64))} if packed else {
        "query": rng.standard_normal((rows, new, 32)), "key": rng.standard_normal((rows, new, 16)),
        "value": rng.standard_normal((rows, new, 16))}
    feeds = {**qkv, "past_key": rng.standard_normal((rows, 2, past, 8)),
             "past_value": rng.standard_normal((rows, 2, past, 8))}
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    feeds["seqlens_k"] = np.asarray(seqlens if seqlens is not None else [past + new - 1] * rows, dtype=np.int32)
    feeds["total_sequence_length"] = np.array(past + new, dtype=np.int32)
    return feeds


def cache_model(op: str = "MultiHeadAttention", *, unidirectional=1, mask=False, heads=2, head=8,
                seed=0) -> onnx.ModelProto:
    """`mask`: a raw key padding mask [B, past + S] (int32, 0 at the padding) over the past and new keys."""
    width = heads * head
    rng = np.random.default_rng(seed)
    padding = [helper.make_tensor_value_info("mask", TensorProto.INT32, ["b", "past+s"])] if mask else []
    if op == "Attention":
        inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", width]),
                  helper.make_tensor_value_info("past", TensorProto.FLOAT, [2, "b", heads, "past", head])]
        inits = [numpy_helper.from_array((rng.standard_normal((width, 3 * width)) * 0.3).astype(np.float32), "w"),
                 numpy_helper.from_array((rng.standard_normal(3 * width) * 0.3).astype(np.float32), "bias")]
        node = helper.make_node("Attention", ["x", "w", "bias", "mask" if mask else "", "past"], ["y", "present"],
                                domain="com.microsoft", num_heads=heads, unidirectional=unidirectional, name="attention")
        return _model([node], inputs + padding, ["y", "present"], inits)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", width]) for n in ("q", "k", "v")] + \
             [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", heads, "past", head])
              for n in ("past_key", "past_value")]
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "mask" if mask else "", "", "past_key", "past_value"],
                            ["y", "present_key", "present_value"], domain="com.microsoft", num_heads=heads,
                            unidirectional=unidirectional, name="mha")
    return _model([node], inputs + padding, ["y", "present_key", "present_value"])


def group_query_decoder(seed=0) -> onnx.ModelProto:
    """Token ids -> embedding -> Q/K/V projections -> GroupQueryAttention with a past, its int64 length inputs
    cast to int32 (the query is not an input: its new tokens are the token ids' sequence)."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * scale, name)
             for name, shape, scale in (("embedding", (50, 64), 1.0), ("wq", (64, 64), 0.2), ("wk", (64, 32), 0.2),
                                        ("wv", (64, 32), 0.2))]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence_length"]),
              helper.make_tensor_value_info("past_key", TensorProto.FLOAT, ["batch", 2, "past_sequence_length", 16]),
              helper.make_tensor_value_info("past_value", TensorProto.FLOAT, ["batch", 2, "past_sequence_length", 16]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT64, ["batch"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT64, [])]
    nodes = [helper.make_node("Gather", ["embedding", "input_ids"], ["hidden"]),
             *(helper.make_node("MatMul", ["hidden", f"w{t}"], [t]) for t in "qkv"),
             helper.make_node("Cast", ["seqlens_k"], ["seqlens_k_int32"], to=TensorProto.INT32),
             helper.make_node("Cast", ["total_sequence_length"], ["total_int32"], to=TensorProto.INT32),
             helper.make_node("GroupQueryAttention", ["q", "k", "v", "past_key", "past_value", "seqlens_k_int32",
                                                      "total_int32"], ["y", "present_key", "present_value"],
                              domain="com.microsoft", num_heads=4, kv_num_heads=2, name="gqa")]
    return _model(nodes, inputs, ["y", "present_key", "present_value"], inits)


def attention_decoder(*, vocab=32, heads=2, head=8, seed=0) -> onnx.ModelProto:
    """A decoder step on the standard Attention op with its cache inside (past_key/past_value in, present_key/
    present_value out, is_causal): token ids -> embedding -> Q/K/V -> Attention -> logits [B, S, vocab]."""
    width = heads * head
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * scale, name)
             for name, shape, scale in (("embedding", (vocab, width), 1.0), ("wq", (width, width), 0.5),
                                        ("wk", (width, width), 0.5), ("wv", (width, width), 0.5),
                                        ("wo", (width, vocab), 0.5))]
    cache = ["batch", heads, "past_sequence_length", head]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence_length"]),
              helper.make_tensor_value_info("past_key", TensorProto.FLOAT, cache),
              helper.make_tensor_value_info("past_value", TensorProto.FLOAT, cache)]
    nodes = [helper.make_node("Gather", ["embedding", "input_ids"], ["hidden"]),
             *(helper.make_node("MatMul", ["hidden", f"w{t}"], [t]) for t in "qkv"),
             helper.make_node("Attention", ["q", "k", "v", "", "past_key", "past_value"],
                              ["y", "present_key", "present_value"], q_num_heads=heads, kv_num_heads=heads,
                              is_causal=1, name="attention"),
             helper.make_node("MatMul", ["y", "wo"], ["logits"])]
    present = ["batch", heads, "total_sequence_length", head]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "sequence_length", vocab]),
               helper.make_tensor_value_info("present_key", TensorProto.FLOAT, present),
               helper.make_tensor_value_info("present_value", TensorProto.FLOAT, present)]
    graph = helper.make_graph(nodes, "attention_decoder", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model
