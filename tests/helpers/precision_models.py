"""Attention models in fp16 and bf16 and the mark for tests that need ModelOpt's autocast: the precision tests
(rewrite/precision: widen, common) build them."""

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
