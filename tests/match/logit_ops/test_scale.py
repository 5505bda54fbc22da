"""Scales computed at run time (issue 18, class 3): shape-derived scalars fold to the constant they are,
a scale held as a graph input with a default (keep_initializers_as_inputs) is that default, and a
per-head logit scale (cosine attention, Swin-v2) goes on Q with scale 1 on the fused op."""

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import mask_step_ops
from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.graphs import attention_model

HEADS, HEAD = 4, 8


def _logit_div(model):
    """The Div of the logits by Sqrt(head) that attention_model(scale_style='div_after') writes."""
    return next(n for n in model.graph.node if n.op_type == "Div")


def _query(model):
    return next(n for n in model.graph.node if n.op_type == "MatMul" and n.input[0] not in ("x",)
                and not any(i.name == n.input[1] for i in model.graph.initializer)).input[0]


def shape_scale(form: str) -> onnx.ModelProto:
    """The logits divided (or multiplied) by a scale the graph computes from Q's shape."""
    model = attention_model(scale_style="div_after")
    div = _logit_div(model)
    q = _query(model)
    nodes = []

    def op(kind, inputs, **attrs):
        out = f"scale_{len(nodes)}"
        nodes.append(helper.make_node(kind, inputs, [out], name=f"scale/{kind}_{len(nodes)}", **attrs))
        return out

    model.graph.initializer.extend([numpy_helper.from_array(np.asarray(-1, np.int64), "minus_one"),
                                    numpy_helper.from_array(np.asarray([-1], np.int64), "minus_one_1d"),
                                    numpy_helper.from_array(np.asarray([2**62], np.int64), "end"),
                                    numpy_helper.from_array(np.asarray(1.0, np.float32), "one")])
    if form == "div_sqrt_shape":  # scores / sqrt(q.size(-1))
        root = op("Sqrt", [op("Cast", [op("Gather", [op("Shape", [q]), "minus_one"], axis=0)], to=TensorProto.FLOAT)])
        div.input[1] = root
    elif form == "mul_reciprocal":  # scores * (1 / sqrt(q.shape[-1:]))  (a [1] tensor)
        dim = op("Cast", [op("Slice", [op("Shape", [q]), "minus_one_1d", "end"])], to=TensorProto.FLOAT)
        div.op_type = "Mul"
        div.input[1] = op("Div", ["one", op("Sqrt", [dim])])
    at = list(model.graph.node).index(div)
    for i, n in enumerate(nodes):
        model.graph.node.insert(at + i, n)
    return model


def scale_input_with_default() -> onnx.ModelProto:
    """keep_initializers_as_inputs: the divisor is an initializer that is also a graph input."""
    model = attention_model(scale_style="div_after")
    div = _logit_div(model)
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(np.sqrt(HEAD), np.float32), "scale_default"))
    model.graph.input.append(helper.make_tensor_value_info("scale_default", TensorProto.FLOAT, []))
    div.input[1] = "scale_default"
    return model


def per_head_scale(op_type: str = "Mul") -> onnx.ModelProto:
    """Cosine attention's learned temperature: the logits times a [heads, 1, 1] tensor (after exp/clamp,
    computed from constants), then an additive bias."""
    model = attention_model(scale_style="div_after", mask_style=None)
    div = _logit_div(model)
    rng = np.random.default_rng(1)
    raw = rng.uniform(0.5, 3.0, (HEADS, 1, 1)).astype(np.float32)
    model.graph.initializer.extend([numpy_helper.from_array(np.log(raw), "logit_scale"),
                                    numpy_helper.from_array(np.asarray(np.log(100.0), np.float32), "max_scale")])
    nodes = [helper.make_node("Min", ["logit_scale", "max_scale"], ["clamped"], name="scale/Min"),
             helper.make_node("Exp", ["clamped"], ["per_head"], name="scale/Exp")]
    div.op_type = op_type
    div.input[1] = "per_head" if op_type == "Mul" else "per_head_inv"
    if op_type == "Div":
        nodes.append(helper.make_node("Reciprocal", ["per_head"], ["per_head_inv"], name="scale/Reciprocal"))
    at = list(model.graph.node).index(div)
    for i, n in enumerate(nodes):
        model.graph.node.insert(at + i, n)
    return model


