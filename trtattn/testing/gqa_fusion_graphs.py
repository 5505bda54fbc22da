"""Grouped-query attention with rotary tables given as graph inputs, shaped as onnxscript's GQA fusion tests write it
(built here by hand with onnx.helper): the fused form (com.microsoft GroupQueryAttention with do_rotary, seqlens_k and
the total length from the inputs' shapes) and the unfused one (com.microsoft RotaryEmbedding at positions
Range(past, past + new), the past concatenated, the key/value heads expanded, an explicit causal mask, MatMul,
Softmax, MatMul). Inputs: query [B, S, H*Dh] (packed: [B, S, (H + 2 Hkv) Dh]), key and value [B, S, Hkv*Dh],
past_key/past_value [B, Hkv, P, Dh], cos/sin [max_seqlen, Dh / 2]. ONNX Runtime runs both at batch 1 over a past and
max_seqlen >= P + S: what the dims search has to find (graph/op_dims.py)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HEADS, KV_HEADS, HEAD = 4, 2, 16


def _inputs(packed: bool) -> list[onnx.ValueInfoProto]:
    width, kv = HEADS * HEAD, KV_HEADS * HEAD
    qkv = [helper.make_tensor_value_info("query", TensorProto.FLOAT, ["B", "S", width + 2 * kv])] if packed else [
        helper.make_tensor_value_info("query", TensorProto.FLOAT, ["B", "S", width]),
        helper.make_tensor_value_info("key", TensorProto.FLOAT, ["B", "S", kv]),
        helper.make_tensor_value_info("value", TensorProto.FLOAT, ["B", "S", kv])]
    return qkv + [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", KV_HEADS, "P", HEAD])
                  for n in ("past_key", "past_value")] + \
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["max_seqlen", HEAD // 2]) for n in ("cos", "sin")]


def _model(nodes, inputs, inits, name: str) -> onnx.ModelProto:
    outputs = [helper.make_tensor_value_info("attention", TensorProto.FLOAT, ["B", "S", HEADS * HEAD])] + \
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", KV_HEADS, "T", HEAD])
         for n in ("present_key", "present_value")]
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, inits), opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def fused_rotary_gqa(packed: bool = False) -> onnx.ModelProto:
    """GroupQueryAttention with do_rotary=1 on the cos/sin inputs; total = P + S and seqlens_k = total - 1 per row,
    both from the inputs' shapes."""
    nodes = [helper.make_node("Shape", ["query"], ["new"], start=1, end=2),
             helper.make_node("Shape", ["past_key"], ["past"], start=2, end=3),
             helper.make_node("Add", ["past", "new"], ["total"]),
             helper.make_node("Cast", ["total"], ["total_int32"], to=TensorProto.INT32),
             helper.make_node("Sub", ["total_int32", "one"], ["last"]),
             helper.make_node("Shape", ["query"], ["batch"], start=0, end=1),
             helper.make_node("Tile", ["last", "batch"], ["seqlens_k"]),
             helper.make_node("GroupQueryAttention", [
                 "query", "" if packed else "key", "" if packed else "value", "past_key", "past_value", "seqlens_k",
                 "total_int32", "cos", "sin"], ["attention", "present_key", "present_value"], name="gqa",
                 domain="com.microsoft", num_heads=HEADS, kv_num_heads=KV_HEADS, do_rotary=1)]
    return _model(nodes, _inputs(packed), [_const("one", np.array([1], np.int32))], "fused_rotary_gqa")


