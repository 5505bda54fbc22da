"""Values a rule needs that a pattern cannot prove, evaluated (issue 26, part B): a scale computed from the shape
of a Slice whose end is computed, folded by running it at two probe dims (graph/measure.value); which dims are
symbolic told by the model's inputs, not by the names shape inference gives inside (graph/dim_names.lengths_vary)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import DATA
from trtattn.rewrite.fuse import fuse_model

FOREIGN = DATA / "foreign"


def _fused(result, sites=1):
    assert [r.status.value for r in result.reports] == ["fused"] * sites, [r.row() for r in result.reports]
    assert result.ok and result.verification.max_abs_err <= 1e-4, result.verification
    assert sum(n.op_type == "Attention" for n in result.model.graph.node) == sites
    return result.reports


# ------------------------------------------------------------------ class 1: a scale from a Slice's shape
def in_projection_export() -> onnx.ModelProto:
    """nn.MultiheadAttention-style code: one in-projection sliced into Q, K, V at an end computed from its shape,
    the head size read off the Q slice and the logits divided by its square root, as TorchScript writes it:
    Div(logits, Pow(Cast(Div(Gather(Shape(Slice(proj, 0, end)), 2), heads)), 0.5)) (the corpus's recipe)."""
    pytest.importorskip("torch", reason="the export needs torch")
    import tempfile

    from trtattn.zoo.foreign.tools import in_projection

    with tempfile.TemporaryDirectory() as tmp:
        return in_projection(Path(tmp))[0]


def test_scale_from_the_shape_of_a_computed_slice_is_evaluated(monkeypatch):
    """ONNX's shape inference does not follow a Slice whose end is computed, and ONNX Runtime's symbolic one gave
    up on the real models (here it is left out): folding cannot make the divisor a constant, so it was listed
    ('Div ... multiplies the logits by a tensor, not a scalar'). Evaluated at two probe dims, it is the same at
    both: the scale 1/sqrt(8)."""
    from trtattn.graph import shapes

    model = in_projection_export()
    monkeypatch.setattr(shapes, "symbolic_shapes", lambda model: None)
    [report] = _fused(fuse_model(model))
    assert report.site.scale == pytest.approx(1 / np.sqrt(8), rel=1e-6)


def test_the_committed_in_projection_export_is_evaluated_without_symbolic_shapes(monkeypatch):
    """The corpus's TorchScript export of the same code (tests/data/foreign): with ONNX Runtime's symbolic shape
    inference giving up, as it did on the real models, its scale is still evaluated."""
    from trtattn.graph import shapes

    monkeypatch.setattr(shapes, "symbolic_shapes", lambda model: None)
    [report] = _fused(fuse_model(onnx.load(FOREIGN / "in-projection.torchscript.onnx")))
    assert report.site.scale == pytest.approx(1 / np.sqrt(8), rel=1e-6)


def test_a_divisor_that_changes_with_the_dims_is_not_a_scale(monkeypatch):
    """The same export with the logits divided by the square root of the slice's length axis instead: it varies
    with the input, so it is not folded into a scale, and the site is listed with why."""
    from onnx import helper

    from trtattn.graph import shapes

    model = in_projection_export()
    pow_ = next(n for n in model.graph.node if n.op_type == "Pow")
    q = next(n for n in model.graph.node if n.op_type == "Slice" and n.name == "/Slice_1").output[0]
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(0, np.int64), "length_axis"))
    added = [helper.make_node("Shape", [q], ["q_shape"], name="length/Shape"),
             helper.make_node("Gather", ["q_shape", "length_axis"], ["q_length"], name="length/Gather"),
             helper.make_node("Cast", ["q_length"], ["q_length_f"], name="length/Cast", to=onnx.TensorProto.FLOAT)]
    at = list(model.graph.node).index(pow_)
    for i, n in enumerate(added):
        model.graph.node.insert(at + i, n)
    pow_.input[0] = "q_length_f"
    monkeypatch.setattr(shapes, "symbolic_shapes", lambda model: None)
    result = fuse_model(model)
    [report] = result.reports
    assert report.status.value == "not fused" and "not a scalar" in report.reason, report.row()


