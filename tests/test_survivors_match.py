"""Issue 20's mutation survivors in matching: each test here fails when the guarded line is mutated
(the line named in each docstring), and passes as the code is. Hand-built graphs (tests/graphs.py) edited
with graphsurgeon into the one shape that reaches the line."""

import collections
import json

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx import TensorProto, helper

from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.graphs import attention_model
from trtattn.trt import profiles


def _statuses(result):
    return [(r.status, r.reason) for r in result.reports]


# ------------------------------------------------------------------ match/find.py: a length baked into a Reshape
def baked_length_model(seq=6, head=8, which=(0, 1, 2)):
    """attention_model's rank-3 export with Q, V and K (`which`: their order in the graph) merged to [B*N, S, H]
    by a constant Reshape target [-1, 6, 8] instead of one read from Shape: at any other length it attends
    within blocks of 6. (K's alone baked fuses: the original then fails at other lengths, so nothing differs.)"""
    g = gs.import_onnx(attention_model(rank=3, seq=seq, head=head))
    merges = []
    for node in g.nodes:
        target = node.inputs[1] if node.op == "Reshape" else None
        if target is not None and target.inputs and target.inputs[0].op == "Concat":
            first = target.inputs[0].inputs[0]
            if isinstance(first, gs.Constant) and list(first.values) == [-1]:  # the [B*N] merge of Q, V or K
                merges.append(node)
    assert len(merges) == 3
    for i in which:
        merges[i].inputs[1] = gs.Constant(f"baked_{i}", np.array([-1, seq, head], np.int64))
    g.cleanup()
    return gs.export_onnx(g)


def test_length_baked_into_the_head_merge_is_not_fused():
    """find.py:121 (the baked-length check): without it the site is fused and verified at the one length
    the graph was built for, and written; at another length it is off by 1.57."""
    result = fuse_model(baked_length_model())
    assert not result.ok
    [(status, reason)] = _statuses(result)
    assert status == "not fused" and "writes the query length 6" in reason and "symbolic" in reason, reason


