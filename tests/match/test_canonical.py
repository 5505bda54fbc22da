"""Issue 18, classes 1 and 10: a softmax written without a Softmax op is found, fused and verified, or
listed (never silent); a site's description does not depend on how its neighbour is written."""

import collections
import json

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest

from trtattn.cli import main
from trtattn.match import match
from trtattn.match.canonical import canonicalize
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.fuzz.softmax_forms import FORMS, write_softmax
from trtattn.testing.graphs import attention_model, two_attentions

RULE = {"onnx_body": "exp_div_sum", "plain": "exp_div_sum", "mul_reciprocal": "exp_mul_reciprocal_sum",
        "reciprocal_first": "exp_mul_reciprocal_sum", "exp_logsoftmax": "exp_logsoftmax",
        "exp_sub_logsumexp": "exp_sub_logsumexp", "logsoftmax_body": "exp_sub_logsumexp",
        "shifted_softmax": "softmax_of_shifted"}


def rewritten(model: onnx.ModelProto, form: str, which=None) -> onnx.ModelProto:
    """`model` with its Softmax nodes (those whose index is in `which`, default all) written as `form`."""
    g = gs.import_onnx(model)
    for i, sm in enumerate([n for n in g.nodes if n.op == "Softmax"]):
        if which is None or i in which:
            write_softmax(g, sm, form)
    out = gs.export_onnx(g)
    out.ir_version = model.ir_version
    out.metadata_props.extend(model.metadata_props)
    return out


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("opset", [17, 18])
def test_each_form_is_one_rule_and_fuses_verified(form, opset):
    model = rewritten(attention_model(opset=opset, mask_style="additive_input"), form)
    assert sum(n.op_type == "Softmax" for n in model.graph.node) == (form == "shifted_softmax")
    g = gs.import_onnx(model)
    canon = canonicalize(g, opset)
    assert canon.counts == {RULE[form]: 1} and not canon.unproven
    (sm,) = [n for n in g.nodes if n.op == "Softmax"]
    assert sm.attrs["axis"] == -1 and sm.inputs[0].inputs[0].op != "Sub"  # the max shift is gone
    assert not any(n.op in ("Exp", "ReduceSum", "ReduceMax", "ReduceLogSumExp") for n in g.nodes)
    result = fuse_model(model)
    (r,) = result.reports
    assert r.status == "fused" and r.max_abs_err < 1e-5, r.reason
    assert f"softmax written as {RULE[form]}" in r.site.notes


def test_shift_over_another_axis_stays_in_the_logits():
    """Exp(y)/Sum(Exp(y)) is Softmax(y) for any y: a max over another axis is kept, not removed."""
    g = gs.import_onnx(attention_model(opset=18))
    sm = next(n for n in g.nodes if n.op == "Softmax")
    write_softmax(g, sm, "onnx_body")
    red = next(n for n in g.nodes if n.op == "ReduceMax")
    red.inputs[1] = gs.Constant("other_axis", np.asarray([-2], np.int64))
    canon = canonicalize(g, 18)
    assert canon.counts == {"exp_div_sum": 1}
    (sm,) = [n for n in g.nodes if n.op == "Softmax"]
    assert sm.inputs[0].inputs[0].op == "Sub"


def test_reductions_over_different_axes_are_listed_not_rewritten(tmp_path):
    g = gs.import_onnx(attention_model(opset=18))
    write_softmax(g, next(n for n in g.nodes if n.op == "Softmax"), "onnx_body")
    total = next(n for n in g.nodes if n.op == "ReduceSum")
    total.inputs[1] = gs.Constant("sum_axis", np.asarray([-2], np.int64))
    red = next(n for n in g.nodes if n.op == "ReduceMax")
    red.inputs[1] = gs.Constant("max_axis", np.asarray([-2], np.int64))
    total.attrs["keepdims"] = 0  # no longer broadcasts along its axis: not a softmax
    model = gs.export_onnx(g)
    canon = canonicalize(gs.import_onnx(model), 18)
    assert not canon.counts and "keepdims=0" in canon.unproven[0].reason
    (skipped,) = match(model).skipped
    assert "cannot be proven" in skipped.reason


