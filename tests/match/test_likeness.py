"""Attention decided by axes (issue 18, class 2): a learned query (attention pooling, a MAP head,
Perceiver's latents) is attention, because the softmax runs over the input's positions and the
probabilities weigh input values; a classifier head or an MoE router normalises over a weight's axis
(classes, experts) and is never attention, whatever product follows it. Real torch exports. Then hand-built
graphs (issue 32): not attention stays out the same way in every layer (match/likeness.py: one decision with its
reason), and an integer softmax between the two products is listed, not passed over."""

import collections
import re

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

torch = pytest.importorskip("torch", reason="the exports need torch")
transformers = pytest.importorskip("transformers", reason="the exports need transformers")

from trtattn.graph.view import GraphView, import_graph  # noqa: E402
from trtattn.match import match  # noqa: E402
from trtattn.match.likeness import likeness  # noqa: E402
from trtattn.rewrite.fuse import fuse_model  # noqa: E402
from trtattn.testing.exports import export_module as export  # noqa: E402
from trtattn.testing.not_attention import not_attention_model  # noqa: E402


def fused_ops(result):
    return collections.Counter(n.op_type for n in result.model.graph.node)


class Pooling(torch.nn.Module):
    """Attention pooling with a learned probe (CLIP/SigLIP MAP heads, Set Transformer's PMA)."""

    def __init__(self, d=32, heads=4, probes=2):
        super().__init__()
        self.probe = torch.nn.Parameter(torch.randn(1, probes, d))
        self.mha = torch.nn.MultiheadAttention(d, heads, batch_first=True)

    def forward(self, x):
        return self.mha(self.probe.expand(x.shape[0], -1, -1), x, x, need_weights=False)[0]


class DenseMoE(torch.nn.Module):
    """Self-attention, then experts mixed by a softmax router whose probabilities are contracted with the
    experts' outputs (a product with activations, like attention's): layer 0's router is a MatMul, layer
    1's a Gemm over flattened tokens."""

    def __init__(self, d=32, heads=4, experts=4):
        super().__init__()
        self.heads, self.experts = heads, experts
        self.qkv = torch.nn.ModuleList([torch.nn.Linear(d, 3 * d) for _ in range(2)])
        self.router = torch.nn.ModuleList([torch.nn.Linear(d, experts) for _ in range(2)])
        self.mix = torch.nn.ModuleList([torch.nn.Linear(d, d * experts) for _ in range(2)])

    def forward(self, x):
        b, t, d = x.shape
        for i in range(2):
            q, k, v = self.qkv[i](x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, -1) @ v
            x = x + a.transpose(1, 2).reshape(b, t, d)
            h = x.reshape(-1, d) if i == 1 else x
            w = torch.softmax(self.router[i](h), -1).reshape(b, t, 1, self.experts)
            x = x + (w @ self.mix[i](x).reshape(b, t, self.experts, d)).reshape(b, t, d)
        return x


def test_attention_pooling_with_a_learned_probe_is_fused():
    torch.manual_seed(0)
    model = export(Pooling(), (torch.randn(2, 7, 32),), ["x"], {"x": {0: "batch"}})
    result = fuse_model(model)
    assert [r.status for r in result.reports] == ["fused"], [r.row() for r in result.reports]
    assert result.ok and result.verification.max_abs_err <= 1e-4
    assert fused_ops(result)["Attention"] == 1 and fused_ops(result)["Softmax"] == 0


@pytest.mark.slow
def test_siglip_map_head_is_fused():
    """SigLIP's vision tower with its multihead-attention-pooling head: the encoder's self-attention and
    the head's attention from a learned probe both fuse."""
    torch.manual_seed(0)
    config = transformers.SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=4, image_size=32, patch_size=8,
                                             vision_use_head=True)

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = transformers.SiglipVisionModel(config)

        def forward(self, pixel_values):
            return self.m(pixel_values).pooler_output

    model = export(Head(), (torch.randn(2, 3, 32, 32),), ["pixel_values"], {"pixel_values": {0: "batch"}})
    result = fuse_model(model)
    assert sorted(r.site.name for r in result.reports if r.status == "fused") == ["m/encoder/layers.0/self_attn",
                                                                           "m/head/attention"]
    assert result.ok and fused_ops(result)["Attention"] == 2 and fused_ops(result)["Softmax"] == 0