def test_values_are_evaluated_at_the_dims_the_model_runs_at(monkeypatch):
    """A recognizer-style export that runs only at an image height of 32 (a Conv whose kernel is 32 high) and not
    at the default dims: the probes ran at the defaults, so nothing was measured or evaluated (every measured rule
    fell back to names) and its scale stayed 'a tensor, not a scalar'. They run at the dims the search found."""
    torch = pytest.importorskip("torch", reason="the export needs torch")
    from trtattn.graph import shapes
    from trtattn.testing.exports import export_module

    class Recognizer(torch.nn.Module):
        def __init__(self, embed=32, heads=4):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, embed, (32, 4), (32, 4))
            self.in_proj, self.heads = torch.nn.Linear(embed, 3 * embed), heads

        def forward(self, image):  # [N, 3, 32, W] -> [W/4, N, E]
            x = self.conv(image).mean(2).permute(2, 0, 1)
            length, batch = x.shape[0], x.shape[1]
            proj = self.in_proj(x)
            embed = proj.size(-1) // 3
            q, k, v = proj[:, :, :embed], proj[:, :, embed:2 * embed], proj[:, :, 2 * embed:]
            head = q.size(2) // self.heads
            q, k, v = (t.contiguous().view(length, batch * self.heads, head).transpose(0, 1) for t in (q, k, v))
            scores = torch.bmm(q, k.transpose(1, 2)) / (head ** 0.5)
            return torch.bmm(torch.softmax(scores, dim=-1), v).transpose(0, 1).contiguous().view(length, batch, -1)

    torch.manual_seed(0)
    model = export_module(Recognizer(), (torch.randn(2, 3, 32, 20),), ["image"], {"image": {0: "N", 2: "H", 3: "W"}})
    monkeypatch.setattr(shapes, "symbolic_shapes", lambda model: None)
    result = fuse_model(model)
    assert result.dims["values"]["H"] == 32  # not the default: the model does not run there
    [report] = _fused(result)
    assert report.site.scale == pytest.approx(1 / np.sqrt(8), rel=1e-6)


def test_verify_matches_the_original_at_the_dims_it_runs_at(monkeypatch, tmp_path):
    """`trtattn verify` matches the original's sites to compare their outputs: at the dims the search found (the
    recogniser runs only at a height of 32), where fuse matched them, not at the defaults, where nothing runs and
    nothing a pattern cannot prove is measured."""
    from trtattn.graph.view import GraphView
    from trtattn.verify import candidate

    original = onnx.load(FOREIGN / "paddle-recognizer.paddle2onnx.onnx")
    fused = fuse_model(original)
    _fused(fused)
    path = tmp_path / "fused.onnx"
    onnx.save(fused.model, path)
    seen = []

    def view(graph, model=None, fold=True, dims=None):
        seen.append(dims)
        return GraphView(graph, model, fold, dims)

    monkeypatch.setattr(candidate, "GraphView", view)
    verification = candidate.verify_candidate(str(path), original)
    assert [d and d["DynamicDimension.1"] for d in seen] == [32]
    assert verification.outcome.passed and list(verification.site_errors) == ["Softmax.0"]


@pytest.mark.parametrize("name", ["paddle-recognizer", "paddle-recognizer-opset7"])
def test_heads_are_measured_where_the_graph_computes_the_shape(name):
    """paddle2onnx's recogniser: Q, K, V from one projection reshaped by a Concat-computed shape, so inference
    leaves every dim of the products unknown, and the model runs at one image height only. The second probe keeps
    that height and moves the other dims; the products' operands are measured: 4 heads of 8, not 1 of unknown."""
    [report] = _fused(fuse_model(onnx.load(FOREIGN / f"{name}.paddle2onnx.onnx")))
    assert (report.site.q_heads, report.site.kv_heads, report.site.head_size) == (4, 4, 8)


# ------------------------------------------------------------------ class 2: a static length, a symbolic batch
@pytest.mark.parametrize("name", ["keras-mha", "keras-block"])
def test_a_static_length_with_a_symbolic_batch_is_not_baked(name):
    """tf2onnx exports of Keras attention whose length is static (17, as a Keras ViT's tokens) and whose batch is
    unk__N: shape inference names the logits' length axis unk__N too, which read as a symbolic length the Reshape
    targets write 17 into. The model's inputs say only the batch is symbolic: nothing is baked."""
    model = onnx.load(FOREIGN / f"{name}.tf2onnx.onnx")
    for i in model.graph.input:
        dims = i.type.tensor_type.shape.dim
        assert dims[0].dim_param.startswith("unk__") and dims[1].dim_param.startswith("unk__")
        dims[1].Clear()
        dims[1].dim_value = 17
    _fused(fuse_model(model))


def test_lengths_vary_reads_the_inputs():
    from trtattn.graph.dim_names import lengths_vary
    from trtattn.graph.roles import InputSpec

    def spec(name, shape, kind="float"):
        return InputSpec(name, np.dtype(np.float32), shape, {"kind": kind})

    assert not lengths_vary([spec("x", ["unk__543", 17, 32])])
    assert not lengths_vary([spec("x", ["unk__1", 17, 32]), spec("mask", ["unk__2", 17], "padding_mask")])
    assert lengths_vary([spec("x", ["unk__1", "unk__2", 32])])
    assert lengths_vary([spec("ids", ["batch", "seq"], "token_ids")])
    assert not lengths_vary([spec("ids", ["batch", 32], "token_ids"), spec("mask", ["batch", 32], "padding_mask")])


