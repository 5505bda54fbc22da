"""Issue 18, class 12: a mask re-applied to the probabilities after the softmax (Keras 3 and flax: P * mask;
DeBERTa's XSoftmax: masked_fill of P by Where) is fused as a boolean mask and verified; a re-applied mask
that changes the result outside fully masked rows is listed, never silent."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.graphs import attention_model


def reapplied(form: str, mask_style="additive_input", same_mask=True) -> onnx.ModelProto:
    """attention_model with its padding mask applied again to the probabilities, written as `form`."""
    return reapply(attention_model(opset=18, mask_style=mask_style), form, "attention_mask" if same_mask else None)


def reapply(model: onnx.ModelProto, form: str, mask_input: str | None) -> onnx.ModelProto:
    """`model` with the [batch, seq] input `mask_input` (None: a new one) applied again to the probabilities
    of every Softmax, written as `form`."""
    g = gs.import_onnx(model)
    if mask_input is None:
        mask = gs.Variable("other_mask", np.float32, ["batch", "seq"])
        g.inputs.append(mask)
    else:
        mask = next(i for i in g.inputs if i.name == mask_input)
    made = []

    def op(kind, inputs, dtype=np.float32, **attrs):
        out = gs.Variable(f"reapplied/{kind}_{len(made)}", dtype)
        made.append(gs.Node(kind, f"reapplied/{kind}_{len(made)}", attrs, inputs, [out]))
        return out

    axes = gs.Constant("reapplied/axes", np.asarray([1, 2], np.int64))
    m = op("Unsqueeze", [op("Cast", [mask], to=onnx.TensorProto.FLOAT), axes])  # [B, 1, 1, S]: the keys
    zero = gs.Constant("reapplied/zero", np.asarray(0.0, np.float32))
    for sm in [n for n in g.nodes if n.op == "Softmax"]:
        probs = sm.outputs[0]
        consumer = probs.outputs[0]
        if form == "mul":
            out = op("Mul", [probs, m])
        elif form == "where":
            out = op("Where", [op("Cast", [m], np.bool_, to=onnx.TensorProto.BOOL), probs, zero])
        else:  # where_not: masked_fill(P, ~mask, 0)
            out = op("Where", [op("Not", [op("Cast", [m], np.bool_, to=onnx.TensorProto.BOOL)], np.bool_), zero, probs])
        consumer.inputs[consumer.inputs.index(probs)] = out
    g.nodes.extend(made)
    g.toposort()
    fixed = gs.export_onnx(g)
    fixed.ir_version = model.ir_version
    fixed.metadata_props.extend(model.metadata_props)
    return fixed


@pytest.mark.parametrize("form", ["mul", "where", "where_not"])
def test_mask_reapplied_to_probabilities_is_fused_and_verified(form):
    model = reapplied(form)
    (site,) = match(model).sites
    assert site.mask_steps[-1].op == {"mul": "probs_mul", "where": "probs_where", "where_not": "probs_where_not"}[form]
    (r,) = fuse_model(model).reports
    assert r.status == "fused" and r.max_abs_err < 1e-5, r.reason


def test_reapplied_mask_the_logits_did_not_apply_fails_verification_and_is_listed():
    """P * m with m not applied before the softmax: not renormalised, so not attention with that mask."""
    model = reapplied("mul", mask_style=None, same_mask=False)
    (r,) = fuse_model(model).reports
    assert r.status == "not fused" and "verification failed" in r.reason


@pytest.mark.parametrize("form", ["mul", "where_not"])
def test_zoo_bert_with_mask_reapplied_after_softmax_fuses_verified(zoo_export, form):
    model = reapply(onnx.load(str(zoo_export("bert", "torchscript"))), form, "attention_mask")
    reports = fuse_model(model).reports
    assert len(reports) == 2
    for r in reports:
        assert r.status == "fused" and r.max_abs_err < 1e-4, r.reason


def test_xsoftmax_hand_built_fuses_as_one_boolean_mask():
    """DeBERTa's XSoftmax: Where(~mask, finfo.min, x) -> Softmax -> Where(~mask, 0, P); padded rows are 0."""
    model = reapply(attention_model(opset=18, mask_style="where_not"), "where_not", "attention_mask")
    (site,) = match(model).sites
    assert [s.op for s in site.mask_steps if s.op != "scale"] == ["where_not", "probs_where_not"]
    (r,) = fuse_model(model).reports
    assert r.status == "fused" and r.max_abs_err < 1e-5, r.reason


def test_sew_d_xsoftmax_export_reads_the_probabilities_where():
    """transformers' SEW-D exports XSoftmax through its ONNX symbolic (tests/data/foreign): both layers read the
    masked_fill of the probabilities as a re-applied mask, fuse and verify."""
    from pathlib import Path

    model = onnx.load(Path(__file__).parent / "data" / "foreign" / "sew-d.torchscript.onnx")
    sites = match(model).sites
    assert len(sites) == 2 and all(s.mask_steps[-1].op == "probs_where_not" for s in sites)
    result = fuse_model(model)
    assert [r.status for r in result.reports] == ["fused", "fused"] and result.verification["passed"]
