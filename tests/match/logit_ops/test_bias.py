"""Issue 18, class 8: a gated relative-position bias (WavLM's gru_rel_pos: the bias times a sigmoid gate computed
from the query, added to the logits) is an input-dependent additive mask of shape [B*N, S, S]: fused into the
Attention op's float mask and verified. The corpus' transformers WavLM export (tests/data/foreign) is the real
model; this is the hand-built one, in torch's multi_head_attention_forward layout ([S, B, C], heads merged into
the batch), where the head split B*N -> B, N shares its static dim with the head size (N * H = 32)."""

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import site_statuses
from trtattn.match import match
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.graphs import attention_model

HEADS, HEAD = 2, 16
WIDTH = HEADS * HEAD


def gated_bias_model(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def const(name, value, dtype=np.float32):
        inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def op(kind, inputs, name, **attrs):
        nodes.append(helper.make_node(kind, inputs, [name], name=name, **attrs))
        return name

    i64 = lambda name, v: const(name, v, np.int64)  # noqa: E731
    w = lambda name, r, c: const(name, rng.standard_normal((r, c)) / np.sqrt(r))  # noqa: E731
    shape = op("Shape", ["x"], "shape")  # [S, B, C]
    seq, batch = op("Slice", [shape, i64("s0", [0]), i64("s1", [1])], "seq"), \
        op("Slice", [shape, i64("b0", [1]), i64("b1", [2])], "batch")
    heads_shape = op("Concat", [seq, op("Mul", [batch, i64("n", [HEADS])], "bn"), i64("h", [HEAD])], "heads_shape",
                     axis=0)

    def heads(name):  # [S, B, C] -> [B*N, S, H]
        proj = op("Add", [op("MatMul", ["x", w(f"w_{name}", WIDTH, WIDTH)], f"{name}_mm"),
                          const(f"b_{name}", rng.standard_normal(WIDTH) * 0.1)], f"{name}_proj")
        return op("Transpose", [op("Reshape", [proj, heads_shape], f"{name}_split")], f"{name}_heads", perm=[1, 0, 2])

    q, k, v = heads("q"), heads("k"), heads("v")
    logits = op("MatMul", [op("Mul", [q, const("scale", HEAD ** -0.5)], "q_scaled"),
                           op("Transpose", [k], "k_t", perm=[0, 2, 1])], "logits")
    # the gate: one sigmoid per head and query, from the query (WavLM: from the hidden states split in heads)
    gate = op("Sigmoid", [op("ReduceSum", [op("MatMul", [q, w("w_gate", HEAD, 4)], "gate_mm"), i64("gate_axes", [-1])],
                             "gate_sum", keepdims=1)], "gate")  # [B*N, S, 1]
    # the bias: a per-head slope times |i - j|, tiled over the batch as heads merged into it
    pos = op("Cast", [op("Range", [i64("zero", 0), op("Squeeze", [seq], "seq_len"), i64("one", 1)], "range")],
             "pos", to=TensorProto.FLOAT)
    dist = op("Abs", [op("Sub", [op("Unsqueeze", [pos, i64("ax0", [0])], "pos_row"),
                                 op("Unsqueeze", [pos, i64("ax1", [1])], "pos_col")], "rel")], "dist")  # [S, S]
    bias = op("Mul", [const("slopes", rng.uniform(-1.0, 1.0, (HEADS, 1, 1))), dist], "bias")  # [N, S, S]
    tiled = op("Expand", [bias, op("Concat", [batch, i64("n1", [HEADS]), seq, seq], "tile_shape", axis=0)], "tiled")
    merged = op("Reshape", [tiled, op("Concat", [op("Mul", [batch, i64("n2", [HEADS])], "bn2"), seq, seq],
                                      "merge_shape", axis=0)], "bias_bn")  # [B*N, S, S]
    scores = op("Add", [logits, op("Mul", [gate, merged], "gated_bias")], "scores")
    out = op("MatMul", [op("Softmax", [scores], "probs", axis=-1), v], "context")  # [B*N, S, H]
    back = op("Concat", [seq, batch, i64("c", [WIDTH])], "out_shape", axis=0)
    op("Reshape", [op("Transpose", [out], "context_t", perm=[1, 0, 2]), back], "y")
    graph = helper.make_graph(nodes, "gated_bias", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                  ["seq", "batch", WIDTH])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["seq", "batch", WIDTH])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def test_gated_bias_on_merged_heads_fuses_as_a_float_mask_and_verifies():
    model = gated_bias_model()
    (site,) = match(model).sites
    assert (site.q_heads, site.head_size) == (HEADS, HEAD)
    assert [s.op for s in site.mask_steps if s.op != "scale"] == ["add"]
    result = fuse_model(model)
    (r,) = result.reports
    assert r.status == "fused" and r.max_abs_err < 1e-5, r.reason
    assert result.verification.passed
    ops = {n.op_type for n in result.model.graph.node}
    assert "Attention" in ops and "Softmax" not in ops and "Sigmoid" in ops  # the gate stays: it makes the mask


# Survivors of issue 20's mutation run (benchmarks/mutate.py):
# each test fails when the line its docstring names is mutated.
def subtracted_mask_model(style: str):
    """The additive padding mask written as logits - (1 - mask) * 10000 (Sub instead of Add of -10000):
    alone ("additive_input": the first mask step, lowered as Neg) or after a gathered bias ("bias_and_mask":
    Sub of the running mask)."""
    g = gs.import_onnx(attention_model(mask_style=style))
    mul = next(n for n in g.nodes if n.op == "Mul" and isinstance(n.inputs[1], gs.Constant)
               and float(n.inputs[1].values) == -10000.0)
    mul.inputs[1] = gs.Constant("plus_10000", np.asarray(10000.0, np.float32))
    add = mul.outputs[0].outputs[0]
    assert add.op == "Add"
    add.op = "Sub"
    if add.inputs[0] is mul.outputs[0]:
        add.inputs = add.inputs[::-1]
    return gs.export_onnx(g)


def test_subtracted_mask_lowers_to_its_negation():
    """bias.py:45 (Neg of the first subtracted tensor) and :48 (Sub from the running mask): verified against
    the model on feeds that pad (a wrong sign attends to padding)."""
    for style in ("additive_input", "bias_and_mask"):
        result = fuse_model(subtracted_mask_model(style))
        assert result.ok and [s for s, _ in site_statuses(result)] == ["fused"], (style, site_statuses(result))
        assert result.reports[0].site.mask.value == "additive"
        assert result.verification.max_abs_err <= 1e-4, (style, result.verification)
