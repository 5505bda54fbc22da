"""normalize and the ONNX Attention op's fully-masked-row guard, as its function body writes it (the `_expanded`
conformance cases): logits + bias -> Softmax -> Where(ReduceMax(bias) == -inf, 0, P) -> MatMul(., V). The guard
moves after the second MatMul, kept as it is (or, when the core is re-emitted on [batch, heads, seq, dim], testing
the same bias there), so rows where every key is masked give 0 as the op's do: by construction, verified on inputs
with such a row. The Shape(x, start, end) nodes the body reads its sizes with fold to the right sizes."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from trtattn.graph.user_inputs import GivenInputs
from trtattn.rewrite.normalize import normalize_model
from trtattn.rewrite.normalize.cleanup import cleanup
from trtattn.rewrite.normalize.probabilities import between


def guarded_body(rank: int, zero: str, b=2, h=2, s=5, d=8):
    """The body's core on Q, K, V ([b, h, s, d], or heads merged into the batch for rank 3) and a float bias, and
    inputs with a row the bias masks everywhere. zero: "const" (a constant 0) or "castlike" (CastLike(0, P), the
    body's own)."""
    shp = [b, h, s, d] if rank == 4 else [b * h, s, d]
    bias_shape = shp[:-1] + [s]
    nodes = [helper.make_node("Transpose", ["K"], ["kt"], perm=[0, 1, 3, 2] if rank == 4 else [0, 2, 1]),
             helper.make_node("MatMul", ["Q", "kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "scale"], ["scaled"]),
             helper.make_node("Add", ["scaled", "bias"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["p"], axis=-1, name="attn/Softmax"),
             helper.make_node("ReduceMax", ["bias", "last"], ["row_max"], keepdims=1),
             helper.make_node("Equal", ["row_max", "neg_inf"], ["row_masked"])]
    fill = "zero"
    if zero == "castlike":
        nodes.append(helper.make_node("CastLike", ["zero", "p"], ["zero_t"]))
        fill = "zero_t"
    nodes += [helper.make_node("Where", ["row_masked", fill, "p"], ["p_safe"], name="attn/row_guard"),
              helper.make_node("MatMul", ["p_safe", "V"], ["Y"])]
    inits = [helper.make_tensor("scale", TensorProto.FLOAT, [], [1 / np.sqrt(d)]),
             helper.make_tensor("last", TensorProto.INT64, [1], [-1]),
             helper.make_tensor("neg_inf", TensorProto.FLOAT, [], [float("-inf")]),
             helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])]
    graph = helper.make_graph(nodes, "body", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shp) for n in "QKV"]
                              + [helper.make_tensor_value_info("bias", TensorProto.FLOAT, bias_shape)],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(shp).astype(np.float32) for n in "QKV"}
    bias = np.where(rng.random(bias_shape) < 0.3, -np.inf, 0).astype(np.float32)
    bias[..., 1, :] = -np.inf  # query 1 may attend to no key: the guard makes its row 0
    feeds["bias"] = bias
    return model, feeds


def run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


@pytest.mark.parametrize("zero", ["const", "castlike"])
@pytest.mark.parametrize("rank", [4, 3])
def test_the_fully_masked_row_guard_moves_after_the_second_matmul(rank, zero):
    model, feeds = guarded_body(rank, zero)
    assert between(model, "attn/Softmax") == ["Where"]  # CastLike reads P's type only
    before = run(model, feeds)
    assert np.all(before[..., 1, :] == 0) and np.isfinite(before).all()
    result = normalize_model(model, inputs=GivenInputs("guarded body", [feeds]))
    assert result.ok and result.verification.passed, result.verification
    (row,) = result.sites
    assert row.action == "rewritten" and row.probabilities == "fully-masked-row guard moved after BMM2", row.row()
    assert between(result.model, "attn/Softmax") == []  # nothing between the Softmax and BMM2 now
    onnx.checker.check_model(result.model, full_check=True)
    after = run(result.model, feeds)
    assert np.all(after[..., 1, :] == 0)  # the op's behaviour: a row masked at every key gives 0
    np.testing.assert_allclose(after, before, atol=1e-6)


