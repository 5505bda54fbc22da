"""routes/prepare/qk_beside.py: a soft-capped Attention that returns its QK product and takes a past cache inside
the op is refused by name, with the one soft-cap reason (site.SOFTCAP_WHY)."""

from types import SimpleNamespace

import onnx
import pytest
from onnx import TensorProto, helper

from trtattn.errors import SitesRefused
from trtattn.routes.prepare.qk_beside import qk_outputs_beside
from trtattn.site import SOFTCAP_WHY


def _attention(softcap: float) -> onnx.ModelProto:
    names = ["q", "k", "v", "", "past_key", "past_value"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 2, 3, 4]) for n in names if n]
    node = helper.make_node("Attention", names, ["y", "present_key", "present_value", "qk"], name="attn",
                            softcap=softcap)
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in node.output]
    return helper.make_model(helper.make_graph([node], "g", inputs, outputs), opset_imports=[helper.make_opsetid("", 24)])


def test_a_soft_capped_op_returning_qk_over_its_past_is_refused_by_name():
    sites = {"attn": SimpleNamespace(name="site0", qk_output="qk")}
    with pytest.raises(SitesRefused, match="site0: its logits are soft-capped") as refused:
        qk_outputs_beside(_attention(30.0), sites, ["attn"])
    assert SOFTCAP_WHY in str(refused.value)


def test_without_a_cap_it_is_left_for_qk_over_cache():
    sites = {"attn": SimpleNamespace(name="site0", qk_output="qk")}
    _, notes, cached = qk_outputs_beside(_attention(0.0), sites, ["attn"])
    assert cached == {"attn"}
