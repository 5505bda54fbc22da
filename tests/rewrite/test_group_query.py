"""trtattn/rewrite/group_query.py: ONNX Runtime's GroupQueryAttention as the standard op."""

import numpy as np
import onnxruntime as ort

from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.contrib_graphs import group_query_feeds, group_query_model


# Survivors of mutating rewrite/group_query.py (benchmarks/mutate.py, base 8bb4c20):
# each test pins an outcome the fast lane left open.
def test_group_query_attention_without_a_past_presents_the_new_keys_and_values():
    """No past_key/past_value: the present outputs are the new K and V ([B, Nkv, S, H]), each its own."""
    model = group_query_model()
    gqa = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
    gqa.input[3] = gqa.input[4] = ""
    kept = [i for i in model.graph.input if i.name not in ("past_key", "past_value")]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    result = fuse_model(model)
    assert result.ok, [r.row() for r in result.reports]
    assert not any(n.op_type == "GroupQueryAttention" for n in result.model.graph.node)
    feeds = {k: v for k, v in group_query_feeds(2, 3, 0, seed=3).items() if not k.startswith("past")}

    def run(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    want, got = run(model), run(result.model)
    assert [w.shape for w in want] == [g.shape for g in got] == [(2, 3, 32), (2, 2, 3, 8), (2, 2, 3, 8)]
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, atol=1e-5)
