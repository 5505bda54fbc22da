"""Attention models in fp16 and bf16 and the mark for tests that need ModelOpt's autocast: the precision tests
(rewrite/precision: widen, common) build them."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

needs_autocast = pytest.mark.usefixtures("autocast")


def fp16_attention(batch=2, seq=6, hidden=32, heads=4) -> onnx.ModelProto:
    """x (fp16) -> three fp16 projections -> a 3-D ONNX Attention -> times an fp16 Constant -> y (fp16)."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((hidden, hidden)) / hidden**0.5).astype(np.float16), w)
               for w in ("wq", "wk", "wv")]
    nodes = [helper.make_node("MatMul", ["x", w], [w[1]], name=f"proj_{w[1]}") for w in ("wq", "wk", "wv")]
    nodes += [helper.make_node("Attention", ["q", "k", "v"], ["a"], name="attn", q_num_heads=heads,
                               kv_num_heads=heads),
              helper.make_node("Constant", [], ["half"], value=numpy_helper.from_array(np.array(0.5, np.float16))),
              helper.make_node("Mul", ["a", "half"], ["y"], name="out_scale")]
    graph = helper.make_graph(nodes, "fp16_attention", [helper.make_tensor_value_info("x", T.FLOAT16, [batch, seq, hidden])],
                              [helper.make_tensor_value_info("y", T.FLOAT16, [batch, seq, hidden])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    onnx.checker.check_model(model, full_check=True)
    return model


def bf16_attention(batch=2, seq=5, heads=2, head=16) -> onnx.ModelProto:
    """One 4-D ONNX Attention, causal, its Q, K, V and output in bf16: ONNX Runtime's CPU provider cannot open it."""
    shape = [batch, heads, seq, head]
    graph = helper.make_graph([helper.make_node("Attention", ["q", "k", "v"], ["y"], name="attn", is_causal=1)],
                              "bf16_attention", [helper.make_tensor_value_info(n, T.BFLOAT16, shape) for n in "qkv"],
                              [helper.make_tensor_value_info("y", T.BFLOAT16, shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def fp16_sliding_window(batch=2, seq=16, hidden=16, heads=2, window=3) -> onnx.ModelProto:
    """A decomposed fp16 causal attention over a sliding window of `window` keys and a right-padded [batch, seq]
    mask, both as one Where filling fp16's lowest (as transformers writes its masks): a padded query more than
    `window` - 1 positions past the last token has no key, and its output is undefined."""
    rng = np.random.default_rng(0)
    head = hidden // heads

    def const(name, value):
        return numpy_helper.from_array(np.asarray(value), name)

    # logits of tens (query weights x8), so that a masked one plus fp16's lowest overflows to -inf in some cells
    inits = [numpy_helper.from_array((rng.standard_normal((hidden, hidden)) * (8 if x == "q" else 1) / hidden**0.5)
                                     .astype(np.float16), f"w{x}") for x in "qkvo"]
    inits += [const("heads", np.array([0, -1, heads, head], np.int64)), const("merged", np.array([0, 0, hidden], np.int64)),
              const("scale", np.float16(head**-0.5)), const("lowest", np.float16(np.finfo(np.float16).min)),
              const("zero", np.int64(0)), const("one", np.int64(1)), const("window", np.int64(window)),
              const("ax0", np.array([0], np.int64)), const("ax1", np.array([1], np.int64)),
              const("ax12", np.array([1, 2], np.int64)), const("from1", np.array([1], np.int64)),
              const("to2", np.array([2], np.int64))]
    nodes = []
    for x, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [helper.make_node("MatMul", ["x", f"w{x}"], [f"{x}2"]),
                  helper.make_node("Reshape", [f"{x}2", "heads"], [f"{x}3"]),
                  helper.make_node("Transpose", [f"{x}3"], [x], perm=perm)]
    nodes += [helper.make_node("MatMul", ["q", "k"], ["qk"]), helper.make_node("Mul", ["qk", "scale"], ["logits"]),
              helper.make_node("Shape", ["x"], ["x_shape"]), helper.make_node("Slice", ["x_shape", "from1", "to2"], ["s1"]),
              helper.make_node("Squeeze", ["s1", "ax0"], ["s"]), helper.make_node("Range", ["zero", "s", "one"], ["idx"]),
              helper.make_node("Unsqueeze", ["idx", "ax1"], ["qi"]), helper.make_node("Unsqueeze", ["idx", "ax0"], ["ki"]),
              helper.make_node("GreaterOrEqual", ["qi", "ki"], ["causal"]),
              helper.make_node("Sub", ["qi", "ki"], ["back"]), helper.make_node("Less", ["back", "window"], ["near"]),
              helper.make_node("And", ["causal", "near"], ["windowed"]),
              helper.make_node("Cast", ["attention_mask"], ["keep"], to=T.BOOL),
              helper.make_node("Unsqueeze", ["keep", "ax12"], ["keep4"]),
              helper.make_node("And", ["windowed", "keep4"], ["allowed"]),
              helper.make_node("Where", ["allowed", "logits", "lowest"], ["masked"]),
              helper.make_node("Softmax", ["masked"], ["p"], axis=-1, name="attn/Softmax"),
              helper.make_node("MatMul", ["p", "v"], ["o"]),
              helper.make_node("Transpose", ["o"], ["o2"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["o2", "merged"], ["o3"]),
              helper.make_node("MatMul", ["o3", "wo"], ["y"])]
    graph = helper.make_graph(nodes, "fp16_sliding_window",
                              [helper.make_tensor_value_info("x", T.FLOAT16, ["batch", "seq", hidden]),
                               helper.make_tensor_value_info("attention_mask", T.INT64, ["batch", "seq"])],
                              [helper.make_tensor_value_info("y", T.FLOAT16, ["batch", "seq", hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    meta = {"inputs": {"x": {"kind": "float"}, "attention_mask": {"kind": "padding_mask"}},
            "dims": {"batch": batch, "seq": seq}}
    model.metadata_props.add(key="trtattn.inputs", value=json.dumps(meta))
    onnx.checker.check_model(model, full_check=True)
    return model