def test_unprovable_form_is_listed_and_exits_1(tmp_path):
    """Exp / (ReduceSum + eps): the same numbers, but no rule proves it a softmax: listed, exit 1."""
    model = rewritten(attention_model(opset=18), "sum_eps")
    result = match(model)
    assert not result.sites and len(result.skipped) == 1
    assert "cannot be proven" in result.skipped[0].reason and "Div" in result.skipped[0].reason
    src, out, report = tmp_path / "in.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(model, str(src))
    assert main(["-q", "fuse", str(src), "-o", str(out), "--report", str(report)]) == 1
    (site,) = json.loads(report.read_text())["sites"]
    assert site["status"] == "not fused" and "cannot be proven" in site["reason"]


def test_softmax_like_classifier_is_ignored_not_listed():
    """A classifier head's Exp / (ReduceSum + eps) normalises over a weight's axis: not attention."""
    model = attention_model(opset=18, extra_softmax="classifier")
    g = gs.import_onnx(model)
    write_softmax(g, next(n for n in g.nodes if n.name == "classifier/Softmax"), "sum_eps")
    result = match(gs.export_onnx(g))
    assert len(result.sites) == 1 and not result.skipped
    assert any("cannot be proven" in i.reason for i in result.ignored)


def test_neighbour_description_does_not_depend_on_a_rewritten_softmax():
    """Class 10 on hand-built graphs: only the first block's softmax rewritten; the second is unchanged."""
    blocks = dict(opset=18, heads=4, kv_heads=2)
    plain = fuse_model(two_attentions(blocks, **blocks))
    mixed = fuse_model(rewritten(two_attentions(blocks, **blocks), "onnx_body", which={0}))
    assert all(r.status == "fused" for r in plain.reports + mixed.reports)
    describe = lambda rs: sorted((r.site.q_heads, r.site.kv_heads, r.site.head_size) for r in rs)  # noqa: E731
    assert describe(plain.reports) == describe(mixed.reports) == [(4, 2, 8)] * 2


@pytest.mark.parametrize("form", ["onnx_body", "exp_sub_logsumexp", "sum_eps"])
def test_zoo_llama_one_layer_rewritten_leaves_the_other_as_it_was(zoo_export, form):
    """Class 10 on a real export: layer 0's softmax rewritten, layer 1 keeps heads 4/2, its rope, and fuses;
    layer 0 fuses too, or (an unprovable form) is listed."""
    model = onnx.load(str(zoo_export("llama", "torchscript")))
    before = {s.name: s for s in match(model).sites}
    result = fuse_model(rewritten(model, form, which={0}))
    by_layer = {next(p for p in r.site.name.split("/") if p.startswith("layers.")): r for r in result.reports}
    other, first = by_layer["layers.1"], by_layer["layers.0"]
    want = before["model/layers.1/self_attn"]
    assert other.status == "fused" and other.max_abs_err < 1e-4, other.reason
    assert (other.site.q_heads, other.site.kv_heads, other.site.rope) == (want.q_heads, want.kv_heads, want.rope)
    assert want.q_heads == 4 and want.kv_heads == 2 and want.rope is not None
    if form == "sum_eps":
        assert first.status == "not fused" and "cannot be proven" in first.reason
    else:
        assert first.status == "fused" and first.max_abs_err < 1e-4, first.reason
        assert (first.site.q_heads, first.site.kv_heads) == (4, 2)
        assert (first.site.rope.kind, first.site.rope.rotary_dim) == (want.rope.kind, want.rope.rotary_dim)


def test_zoo_bert_with_onnx_softmax_body_fuses_every_site(zoo_export):
    """Every Softmax of a real export replaced by ONNX's function body (what inlining writes)."""
    model = rewritten(onnx.load(str(zoo_export("bert", "torchscript"))), "onnx_body")
    result = fuse_model(model)
    assert len(result.reports) == 2
    for r in result.reports:
        assert r.status == "fused" and r.max_abs_err < 1e-4 and r.site.q_heads == 4, r.reason


