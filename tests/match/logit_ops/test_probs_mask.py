"""Issue 18, class 12: a mask re-applied to the probabilities after the softmax (Keras 3 and flax: P * mask;
DeBERTa's XSoftmax: masked_fill of P by Where) is fused as a boolean mask and verified; a re-applied mask
that changes the result outside fully masked rows is listed, never silent."""

import onnx
import pytest
from onnx import helper

from tests.conftest import DATA
from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.edits import reapply
from trtattn.testing.graphs import attention_model


def reapplied(form: str, mask_style="additive_input", same_mask=True) -> onnx.ModelProto:
    """attention_model with its padding mask applied again to the probabilities, written as `form`."""
    return reapply(attention_model(opset=18, mask_style=mask_style), form, "attention_mask" if same_mask else None)


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

    model = onnx.load(DATA / "foreign" / "sew-d.torchscript.onnx")
    sites = match(model).sites
    assert len(sites) == 2 and all(s.mask_steps[-1].op == "probs_where_not" for s in sites)
    result = fuse_model(model)
    assert [r.status for r in result.reports] == ["fused", "fused"] and result.verification.passed


# Survivors of mutating match/logit_ops/probs_mask.py (benchmarks/mutate.py, base d3efd07):
# each test pins an outcome the fast lane left open.
def test_a_reshape_of_the_probabilities_is_not_a_mask_reapplied():
    """Flatten -> Softmax -> Reshape(Shape(logits)) (the opset-12 form): the Reshape reads the probabilities
    and another tensor, as P * m does, but re-applies no mask."""
    (site,) = match(attention_model(softmax_style="flatten")).sites
    assert not [s.op for s in site.mask_steps if s.op.startswith("probs")]


def test_probabilities_squared_are_not_a_mask_reapplied():
    model = attention_model(opset=18)
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    probs = softmax.output[0]
    for n in model.graph.node:
        n.input[:] = ["squared" if i == probs else i for i in n.input]
    model.graph.node.insert(list(model.graph.node).index(softmax) + 1,
                            helper.make_node("Mul", [probs, probs], ["squared"], name="square/Mul"))
    result = match(model)
    assert not any(s.op.startswith("probs") for site in result.sites for s in site.mask_steps)
    assert not result.sites and result.skipped


@pytest.mark.parametrize("form", ["mul", "where", "where_not"])
def test_a_mask_on_the_probabilities_alone_is_not_already_normal(form):
    """Scale on Q and no mask but one re-applied to the probabilities: TensorRT's implicit fusion does not take
    that step, so normalize must rewrite the site (already_normal says no)."""
    from trtattn.rewrite.normalize import already_normal

    (site,) = match(reapply(attention_model(opset=18, scale_style="mul_q"), form, None)).sites
    assert [s.op for s in site.mask_steps] == [{"mul": "probs_mul", "where": "probs_where",
                                                "where_not": "probs_where_not"}[form]]
    assert not already_normal(site)
