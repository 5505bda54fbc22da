"""trtattn/match/subgraphs.py: attention inside the subgraphs of control-flow ops."""

import collections
import json

import onnx
from onnx import TensorProto, helper

from tests.conftest import site_statuses
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.graphs import attention_model


# Survivors of issue 20's mutation run (benchmarks/mutate.py):
# each test fails when the line its docstring names is mutated.
def scan_model():
    """attention_model's block as the body of a Scan over a leading steps axis: the body's scan input x is
    one step [B, S, D] (a torch scripted loop over chunks exports this way)."""
    inner = attention_model()
    body = onnx.GraphProto()
    body.CopyFrom(inner.graph)
    body.name = "step"
    d = inner.graph.input[0].type.tensor_type.shape.dim[2].dim_value
    xs = helper.make_tensor_value_info("xs", TensorProto.FLOAT, ["steps", "batch", "seq", d])
    node = helper.make_node("Scan", ["xs"], ["ys"], name="scan", body=body, num_scan_inputs=1)
    graph = helper.make_graph([node], "attention_in_scan", [xs],
                              [helper.make_tensor_value_info("ys", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=list(inner.opset_import), producer_name="tests")
    model.ir_version = inner.ir_version
    meta = json.loads(next(p.value for p in inner.metadata_props if p.key == "trtattn.inputs"))
    meta["inputs"] = {"xs": {"kind": "float"}}
    meta["dims"]["steps"] = 2
    model.metadata_props.add(key="trtattn.inputs", value=json.dumps(meta))
    return model


def test_attention_in_a_scan_body_is_fused_in_place():
    """subgraphs.py:19 (Scan in SUBGRAPHS): without it, "no attention found" and exit 0 (README claims Scan)."""
    result = fuse_model(scan_model())
    assert result.ok and [s for s, _ in site_statuses(result)] == ["fused"], site_statuses(result)
    assert result.reports[0].site.graph == (("ys", "body"),)
    body = collections.Counter(n.op_type for n in result.model.graph.node[0].attribute[0].g.node)
    assert body["Attention"] == 1 and body["Softmax"] == 0
    assert result.verification.max_abs_err <= 1e-4