def test_routers_are_not_attention_and_every_attention_fuses():
    """Both routers are ignored, for the same reason (they normalise over the experts, a weight's axis),
    whether the router is a MatMul or a Gemm; both attentions fuse."""
    torch.manual_seed(0)
    model = export(DenseMoE(), (torch.randn(2, 7, 32),), ["x"], {"x": {0: "batch", 1: "seq"}})
    result = fuse_model(model)
    assert [r.status for r in result.reports] == ["fused", "fused"], [r.row() for r in result.reports]
    assert result.ok
    assert len(result.ignored) == 2, result.ignored
    assert all("/router." in i.reason and "a classifier head or a router" in i.reason for i in result.ignored)


@pytest.mark.slow
def test_mixtral_routers_are_ignored_and_attention_fused():
    torch.manual_seed(0)
    config = transformers.MixtralConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                        num_experts_per_tok=2, experts_implementation="eager")

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = transformers.MixtralModel(config)

        def forward(self, input_ids):
            return self.m(input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False).last_hidden_state

    model = export(Wrap(), (torch.randint(0, 100, (2, 7)),), ["input_ids"], {"input_ids": {0: "batch", 1: "seq"}})
    result = fuse_model(model)
    assert [r.status for r in result.reports] == ["fused", "fused"] and result.ok
    routers = [i for i in result.ignored if "/mlp/gate/" in i.name]
    assert len(routers) == 2 and all("a classifier head or a router" in i.reason for i in routers), result.ignored


class BatchedRouter(torch.nn.Module):
    """A router whose weights are expanded over the batch (a batched MatMul of the same rank as its input):
    read by frames, its softmax runs over the weights' free axis."""

    def __init__(self, d=32, experts=4):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(1, d, experts) / d ** 0.5)
        self.mix = torch.nn.Linear(d, d * experts)
        self.experts = experts

    def forward(self, x):
        b, t, d = x.shape
        w = torch.softmax(x @ self.w.expand(b, -1, -1), -1).reshape(b, t, 1, self.experts)
        return (w @ self.mix(x).reshape(b, t, self.experts, d)).reshape(b, t, d)


def test_router_read_by_frames_is_not_attention():
    torch.manual_seed(0)
    model = export(BatchedRouter(), (torch.randn(2, 7, 32),), ["x"], {"x": {0: "batch", 1: "seq"}})
    result = fuse_model(model)
    assert result.reports == [] and len(result.ignored) == 1, ([r.row() for r in result.reports], result.ignored)
    assert "normalises over the 4 outputs of weights" in result.ignored[0].reason, result.ignored


def test_an_unprovable_softmax_over_a_learned_probe_is_listed_not_ignored():
    """Exp / (ReduceSum + eps) (no rule proves it a softmax) after the probe's product with the input's keys:
    with no Softmax to read the axis from, that product counts as attention's, so the site is listed."""
    import onnx_graphsurgeon as gs

    from trtattn.match import match
    from trtattn.testing.fuzz.softmax_forms import write_softmax

    torch.manual_seed(0)
    model = export(Pooling(), (torch.randn(2, 7, 32),), ["x"], {"x": {0: "batch"}})
    g = gs.import_onnx(model)
    write_softmax(g, next(n for n in g.nodes if n.op == "Softmax"), "sum_eps")
    result = match(gs.export_onnx(g))
    assert not result.sites and len(result.skipped) == 1, (result.skipped, result.ignored)
    assert "cannot be proven" in result.skipped[0].reason