def test_shape_with_start_and_end_folds_to_its_slice():
    """onnx-graphsurgeon's shape folding takes Shape(x, start, end) for the whole shape: cleanup folds the slice."""
    nodes = [helper.make_node("Shape", ["x"], ["last"], start=-1),
             helper.make_node("Shape", ["x"], ["middle"], start=1, end=2),
             helper.make_node("Shape", ["y"], ["dynamic"], end=1),  # [n]: stays a Shape node
             helper.make_node("Concat", ["minus_one", "middle", "last"], ["dims"], axis=0),
             helper.make_node("Reshape", ["x", "dims"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4]),
                                           helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("dynamic", TensorProto.INT64, None)],
                              [helper.make_tensor("minus_one", TensorProto.INT64, [1], [-1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    cleaned, _ = cleanup(model)
    feeds = {"x": np.arange(24, dtype=np.float32).reshape(2, 3, 4), "y": np.zeros((7, 5), np.float32)}
    session = ort.InferenceSession(cleaned.SerializeToString(), providers=["CPUExecutionProvider"])
    out, dynamic = session.run(None, feeds)
    assert out.shape == (2, 3, 4) and dynamic.tolist() == [7]  # Reshape to [-1, 3, 4], not [-1, 2, 3, 4, 2, 3, 4]
    shapes = [n for n in cleaned.graph.node if n.op_type == "Shape"]
    assert [(n.input[0], {a.name: a.i for a in n.attribute}) for n in shapes] == [("y", {"end": 1})]


def test_the_matcher_reads_a_static_dim_of_a_sliced_dynamic_shape():
    """Gather(Shape(x, start=1), 1) of x [n, 8, 64] is 64 (x's axis 2), not 8 (onnx-graphsurgeon's reading)."""
    import onnx_graphsurgeon as gs

    from trtattn.graph.view import GraphView

    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1),
             helper.make_node("Gather", ["s", "one"], ["d"], axis=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8, 64])],
                              [helper.make_tensor_value_info("d", TensorProto.INT64, None)],
                              [helper.make_tensor("one", TensorProto.INT64, [], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    imported = gs.import_onnx(model)
    assert int(GraphView(imported, model).const(imported.tensors()["d"])) == 64
    cleaned, _ = cleanup(model)
    assert [n.op_type for n in cleaned.graph.node] == [] and \
        int(onnx.numpy_helper.to_array(next(i for i in cleaned.graph.initializer if i.name == "d"))) == 64


def test_nodes_inside_an_if_branch_are_named_too():
    """name_nodes names unnamed (or same-named) nodes in control-flow bodies as in the main graph: a site inside
    a branch names its Softmax by that name."""
    import onnx_graphsurgeon as gs

    from trtattn.rewrite.normalize.cleanup import name_nodes

    def branch(op: str) -> onnx.GraphProto:  # unnamed nodes
        nodes = [helper.make_node(op, ["x"], [f"{op}_y"]), helper.make_node("Softmax", [f"{op}_y"], [f"{op}_out"])]
        return helper.make_graph(nodes, op, [], [helper.make_tensor_value_info(f"{op}_out", TensorProto.FLOAT, [2])])
    if_node = helper.make_node("If", ["c"], ["y"], then_branch=branch("Relu"), else_branch=branch("Neg"))
    graph = helper.make_graph([if_node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                               helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    imported = gs.import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    name_nodes(imported)
    (if_node,) = imported.nodes
    names = [n.name for attr in ("then_branch", "else_branch") for n in if_node.attrs[attr].nodes]
    assert names == ["Relu:Relu_y", "Softmax:Relu_out", "Neg:Neg_y", "Softmax:Neg_out"], names


def test_a_guard_testing_a_bias_the_logits_do_not_add_is_named_by_that_bias():
    """Re-emitting the core, the guard is tested on the bias the logits add; one testing another tensor leaves the
    site, named with the tensor the guard tests."""
    model, feeds = guarded_body(3, "castlike")
    (reduce_max,) = (n for n in model.graph.node if n.op_type == "ReduceMax")
    reduce_max.input[0] = "guard_bias"
    feeds["guard_bias"] = feeds["bias"].copy()
    model.graph.input.append(helper.make_tensor_value_info("guard_bias", TensorProto.FLOAT, feeds["bias"].shape))
    result = normalize_model(model, inputs=GivenInputs("guard on another bias", [feeds]))
    (row,) = result.sites
    assert not result.ok and row.action.startswith(
        "skipped: the probabilities' rows are zeroed where guard_bias says (the op's fully-masked-row guard)"), row.action


def test_a_size_read_after_the_guards_fill_is_still_checked():
    """The guard's CastLike(0, P) fill goes with the guard; another reader of P's size after it (a Size, not a Shape)
    still leaves the site named, as it would on its own."""
    model, feeds = guarded_body(3, "castlike")  # heads merged: the core is re-emitted
    for vi in model.graph.input:  # a symbolic sequence length: the Size is not folded away
        vi.type.tensor_type.shape.dim[1].dim_param = "s"
    model.graph.node.append(helper.make_node("Size", ["p"], ["n"]))  # after the fill among P's readers
    model.graph.output.append(helper.make_tensor_value_info("n", TensorProto.INT64, []))
    result = normalize_model(model, inputs=GivenInputs("size read after the fill", [feeds]))
    (row,) = result.sites
    assert not result.ok and row.action == \
        "skipped: n reads the size of a tensor inside the attention, not through a Shape node", row.action