def fused(model):
    result = fuse_model(model)
    assert [r.status for r in result.reports] == ["fused"], [r.row() for r in result.reports]
    assert result.ok and result.verification.max_abs_err <= 1e-4
    ops = collections.Counter(n.op_type for n in result.model.graph.node)
    assert ops["Attention"] == 1 and ops["Softmax"] == 0
    return result.reports[0].site, result


@pytest.mark.parametrize("form", ["div_sqrt_shape", "mul_reciprocal"])
def test_shape_derived_scale_folds(form):
    site, _ = fused(shape_scale(form))
    assert site.scale == pytest.approx(1 / np.sqrt(HEAD), rel=1e-6)


def test_scale_held_as_a_graph_input_is_its_default():
    site, result = fused(scale_input_with_default())
    assert site.scale == pytest.approx(1 / np.sqrt(HEAD), rel=1e-6)
    assert any("scale_default is a graph input with a default: taken at its default 2.82843" in n
               for n in site.notes), site.notes


@pytest.mark.parametrize("op_type", ["Mul", "Div"])
def test_per_head_scale_goes_on_q(op_type):
    site, result = fused(per_head_scale(op_type))
    attention = next(n for n in result.model.graph.node if n.op_type == "Attention")
    scale = next(a.f for a in attention.attribute if a.name == "scale")
    assert scale == 1.0  # the per-head factor is on Q, the op's scale is 1


@pytest.mark.parametrize("op_type", ["Mul", "Div"])
def test_per_head_scale_is_kept_by_normalize(op_type):
    """normalize re-emits the core with the per-head factor on Q (it used to drop it: Swin-v2 off by 3.6)."""
    from trtattn.rewrite.normalize import normalize_model

    result = normalize_model(per_head_scale(op_type))
    assert result.ok and result.verification.max_abs_err <= 1e-4, result.verification


@pytest.mark.slow
def test_swinv2_cosine_attention_is_fused():
    """Swin-v2's cosine attention: normalized Q and K, times exp(clamp(logit_scale)) per head, plus a
    relative position bias from a small MLP; two stages with 2 and 4 heads, the first with its shifted-window
    block (the mask Swin-v2 adds twice, over the logits viewed [B, nW, N, S, S]: tests/match/logit_ops/test_reshape.py)."""
    torch = pytest.importorskip("torch", reason="the export needs torch")
    transformers = pytest.importorskip("transformers", reason="the export needs transformers")

    from trtattn.testing.exports import export_module

    torch.manual_seed(0)
    config = transformers.Swinv2Config(image_size=32, patch_size=4, embed_dim=16, depths=[2, 1], num_heads=[2, 4],
                                       window_size=4)

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = transformers.Swinv2Model(config)

        def forward(self, pixel_values):
            return self.m(pixel_values).last_hidden_state

    model = export_module(Wrap(), (torch.randn(2, 3, 32, 32),), ["pixel_values"], {"pixel_values": {0: "batch"}})
    result = fuse_model(model)
    assert [r.status for r in result.reports] == ["fused"] * 3, [r.row() for r in result.reports]
    assert result.ok and all(r.site.scale == 1.0 for r in result.reports)
    assert all(any(s.op == "head_scale" for s in r.site.mask_steps) for r in result.reports)


