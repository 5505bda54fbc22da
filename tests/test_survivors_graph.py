"""Tests for the survivors of mutating last round's graph modules (benchmarks/mutate.py, base d3efd07):
graph/validate.py, graph/branches.py, graph/memory.py. Each pins an outcome the fast lane left open."""

import onnx
import pytest
from onnx import TensorProto, helper

from trtattn.graph import validate
from trtattn.graph.validate import InvalidModelError


def _relu(opset_domain: str = "") -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(opset_domain, 17)])


# ---------------------------------------------------------------- validate.py
def test_the_default_domain_imported_as_ai_onnx_is_the_default_domain():
    """opset_import may name the default domain 'ai.onnx': a node in domain '' is then known at its version."""
    validate.structural(_relu("ai.onnx"))
    model = _relu("ai.onnx")
    model.graph.node[0].op_type = "Gelu"  # opset 20
    with pytest.raises(Exception, match="'Gelu' does not exist at opset 17"):
        validate.structural(model)


def test_a_subgraph_is_checked_and_named():
    """An If whose then-branch reads a name nothing defines: refused, naming the branch and the name."""
    model = _relu()
    cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    model.graph.input.append(cond)

    def branch(name, read):
        return helper.make_graph([helper.make_node("Identity", [read], [f"{name}_out"], name=f"{name}/id")], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, [2])])

    good = branch("else_g", "y")
    model.graph.node.append(helper.make_node("If", ["c"], ["z"], name="if", then_branch=branch("then_g", "y"),
                                             else_branch=good))
    model.graph.output[0].name = "z"
    validate.check(model, "m")
    then = next(a.g for a in model.graph.node[-1].attribute if a.name == "then_branch")
    then.node[0].input[0] = "ghost"  # the then-branch reads what nothing defines
    with pytest.raises(InvalidModelError, match="m: node 'then_g/id' \\(Identity\\) reads 'ghost'"):
        validate.check(model, "m")