def inlined(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every Softmax replaced by ONNX's own function body for it (the schema's context-dependent function at
    the model's opset), as a function-inlining pass writes it."""
    opset = next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx"))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for k, node in enumerate(out.graph.node):
        if node.op_type != "Softmax":
            nodes.append(node)
            continue
        version = max(v for v in onnx.defs.get_schema("Softmax", opset).context_dependent_function_opset_versions
                      if v <= opset)
        any_float = onnx.helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, None)
        body = onnx.FunctionProto()
        body.ParseFromString(onnx.defs.get_schema("Softmax", opset).get_context_dependent_function_with_opset_version(
            version, node.SerializeToString(), [any_float.SerializeToString()]))
        rename = {"input": node.input[0], "output": node.output[0]}
        for inner in body.node:
            inner.input[:] = [rename.get(i, f"inlined{k}/{i}") for i in inner.input]
            inner.output[:] = [rename.get(o, f"inlined{k}/{o}") for o in inner.output]
            inner.name = f"{node.name}/inlined/{inner.op_type}"
            nodes.append(inner)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


@pytest.mark.parametrize("source", [("bert", "torchscript"), ("llama", "dynamo")])
def test_zoo_with_onnx_inlined_softmax_fuses_every_site(zoo_export, source):
    """ONNX's own Softmax function body (schema, at the export's opset: axes as attribute or input) in place
    of every Softmax of a real export: each site fused, verified, described as before."""
    model = onnx.load(str(zoo_export(*source)))
    before = sorted((s.q_heads, s.kv_heads, s.head_size) for s in match(model).sites)
    body = inlined(model)
    assert not any(n.op_type == "Softmax" for n in body.graph.node)
    result = fuse_model(body)
    assert len(result.reports) == len(before) == 2
    assert sorted((r.site.q_heads, r.site.kv_heads, r.site.head_size) for r in result.reports) == before
    for r in result.reports:
        assert r.status == "fused" and r.max_abs_err < 1e-4 and "softmax written as exp_div_sum" in r.site.notes, r.reason


@pytest.mark.parametrize("form", ["onnx_body", "exp_logsoftmax", "exp_sub_logsumexp"])
def test_opset_12_forms_with_axes_attributes_fuse(form):
    """Opset 12: reductions take axes as an attribute and the Softmax flattens from its axis (the last here)."""
    model = rewritten(attention_model(opset=12), form)
    g = gs.import_onnx(model)
    assert all("axes" in n.attrs for n in g.nodes if n.op.startswith("Reduce"))
    (site,) = match(model).sites
    assert f"softmax written as {RULE[form]}" in site.notes
    (r,) = fuse_model(model).reports
    assert r.status == "fused" and r.max_abs_err < 1e-5, r.reason


def test_written_softmax_in_a_loop_body_is_found_and_fused():
    """A Loop body whose only attention is a written softmax: the model has candidates (not 'no attention
    found', exit 0), and the site is fused in the body."""
    from trtattn.rewrite.fuse import has_candidates
    from trtattn.testing.graphs import control_flow_model

    g = gs.import_onnx(control_flow_model("loop", opset=18))
    (loop,) = [n for n in g.nodes if n.op == "Loop"]
    body = loop.attrs["body"]
    write_softmax(body, next(n for n in body.nodes if n.op == "Softmax"), "onnx_body")
    model = gs.export_onnx(g)
    model.ir_version = 10
    assert not any(n.op_type == "Softmax" for n in model.graph.node[0].attribute[0].g.node)
    assert has_candidates(model)
    result = fuse_model(model)
    (r,) = result.reports
    assert r.status == "fused" and result.verification.passed, r.reason


