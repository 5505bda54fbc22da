"""Issue 18, class 9: attention sinks (gpt-oss): a learned per-head logit column concatenated before the
softmax and sliced off after is attention over one extra key with zero K and V; fused and verified."""

import onnx
import pytest

from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.edits import with_sinks
from trtattn.testing.graphs import attention_model


@pytest.mark.parametrize("shift,first", [(False, False), (True, False), (False, True)])
def test_sink_is_an_extra_key_fused_and_verified(shift, first):
    model = with_sinks(attention_model(opset=18, heads=4, kv_heads=2, mask_style="additive_input"), 4,
                       shift=shift, first=first)
    (site,) = match(model).sites
    assert site.mask_steps[-1].op == "sink"
    (r,) = fuse_model(model).reports
    assert r.status == "fused" and r.max_abs_err < 1e-5, r.reason


@pytest.mark.parametrize("wrong", [dict(slice_wrong=True), dict(first=True, drop_first=False),
                                   dict(first=False, drop_first=True)])
def test_slice_that_is_not_the_sink_column_is_listed(wrong):
    model = with_sinks(attention_model(opset=18, heads=4), 4, **wrong)
    result = match(model)
    assert not result.sites and "not exactly the sink's column" in result.skipped[0].reason


def test_zoo_llama_with_sinks_fuses_verified(zoo_export):
    """gpt-oss's form (sinks, then the max shift) written into a real export with GQA, rope and a causal mask."""
    model = with_sinks(onnx.load(str(zoo_export("llama", "torchscript"))), 4, shift=True)
    reports = fuse_model(model).reports
    assert len(reports) == 2
    for r in reports:
        assert r.status == "fused" and r.max_abs_err < 1e-4 and (r.site.q_heads, r.site.kv_heads) == (4, 2), r.reason