# ------------------------------------------------------------------ class 5: tf2onnx's select on the probabilities
def keras_select_after_softmax(fill: float = 0.0) -> onnx.ModelProto:
    """The tf2onnx Keras encoder block with where(mask, P, fill) on the probabilities, as tf2onnx lowers SelectV2
    (Add(Mul(Cast(c), P), Mul(y, Cast(Not(c))))), on the boolean mask the block already masks its logits with."""
    from onnx import helper

    model = onnx.load(FOREIGN / "keras-block.tf2onnx.onnx")
    graph = model.graph
    softmax = next(n for n in graph.node if n.op_type == "Softmax")
    probs, scope = softmax.output[0], "multi_head_attention_1_1/SelectV2_1"
    cond = next(n for n in graph.node if n.op_type == "And").output[0]
    graph.initializer.append(onnx.numpy_helper.from_array(np.array(fill, np.float32), f"{scope}/y"))
    made = [("Cast", [cond], {"to": onnx.TensorProto.FLOAT}), ("Mul", ["a", probs], {}), ("Not", [cond], {}),
            ("Cast", ["c"], {"to": onnx.TensorProto.FLOAT}), ("Mul", [f"{scope}/y", "d"], {}), ("Add", ["b", "e"], {})]
    name = {k: f"{scope}__{k}:0" for k in "abcde"}
    nodes = [helper.make_node(op, [name.get(i, i) for i in ins], [f"{scope}:0" if op == "Add" else name["abcde"[i]]],
                              name=scope if op == "Add" else f"{scope}__{'abcde'[i]}", **attrs)
             for i, (op, ins, attrs) in enumerate(made)]
    for n in graph.node:
        n.input[:] = [f"{scope}:0" if x == probs else x for x in n.input]
    at = list(graph.node).index(softmax) + 1
    for i, n in enumerate(nodes):
        graph.node.insert(at + i, n)
    onnx.checker.check_model(model)
    return model


def test_keras_select_of_zero_after_the_softmax_is_a_mask():
    """tf2onnx's select: the probabilities feed Mul(Cast(mask), P), then an Add of the other branch. Evaluated on
    the model's padded feeds, that branch is 0 everywhere: P * mask, a mask re-applied to the probabilities."""
    result = fuse_model(keras_select_after_softmax(0.0))
    [report] = _fused(result)
    assert report.site.mask.value == "additive"
    assert "padding" in result.verification.inputs.domains["mask"]


def test_keras_select_of_another_value_is_listed():
    """where(mask, P, 0.5): the other branch is 0.5 where the mask drops P, which no fused op computes: listed."""
    [report] = fuse_model(keras_select_after_softmax(0.5)).reports
    assert report.status.value == "not fused" and "SelectV2_1" in report.reason, report.row()


# ------------------------------------------------------------------ class 3: measured sizes that cannot be placed
def test_a_regroup_the_measured_sizes_cannot_place_follows_the_names():
    """The recognizer's message, reproduced at the regroup: the probabilities as [batch*heads*query, key] back to
    4-D, measured [8, 8, 1, 1] at both runs (a length of 1 at the probe dims tells a position from a unit axis by
    nothing). The measured sizes cannot be placed; the names inference gives ([N, 8, L, L]) can, as they did
    before sizes were measured."""
    from trtattn.graph.measure import Sizes
    from trtattn.match.axes import Atoms, Unfollowable, regroup, show
    from trtattn.match.layout_ops import _regroup

    def atoms():
        a = Atoms()
        for x in ("x0", "m", "n", "c"):
            a.new(x)
        a.new("x1", 8)
        return a

    frame = (("x0", "x1", "m"), ("n",))
    measured = ([Sizes((64, 64)), Sizes((1, 1))], [Sizes((8, 8)), Sizes((8, 8)), Sizes((1, 1)), Sizes((1, 1))])
    named = (["unk__2", "L"], ["N", 8, "L", "L"])
    with pytest.raises(Unfollowable, match=r"cannot tell how \[x0\*x1\*m, n\] regroups into \[8, 8, 1, 1\]"):
        regroup(atoms(), frame, *measured, "Reshape")
    registry = atoms()
    assert show(_regroup(registry, frame, measured, named, "Reshape")) == "[x0, x1, m, n]"


