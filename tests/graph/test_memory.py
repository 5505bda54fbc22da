"""trtattn/graph/memory.py: the activation memory estimate and memory sizes."""

import onnx
import pytest
from onnx import TensorProto, helper


# Survivors of mutating graph/memory.py (benchmarks/mutate.py, base d3efd07):
# each test pins an outcome the fast lane left open.
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