def test_a_written_softmax_whose_site_fails_keeps_its_original_nodes():
    """Two written softmaxes; the second's probabilities are model outputs twice (before and after an Identity the
    product reads), which one op's qk_matmul_output cannot give, so it cannot fuse. The first is fused; the second
    is written back as it was (Exp, ReduceMax, ReduceSum, Div), not as the rule's Softmax."""
    g = gs.import_onnx(rewritten(two_attentions(), "onnx_body"))
    second = [n for n in g.nodes if n.op == "Div" and n.name.startswith("b2/")]
    probs = next(n for n in second if n.inputs[0].inputs and n.inputs[0].inputs[0].op == "Exp").outputs[0]
    again = gs.Variable("probs_again", dtype=np.float32)
    (product,) = probs.outputs
    product.inputs[product.inputs.index(probs)] = again
    g.nodes.append(gs.Node("Identity", "b2/again", inputs=[probs], outputs=[again]))
    probs.dtype = np.float32
    g.outputs += [probs, again]
    model = gs.export_onnx(g.toposort())
    model.ir_version = 10
    result = fuse_model(model)
    assert [r.status for r in result.reports] == ["fused", "not fused"], [r.reason for r in result.reports]
    assert "returned twice" in result.reports[1].reason
    ops = collections.Counter(n.op_type for n in result.model.graph.node)
    assert ops["Attention"] == 1 and ops["Softmax"] == 0
    assert ops["Exp"] == ops["ReduceMax"] == ops["ReduceSum"] == 1
    names = {n.name for n in result.model.graph.node}
    assert {n.name for n in model.graph.node if n.name.startswith("b2/") and n.op_type in ("Exp", "ReduceSum")} <= names


# Survivors of mutating match/canonical.py (benchmarks/mutate.py, base d3efd07):
# each test pins an outcome the fast lane left open.
def _graph(build) -> gs.Graph:
    """x [2, 3, 4] -> build(op, x) -> y."""
    x = gs.Variable("x", np.float32, [2, 3, 4])
    nodes = []

    def op(kind, inputs, **attrs):
        out = gs.Variable(f"{kind}_{len(nodes)}", np.float32)
        nodes.append(gs.Node(kind, f"{kind}_{len(nodes)}", attrs, inputs, [out]))
        return out

    y = build(op, x)
    return gs.Graph(nodes=nodes, inputs=[x], outputs=[y], opset=18)


def test_exponentials_divided_by_something_not_their_sum_are_not_softmax_like():
    """Exp(x) / Sqrt(Exp(x)): no sum of the exponentials anywhere, so nothing to list (a listed stray
    normalisation needs a ReduceSum over them)."""
    def build(op, x):
        e = op("Exp", [x])
        return op("Div", [e, op("Sqrt", [e])])

    canon = canonicalize(_graph(build), 18)
    assert not canon.counts and not canon.unproven


def test_exponentials_over_a_sum_plus_epsilon_are_listed():
    """Exp(x) / (ReduceSum(Exp(x)) + eps): softmax-like, not provably one: listed with the Div that normalises."""
    def build(op, x):
        e = op("Exp", [x])
        total = op("ReduceSum", [e, gs.Constant("axes", np.asarray([-1], np.int64))], keepdims=1)
        return op("Div", [e, op("Add", [total, gs.Constant("eps", np.asarray(1e-6, np.float32))])])

    canon = canonicalize(_graph(build), 18)
    (u,) = canon.unproven
    assert not canon.counts and u.anchor.op == "Div" and u.logits.name == "x"
    assert "Exp Exp_0 is normalised by Div Div_3" in u.reason


def _axes(values):
    return gs.Constant(f"axes_{values}_{np.random.default_rng().integers(1 << 30)}", np.asarray(values, np.int64))


def test_a_shift_over_the_same_axis_written_positive_is_removed():
    """Exp(x - ReduceMax(x, axes=[2])) / ReduceSum(.., axes=[-1]) on a rank-3 x: axis 2 is -1, the shift goes."""
    def build(op, x):
        e = op("Exp", [op("Sub", [x, op("ReduceMax", [x, _axes([2])], keepdims=1)])])
        return op("Div", [e, op("ReduceSum", [e, _axes([-1])], keepdims=1)])

    g = _graph(build)
    canon = canonicalize(g, 18, rank_of=lambda t: 3)
    assert canon.counts == {"exp_div_sum": 1}
    (sm,) = g.nodes
    assert sm.op == "Softmax" and sm.attrs["axis"] == -1 and sm.inputs[0].name == "x"


def test_exp_of_a_logsoftmax_without_an_axis_is_a_softmax_over_the_last_axis():
    g = _graph(lambda op, x: op("Exp", [op("LogSoftmax", [x])]))
    assert canonicalize(g, 18).counts == {"exp_logsoftmax": 1}
    (sm,) = g.nodes
    assert sm.op == "Softmax" and sm.attrs["axis"] == -1