def _two_inputs(op: str, types: tuple, shapes: tuple) -> onnx.ModelProto:
    graph = helper.make_graph([helper.make_node(op, ["a", "b"], ["y"], name="n")], "g",
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in zip("ab", types, shapes)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("types,shapes", [
    ((TensorProto.FLOAT, TensorProto.INT64), ([2], [2])),  # a type the op does not take: check_type
    ((TensorProto.FLOAT, TensorProto.FLOAT), ([2], [3])),  # shapes that cannot broadcast: strict_mode
])
def test_the_full_check_refuses_what_the_structural_one_lets_through(types, shapes):
    model = _two_inputs("Add", types, shapes)
    validate.structural(model)
    with pytest.raises(InvalidModelError, match="^m: invalid ONNX \\(.*"):
        validate.check(model, "m")
    validate.check(model, "m", full=False)


# ---------------------------------------------------------------- memory.py
def _walk_model() -> onnx.ModelProto:
    """x [batch, 64] fp32; a = Relu(x), b = Cast(x) to fp16, c = Add(a, Cast(b)) : liveness decides the peak."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu"),
             helper.make_node("Cast", ["x"], ["b"], name="half", to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["b"], ["b32"], name="back", to=TensorProto.FLOAT),
             helper.make_node("Add", ["a", "b32"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_the_activation_peak_is_the_largest_sum_of_live_tensors():
    from trtattn.graph import memory

    row = 64 * 4  # bytes of one fp32 row
    # x, a live; b (fp16) made, x freed; b32 made, b freed; y made, a and b32 freed
    walk = [row, 2 * row, 2 * row + row // 2, row + row // 2 + row, row + row + row]
    for batch in (1, 3):
        assert memory.activation_bytes(_walk_model(), {"batch": batch}) == batch * max(walk) == batch * 3 * row


def test_a_fused_attention_holds_its_scores():
    """ONNX Attention with Q [B, N, Sq, H] and K [B, N, Skv, H]: the estimate adds B*N*Sq*Skv fp32 scores."""
    from trtattn.graph import memory

    b, n, sq, skv, h = 2, 3, 5, 7, 4
    spec = lambda name, s: helper.make_tensor_value_info(name, TensorProto.FLOAT, s)  # noqa: E731
    graph = helper.make_graph([helper.make_node("Attention", ["q", "k", "v"], ["y"], name="att")], "g",
                              [spec("q", [b, n, sq, h]), spec("k", [b, n, skv, h]), spec("v", [b, n, skv, h])],
                              [spec("y", None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    io = 4 * (b * n * sq * h + 2 * b * n * skv * h + b * n * sq * h)  # q, k, v and y alive at the op
    assert memory.activation_bytes(model, {}) == io + 4 * b * n * sq * skv
    # 3-D Q [B, Sq, N*H] with q_num_heads: the same scores
    graph = helper.make_graph([helper.make_node("Attention", ["q", "k", "v"], ["y"], name="att", q_num_heads=n,
                                                kv_num_heads=n)], "g",
                              [spec("q", [b, sq, n * h]), spec("k", [b, skv, n * h]), spec("v", [b, skv, n * h])],
                              [spec("y", None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    assert memory.activation_bytes(model, {}) == io + 4 * b * n * sq * skv


def test_a_branch_adds_its_own_peak_while_its_node_runs():
    from trtattn.graph import memory

    spec = lambda name, s, t=TensorProto.FLOAT: helper.make_tensor_value_info(name, t, s)  # noqa: E731
    inner = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="r"),
                               helper.make_node("Relu", ["r"], ["r2"], name="r2")], "then", [], [spec("r2", [16])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"], name="e")], "else", [], [spec("e", [16])])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], name="if", then_branch=inner, else_branch=other)],
                              "g", [spec("x", [16]), spec("c", [], TensorProto.BOOL)], [spec("y", [16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    # outer: x 64 + c 1; the then-branch holds r and r2 (64 each) at once; y 64
    assert memory.activation_bytes(model, {}) == 64 + 1 + 128 + 64


@pytest.mark.parametrize("text,nbytes", [("1048576", 1 << 20), ("512M", 512 << 20), ("1.5g", 3 << 29),
                                         (" 2 KiB ", 2 << 10), ("1TB", 1 << 40)])
def test_memory_sizes_parse(text, nbytes):
    from trtattn.graph import memory

    assert memory.parse_size(text) == nbytes


@pytest.mark.parametrize("nbytes,shown", [(100, "100B"), (1024, "1.0K"), (1536, "1.5K"), ((1 << 20) - 1, "1024.0K"),
                                          (3 << 29, "1.5G")])
def test_sizes_are_shown_in_the_largest_unit(nbytes, shown):
    from trtattn.graph import memory

    assert memory.show(nbytes) == shown


def test_the_estimate_runs_without_the_weights_and_keeps_small_constants():
    import numpy as np
    from onnx import numpy_helper

    from trtattn.graph import memory

    model = onnx.ModelProto()
    model.CopyFrom(_walk_model())
    model.graph.initializer.extend([numpy_helper.from_array(np.ones(256, np.float32), "small"),  # 1024 bytes
                                    numpy_helper.from_array(np.ones(257, np.float32), "big")])
    skeleton = memory._without_weights(model)
    small, big = skeleton.graph.initializer
    assert len(small.raw_data) == 1024 and not big.HasField("raw_data")
    assert big.data_location == TensorProto.EXTERNAL and list(big.dims) == [257]
    assert len(model.graph.initializer[1].raw_data) == 257 * 4  # the model itself untouched


def test_available_memory_is_read_from_the_kernel():
    from trtattn.graph import memory

    with open("/proc/meminfo") as f:
        line = next(line for line in f if line.startswith("MemAvailable:"))
    assert abs(memory.available_memory() - int(line.split()[1]) * 1024) < 1 << 30  # it moves between the reads


# ---------------------------------------------------------------- branches.py
def _if_model(extra_reader: str | None = None) -> onnx.ModelProto:
    """If(flag) -> (y, p): then y = x + w (w the branch's initializer), p an empty constant (a placeholder);
    else y = -x, p = [1, 1]. extra_reader: "node" (flag also read by a node) or "subgraph" (by another If's
    branch)."""
    import numpy as np
    from onnx import numpy_helper

    spec = lambda name, s, t=TensorProto.FLOAT: helper.make_tensor_value_info(name, t, s)  # noqa: E731
    empty = numpy_helper.from_array(np.zeros([0], np.float32))
    then = helper.make_graph([helper.make_node("Add", ["x", "w"], ["t_y"], name="t/add"),
                              helper.make_node("Constant", [], ["t_p"], name="t/empty", value=empty)], "then", [],
                             [spec("t_y", [2]), spec("t_p", [0])], [numpy_helper.from_array(np.float32([10, 20]), "w")])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e_y"], name="e/neg"),
                               helper.make_node("Constant", [], ["e_p"], name="e/ones",
                                                value=numpy_helper.from_array(np.float32([1, 1])))], "else", [],
                              [spec("e_y", [2]), spec("e_p", [2])])
    nodes = [helper.make_node("If", ["flag"], ["y", "p"], name="if", then_branch=then, else_branch=other)]
    inputs = [spec("x", [2]), spec("flag", [], TensorProto.BOOL), spec("other", [], TensorProto.BOOL)]
    outputs = [spec("y", [2]), spec("p", None)]
    if extra_reader == "node":
        nodes.append(helper.make_node("Cast", ["flag"], ["flag_f"], name="cast", to=TensorProto.FLOAT))
        outputs.append(spec("flag_f", []))
    elif extra_reader == "subgraph":
        reads = lambda name: helper.make_graph(  # noqa: E731
            [helper.make_node("Cast", ["flag"], [f"{name}_f"], name=f"{name}/cast", to=TensorProto.FLOAT)], name, [],
            [spec(f"{name}_f", [])])
        nodes.append(helper.make_node("If", ["other"], ["flag_f"], name="if2", then_branch=reads("a"),
                                      else_branch=reads("b")))
        outputs.append(spec("flag_f", []))
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                             opset_imports=[helper.make_opsetid("", 17)])


def _run(model, **feeds):
    import numpy as np
    from onnx.reference import ReferenceEvaluator

    names = [o.name for o in model.graph.output]
    values = ReferenceEvaluator(model).run(None, {k: np.asarray(v) for k, v in feeds.items()})
    return dict(zip(names, values))


def test_only_boolean_inputs_deciding_an_if_are_branch_inputs():
    from trtattn.graph.branches import branch_inputs

    assert branch_inputs(_if_model()) == ["flag"]  # 'other' is boolean but decides nothing
    assert branch_inputs(_if_model("subgraph")) == ["flag", "other"]


@pytest.mark.parametrize("value,y,p", [(True, [11.0, 22.0], []), (False, [-1.0, -2.0], [1.0, 1.0])])
def test_taking_a_branch_is_the_model_with_that_input_fixed(value, y, p):
    import numpy as np

    from trtattn.graph.branches import take_branch

    model = _if_model()
    before = model.SerializeToString()
    taken = take_branch(model, "flag", value)
    assert model.SerializeToString() == before  # the input model is not modified
    assert not [n for n in taken.graph.node if n.op_type == "If"]
    assert [i.name for i in taken.graph.input] == ["x", "other"]  # flag is read by nothing now
    validate.check(taken, "taken")
    got = _run(taken, x=np.float32([1, 2]), other=True)
    assert got["y"].tolist() == y and got["p"].tolist() == p


def test_a_taken_branch_can_leave_its_placeholders_out():
    import numpy as np

    from trtattn.graph.branches import empty_outputs, take_branch

    then = next(a.g for a in _if_model().graph.node[0].attribute if a.name == "then_branch")
    assert empty_outputs(then) == {"t_p"}
    taken = take_branch(_if_model(), "flag", True, drop_empty=True)
    assert [o.name for o in taken.graph.output] == ["y"]
    assert "p" not in {o for n in taken.graph.node for o in n.output}
    validate.check(taken, "taken")
    assert _run(taken, x=np.float32([1, 2]), other=True)["y"].tolist() == [11.0, 22.0]
    kept = take_branch(_if_model(), "flag", False, drop_empty=True)  # the else branch has no placeholder
    assert [o.name for o in kept.graph.output] == ["y", "p"]


def _unused(model: onnx.ModelProto) -> list[str]:
    """Nodes whose outputs nothing reads, inputs and initializers no node reads (subgraphs included)."""
    def reads(graph):
        return {i for n in graph.node for i in n.input} | {
            i for n in graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH for i in reads(a.g)}

    read = reads(model.graph) | {o.name for o in model.graph.output}
    return ([f"node {n.name}" for n in model.graph.node if not read & set(n.output)]
            + [f"input {i.name}" for i in model.graph.input if i.name not in read]
            + [f"initializer {t.name}" for t in model.graph.initializer if t.name not in read])


@pytest.mark.parametrize("value,gone", [(True, "z"), (False, "x")])
def test_a_taken_branch_keeps_nothing_unused(value, gone):
    """The placeholders' makers go with them, and so do the inputs and weights only the other branch read
    (a first step's past, a cached step's encoder states); an input no branch read stays."""
    import numpy as np
    from onnx import numpy_helper

    from trtattn.graph.branches import take_branch

    model = _if_model()
    model.graph.input.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [2]))
    model.graph.initializer.append(numpy_helper.from_array(np.float32([3, 4]), "v"))
    other = next(a.g for a in model.graph.node[0].attribute if a.name == "else_branch")
    other.node[0].op_type, other.node[0].input[:] = "Sub", ["v", "z"]  # else: y = v - z, v an outer weight
    assert _unused(model) == ["input other"]
    taken = take_branch(model, "flag", value, drop_empty=True)
    assert _unused(taken) == ["input other"]  # the input the If never read is the user's business
    assert gone not in {i.name for i in taken.graph.input} and "flag" not in {i.name for i in taken.graph.input}
    assert ("v" in {t.name for t in taken.graph.initializer}) == (not value)
    validate.check(taken, "taken")
    got = _run(taken, **{"x" if value else "z": np.float32([1, 2])}, other=True)
    assert got["y"].tolist() == ([11.0, 22.0] if value else [2.0, 2.0])


def test_an_empty_initializer_output_is_a_placeholder_too():
    import numpy as np
    from onnx import numpy_helper

    from trtattn.graph.branches import empty_outputs

    spec = lambda name, s: helper.make_tensor_value_info(name, TensorProto.FLOAT, s)  # noqa: E731
    branch = helper.make_graph([], "b", [], [spec("e", [0, 4]), spec("full", [1])],
                               [numpy_helper.from_array(np.zeros([0, 4], np.float32), "e"),
                                numpy_helper.from_array(np.zeros([1], np.float32), "full")])
    assert empty_outputs(branch) == {"e"}


@pytest.mark.parametrize("reader", ["node", "subgraph"])
def test_the_fixed_input_stays_while_something_else_reads_it(reader):
    from trtattn.graph.branches import take_branch

    taken = take_branch(_if_model(reader), "flag", True)
    assert "flag" in [i.name for i in taken.graph.input]
    validate.check(taken, "taken")


def test_taking_a_branch_of_an_input_that_decides_no_if_is_refused():
    from trtattn.errors import TrtattnError
    from trtattn.graph.branches import take_branch

    with pytest.raises(TrtattnError, match="'other' is not a boolean input that decides an If of the main graph"):
        take_branch(_if_model(), "other", True)


def test_tensors_inference_cannot_size_count_zero():
    """The estimate is a lower bound: NonZero's output (kept to the end, a graph output) counts 0 bytes; an
    input of unknown rank is sized as the run feeds it (a scalar)."""
    from trtattn.graph import memory

    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nz"), helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Add", ["a", "u"], ["y"], name="y")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                                           helper.make_tensor_value_info("u", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("nz", TensorProto.INT64, None),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert memory.activation_bytes(model, {}) == 16 + 4 + 16  # x, u and a at Relu; nz 0


def test_an_unimported_domain_is_refused_when_the_default_is_imported_as_ai_onnx():
    model = _relu("ai.onnx")
    model.graph.node.append(helper.make_node("Plugin", ["y"], ["z"], name="plug", domain="trt"))
    model.graph.output[0].name = "z"
    with pytest.raises(Exception, match="node 'plug' \\(Plugin\\) is in domain 'trt', which the model does not import"):
        validate.structural(model)


def test_a_graphs_attribute_of_a_custom_op_is_checked_too():
    """A node of a domain ONNX does not define, with a list of subgraphs (a GRAPHS attribute): each is checked."""
    spec = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])  # noqa: E731
    body = helper.make_graph([helper.make_node("Relu", ["ghost"], ["b"], name="body/relu")], "body", [], [spec("b")])
    model = _relu()
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    model.graph.node.append(helper.make_node("Loopish", ["y"], ["z"], name="custom", domain="com.example",
                                             bodies=[body]))
    model.graph.output[0].name = "z"
    with pytest.raises(Exception, match="node 'body/relu' \\(Relu\\) reads 'ghost'"):
        validate.structural(model)


def test_the_top_graph_and_a_subgraph_are_named_apart():
    model = _relu()
    model.graph.output[0].name = "nowhere"
    with pytest.raises(Exception, match="^graph output 'nowhere' is produced by no node$"):
        validate.structural(model)
    model = _relu()
    spec = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])  # noqa: E731
    model.graph.input.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    empty = helper.make_graph([], "empty_branch", [], [spec("missing")])
    ok = helper.make_graph([helper.make_node("Identity", ["y"], ["o"], name="id")], "ok", [], [spec("o")])
    model.graph.node.append(helper.make_node("If", ["c"], ["z"], name="if", then_branch=empty, else_branch=ok))
    model.graph.output[0].name = "z"
    with pytest.raises(Exception, match="^subgraph 'empty_branch' output 'missing' is produced by no node$"):
        validate.structural(model)
