"""Issue 18, class 11: a mask applied by multiplication (logits * m + (1 - m) * -big; TF's SelectV2
Where(m, logits, 0) + offset) is fused as the equivalent mask and verified; a product without an offset
after it is listed, never silent."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.graphs import attention_model


def multiplied(model: onnx.ModelProto, form: str, mask_input: str, offset=True) -> onnx.ModelProto:
    """Each Softmax's input S becomes S * m + (1 - m) * -1e9 (form "mul") or Where(m, S, 0) + ... ("where"),
    m = the [batch, seq] input `mask_input` as [B, 1, 1, S] floats."""
    g = gs.import_onnx(model)
    mask = next(i for i in g.inputs if i.name == mask_input)
    made = []

    def op(kind, inputs, dtype=np.float32, **attrs):
        out = gs.Variable(f"mulmask/{kind}_{len(made)}", dtype)
        made.append(gs.Node(kind, f"mulmask/{kind}_{len(made)}", attrs, inputs, [out]))
        return out

    const = lambda name, v: gs.Constant(f"mulmask/{name}", np.asarray(v, np.float32))  # noqa: E731
    axes = gs.Constant("mulmask/axes", np.asarray([1, 2], np.int64))
    m = op("Unsqueeze", [op("Cast", [mask], to=onnx.TensorProto.FLOAT), axes])
    big = op("Mul", [op("Sub", [const("one", 1.0), m]), const("big", -1e9)])
    for sm in [n for n in g.nodes if n.op == "Softmax"]:
        s = sm.inputs[0]
        if form == "mul":
            kept = op("Mul", [s, m])
        else:
            kept = op("Where", [op("Cast", [m], np.bool_, to=onnx.TensorProto.BOOL), s, const("zero", 0.0)])
        sm.inputs[0] = op("Add", [kept, big]) if offset else kept
    g.nodes.extend(made)
    g.toposort()
    out = gs.export_onnx(g)
    out.ir_version = model.ir_version
    out.metadata_props.extend(model.metadata_props)
    return out


@pytest.mark.parametrize("form", ["mul", "where"])
def test_multiplied_mask_with_offset_is_fused_and_verified(form):
    model = multiplied(attention_model(opset=18, mask_style="additive_input"), form, "attention_mask")
    (site,) = match(model).sites
    assert [s.op for s in site.mask_steps][-2:] == [{"mul": "mul_mask", "where": "where"}[form], "add"]
    (r,) = fuse_model(model).reports
    assert r.status == "fused" and r.max_abs_err < 1e-5, r.reason


def test_multiplied_mask_without_offset_is_listed():
    model = multiplied(attention_model(opset=18, mask_style="additive_input"), "mul", "attention_mask", offset=False)
    result = match(model)
    assert not result.sites and "no offset" in result.skipped[0].reason


@pytest.mark.parametrize("form", ["mul", "where"])
def test_zoo_bert_with_multiplied_mask_fuses_verified(zoo_export, form):
    model = multiplied(onnx.load(str(zoo_export("bert", "torchscript"))), form, "attention_mask")
    reports = fuse_model(model).reports
    assert len(reports) == 2
    for r in reports:
        assert r.status == "fused" and r.max_abs_err < 1e-4, r.reason
