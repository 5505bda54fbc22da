"""trtattn/testing/conformance.py: the models the conformance checks build."""

import numpy as np
from onnx import TensorProto, helper

from tests.conftest import ort_run
from trtattn.testing.conformance import ConformanceCase, inside_attention


# Survivors of mutating match/ and testing/ (benchmarks/mutate.py, seed 20261128): each test fails when the line its
# docstring names is mutated.
def test_inside_attention_is_rotary_q_and_k_scaled_by_0_3():
    """testing/conformance.py:169: the model is Softmax(rot(Q) . rot(K)^T * 0.3) . V, as its docstring says."""
    f = TensorProto.FLOAT
    rope = helper.make_model(helper.make_graph(
        [helper.make_node("RotaryEmbedding", ["input", "cos_cache", "sin_cache", "position_ids"], ["output"])],
        "rope", [helper.make_tensor_value_info("input", f, [1, 2, 3, 4]),
                 helper.make_tensor_value_info("cos_cache", f, [5, 2]), helper.make_tensor_value_info("sin_cache", f, [5, 2]),
                 helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, 3])],
        [helper.make_tensor_value_info("output", f, [1, 2, 3, 4])]), opset_imports=[helper.make_opsetid("", 23)])
    rng = np.random.default_rng(1)
    tables = {n: rng.uniform(-1, 1, (5, 2)).astype(np.float32) for n in ("cos_cache", "sin_cache")}
    case = ConformanceCase("rope", rope, {"input": rng.standard_normal((1, 2, 3, 4)).astype(np.float32), **tables,
                                          "position_ids": np.array([[4, 0, 2]])}, {}, 1e-3, 1e-7)
    model, feeds = inside_attention(case)
    shared = {k: v for k, v in feeds.items() if k not in "qkv"}
    q, k = (ort_run(case.model, {**shared, "input": feeds[s]})[0] for s in "qk")
    logits = q @ np.swapaxes(k, -1, -2) * 0.3
    p = np.exp(logits - logits.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ feeds["v"]
    np.testing.assert_allclose(ort_run(model, feeds)[0], want, rtol=1e-4, atol=1e-5)