def test_a_length_of_one_at_both_runs_is_placed_by_the_names():
    """The same with the heads' size unknown too: the measured sizes are placed, wrongly (the query positions
    merged into the heads, a unit axis in their place, which the second product reports as 'does not keep the
    query positions of the probabilities', the opset-7 recognizer's message). A length measured 1 at both
    runs, where inference names a symbol, is placed by the names."""
    from trtattn.graph.measure import Sizes
    from trtattn.match.axes import Atoms, regroup, show
    from trtattn.match.layout_ops import _regroup

    def atoms():
        a = Atoms()
        for x in ("x0", "x1", "m", "n", "c"):
            a.new(x)
        return a

    frame = (("x0", "x1", "m"), ("n",))
    measured = ([Sizes((64, 64)), Sizes((1, 1))], [Sizes((8, 8)), Sizes((8, 8)), Sizes((1, 1)), Sizes((1, 1))])
    named = (["unk__2", "unk__3"], ["unk__4", 8, "unk__5", "unk__6"])
    assert show(regroup(atoms(), frame, *measured, "Reshape")) != "[x0, x1, m, n]"
    assert show(_regroup(atoms(), frame, measured, named, "Reshape")) == "[x0, x1, m, n]"


def test_a_probe_of_one_query_is_placed_by_the_numbers_where_every_size_is_known():
    """A learned probe of one query and batch 1, expanded to the batch (SigLIP's pooling head, torch's (L, N, E)
    layout): [1, B*H, 8] -> [1, B, 32], inference naming none of it. Every atom's size is known (the query's 1,
    the head size, B*H measured), so the numbers place the heads with the head dim; the names, fresh symbols
    all, would leave them in the batch (the head split then read a head size of 32)."""
    from trtattn.graph.measure import Sizes
    from trtattn.match.axes import Atoms, show
    from trtattn.match.layout_ops import _regroup

    registry = Atoms()
    registry.new("m", 1), registry.new("c", 8), registry.new("x0")
    registry.measure["x0"] = Sizes((8, 16))
    frame = (("m",), ("x0",), ("c",))
    measured = ([Sizes((1, 1)), Sizes((8, 16)), Sizes((8, 8))], [Sizes((1, 1)), Sizes((2, 4)), Sizes((32, 32))])
    named = (["unk__1", "unk__2", "unk__3"], ["unk__4", "unk__5", "unk__6"])
    assert show(_regroup(registry, frame, measured, named, "Reshape")) == "[m, x0.0, x0.1*c]"
    assert registry.known("x0.1") == 4 and registry.measure["x0.0"] == Sizes((2, 4))


def _sizes(shape):
    return [d if isinstance(d, int) else None for d in shape or []]


@pytest.mark.parametrize("name", ["bart", "llama"])
def test_dims_onnx_cannot_name_are_measured_to_the_sizes_symbolic_inference_gives(name, zoo_export, monkeypatch):
    """TorchScript's head splits: ONNX's inference calls the heads dim unk__N. inferred_shapes measures those dims
    instead of asking ONNX Runtime's symbolic inference (0.7 s a fuse, sympy's import among it), and every
    tensor gets the sizes the symbolic inference gives it, and the same types."""
    from trtattn.graph import shapes
    from trtattn.graph.dim_names import is_free
    from trtattn.graph.measure import inferred_shapes
    from trtattn.graph.view import import_graph

    model = onnx.load(str(zoo_export(name, "torchscript")))
    onnx_only, _ = shapes.merged(shapes.infer(model, symbolic=False))
    assert any(shapes.unnamed(s) for s in onnx_only.values())  # there is something to name
    symbolic, symbolic_types = shapes.known_shapes_and_types(model)
    asked = []
    monkeypatch.setattr(shapes, "symbolic_shapes", lambda m: asked.append(m))
    inferred = inferred_shapes(import_graph(model), model)
    assert not asked
    assert {k: _sizes(s) for k, s in inferred.shapes.items()} == {k: _sizes(s) for k, s in symbolic.items()}
    assert inferred.types == symbolic_types
    # a measured dim that varies as no input dim does is as unnamed as ONNX's unk__N (a name of its own would read
    # as a symbolic length of the model: SigLIP's probe query was refused as baked so)
    graph = model.graph
    declared = {d.dim_param for i in [*graph.input, *graph.output, *graph.value_info]
                for d in i.type.tensor_type.shape.dim if d.dim_param}  # the exporter's own names
    named = {d for s in inferred.shapes.values() for d in s or [] if isinstance(d, str)}
    assert all(d in declared or is_free(d) for d in named), sorted(d for d in named if d not in declared
                                                                   and not is_free(d))


def test_symbolic_inference_still_runs_where_the_model_cannot_be_measured(zoo_export, monkeypatch):
    """Where the model does not run at the probe dims nothing is measured, and the symbolic inference names the
    dims as before (its result is what the view gets)."""
    from trtattn.graph import measure, shapes
    from trtattn.graph.view import import_graph

    model = onnx.load(str(zoo_export("bart", "torchscript")))
    monkeypatch.setattr(measure, "_runs", lambda *a, **k: None)  # as for a model that does not run
    graph = import_graph(model)
    inferred = measure.inferred_shapes(graph, model)
    assert (inferred.shapes, inferred.types) == shapes.known_shapes_and_types(model) and not inferred.measured