# ------------------------------------------------------------------ match/subgraphs.py: Scan bodies
def scan_model():
    """attention_model's block as the body of a Scan over a leading steps axis: the body's scan input x is
    one step [B, S, D] (a torch scripted loop over chunks exports this way)."""
    inner = attention_model()
    body = onnx.GraphProto()
    body.CopyFrom(inner.graph)
    body.name = "step"
    d = inner.graph.input[0].type.tensor_type.shape.dim[2].dim_value
    xs = helper.make_tensor_value_info("xs", TensorProto.FLOAT, ["steps", "batch", "seq", d])
    node = helper.make_node("Scan", ["xs"], ["ys"], name="scan", body=body, num_scan_inputs=1)
    graph = helper.make_graph([node], "attention_in_scan", [xs],
                              [helper.make_tensor_value_info("ys", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=list(inner.opset_import), producer_name="tests")
    model.ir_version = inner.ir_version
    meta = json.loads(next(p.value for p in inner.metadata_props if p.key == "trtattn.inputs"))
    meta["inputs"] = {"xs": {"kind": "float"}}
    meta["dims"]["steps"] = 2
    model.metadata_props.add(key="trtattn.inputs", value=json.dumps(meta))
    return model


def test_attention_in_a_scan_body_is_fused_in_place():
    """subgraphs.py:19 (Scan in SUBGRAPHS): without it, "no attention found" and exit 0 (README claims Scan)."""
    result = fuse_model(scan_model())
    assert result.ok and [s for s, _ in _statuses(result)] == ["fused"], _statuses(result)
    assert result.reports[0].site.graph == (("ys", "body"),)
    body = collections.Counter(n.op_type for n in result.model.graph.node[0].attribute[0].g.node)
    assert body["Attention"] == 1 and body["Softmax"] == 0
    assert result.verification.max_abs_err <= 1e-4


# ------------------------------------------------------------------ logit_ops/softcap.py: cap * tanh(x / cap) only
def capped_model(outer: float, inner: float = 2.0):
    """outer * tanh(logits / inner): a soft-cap only when outer == inner."""
    g = gs.import_onnx(attention_model(softcap=inner))
    tanh = next(n for n in g.nodes if n.op == "Tanh")
    mul = tanh.outputs[0].outputs[0]
    mul.inputs[1 if mul.inputs[0] is tanh.outputs[0] else 0] = gs.Constant("outer", np.asarray(outer, np.float32))
    return gs.export_onnx(g)


def test_tanh_scaled_by_another_value_than_it_divides_by_is_not_a_softcap():
    """softcap.py:33 (b == a): Attention's softcap is a * tanh(x / a); 3 * tanh(x / 2) is something else."""
    assert [s for s, _ in _statuses(fuse_model(capped_model(2.0)))] == ["fused"]
    result = fuse_model(capped_model(3.0))
    [(status, reason)] = _statuses(result)
    assert status == "not fused" and "not a soft-cap" in reason and not result.ok, reason


# ------------------------------------------------------------------ logit_ops/bias.py: masks subtracted
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
        assert result.ok and [s for s, _ in _statuses(result)] == ["fused"], (style, _statuses(result))
        assert result.reports[0].site.mask.value == "additive"
        assert result.verification.max_abs_err <= 1e-4, (style, result.verification)


# ------------------------------------------------------------------ trt/profiles.py: position tables with an offset
def test_position_table_with_an_offset_limits_the_positions(zoo_export):
    """profiles.py:104 (rows - offset): BART indexes its learned table at position + 2, so a table of
    max_position_embeddings + 2 = 66 rows takes 64 positions (68 with the sign flipped)."""
    model = onnx.load(str(zoo_export("bart", "torchscript")), load_external_data=False)
    rows = {int(t.dims[0]) for t in model.graph.initializer if len(t.dims) == 2 and "embed_positions" in t.name}
    want = 64  # zoo/models.py bart_config: max_position_embeddings=64
    assert rows == {want + 2}, rows
    assert profiles.max_positions(model) == (want, "its learned position table")


def _softcap_written(cap: float, inner: str):
    """cap * tanh(logits * (1/cap)) with the constant on the left or right (inner="mul_left"/"mul_right"), or
    cap * tanh(logits / d)
    with d a constant 0 (inner="div_zero") or a tensor computed from the input (inner="div_tensor")."""
    g = gs.import_onnx(attention_model(softcap=cap))
    div = next(n for n in g.nodes if n.op == "Div" and n.outputs[0].outputs[0].op == "Tanh")
    if inner in ("mul_left", "mul_right"):
        inputs = [gs.Constant("inv_cap", np.asarray(1 / cap, np.float32)), div.inputs[0]]
        div.op, div.inputs = "Mul", inputs if inner == "mul_left" else inputs[::-1]
    elif inner == "div_zero":
        div.inputs[1] = gs.Constant("zero_cap", np.asarray(0.0, np.float32))
    else:  # a scalar computed from the activations: not a constant
        x = g.inputs[0]
        mean = gs.Variable("x_mean", dtype=np.float32)
        g.nodes.append(gs.Node("ReduceMean", attrs={"keepdims": 0}, inputs=[x], outputs=[mean]))
        div.inputs[1] = mean
    return gs.export_onnx(g)


def test_softcap_forms_and_what_is_not_one():
    """softcap.py:28-34: the cap as Mul by 1/cap with the constant first (the loop over both Mul inputs),
    a cap of 1; a Tanh of the logits divided by 0 or by a tensor is listed, not a crash."""
    for cap, inner in ((2.0, "mul_left"), (2.0, "mul_right"), (1.0, "mul_left")):
        result = fuse_model(_softcap_written(cap, inner))
        assert [s for s, _ in _statuses(result)] == ["fused"], (cap, inner, _statuses(result))
        assert result.reports[0].site.softcap == pytest.approx(cap)
    for inner in ("div_zero", "div_tensor"):
        result = fuse_model(_softcap_written(2.0, inner))
        [(status, reason)] = _statuses(result)
        assert status == "not fused" and "not a soft-cap" in reason, (inner, reason)