def unfused_rotary_gqa() -> onnx.ModelProto:
    """The same attention written out: heads split, RotaryEmbedding on Q and K at positions P .. P + S - 1, past
    concatenated, key/value heads repeated, a causal mask over the past and new keys, softmax attention."""
    groups = HEADS // KV_HEADS
    inits = [_const("heads_split", np.array([0, 0, -1, HEAD], np.int64)),
             _const("merge", np.array([0, 0, -1], np.int64)), _const("axis2", np.array([2], np.int64)),
             _const("axis0", np.array([0], np.int64)), _const("step", np.array(1, np.int64)),
             _const("zero", np.array(0, np.int64)), _const("kv_groups", np.array([1, 1, groups, 1, 1], np.int64)),
             _const("heads_shape", np.array([0, HEADS, -1, HEAD], np.int64)),
             _const("low", np.array(-1e9, np.float32)), _const("column", np.array([-1, 1], np.int64)),
             _const("scale", np.array(HEAD ** -0.5, np.float32))]
    nodes = [helper.make_node("Shape", ["past_key"], ["past1"], start=2, end=3),
             helper.make_node("Shape", ["query"], ["new1"], start=1, end=2),
             helper.make_node("Squeeze", ["past1"], ["past"]), helper.make_node("Squeeze", ["new1"], ["new"]),
             helper.make_node("Add", ["past", "new"], ["total"]),
             helper.make_node("Range", ["past", "total", "step"], ["positions1"]),
             helper.make_node("Unsqueeze", ["positions1", "axis0"], ["positions"])]
    for t in ("query", "key", "value"):
        nodes += [helper.make_node("Reshape", [t, "heads_split"], [f"{t}_bshd"]),
                  helper.make_node("Transpose", [f"{t}_bshd"], [f"{t}_bhsd"], perm=[0, 2, 1, 3])]
    for t in ("query", "key"):
        nodes.append(helper.make_node("RotaryEmbedding", [f"{t}_bhsd", "positions", "cos", "sin"], [f"{t}_rope"],
                                      domain="com.microsoft"))
    for t, new in (("key", "key_rope"), ("value", "value_bhsd")):
        nodes += [helper.make_node("Concat", [f"past_{t}", new], [f"present_{t}"], axis=2),
                  helper.make_node("Unsqueeze", [f"present_{t}", "axis2"], [f"{t}_1"]),
                  helper.make_node("Tile", [f"{t}_1", "kv_groups"], [f"{t}_groups"]),
                  helper.make_node("Reshape", [f"{t}_groups", "heads_shape"], [f"{t}_all"])]
    nodes += [helper.make_node("Range", ["zero", "total", "step"], ["key_positions"]),
              helper.make_node("Reshape", ["positions1", "column"], ["query_positions"]),
              helper.make_node("Greater", ["key_positions", "query_positions"], ["future"]),
              helper.make_node("Cast", ["future"], ["future_float"], to=TensorProto.FLOAT),
              helper.make_node("Mul", ["future_float", "low"], ["mask"]),
              helper.make_node("Transpose", ["key_all"], ["key_t"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["query_rope", "key_t"], ["scores"]),
              helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
              helper.make_node("Add", ["scaled", "mask"], ["masked"]),
              helper.make_node("Softmax", ["masked"], ["weights"], axis=-1),
              helper.make_node("MatMul", ["weights", "value_all"], ["context"]),
              helper.make_node("Transpose", ["context"], ["context_bshd"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["context_bshd", "merge"], ["attention"])]
    return _model(nodes, _inputs(False), inits, "unfused_rotary_gqa")


def rotary_gqa_feeds(*, batch: int = 1, new: int = 8, past: int = 6, rows: int | None = None, packed: bool = False,
                     seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    width, kv = HEADS * HEAD, KV_HEADS * HEAD
    qkv = {"query": rng.standard_normal((batch, new, width + 2 * kv))} if packed else {
        "query": rng.standard_normal((batch, new, width)), "key": rng.standard_normal((batch, new, kv)),
        "value": rng.standard_normal((batch, new, kv))}
    angles = np.arange(rows or past + new)[:, None] / (10000 ** (np.arange(0, HEAD, 2) / HEAD))[None]
    feeds = {**qkv, "past_key": rng.standard_normal((batch, KV_HEADS, past, HEAD)),
             "past_value": rng.standard_normal((batch, KV_HEADS, past, HEAD)), "cos": np.cos(angles),
             "sin": np.sin(angles)}
    return {k: v.astype(np.float32) for k, v in feeds.items()}


# --- the rest of onnxscript's GQA fusion test models (ort_fusions/gqa_test.py, gqa_packed_qkv_test.py and their
# extended tests), rebuilt by hand: 20 query heads, 10 key/value heads of 16, as those tests size them.
TEST_HEADS, TEST_KV_HEADS = 20, 10


def _vi(name: str, dims: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def _test_io(*, norm: bool, rotary: bool = True) -> tuple[list, list]:
    q, kv = TEST_HEADS * HEAD, TEST_KV_HEADS * HEAD
    inputs = [_vi("query", ["B", "S", q]), _vi("key", ["B", "S", kv]), _vi("value", ["B", "S", kv]),
              _vi("past_key", ["B", TEST_KV_HEADS, "P", HEAD]), _vi("past_value", ["B", TEST_KV_HEADS, "P", HEAD])]
    inputs += [_vi("cos", ["max_seqlen", HEAD // 2]), _vi("sin", ["max_seqlen", HEAD // 2])] if rotary else []
    inputs += [_vi("query_scale", ["Dh"]), _vi("key_scale", ["Dh"])] if norm else []
    outputs = [_vi("attention", ["B", "S", q]), _vi("present_key", ["B", TEST_KV_HEADS, "T", HEAD]),
               _vi("present_value", ["B", TEST_KV_HEADS, "T", HEAD])]
    return inputs, outputs


def _split_heads(norm: str | None) -> list[onnx.NodeProto]:
    """query/key/value [B, S, heads * 16] -> [B, heads, S, 16]; an RMS norm of the query and key heads (Gemma's
    SimplifiedLayerNormalization) before the transpose or after it."""
    nodes = []
    for t in ("query", "key", "value"):
        scaled = norm is not None and t != "value"
        nodes.append(helper.make_node("Reshape", [t, "shape_bshd"], [f"{t}_bshd"]))
        bshd, bhsd = f"{t}_bshd", f"{t}_bhsd"
        if scaled and norm == "before_transpose":
            nodes.append(helper.make_node("SimplifiedLayerNormalization", [bshd, f"{t}_scale"], [f"{t}_bshd_n"],
                                          axis=-1, epsilon=1e-6, stash_type=1))
            bshd = f"{t}_bshd_n"
        nodes.append(helper.make_node("Transpose", [bshd], [bhsd], perm=[0, 2, 1, 3]))
        if scaled and norm == "after_transpose":
            nodes.append(helper.make_node("SimplifiedLayerNormalization", [bhsd, f"{t}_scale"], [f"{t}_bhsd_n"],
                                          axis=-1, epsilon=1e-6, stash_type=1))
    return nodes


def _phi_mask() -> list[onnx.NodeProto]:
    """The exported Phi models' causal mask: [B, 1, S, T + 1] of 0 and float32's lowest over the future keys,
    sliced back to T keys (the extra column the modeling code makes)."""
    return [helper.make_node("Squeeze", ["new1"], ["new0"]), helper.make_node("Squeeze", ["past1"], ["past0"]),
            helper.make_node("Add", ["past0", "new0"], ["total0"]),
            helper.make_node("Reshape", ["total0", "minus_one"], ["total1d"]),
            helper.make_node("Add", ["total0", "one64"], ["wide0"]),
            helper.make_node("Reshape", ["wide0", "minus_one"], ["wide1d"]),
            helper.make_node("Range", ["past0", "total0", "one64"], ["rows"]),
            helper.make_node("Concat", ["new1", "wide1d"], ["mask_shape"], axis=0),
            helper.make_node("Expand", ["lowest", "mask_shape"], ["all_low"]),
            helper.make_node("Range", ["zero64", "wide0", "one64"], ["columns"]),
            helper.make_node("Reshape", ["rows", "column_shape"], ["rows_column"]),
            helper.make_node("Greater", ["columns", "rows_column"], ["future"]),
            helper.make_node("Cast", ["future"], ["future_f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["all_low", "future_f"], ["mask2d"]),
            helper.make_node("Unsqueeze", ["mask2d", "axes01"], ["mask4d"]),
            helper.make_node("Concat", ["batch1", "ones1", "ones1", "ones1"], ["shape_b111"], axis=0),
            helper.make_node("Expand", ["mask4d", "shape_b111"], ["mask_wide"]),
            helper.make_node("Slice", ["mask_wide", "zero1", "total1d", "axis3"], ["mask"])]


def _test_inits() -> list[onnx.TensorProto]:
    i64 = np.int64
    return [_const(n, np.array(v, i64)) for n, v in (
        ("minus_one", [-1]), ("head1", [HEAD]), ("kv_heads1", [TEST_KV_HEADS]), ("heads1", [TEST_HEADS]),
        ("groups1", [TEST_HEADS // TEST_KV_HEADS]), ("one64", 1), ("zero64", 0), ("column_shape", [-1, 1]),
        ("axes01", [0, 1]), ("ones1", [1]), ("zero1", [0]), ("axis3", [3]), ("axis0", [0]), ("axis2", [2]))] + [
        _const("lowest", np.array([np.finfo(np.float32).min], np.float32)),
        _const("root_scale", np.array(HEAD ** 0.25, np.float32))]


def onnxscript_test_gqa(*, norm: str | None = None, past: bool = True, rotary: bool = True,
                        mask: bool = True) -> onnx.ModelProto:
    """The unfused attention of onnxscript's GQA fusion tests, as exported Phi/Gemma models write it: sizes from
    Shape ops, RotaryEmbedding at positions Range(P, P + S), the past concatenated (`past`; without it the caches
    are still inputs, read only for P), key/value heads broadcast by Expand, the causal mask above (`mask`), both
    query and key divided by Dh ** 0.25. `norm` is None, "before_transpose" or "after_transpose"."""
    nodes = [helper.make_node("Shape", ["query"], ["batch1"], start=0, end=1),
             helper.make_node("Shape", ["query"], ["new1"], start=1, end=2),
             helper.make_node("Shape", ["past_key"], ["past1"], start=2, end=3),
             helper.make_node("Add", ["past1", "new1"], ["total1"]),
             helper.make_node("Concat", ["batch1", "new1", "minus_one", "head1"], ["shape_bshd"], axis=0),
             helper.make_node("Concat", ["batch1", "new1", "minus_one"], ["shape_bsd"], axis=0),
             helper.make_node("Concat", ["batch1", "kv_heads1", "groups1", "total1", "head1"], ["shape_grouped"],
                              axis=0),
             helper.make_node("Concat", ["batch1", "heads1", "total1", "head1"], ["shape_bhtd"], axis=0),
             *_split_heads(norm)]
    query, key = ("query_bhsd_n", "key_bhsd_n") if norm == "after_transpose" else ("query_bhsd", "key_bhsd")
    if rotary:
        nodes += [helper.make_node("Squeeze", ["past1"], ["past_s"]), helper.make_node("Squeeze", ["total1"],
                                                                                        ["total_s"]),
                  helper.make_node("Range", ["past_s", "total_s", "one64"], ["positions1d"]),
                  helper.make_node("Unsqueeze", ["positions1d", "axis0"], ["positions"])]
        for t, name in (("query", query), ("key", key)):
            nodes.append(helper.make_node("RotaryEmbedding", [name, "positions", "cos", "sin"], [f"{t}_rope"],
                                          domain="com.microsoft"))
        query, key = "query_rope", "key_rope"
    for t, new in (("key", key), ("value", "value_bhsd")):
        nodes.append(helper.make_node("Concat", [f"past_{t}", new], [f"present_{t}"], axis=-2) if past else
                     helper.make_node("Identity", [new], [f"present_{t}"]))
        nodes += [helper.make_node("Unsqueeze", [f"present_{t}", "axis2"], [f"{t}_1"]),
                  helper.make_node("Expand", [f"{t}_1", "shape_grouped"], [f"{t}_grouped"]),
                  helper.make_node("Reshape", [f"{t}_grouped", "shape_bhtd"], [f"{t}_all"])]
    nodes += _phi_mask() if mask else []
    nodes += [helper.make_node("Transpose", ["key_all"], ["key_t"], perm=[0, 1, 3, 2]),
              helper.make_node("Div", [query, "root_scale"], ["query_s"]),
              helper.make_node("Div", ["key_t", "root_scale"], ["key_s"]),
              helper.make_node("MatMul", ["query_s", "key_s"], ["scores"]),
              *([helper.make_node("Add", ["scores", "mask"], ["masked"])] if mask else []),
              helper.make_node("Softmax", ["masked" if mask else "scores"], ["weights"], axis=-1),
              helper.make_node("MatMul", ["weights", "value_all"], ["context"]),
              helper.make_node("Transpose", ["context"], ["context_bshd"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["context_bshd", "shape_bsd"], ["attention"])]
    inputs, outputs = _test_io(norm=norm is not None, rotary=rotary)
    read = {i for n in nodes for i in n.input}
    graph = helper.make_graph(nodes, "onnxscript_test_gqa", inputs, outputs,
                              [t for t in _test_inits() if t.name in read])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


def onnxscript_test_sliced_gqa(*, key_start: int | None = None) -> onnx.ModelProto:
    """gqa_packed_qkv_test's source: one packed QKV input [B, S, (20 + 2 * 10) * 16] sliced into query, key and
    value for GroupQueryAttention (do_rotary), with seqlens_k [B] and total_sequence_length [1] given as inputs.
    `key_start` moves the key's slice off the head boundary (the extended test's misaligned case; the value then
    starts where that key ends)."""
    q, kv = TEST_HEADS * HEAD, TEST_KV_HEADS * HEAD
    key_start = q if key_start is None else key_start
    bounds = {"query": (0, q), "key": (key_start, key_start + kv), "value": (key_start + kv, q + 2 * kv)}
    inits = [_const("axis2", np.array([2], np.int64)), _const("step1", np.array([1], np.int64))]
    nodes = []
    for t, (start, end) in bounds.items():
        inits += [_const(f"{t}_start", np.array([start], np.int64)), _const(f"{t}_end", np.array([end], np.int64))]
        nodes.append(helper.make_node("Slice", ["packed_qkv", f"{t}_start", f"{t}_end", "axis2", "step1"], [t]))
    nodes.append(helper.make_node(
        "GroupQueryAttention", ["query", "key", "value", "past_key", "past_value", "seqlens_k",
                                "total_sequence_length", "cos", "sin"], ["attention", "present_key", "present_value"],
        name="gqa", domain="com.microsoft", num_heads=TEST_HEADS, kv_num_heads=TEST_KV_HEADS, do_rotary=1,
        rotary_interleaved=0))
    inputs, outputs = _test_io(norm=False)
    lengths = [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
               helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [1])]
    inputs = [_vi("packed_qkv", ["B", "S", q + 2 * kv])] + inputs[3:5] + lengths + inputs[5:7]
    graph = helper.make_graph(nodes, "onnxscript_test_sliced_gqa", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model


def onnxscript_test_feeds(model: onnx.ModelProto, *, batch: int = 1, new: int = 8, past: int = 16,
                          seed: int = 0) -> dict[str, np.ndarray]:
    """Feeds for the models above (the tests' sizes: 8 new tokens over 16 past ones at batch 1, max_seqlen = P + S;
    seqlens_k = total - 1 per row where it is an input). Values in [0, 1), as the tests draw them."""
    rng = np.random.default_rng(seed)
    total = past + new
    sizes = {"B": batch, "S": new, "P": past, "max_seqlen": total, "Dh": HEAD}
    feeds: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        shape = [d.dim_value if d.HasField("dim_value") else sizes[d.dim_param] for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = rng.random(shape).astype(np.float32)
    if "seqlens_k" in feeds:
        feeds["seqlens_k"] = np.full((batch,), total - 1, np.int32)
        feeds["total_sequence_length"] = np.array([total], np.int32)
    return feeds


def onnxscript_fused(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` through onnxscript's own GQA fusions, as its tests run them (shape inference, onnxscript's optimizer,
    then its SDPA and GQA rules, or its packed-QKV rule): the fused models those tests check. The shapes of the
    heads are written first, symbolic in batch and lengths, as the tests write them for the rules to read."""
    import onnx_ir as ir
    import onnx_ir.passes.common.shape_inference as shape_inference
    import onnxscript.optimizer
    from onnxscript.rewriter.ort_fusions.gqa import fuse_gqa
    from onnxscript.rewriter.ort_fusions.gqa_packed_qkv import fuse_qkv_gqa
    from onnxscript.rewriter.ort_fusions.sdpa import fuse_sdpa

    hinted = onnx.ModelProto()
    hinted.CopyFrom(model)
    heads, kv = TEST_HEADS, TEST_KV_HEADS
    hinted.graph.value_info.extend([
        _vi("query_rope", ["B", heads, "S", HEAD]), _vi("key_rope", ["B", kv, "S", HEAD]),
        _vi("query_bshd", ["B", "S", heads, HEAD]), _vi("key_bshd", ["B", "S", kv, HEAD]),
        _vi("key_all", ["B", heads, "T", HEAD]), _vi("value_all", ["B", heads, "T", HEAD]),
        _vi("key_t", ["B", heads, HEAD, "T"])])
    graph = shape_inference.infer_shapes(ir.serde.from_proto(hinted))
    onnxscript.optimizer.optimize(graph)
    sliced = any(n.op_type == "GroupQueryAttention" for n in model.graph.node)
    count = fuse_qkv_gqa(graph) if sliced else fuse_sdpa(graph) and fuse_gqa(graph)
    if not count:
        raise ValueError(f"onnxscript's fusion found nothing to fuse in {model.graph.name}")
    return ir.serde.to_proto(graph)


def onnxscript_test_standard_gqa() -> onnx.ModelProto:
    """rules/fusion/_gqa_test.py's source (opset 23): the standard Attention op over key/value heads broadcast from
    4 to 8 (past concatenated, Unsqueeze, Expand to [B, 4, 2, T, 64], Reshape to [B, 8, T, 64]), at the test's static
    sizes B=2, S=4, P=8. onnxscript's public onnx_fusions.fuse turns it into one Attention over the 4 kv heads."""
    heads, kv, head = 8, 4, 64
    # the axis a scalar, as the test's script writes Unsqueeze(x, 2) (the rule matches only that; ONNX Runtime runs it)
    inits = [_const(n, np.array(v, np.int64)) for n, v in (
        ("axis2", 2), ("kv1", [kv]), ("groups1", [heads // kv]), ("head1", [head]), ("heads1", [heads]))]
    nodes = [helper.make_node("Shape", ["query"], ["batch1"], start=0, end=1)]
    for t in ("key", "value"):
        nodes += [helper.make_node("Concat", [f"past_{t}", t], [f"present_{t}"], axis=-2),
                  helper.make_node("Unsqueeze", [f"present_{t}", "axis2"], [f"{t}_1"]),
                  helper.make_node("Shape", [f"present_{t}"], [f"{t}_total"], start=2, end=3),
                  helper.make_node("Concat", ["batch1", "kv1", "groups1", f"{t}_total", "head1"], [f"{t}_grouped_shape"],
                                   axis=0),
                  helper.make_node("Expand", [f"{t}_1", f"{t}_grouped_shape"], [f"{t}_grouped"]),
                  helper.make_node("Concat", ["batch1", "heads1", f"{t}_total", "head1"], [f"{t}_all_shape"], axis=0),
                  helper.make_node("Reshape", [f"{t}_grouped", f"{t}_all_shape"], [f"{t}_all"])]
    nodes.append(helper.make_node("Attention", ["query", "key_all", "value_all"], ["attention"]))
    inputs = [_vi("query", [2, heads, 4, head])] + [_vi(t, [2, kv, 4, head]) for t in ("key", "value")] + \
        [_vi(f"past_{t}", [2, kv, 8, head]) for t in ("key", "value")]
    graph = helper.make_graph(nodes, "onnxscript_test_standard_gqa", inputs, [_vi("attention", [2, heads, 4, head])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model


def onnx_fused(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` through onnxscript's public fusions to standard ONNX ops (onnx_fusions.fuse, opset 23), after its
    optimizer, as rules/fusion/_gqa_test.py runs its GQA rule."""
    import onnx_ir as ir
    import onnxscript.optimizer
    from onnxscript.rewriter import onnx_fusions

    graph = ir.serde.deserialize_model(model)
    onnxscript.optimizer.optimize(graph)
    if not onnx_fusions.fuse(graph).get("GQA"):
        raise ValueError(f"onnxscript's GQA fusion found nothing to fuse in {model.graph.name}")
    onnxscript.optimizer.remove_unused_nodes(graph)
    return ir.serde.serialize_model(graph)