def test_per_head_scale_of_unknown_shape_is_unsupported():
    """A per-head logit scale whose operand has no known shape cannot be told per-head from per-position:
    refused by name (it used to be a TypeError from zip over None)."""
    import onnx_graphsurgeon as gs

    from trtattn.graph.view import GraphView
    from trtattn.match.axes import Atoms
    from trtattn.match.core import _per_head
    from trtattn.match.errors import Unsupported
    from trtattn.site import MaskStep

    s, y = gs.Variable("s", dtype=np.float32), gs.Variable("y", dtype=np.float32)
    graph = gs.Graph(nodes=[gs.Node("Identity", inputs=[s], outputs=[y])], inputs=[s], outputs=[y], opset=17)
    step = MaskStep("head_scale", operand="s", node="scale/Mul", frame=(("x0",),))
    with pytest.raises(Unsupported, match="scale/Mul multiplies the logits by s, whose shape is not known"):
        _per_head(GraphView(graph, fold=False), step, Atoms())


# Survivors of mutating match/logit_ops/scale.py (benchmarks/mutate.py, base d3efd07):
# each test pins an outcome the fast lane left open.
def test_a_per_head_factor_computed_at_run_time_is_a_scale_not_a_mask():
    """logits * f, f [heads, 1, 1] from a graph input (not foldable): constant along the keys, so scale.py
    reads it (and refuses it as not a scalar), not mul_mask.py (which would say 'no offset')."""
    model = per_head_scale("Mul")
    init = next(i for i in model.graph.initializer if i.name == "logit_scale")
    model.graph.initializer.remove(init)
    model.graph.input.append(helper.make_tensor_value_info("logit_scale", TensorProto.FLOAT, [4, 1, 1]))
    result = match(model)
    assert not result.sites and "multiplies the logits by a tensor, not a scalar" in result.skipped[0].reason


def test_a_multiplier_of_one_number_computed_at_run_time_is_a_scale_not_a_mask():
    """logits * f, f of shape [1, 1, 1, 1] from a graph input: one number, a scale."""
    model = per_head_scale("Mul")
    init = next(i for i in model.graph.initializer if i.name == "logit_scale")
    model.graph.initializer.remove(init)
    model.graph.input.append(helper.make_tensor_value_info("logit_scale", TensorProto.FLOAT, [1, 1, 1, 1]))
    result = match(model)
    assert not result.sites and "multiplies the logits by a tensor, not a scalar" in result.skipped[0].reason


def test_a_constant_factor_that_varies_over_the_keys_is_not_a_per_head_scale():
    """logits * w, w a constant [1, 1, 6] (one weight per key): not constant along the keys, so not a head
    scale (which goes on Q); refused as a tensor that is not a scalar."""
    model = per_head_scale("Mul")
    init = next(i for i in model.graph.initializer if i.name == "logit_scale")
    init.CopyFrom(numpy_helper.from_array(np.linspace(0.5, 1.5, 6).astype(np.float32).reshape(1, 1, 6), "logit_scale"))
    result = match(model)
    assert not result.sites and "multiplies the logits by a tensor, not a scalar" in result.skipped[0].reason
    model = per_head_scale("Mul")  # the same factor per head, [4, 1, 1]: a head scale
    assert any("head_scale" in steps for steps in mask_step_ops(match(model)))


def test_a_factor_that_varies_over_the_queries_is_not_a_per_head_scale():
    model = per_head_scale("Mul")
    init = next(i for i in model.graph.initializer if i.name == "logit_scale")
    init.CopyFrom(numpy_helper.from_array(np.linspace(0.5, 1.5, 24).astype(np.float32).reshape(4, 6, 1), "logit_scale"))
    result = match(model)
    assert not result.sites and "multiplies the logits by a tensor, not a scalar" in result.skipped[0].reason


def test_a_division_by_the_logits_is_refused():
    model = attention_model(scale_style="div_after")
    div = next(n for n in model.graph.node if n.op_type == "Div")
    div.input[:] = [div.input[1], div.input[0]]  # sqrt(d) / logits
    result = match(model)
    assert not result.sites and f"Div {div.name} divides by the logits" in result.skipped[0].reason
