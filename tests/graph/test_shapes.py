"""ONNX Runtime's symbolic shape inference on input dims written -1, '?' or '' (paddle2onnx, tf2onnx, the
zoo's bert-foreign-dims): it took -1 for a size, so a Reshape target built from Shape(input_ids) held two
-1s and it gave up on the whole model (an assertion), leaving every head split unnamed. Those dims now
stand in under their place's name (roles.dim_name: `input_ids[0]`)."""

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import DATA
from trtattn.graph import shapes
from trtattn.match import match
from trtattn.testing.edits import anonymous_dims

FOREIGN = str(DATA / "foreign")


def _negative(model: onnx.ModelProto) -> list[str]:
    vis = list(model.graph.value_info) + list(model.graph.output)
    return [v.name for v in vis if any(isinstance(d, int) and d < 0 for d in shapes.dims_of(v) or [])]


def test_bert_with_anonymous_dims_is_inferred_and_matched():
    model = anonymous_dims(onnx.load(os.path.join(FOREIGN, "bert-opset11.torchscript.onnx")))
    inferred = shapes.symbolic_shapes(model)
    assert inferred is not None and not _negative(inferred)
    assert [i.type.tensor_type.shape.dim[0].dim_value for i in model.graph.input] == [-1, -1]  # input untouched
    sites = match(model).sites
    assert [(s.q_heads, s.kv_heads, s.head_size) for s in sites] == [(4, 4, 16), (4, 4, 16)]


def test_a_minus_one_dim_is_never_a_size():
    """Reshape(x, Concat(Shape(x)[:2], [2, 4])) on x [-1, '?', 8]: the dims keep x's place names."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, "?", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("s0", [0]), ("s2", [2]), ("hd", [2, 4]))]
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Slice", ["sh", "s0", "s2"], ["bs"]),
             helper.make_node("Concat", ["bs", "hd"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"]),
             helper.make_node("Transpose", ["r"], ["y"], perm=[0, 2, 1, 3])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)])
    inferred = shapes.symbolic_shapes(model)
    assert inferred is not None
    dims = {v.name: shapes.dims_of(v) for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    assert dims["r"] == ["x[0]", "x[1]", 2, 4] and dims["y"] == ["x[0]", 2, "x[1]", 4]


def test_symbolic_inference_runs_only_where_onnx_leaves_a_dim_unnamed(zoo_export, monkeypatch):
    """ONNX Runtime's symbolic inference (and its sympy import) is asked only when ONNX's inference leaves a
    dim it could only call unk__N: the dynamo BART export has none, the TorchScript one has (its head splits)."""
    asked = []
    real = shapes.symbolic_shapes
    monkeypatch.setattr(shapes, "symbolic_shapes", lambda model: asked.append(model) or real(model))
    for exporter, expected in (("dynamo", 0), ("torchscript", 1)):
        asked.clear()
        model = onnx.load(str(zoo_export("bart-sdpa" if exporter == "dynamo" else "bart", exporter)))
        assert len(shapes.infer(model)) == 1 + expected
        assert len(asked) == expected, exporter


def _named_outputs_model() -> onnx.ModelProto:
    """x [b, s, 4]: y = Relu(x) declared [b, 'Reluy_dim_1', 4] (as TorchScript names an output's dims after its
    op), z = Concat(x, x) along s (2s: no input's dim), n = NonZero(x) (data-dependent)."""
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Concat", ["x", "x"], ["z"], axis=1),
             helper.make_node("NonZero", ["x"], ["n"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "Reluy_dim_1", 4]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, ["b", "Concatz_dim_1", 4]),
                               helper.make_tensor_value_info("n", TensorProto.INT64, [3, "NonZeron_dim_1"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_output_dims_named_after_an_op_are_proven_the_inputs_dims_or_none():
    model = _named_outputs_model()
    before = model.SerializeToString()
    proven = shapes.proven_output_dims(model, {"b", "s"})
    assert proven == {"y": ["b", "s", None], "z": ["b", None, None], "n": [None, None]}
    assert model.SerializeToString() == before  # the declared shapes are given back as read
    assert shapes.dims_of(model.graph.output[0]) == ["b", "Reluy_dim_1", 4]
    del model.graph.output[1:]
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "s"
    assert shapes.proven_output_dims(model, {"b", "s"}) == {}  # every dim already an input's: nothing to prove
