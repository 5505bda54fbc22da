"""Issue 18, class 11: a mask applied by multiplication (logits * m + (1 - m) * -big; TF's SelectV2
Where(m, logits, 0) + offset) is fused as the equivalent mask and verified; a product without an offset
after it is listed, never silent."""

import onnx
import pytest

from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.edits import multiplied
from trtattn.testing.graphs import attention_model


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
