"""Attention graphs shaped like those ONNX Runtime's transformer-optimizer tests generate (BERT attention,
pruned heads, Add inputs reversed, Q/K and V of different widths; GPT-2 attention with a past), written by hand
at opset 16: their LayerNormalization is below ONNX's opset 17, the op ONNX Runtime registers in the default
domain itself (ONNX's version converter has no schema for it), as such models are. ONNX Runtime runs them all.

    model = bert_attention(heads=2, head=4, reverse_add=True)
    model = gpt2_attention_with_past()
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 16


def _weights(rng, **shapes) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n) for n, s in shapes.items()]


def _add(a: str, b: str, out: str, reverse: bool) -> onnx.NodeProto:
    return helper.make_node("Add", [b, a] if reverse else [a, b], [out], name=out)


def _projection(x: str, tag: str, shape: str, perm, reverse: bool) -> list[onnx.NodeProto]:
    """x @ W + b, split into heads by `shape` ([0, 0, N, H]), transposed by `perm`."""
    return [helper.make_node("MatMul", [x, f"{tag}.weight"], [f"{tag}.mm"], name=f"{tag}.mm"),
            _add(f"{tag}.mm", f"{tag}.bias", f"{tag}.add", reverse),
            helper.make_node("Reshape", [f"{tag}.add", shape], [f"{tag}.heads"], name=f"{tag}.heads"),
            helper.make_node("Transpose", [f"{tag}.heads"], [f"{tag}.t"], perm=perm, name=f"{tag}.t")]


def _layer_norm(x: str, out: str) -> onnx.NodeProto:
    return helper.make_node("LayerNormalization", [x, "ln.weight", "ln.bias"], [out], axis=-1, epsilon=1e-5, name=out)


def bert_attention(*, hidden: int = 16, heads: int = 2, head: int = 4, v_head: int | None = None,
                   reverse_add: bool = False, float_mask: bool = False, seed: int = 0) -> onnx.ModelProto:
    """LayerNorm(input_1 + input_2) -> Q, K, V projections (Q/K of heads * head, V of heads * v_head: pruned
    when that is not `hidden`) -> softmax(QK^T / sqrt(head) + (1 - mask) * -10000) V -> projection, + skip,
    LayerNorm. `reverse_add`: every Add's inputs swapped."""
    v_head = v_head or head
    rng = np.random.default_rng(seed)
    qk, v = heads * head, heads * v_head
    nodes = [helper.make_node("Add", ["input_1", "input_2"], ["ln_in"], name="ln_in"), _layer_norm("ln_in", "x")]
    nodes += _projection("x", "q", "qk_shape", [0, 2, 1, 3], reverse_add)
    nodes += _projection("x", "k", "qk_shape", [0, 2, 3, 1], reverse_add)
    nodes += _projection("x", "v", "v_shape", [0, 2, 1, 3], reverse_add)
    mask = "input_mask" if float_mask else "mask_f"
    if not float_mask:
        nodes.append(helper.make_node("Cast", ["input_mask"], ["mask_f"], to=TensorProto.FLOAT, name="mask_f"))
    nodes += [helper.make_node("Unsqueeze", [mask, "axes_12"], ["mask_4d"], name="mask_4d"),
              helper.make_node("Sub", ["one", "mask_4d"], ["mask_inv"], name="mask_inv"),
              helper.make_node("Mul", ["mask_inv", "minus_10000"], ["mask_add"], name="mask_add"),
              helper.make_node("MatMul", ["q.t", "k.t"], ["qk"], name="qk"),
              helper.make_node("Div", ["qk", "sqrt_head"], ["qk_scaled"], name="qk_scaled"),
              _add("qk_scaled", "mask_add", "logits", reverse_add),
              helper.make_node("Softmax", ["logits"], ["probs"], axis=3, name="softmax"),
              helper.make_node("MatMul", ["probs", "v.t"], ["ctx"], name="ctx"),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3], name="ctx_t"),
              helper.make_node("Reshape", ["ctx_t", "merged_shape"], ["merged"], name="merged"),
              helper.make_node("MatMul", ["merged", "o.weight"], ["o.mm"], name="o.mm"),
              _add("o.mm", "o.bias", "o.add", reverse_add),
              _add("o.add", "x", "skip", reverse_add), _layer_norm("skip", "output")]
    inits = _weights(rng, **{"q.weight": (hidden, qk), "k.weight": (hidden, qk), "v.weight": (hidden, v),
                             "o.weight": (v, hidden), "q.bias": (qk,), "k.bias": (qk,), "v.bias": (v,),
                             "o.bias": (hidden,)})
    inits += [numpy_helper.from_array(np.asarray(a), n) for n, a in {
        "ln.weight": np.ones(hidden, np.float32), "ln.bias": np.zeros(hidden, np.float32),
        "qk_shape": np.array([0, 0, heads, head], np.int64), "v_shape": np.array([0, 0, heads, v_head], np.int64),
        "merged_shape": np.array([0, 0, v], np.int64), "axes_12": np.array([1, 2], np.int64),
        "one": np.array([1.0], np.float32), "minus_10000": np.array([-10000.0], np.float32),
        "sqrt_head": np.array([np.sqrt(head)], np.float32)}.items()]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", hidden]) for n in ("input_1", "input_2")]
    inputs.append(helper.make_tensor_value_info("input_mask", TensorProto.FLOAT if float_mask else TensorProto.INT64,
                                                ["batch", "seq"]))
    graph = helper.make_graph(nodes, "bert_attention", inputs,
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", "seq", hidden])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)


def gpt2_attention_with_past(*, hidden: int = 16, heads: int = 2, seed: int = 0) -> onnx.ModelProto:
    """LayerNorm(x) -> one QKV projection split in three -> K and V after the past's ([2, B, N, P, H], stacked
    as GPT-2's exports stack it) -> present -> causal softmax (a Where over a lower triangle sliced at the past
    length) -> V -> projection."""
    rng = np.random.default_rng(seed)
    head = hidden // heads
    nodes = [_layer_norm("input", "x"),
             helper.make_node("MatMul", ["x", "qkv.weight"], ["qkv.mm"], name="qkv.mm"),
             helper.make_node("Add", ["qkv.mm", "qkv.bias"], ["qkv"], name="qkv"),
             helper.make_node("Split", ["qkv", "split_sizes"], ["q", "k", "v"], axis=2, name="split")]
    for t, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 1, 3]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("Reshape", [t, "heads_shape"], [f"{t}.heads"], name=f"{t}.heads"),
                  helper.make_node("Transpose", [f"{t}.heads"], [f"{t}.t"], perm=perm, name=f"{t}.t")]
    nodes += [helper.make_node("Split", ["past", "two"], ["past_k5", "past_v5"], axis=0, name="past_split"),
              helper.make_node("Squeeze", ["past_k5", "zero_axis"], ["past_k"], name="past_k"),
              helper.make_node("Squeeze", ["past_v5", "zero_axis"], ["past_v"], name="past_v"),
              helper.make_node("Concat", ["past_k", "k.t"], ["key"], axis=2, name="key"),
              helper.make_node("Concat", ["past_v", "v.t"], ["value"], axis=2, name="value"),
              helper.make_node("Unsqueeze", ["key", "zero_axis"], ["key5"], name="key5"),
              helper.make_node("Unsqueeze", ["value", "zero_axis"], ["value5"], name="value5"),
              helper.make_node("Concat", ["key5", "value5"], ["present"], axis=0, name="present"),
              helper.make_node("Transpose", ["key"], ["key_t"], perm=[0, 1, 3, 2], name="key_t"),
              helper.make_node("MatMul", ["q.t", "key_t"], ["qk"], name="qk"),
              helper.make_node("Div", ["qk", "sqrt_head"], ["qk_scaled"], name="qk_scaled"),
              # the causal mask: rows total - new .. total of a lower triangle, columns 0 .. total
              helper.make_node("Shape", ["key"], ["key_shape"], name="key_shape"),
              helper.make_node("Gather", ["key_shape", "two_index"], ["total"], axis=0, name="total"),
              helper.make_node("Shape", ["q.t"], ["q_shape"], name="q_shape"),
              helper.make_node("Gather", ["q_shape", "two_index"], ["new"], axis=0, name="new"),
              helper.make_node("Sub", ["total", "new"], ["past_len"], name="past_len"),
              helper.make_node("Slice", ["tril", "past_len", "total", "two_index"], ["rows"], name="rows"),
              helper.make_node("Slice", ["rows", "zero_index", "total", "three_index"], ["causal"], name="causal"),
              helper.make_node("Where", ["causal", "qk_scaled", "minus_10000"], ["logits"], name="logits"),
              helper.make_node("Softmax", ["logits"], ["probs"], axis=3, name="softmax"),
              helper.make_node("MatMul", ["probs", "value"], ["ctx"], name="ctx"),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3], name="ctx_t"),
              helper.make_node("Reshape", ["ctx_t", "merged_shape"], ["merged"], name="merged"),
              helper.make_node("MatMul", ["merged", "o.weight"], ["output"], name="o.mm")]
    inits = _weights(rng, **{"qkv.weight": (hidden, 3 * hidden), "qkv.bias": (3 * hidden,), "o.weight": (hidden, hidden)})
    inits += [numpy_helper.from_array(np.asarray(a), n) for n, a in {
        "ln.weight": np.ones(hidden, np.float32), "ln.bias": np.zeros(hidden, np.float32),
        "split_sizes": np.array([hidden] * 3, np.int64), "two": np.array([1, 1], np.int64),
        "heads_shape": np.array([0, 0, heads, head], np.int64), "merged_shape": np.array([0, 0, hidden], np.int64),
        "zero_axis": np.array([0], np.int64), "two_index": np.array([2], np.int64),
        "three_index": np.array([3], np.int64), "zero_index": np.array([0], np.int64),
        "tril": np.tril(np.ones((1, 1, 64, 64), bool)), "minus_10000": np.array(-10000.0, np.float32),
        "sqrt_head": np.array([np.sqrt(head)], np.float32)}.items()]
    inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "seq", hidden]),
              helper.make_tensor_value_info("past", TensorProto.FLOAT, [2, "batch", heads, "past", head])]
    outputs = [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", "seq", hidden]),
               helper.make_tensor_value_info("present", TensorProto.FLOAT, [2, "batch", heads, "total", head])]
    graph = helper.make_graph(nodes, "gpt2_attention_with_past", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)


def models() -> dict[str, onnx.ModelProto]:
    """The six of issue 34: BERT attention (plain, pruned, Add reversed, Q/K and V varied, float mask) and GPT-2
    attention with a past."""
    return {"bert": bert_attention(), "bert_pruned": bert_attention(hidden=16, heads=2, head=3),
            "bert_reversed_add": bert_attention(reverse_add=True),
            "bert_varied_qkv": bert_attention(heads=2, head=4, v_head=8),
            "bert_float_mask": bert_attention(float_mask=True), "gpt2_past": gpt2_attention_with_past()}
