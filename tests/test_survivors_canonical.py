"""Tests for the survivors of mutating trtattn/match/canonical.py (benchmarks/mutate.py, base d3efd07)."""

import numpy as np
import onnx_graphsurgeon as gs

from trtattn.match.canonical import canonicalize


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