def test_at_opset_12_a_shifted_softmax_over_the_last_axis_is_rewritten_and_over_another_left():
    """Before opset 13 Softmax(axis) normalises every axis from `axis` on: only the last axis is one axis."""
    for axis, rewritten in ((2, True), (-1, True), (1, False)):
        def build(op, x, axis=axis):
            return op("Softmax", [op("Sub", [x, op("ReduceMax", [x], axes=[axis], keepdims=1)])], axis=axis)

        g = _graph(build)
        g.opset = 12
        canon = canonicalize(g, 12, rank_of=lambda t: 3)
        assert canon.counts == ({"softmax_of_shifted": 1} if rewritten else {}), axis
        assert (len(g.nodes) == 1) == rewritten and not canon.unproven


def test_exp_of_an_opset_12_logsoftmax_without_an_axis_keeps_its_meaning():
    """LogSoftmax before opset 13 defaults to axis 1 (over every axis from 1 on), as Softmax does there: the
    Softmax written for it must take the same axis, not -1 (found by the mutation run, 0.42 off)."""
    import onnxruntime as ort

    g = _graph(lambda op, x: op("Exp", [op("LogSoftmax", [x])]))
    g.opset = 12
    g.outputs[0].dtype = np.float32
    before = gs.export_onnx(g.copy())
    canonicalize(g, 12)
    after = gs.export_onnx(g)
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
                 for m in (before, after))
    assert np.abs(want - got).max() < 1e-6


def _sum(op, e):
    return op("ReduceSum", [e, _axes([-1])], keepdims=1)


def test_exponentials_times_the_sum_to_the_power_minus_one_are_a_softmax():
    def build(op, x):
        e = op("Exp", [x])
        return op("Mul", [e, op("Pow", [_sum(op, e), gs.Constant("minus_one", np.asarray(-1.0, np.float32))])])

    g = _graph(build)
    assert canonicalize(g, 18).counts == {"exp_mul_reciprocal_sum": 1}
    assert [n.op for n in g.nodes] == ["Softmax"]


def test_exponentials_times_one_minus_their_sum_are_not_a_softmax():
    """1 - s is not 1 / s: listed as a stray normalisation, not rewritten."""
    def build(op, x):
        e = op("Exp", [x])
        return op("Mul", [e, op("Sub", [gs.Constant("one", np.asarray(1.0, np.float32)), _sum(op, e)])])

    canon = canonicalize(_graph(build), 18)
    assert not canon.counts and len(canon.unproven) == 1


def test_exp_of_logits_plus_their_logsumexp_is_not_a_softmax():
    """Exp(x + LSE(x)), written with Add or Sum, is not Exp(x - LSE(x))."""
    for plus in ("Add", "Sum"):
        def build(op, x, plus=plus):
            return op("Exp", [op(plus, [x, op("ReduceLogSumExp", [x, _axes([-1])], keepdims=1)])])

        assert not canonicalize(_graph(build), 18).counts, plus


def test_a_softmax_shifted_over_another_axis_keeps_its_shift():
    def build(op, x):
        return op("Softmax", [op("Sub", [x, op("ReduceMax", [x, _axes([2])], keepdims=1)])], axis=1)

    g = _graph(build)
    assert not canonicalize(g, 18, rank_of=lambda t: 3).counts
    assert len(g.nodes) == 3


def test_an_opset_12_shifted_softmax_without_an_axis_keeps_its_meaning():
    """Softmax-12 without an axis normalises every axis from 1 on: a shift by the last axis' max is not a
    no-op there, so the shift must stay (at opset 13 the default is the last axis, and it goes)."""
    import onnxruntime as ort

    def build(op, x):
        return op("Softmax", [op("Sub", [x, op("ReduceMax", [x], axes=[-1], keepdims=1)])])

    for opset, rewritten in ((12, False), (13, True)):
        g = _graph(build)
        g.opset = opset
        g.outputs[0].dtype = np.float32
        before = gs.export_onnx(g.copy())
        assert bool(canonicalize(g, opset, rank_of=lambda t: 3).counts) == rewritten, opset
        after = gs.export_onnx(g)
        x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
        want, got = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
                     for m in (before, after))
        assert np.abs(want - got).max() < 1e-6, opset
