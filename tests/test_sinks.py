"""Issue 18, class 9: attention sinks (gpt-oss): a learned per-head logit column concatenated before the
softmax and sliced off after is attention over one extra key with zero K and V; fused and verified."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.graphs import attention_model


def with_sinks(model: onnx.ModelProto, heads: int, *, shift=False, first=False, slice_wrong=False,
               drop_first=None) -> onnx.ModelProto:
    """Every Softmax of `model` over [logits, sink column] (sinks [1, heads, 1, 1]), its last (or first) column
    dropped after; shift: the gpt-oss form, logits - max(logits) before the softmax."""
    g = gs.import_onnx(model)
    made = []

    def op(kind, inputs, **attrs):
        out = gs.Variable(f"sink/{kind}_{len(made)}")
        made.append(gs.Node(kind, f"sink/{kind}_{len(made)}", attrs, inputs, [out]))
        return out

    i64 = lambda name, v: gs.Constant(f"sink/{name}_{len(made)}", np.asarray(v, np.int64))  # noqa: E731
    sinks = gs.Constant("sinks", np.random.default_rng(0).standard_normal((1, heads, 1, 1)).astype(np.float32))
    for sm in [n for n in g.nodes if n.op == "Softmax"]:
        s, p = sm.inputs[0], sm.outputs[0]
        shape = op("Concat", [op("Slice", [op("Shape", [s]), i64("lo", [0]), i64("hi", [3])]), i64("one", [1])], axis=0)
        column = op("Expand", [sinks, shape])
        both = op("Concat", [column, s] if first else [s, column], axis=-1)
        if shift:
            top = op("ReduceMax", [both, i64("axes", [-1])], keepdims=1) if int(g.opset) >= 18 else \
                op("ReduceMax", [both], axes=[-1], keepdims=1)
            both = op("Sub", [both, top])
        sm.inputs[0] = both
        wide = gs.Variable(f"{p.name}_with_sink")
        sm.outputs[0] = wide
        start, end = ([1], [2 ** 62]) if (first if drop_first is None else drop_first) else ([0], [-1])
        if slice_wrong:
            start, end = [0], [-2]
        made.append(gs.Node("Slice", f"sink/drop_{len(made)}", {},
                            [wide, i64("s", start), i64("e", end), i64("a", [-1])], [p]))
    g.nodes.extend(made)
    g.toposort()
    out = gs.export_onnx(g)
    out.ir_version = model.ir_version
    out.metadata_props.extend(model.metadata_props)
    return out


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