class ProbeAtBatchOne(torch.nn.Module):
    """A learned probe left at batch 1 (no Expand): the products broadcast it over the keys' batch. heads=0:
    one head, the probe [1, Q, D] straight into MatMul with K^T [B, D, S]."""

    def __init__(self, d=32, heads=4, probes=2):
        super().__init__()
        self.heads = heads
        self.probe = torch.nn.Parameter(torch.randn(1, probes, d))
        self.kv = torch.nn.Linear(d, 2 * d)

    def forward(self, x):
        b, t, d = x.shape
        if not self.heads:
            k, v = self.kv(x).chunk(2, -1)
            return torch.softmax(self.probe @ k.transpose(-1, -2) / d ** 0.5, -1) @ v
        h = self.heads
        k, v = self.kv(x).reshape(b, t, 2, h, d // h).permute(2, 0, 3, 1, 4)
        q = self.probe.reshape(1, -1, h, d // h).transpose(1, 2)
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // h) ** 0.5, -1) @ v
        return a.transpose(1, 2).reshape(b, -1, d)


@pytest.mark.parametrize("heads", [4, 0], ids=["heads", "one-head"])
def test_probe_left_at_batch_one_is_expanded_to_the_keys_batch(heads):
    """The fused op takes Q, K and V with one batch: the rewrite expands the probe to K's batch (read at run
    time: the fused model runs at batches 1 and 3 too), and the batch is not taken as 1 from the probe."""
    ort = pytest.importorskip("onnxruntime", reason="running the models needs onnxruntime")
    import numpy as np

    torch.manual_seed(0)
    model = export(ProbeAtBatchOne(heads=heads), (torch.randn(2, 7, 32),), ["x"], {"x": {0: "batch"}})
    result = fuse_model(model)
    assert [r.status for r in result.reports] == ["fused"], [r.row() for r in result.reports]
    assert result.ok and result.verification.max_abs_err <= 1e-4
    assert fused_ops(result)["Attention"] == 1 and fused_ops(result)["Expand"] == 1
    assert result.reports[0].site.layout.batch_broadcast == ("q",)
    a, b = (ort.InferenceSession(m.SerializeToString()) for m in (model, result.model))
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 7, 32)).astype(np.float32)
        np.testing.assert_allclose(b.run(None, {"x": x})[0], a.run(None, {"x": x})[0], atol=1e-5)


def _unnamed(reason: str) -> str:
    return re.sub(r"\b[A-Za-z]+_\d+\b", "N", reason)


@pytest.mark.parametrize("kind,ignored,why", [
    ("router", 1, "a classifier head or a router"),
    ("nystrom", 1, "weigh no values of the input independent of themselves"),
    ("linear", 2, "summed over its queries"),
])
def test_what_is_not_attention_is_ignored_with_its_reason_in_every_layer(kind, ignored, why):
    result = fuse_model(not_attention_model(kind))
    assert result.ok, [(r.site.name, r.reason) for r in result.reports]
    assert len(result.ignored) == 2 * ignored
    assert all(r.site.q_heads for r in result.reports)
    per_layer = [sorted(_unnamed(i.reason) for i in result.ignored[k * ignored:(k + 1) * ignored]) for k in (0, 1)]
    assert per_layer[0] == per_layer[1]  # identically in both layers
    assert any(why in i.reason for i in result.ignored)


def test_the_attention_kernels_of_nystrom_still_fuse():
    result = fuse_model(not_attention_model("nystrom"))
    assert sum(r.row()["status"] == "fused" for r in result.reports) == 6  # the MHA and kernels 1 and 3, twice


def test_an_integer_softmax_between_the_products_is_listed_in_every_layer():
    result = fuse_model(not_attention_model("integer"))
    listed = [r for r in result.reports if r.row()["status"] == "not fused"]
    assert not result.ok and len(listed) == 2
    assert all("an integer softmax" in r.reason for r in listed)
    assert _unnamed(listed[0].reason) == _unnamed(listed[1].reason)


def test_a_model_whose_only_softmaxes_are_integer_ones_is_not_said_to_have_no_attention():
    result = fuse_model(not_attention_model("integer", attention=False))
    assert result.verification.note != "no attention found"
    assert len(result.reports) == 2 and not result.ok


def test_one_decision_gives_a_typed_verdict():
    model = not_attention_model("linear", layers=1)
    graph = import_graph(model)
    view = GraphView(graph, model)
    match(graph, view)
    verdicts = {n.name: likeness(view, n) for n in graph.nodes if n.op == "Softmax"}
    assert [v.attention for v in verdicts.values()] == [True, False, False]
    assert all(v.reason for v in verdicts.values() if not v.attention)


def test_an_integer_softmax_after_another_division_is_still_listed():
    """A Div that is no normalisation (the input divided by 1, first in the graph) does not end the search for the
    integer softmaxes after it: both layers' are still listed."""
    model = not_attention_model("integer")
    graph = model.graph
    source = graph.input[0].name
    for node in graph.node:
        node.input[:] = [f"{source}/1" if i == source else i for i in node.input]
    graph.initializer.append(onnx.numpy_helper.from_array(np.ones((), np.float32), "one"))
    graph.node.insert(0, onnx.helper.make_node("Div", [source, "one"], [f"{source}/1"], name="unit_div"))
    result = fuse_model(model)
    listed = [r for r in result.reports if r.row()["status"] == "not fused"]
    assert len(listed) == 2 and all("an integer softmax" in r.reason for r in listed)
