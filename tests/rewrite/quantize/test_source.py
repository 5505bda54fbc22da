"""trtattn/rewrite/quantize/source.py: the Q/DQ a quantized site reads, as IAttention takes it."""

import json

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

from trtattn.routes.prepare import prepare
from trtattn.testing.graphs import attention_model


# A survivor of issue 20's mutation run: source.py's zero-point check.
def probs_qdq_model(zero_point: int) -> onnx.ModelProto:
    """attention_model with head size 16 (one IAttention's int8 kernels take) and an int8 Q/DQ after its softmax:
    symmetric (zero point 0, scale 1/127) or asymmetric (zero point -128, scale 1/255: [0, 1] onto [-128, 127])."""
    model = attention_model(qdq="probs", head=16)
    meta = next(p for p in model.metadata_props if p.key == "trtattn.inputs")
    meta.value = json.dumps({**json.loads(meta.value), "max_positions": 64})  # int8 IAttention: <= 512
    g = gs.import_onnx(model)
    q = next(n for n in g.nodes if n.op == "Softmax").outputs[0].outputs[0]
    dq = q.outputs[0].outputs[0]
    assert (q.op, dq.op) == ("QuantizeLinear", "DequantizeLinear")
    scale = gs.Constant("probs_scale", np.asarray(1 / 255 if zero_point else 1 / 127, np.float32))
    zero = gs.Constant("probs_zero", np.asarray(zero_point, np.int8))
    for node in (q, dq):
        node.inputs[1], node.inputs[2] = scale, zero
    out = gs.export_onnx(g)
    out.metadata_props.extend(model.metadata_props)  # graphsurgeon drops them
    return out


def test_only_a_symmetric_softmax_quantize_becomes_the_normalization_quantize():
    """source.py:100 (the zero-point check): IAttention's normalization quantize is symmetric; an int8 softmax
    Q/DQ with zero point -128 leaves the site computing in float with a note saying why (without the check it
    became TRT_QuantizedAttention, "verified" at 0.469 within a bound of 0.65). The build plan decides it for
    both routes; tests/routes/trt_ops/test_trt_ops.py checks the plan is written as TRT_QuantizedAttention."""
    symmetric = prepare(probs_qdq_model(0), name="sym", precision="int8").plan
    assert [(a.normalization_quantize_to_type, a.dtype) for a in symmetric.attentions] == [("int8", "int8")]
    assert symmetric.attentions[0].normalization_quantize_scale == pytest.approx(1 / 127)
    asymmetric = prepare(probs_qdq_model(-128), name="asym", precision="int8").plan
    assert [a.row()["normalization_quantize_to_type"] for a in asymmetric.attentions] == [None]
    assert any("zero point -128" in n and "symmetric int8" in n for n in asymmetric.notes), asymmetric.notes
