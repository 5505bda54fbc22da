"""plugins/ (trtattn_plugins): TensorRT's trt:: attention ops run by ONNX Runtime as custom ops.

Every op test writes a one-node model with the trt op, runs it through ONNX Runtime (the custom
ops), and compares it with ONNX Runtime's standard ops (Attention opset 24, TensorScatter,
QuantizeLinear/DequantizeLinear) on the same inputs.
"""

import warnings

import ml_dtypes
import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import trtattn_plugins as tp
from tests.conftest import ort_run
from trtattn_plugins import schema

FP32_TOL = 1e-5
FP16_TOL = 2e-3
ONNX_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
              np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16, np.dtype(bool): TensorProto.BOOL,
              np.dtype(np.int32): TensorProto.INT32, np.dtype(np.int64): TensorProto.INT64}


def _rand(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def _graph_model(nodes, feeds: dict, out_dtype, opsets):
    inputs = [helper.make_tensor_value_info(n, ONNX_TYPES[a.dtype], list(a.shape)) for n, a in feeds.items()]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", out_dtype, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def trt_model(op_type, inputs: dict, **attrs):
    """A one-node model: `inputs` maps each documented input name (in doc order) to an array or None."""
    spec = schema.OPS[op_type]
    names = [n if inputs.get(n) is not None else "" for n in (i.name for i in spec.inputs)]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op_type, names, ["y"], domain="trt", name=f"{op_type.lower()}_0", **attrs)
    feeds = {n: inputs[n] for n in names if n}
    first = inputs[spec.inputs[0].name]
    return _graph_model([node], feeds, ONNX_TYPES[first.dtype], [("", 24), ("trt", 1)]), feeds


def run_trt(op_type, inputs: dict, fully_masked="nan", **attrs):
    model, feeds = trt_model(op_type, inputs, **attrs)
    assert tp.check_model(model) == []
    return tp.Session(model, fully_masked=fully_masked).run(None, feeds)[0]


def ort_attention(q, k, v, mask=None, nonpad=None, is_causal=0, scale=1.0):
    """ONNX Runtime's standard Attention (opset 24) on the same inputs."""
    feeds = {"q": q, "k": k, "v": v}
    names = ["q", "k", "v", "", "", ""]
    if mask is not None:
        feeds["m"], names[3] = mask, "m"
    if nonpad is not None:
        feeds["n"] = np.asarray(nonpad, np.int64)
        names.append("n")
    while not names[-1]:
        names.pop()
    node = helper.make_node("Attention", names, ["y"], is_causal=is_causal, scale=scale)
    return ort_run(_graph_model([node], feeds, ONNX_TYPES[q.dtype], [("", 24)]), feeds)[0]


def lower_right(sq, skv):
    return np.arange(skv)[None, :] <= np.arange(sq)[:, None] + (skv - sq)


def max_err(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


# --------------------------------------------------------------------------- TRT_Attention, padded


@pytest.mark.parametrize("nq,nkv", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
def test_attention_padded_matches_onnx_attention(nq, nkv):
    rng = np.random.default_rng(0)
    q, k, v = _rand(rng, 2, nq, 3, 8), _rand(rng, 2, nkv, 5, 8), _rand(rng, 2, nkv, 5, 8)
    y = run_trt("TRT_Attention", {"Q": q, "K": k, "V": v})
    assert y.shape == q.shape
    assert max_err(y, ort_attention(q, k, v)) < FP32_TOL


@pytest.mark.parametrize("shape", [(2, 1, 1, 5), (3, 5), (2, 4, 3, 5)], ids=["key_padding", "2d", "full"])
def test_attention_bool_and_additive_masks(shape):
    rng = np.random.default_rng(1)
    q, k, v = _rand(rng, 2, 4, 3, 8), _rand(rng, 2, 2, 5, 8), _rand(rng, 2, 2, 5, 8)
    allowed = rng.random(shape) < 0.7
    allowed[..., 0] = True  # every row keeps a key
    full = shape[:-2] + (3, 5)  # ONNX Runtime's Attention does not broadcast the mask over Sq
    y = run_trt("TRT_Attention", {"Q": q, "K": k, "V": v, "attn_mask": allowed})
    assert max_err(y, ort_attention(q, k, v, mask=np.broadcast_to(allowed, full).copy())) < FP32_TOL
    bias = np.where(allowed, rng.standard_normal(shape), -np.inf).astype(np.float32)
    y = run_trt("TRT_Attention", {"Q": q, "K": k, "V": v, "attn_mask": bias})
    assert max_err(y, ort_attention(q, k, v, mask=np.broadcast_to(bias, full).copy())) < FP32_TOL


@pytest.mark.parametrize("sq,skv", [(3, 5), (5, 5), (4, 2)])
def test_attention_causal_kinds(sq, skv):
    rng = np.random.default_rng(2)
    q, k, v = _rand(rng, 2, 4, sq, 8), _rand(rng, 2, 2, skv, 8), _rand(rng, 2, 2, skv, 8)
    upper = run_trt("TRT_Attention", {"Q": q, "K": k, "V": v}, causal_kind="upper_left")
    assert max_err(upper, ort_attention(q, k, v, is_causal=1)) < FP32_TOL  # ONNX is_causal is upper-left
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lower = run_trt("TRT_Attention", {"Q": q, "K": k, "V": v}, causal_kind="lower_right", fully_masked="zero")
    # Lower-right rows before the first key (sq > skv) attend to nothing: said, and zeros as asked.
    assert any("attend to no key" in str(w.message) for w in caught) == (sq > skv)
    assert max_err(lower, ort_attention(q, k, v, mask=lower_right(sq, skv))) < FP32_TOL
    if sq != skv:
        assert max_err(upper, lower) > 0.1  # the two alignments really differ here


def test_attention_per_row_kv_lengths():
    rng = np.random.default_rng(3)
    q, k, v = _rand(rng, 3, 4, 2, 8), _rand(rng, 3, 2, 6, 8), _rand(rng, 3, 2, 6, 8)
    lengths = np.array([6, 3, 1], np.int32)
    y = run_trt("TRT_Attention", {"Q": q, "K": k, "V": v, "kv_lengths": lengths})
    assert max_err(y, ort_attention(q, k, v, nonpad=lengths)) < FP32_TOL
    # Lower-right with per-row lengths: row b's diagonal ends at its own last key.
    q = _rand(rng, 3, 4, 2, 8)
    with pytest.warns(tp.TrtOpWarning, match="4 query rows attend to no key"):  # row 2's first query
        y = run_trt("TRT_Attention", {"Q": q, "K": k, "V": v, "kv_lengths": lengths}, causal_kind="lower_right",
                    fully_masked="zero")
    for b, n in enumerate(lengths):
        want = ort_attention(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], mask=lower_right(2, int(n)))
        assert max_err(y[b:b + 1], want) < FP32_TOL


def _pack(x, lengths):
    """[B, N, S, H] padded -> [T, N, H] packed (row b keeps its first lengths[b] positions)."""
    return np.concatenate([x[b, :, :n].transpose(1, 0, 2) for b, n in enumerate(lengths)], axis=0)


def _cu(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def test_attention_packed_matches_per_row_padded_runs():
    rng = np.random.default_rng(4)
    q_lens, kv_lens = [3, 1, 4], [5, 2, 4]
    q, k, v = _rand(rng, 3, 4, 4, 8), _rand(rng, 3, 2, 5, 8), _rand(rng, 3, 2, 5, 8)
    inputs = {"Q": _pack(q, q_lens), "K": _pack(k, kv_lens), "V": _pack(v, kv_lens),
              "query_lengths": _cu(q_lens), "kv_lengths": _cu(kv_lens)}
    y = run_trt("TRT_Attention", inputs, query_form="packed_nhd", kv_form="packed_nhd", causal_kind="lower_right")
    assert y.shape == inputs["Q"].shape
    start = 0
    for b, (sq, skv) in enumerate(zip(q_lens, kv_lens)):
        want = ort_attention(q[b:b + 1, :, :sq], k[b:b + 1, :, :skv], v[b:b + 1, :, :skv], mask=lower_right(sq, skv))
        assert max_err(y[start:start + sq], want[0].transpose(1, 0, 2)) < FP32_TOL
        start += sq


def test_attention_packed_query_on_padded_cache():
    """The decode pattern: packed new tokens attend to a padded cache with per-row lengths."""
    rng = np.random.default_rng(5)
    q_lens, kv_lens = np.array([1, 2]), np.array([4, 7], np.int32)
    q, k, v = _rand(rng, 2, 4, 2, 8), _rand(rng, 2, 2, 8, 8), _rand(rng, 2, 2, 8, 8)
    y = run_trt("TRT_Attention", {"Q": _pack(q, q_lens), "K": k, "V": v, "query_lengths": _cu(q_lens),
                                  "kv_lengths": kv_lens}, query_form="packed_nhd", causal_kind="lower_right")
    want = [ort_attention(q[b:b + 1, :, :sq], k[b:b + 1, :, :n], v[b:b + 1, :, :n], mask=lower_right(int(sq), int(n)))
            for b, (sq, n) in enumerate(zip(q_lens, kv_lens))]
    assert max_err(y, np.concatenate([w[0].transpose(1, 0, 2) for w in want])) < FP32_TOL


def test_attention_fp16_and_bf16_keep_their_dtype():
    rng = np.random.default_rng(6)
    q, k, v = _rand(rng, 2, 4, 3, 16), _rand(rng, 2, 2, 6, 16), _rand(rng, 2, 2, 6, 16)
    half = [x.astype(np.float16) for x in (q, k, v)]
    y = run_trt("TRT_Attention", dict(zip("QKV", half)), causal_kind="upper_left")
    assert y.dtype == np.float16
    assert max_err(y, ort_attention(*half, is_causal=1)) < FP16_TOL
    # bfloat16 between Casts (ONNX Runtime takes no bfloat16 numpy feeds).
    nodes = [helper.make_node("Cast", [n], [n + "16"], to=TensorProto.BFLOAT16) for n in "qkv"]
    nodes += [helper.make_node("TRT_Attention", ["q16", "k16", "v16"], ["y16"], domain="trt", name="bf16"),
              helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT)]
    model = _graph_model(nodes, {"q": q, "k": k, "v": v}, TensorProto.FLOAT, [("", 24), ("trt", 1)])
    y = tp.Session(model).run(None, {"q": q, "k": k, "v": v})[0]
    exact = ort_attention(*[x.astype(ml_dtypes.bfloat16).astype(np.float32) for x in (q, k, v)])
    assert np.array_equal(y, y.astype(ml_dtypes.bfloat16).astype(np.float32))  # the op's output is bf16
    assert max_err(y, exact) < 1e-2


def test_attention_without_normalization_matches_matmuls():
    rng = np.random.default_rng(7)
    q, k, v = _rand(rng, 1, 2, 3, 4), _rand(rng, 1, 2, 5, 4), _rand(rng, 1, 2, 5, 4)
    allowed = rng.random((1, 1, 3, 5)) < 0.6
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Where", ["m", "s", "zero"], ["p"]),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    feeds = {"q": q, "k": k, "v": v, "m": allowed, "zero": np.zeros((), np.float32)}
    want = ort_run(_graph_model(nodes, feeds, TensorProto.FLOAT, [("", 24)]), feeds)[0]
    y = run_trt("TRT_Attention", {"Q": q, "K": k, "V": v, "attn_mask": allowed}, TRT_normalization_op="none")
    assert max_err(y, want) < FP32_TOL


def test_fully_masked_rows_are_nan_unless_asked_for_zeros():
    rng = np.random.default_rng(8)
    q, k, v = _rand(rng, 2, 2, 3, 8), _rand(rng, 2, 2, 4, 8), _rand(rng, 2, 2, 4, 8)
    lengths = np.array([4, 0], np.int32)
    with pytest.warns(tp.TrtOpWarning, match="attend to no key"):
        y = run_trt("TRT_Attention", {"Q": q, "K": k, "V": v, "kv_lengths": lengths})
    assert np.isnan(y[1]).all() and not np.isnan(y[0]).any()
    with pytest.warns(tp.TrtOpWarning):
        y = run_trt("TRT_Attention", {"Q": q, "K": k, "V": v, "kv_lengths": lengths}, fully_masked="zero")
    assert max_err(y, ort_attention(q, k, v, nonpad=lengths)) < FP32_TOL  # ONNX Runtime's zeros


# --------------------------------------------------------------------------- TRT_QuantizedAttention


def ort_qdq_attention(q, k, v, scale, p_scale, to_type, is_causal=False):
    """Standard ops: MatMul -> Mul(scale) -> [causal Where] -> Softmax -> QuantizeLinear ->
    DequantizeLinear -> MatMul, on ONNX Runtime (what the op's Q/DQ between softmax and BMM2 means)."""
    zero = helper.make_tensor("zp", to_type, [], [0])
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]),
             helper.make_node("Mul", ["s0", "scale"], ["s"])]
    feeds = {"q": q, "k": k, "v": v, "scale": np.array(scale, np.float32), "ps": np.array(p_scale, np.float32)}
    if is_causal:
        feeds["causal"] = np.tril(np.ones((q.shape[2], k.shape[2]), bool))
        feeds["ninf"] = np.array(-np.inf, np.float32)
        nodes.append(helper.make_node("Where", ["causal", "s", "ninf"], ["sm"]))
    nodes += [helper.make_node("Softmax", ["sm" if is_causal else "s"], ["p"], axis=-1),
              helper.make_node("QuantizeLinear", ["p", "ps", "zp"], ["pq"]),
              helper.make_node("DequantizeLinear", ["pq", "ps", "zp"], ["pd"]),
              helper.make_node("MatMul", ["pd", "v"], ["y"])]
    model = _graph_model(nodes, feeds, TensorProto.FLOAT, [("", 24)])
    model.graph.initializer.append(zero)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep the Q/DQ pair
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


@pytest.mark.parametrize("to_type,p_scale", [(TensorProto.FLOAT8E4M3FN, 1 / 448), (TensorProto.INT8, 1 / 127)],
                         ids=["fp8", "int8"])
def test_quantized_attention_matches_qdq_around_attention(to_type, p_scale):
    rng = np.random.default_rng(9)
    q, k, v = _rand(rng, 2, 2, 4, 16), _rand(rng, 2, 2, 6, 16), _rand(rng, 2, 2, 6, 16)
    inputs = {"Q": q, "K": k, "V": v, "normalization_quantize_scale": np.array(p_scale, np.float32)}
    y = run_trt("TRT_QuantizedAttention", inputs, normalization_quantize_to_type=to_type, is_causal=1)
    want = ort_qdq_attention(q, k, v, 1 / 4, p_scale, to_type, is_causal=True)  # default scale 1/sqrt(16)
    assert max_err(y, want) < 1e-4
    exact = ort_attention(q, k, v, is_causal=1, scale=0.25)
    assert max_err(y, exact) > 1e-3  # the quantization is really applied


def test_quantized_attention_attention23_layout_and_scale():
    """3-D [B, S, hidden] inputs with q_num_heads/kv_num_heads and an explicit scale (Attention-23)."""
    rng = np.random.default_rng(10)
    q, k, v = _rand(rng, 2, 3, 4 * 8), _rand(rng, 2, 5, 2 * 8), _rand(rng, 2, 5, 2 * 8)
    inputs = {"Q": q, "K": k, "V": v, "normalization_quantize_scale": np.array(1 / 448, np.float32)}
    y = run_trt("TRT_QuantizedAttention", inputs, q_num_heads=4, kv_num_heads=2, scale=0.3)
    four = [x.reshape(2, x.shape[1], -1, 8).transpose(0, 2, 1, 3) for x in (q, k, v)]
    four[1], four[2] = (np.repeat(x, 2, axis=1) for x in four[1:])
    want = ort_qdq_attention(*four, 0.3, 1 / 448, TensorProto.FLOAT8E4M3FN)
    assert y.shape == q.shape
    assert max_err(y, want.transpose(0, 2, 1, 3).reshape(q.shape)) < 1e-4


# --------------------------------------------------------------------------- TRT_KVCacheUpdate


def ort_tensor_scatter(cache, update, write_indices):
    feeds = {"c": cache, "u": update, "w": np.asarray(write_indices, np.int64)}
    node = helper.make_node("TensorScatter", ["c", "u", "w"], ["y"], axis=-2)
    return ort_run(_graph_model([node], feeds, ONNX_TYPES[cache.dtype], [("", 24)]), feeds)[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_kv_cache_update_writes_each_row_at_its_index(dtype):
    rng = np.random.default_rng(11)
    cache, update = _rand(rng, 3, 2, 8, 4, dtype=dtype), _rand(rng, 3, 2, 2, 4, dtype=dtype)
    indices = np.array([0, 3, 6], np.int32)
    y = run_trt("TRT_KVCacheUpdate", {"past_cache": cache, "update": update, "write_indices": indices})
    assert y.dtype == dtype
    assert np.array_equal(y, ort_tensor_scatter(cache, update, indices))


def test_kv_cache_update_drops_writes_past_capacity():
    rng = np.random.default_rng(12)
    cache, update = _rand(rng, 2, 2, 6, 4), _rand(rng, 2, 2, 3, 4)
    indices = np.array([1, 4], np.int32)  # row 1 has room for 2 of its 3 tokens
    with pytest.warns(tp.TrtOpWarning, match="1 cache writes"):
        y = run_trt("TRT_KVCacheUpdate", {"past_cache": cache, "update": update, "write_indices": indices})
    with pytest.raises(Exception, match="exceeds"):  # the standard op rejects this write instead
        ort_tensor_scatter(cache, update, indices)
    assert np.array_equal(y[0], ort_tensor_scatter(cache[:1], update[:1], indices[:1])[0])
    assert np.array_equal(y[1], ort_tensor_scatter(cache[1:], update[1:, :, :2], indices[1:])[0])


def test_kv_cache_update_packed_matches_per_row_tensor_scatter():
    rng = np.random.default_rng(13)
    lengths = [2, 0, 3]
    cache, update = _rand(rng, 3, 2, 7, 4), _rand(rng, 3, 2, 3, 4)
    indices = np.array([5, 1, 0], np.int32)
    y = run_trt("TRT_KVCacheUpdate", {"past_cache": cache, "update": _pack(update, lengths), "write_indices": indices,
                                      "update_lengths": _cu(lengths)}, update_form="packed_nhd")
    for b, n in enumerate(lengths):
        assert np.array_equal(y[b], ort_tensor_scatter(cache[b:b + 1], update[b:b + 1, :, :n], indices[b:b + 1])[0])


def test_cache_update_feeding_attention_in_fp16_matches_standard_ops(tmp_path):
    """The kv-cache form: TRT_KVCacheUpdate writes the new keys/values into preallocated fp16 caches,
    TRT_Attention reads them with per-row lengths (lower-right); the model is opened from a path with
    its weights in external data. Same graph in standard ops: TensorScatter + Attention."""
    rng = np.random.default_rng(19)
    q, k_new, v_new = (_rand(rng, 2, n, 2, 8, dtype=np.float16) for n in (4, 2, 2))
    k_cache, v_cache = _rand(rng, 2, 2, 6, 8, dtype=np.float16), _rand(rng, 2, 2, 6, 8, dtype=np.float16)
    write = np.array([1, 3], np.int32)
    lengths = write + 2
    feeds = {"q": q, "k_new": k_new, "v_new": v_new, "write": write, "lengths": lengths}
    trt_nodes = [
        helper.make_node("TRT_KVCacheUpdate", ["k_cache", "k_new", "write"], ["k_all"], domain="trt", name="k_up"),
        helper.make_node("TRT_KVCacheUpdate", ["v_cache", "v_new", "write"], ["v_all"], domain="trt", name="v_up"),
        helper.make_node("TRT_Attention", ["q", "k_all", "v_all", "", "", "lengths"], ["y"], domain="trt",
                         name="attn", causal_kind="lower_right")]
    model = _graph_model(trt_nodes, feeds, TensorProto.FLOAT16, [("", 24), ("trt", 1)])
    model.graph.initializer.extend([onnx.numpy_helper.from_array(k_cache, "k_cache"),
                                    onnx.numpy_helper.from_array(v_cache, "v_cache")])
    path = tmp_path / "kv.onnx"
    onnx.save(model, path, save_as_external_data=True, location="kv.onnx.data", size_threshold=0)
    y = tp.Session(path).run(None, feeds)[0]

    k_all = ort_tensor_scatter(k_cache, k_new, write)
    v_all = ort_tensor_scatter(v_cache, v_new, write)
    for b, n in enumerate(lengths):
        want = ort_attention(q[b:b + 1], k_all[b:b + 1, :, :n], v_all[b:b + 1, :, :n], mask=lower_right(2, int(n)))
        assert max_err(y[b:b + 1], want) < FP16_TOL


# --------------------------------------------------------------------------- errors and wrong implementations


def test_rejected_inputs_raise_naming_the_node():
    rng = np.random.default_rng(14)
    q, k, v = _rand(rng, 2, 2, 3, 8), _rand(rng, 2, 2, 4, 8), _rand(rng, 2, 2, 4, 8)
    model, feeds = trt_model("TRT_Attention", {"Q": q, "K": k, "V": v, "kv_lengths": np.array([4, 9], np.int32)})
    with pytest.raises(tp.TrtOpError, match=r"trt_attention_0: .*kv_lengths \[4, 9\]"):
        tp.Session(model).run(None, feeds)
    model, feeds = trt_model("TRT_Attention", {"Q": q, "K": _rand(rng, 2, 3, 4, 8), "V": _rand(rng, 2, 3, 4, 8)})
    with pytest.raises(tp.TrtOpError, match="not a multiple"):
        tp.Session(model).run(None, feeds)


def test_a_wrong_causal_alignment_is_caught():
    """The comparison used above fails for an implementation with the alignment flipped."""
    rng = np.random.default_rng(15)
    q, k, v = _rand(rng, 2, 4, 3, 8), _rand(rng, 2, 2, 7, 8), _rand(rng, 2, 2, 7, 8)
    standard = ort_attention(q, k, v, mask=lower_right(3, 7))
    right = tp.trt_attention(q, k, v, causal_kind="lower_right")
    flipped = tp.trt_attention(q, k, v, causal_kind="upper_left")  # a copy that anchors at the wrong corner
    assert max_err(right, standard) < FP32_TOL
    assert max_err(flipped, standard) > 100 * FP32_TOL


def test_ignoring_kv_lengths_is_caught():
    rng = np.random.default_rng(16)
    q, k, v = _rand(rng, 2, 2, 2, 8), _rand(rng, 2, 2, 6, 8), _rand(rng, 2, 2, 6, 8)
    lengths = np.array([2, 5], np.int32)
    standard = ort_attention(q, k, v, nonpad=lengths)
    assert max_err(tp.trt_attention(q, k, v, kv_lengths=lengths), standard) < FP32_TOL
    assert max_err(tp.trt_attention(q, k, v), standard) > 100 * FP32_TOL


# --------------------------------------------------------------------------- schema

# Transcribed from onnx-tensorrt docs/TRT_custom_ops.md: attribute -> (type, default, allowed values).
DOC_ATTRIBUTES = {
    "TRT_Attention": {
        "query_form": ("STRING", "padded_bhnd", {"padded_bhnd", "packed_nhd"}),
        "kv_form": ("STRING", "padded_bhnd", {"padded_bhnd", "packed_nhd"}),
        "causal_kind": ("STRING", "none", {"none", "upper_left", "lower_right"}),
        "TRT_decomposable": ("INT", 0, {0, 1}),
        "TRT_normalization_op": ("STRING", "softmax", {"softmax", "none"}),
        "nb_rank": ("INT", 1, None),
    },
    "TRT_QuantizedAttention": {
        "query_form": ("STRING", "padded_bhnd", {"padded_bhnd", "packed_nhd"}),
        "kv_form": ("STRING", "padded_bhnd", {"padded_bhnd", "packed_nhd"}),
        "is_causal": ("INT", 0, {0, 1}),
        "kv_num_heads": ("INT", None, None),
        "q_num_heads": ("INT", None, None),
        "scale": ("FLOAT", None, None),
        "normalization_quantize_to_type": ("INT", TensorProto.FLOAT8E4M3FN,
                                           {TensorProto.UNDEFINED, TensorProto.FLOAT8E4M3FN, TensorProto.INT8}),
        "TRT_decomposable": ("INT", 0, {0, 1}),
        "TRT_normalization_op": ("STRING", "softmax", {"softmax", "none"}),
    },
    "TRT_KVCacheUpdate": {
        "update_form": ("STRING", "padded_bhnd", {"padded_bhnd", "packed_nhd"}),
        "mode": ("STRING", "linear", {"linear"}),
        "axis": ("INT", -2, {-2}),
    },
}
# Input name, optional, dtypes, in index order.
DOC_INPUTS = {
    "TRT_Attention": [("Q", False), ("K", False), ("V", False), ("attn_mask", True),
                      ("query_lengths", True), ("kv_lengths", True)],
    "TRT_QuantizedAttention": [("Q", False), ("K", False), ("V", False), ("attn_mask", True),
                               ("normalization_quantize_scale", True), ("query_lengths", True), ("kv_lengths", True)],
    "TRT_KVCacheUpdate": [("past_cache", False), ("update", False), ("write_indices", True),
                          ("update_lengths", True)],
}
INT32_INPUTS = {"query_lengths", "kv_lengths", "write_indices", "update_lengths"}


def test_schema_holds_exactly_the_documented_attributes_and_inputs():
    assert set(tp.OPS) == set(DOC_ATTRIBUTES)
    for op_type, spec in tp.OPS.items():
        assert spec.domain == "trt"
        got = {a.name: (a.type, a.default, None if a.allowed is None else set(a.allowed)) for a in spec.attributes}
        assert got == DOC_ATTRIBUTES[op_type], op_type
        assert [(i.name, i.optional) for i in spec.inputs] == DOC_INPUTS[op_type]
        for i in spec.inputs:
            assert (i.dtypes == ("int32",)) == (i.name in INT32_INPUTS), i.name
        assert "bool" in spec.inputs[3].dtypes or op_type == "TRT_KVCacheUpdate"


def _node(op_type, inputs=("q", "k", "v"), **attrs):
    return helper.make_node(op_type, list(inputs), ["y"], domain="trt", name="n", **attrs)


def test_check_node_accepts_documented_nodes():
    assert tp.check_node(_node("TRT_Attention", causal_kind="lower_right", TRT_decomposable=1, nb_rank=1)) == []
    assert tp.check_node(_node("TRT_Attention", ("q", "k", "v", "", "ql", "kl"), query_form="packed_nhd",
                               kv_form="packed_nhd")) == []
    assert tp.check_node(_node("TRT_QuantizedAttention", ("q", "k", "v", "m", "s"), scale=0.125,
                               normalization_quantize_to_type=TensorProto.INT8)) == []
    assert tp.check_node(_node("TRT_KVCacheUpdate", ("c", "u", "w", "l"), update_form="packed_nhd")) == []


@pytest.mark.parametrize("node,problem", [
    (_node("TRT_Attention", scale=0.125), "attribute 'scale' is not documented"),
    (_node("TRT_Attention", is_causal=1), "attribute 'is_causal' is not documented"),
    (_node("TRT_Attention", causal_kind="upper-left"), "causal_kind='upper-left' is not one of"),
    (_node("TRT_Attention", causal_kind=1), "attribute 'causal_kind' is INT, the doc says STRING"),
    (_node("TRT_Attention", query_form="packed"), "query_form='packed' is not one of"),
    (_node("TRT_Attention", nb_rank=0), "nb_rank=0 must be positive"),
    (_node("TRT_Attention", ("q", "k", "v", "m"), causal_kind="lower_right"), "attn_mask cannot be used together"),
    (_node("TRT_Attention", ("q", "k", "v", "m", "ql"), query_form="packed_nhd"), "not supported when query_form"),
    (_node("TRT_Attention", query_form="packed_nhd"), "needs query_lengths"),
    (_node("TRT_Attention", kv_form="packed_nhd"), "needs kv_lengths"),
    (_node("TRT_Attention", ("q", "k")), "required input 2 'V' is missing"),
    (_node("TRT_Attention", ("q", "k", "v", "", "", "", "extra")), "7 inputs, the doc lists at most 6"),
    (_node("TRT_QuantizedAttention"), "normalization_quantize_scale (input 4) is missing"),
    (_node("TRT_QuantizedAttention", ("q", "k", "v", "", "s"), normalization_quantize_to_type=TensorProto.FLOAT16),
     "normalization_quantize_to_type=10 is not one of"),
    (_node("TRT_KVCacheUpdate", ("c", "u", "w"), axis=2), "axis=2 is not one of [-2]"),
    (_node("TRT_KVCacheUpdate", ("c", "u", "w"), mode="circular"), "mode='circular' is not one of"),
    (_node("TRT_KVCacheUpdate", ("c", "u", "w"), update_form="packed_nhd"), "needs update_lengths"),
    (helper.make_node("TRT_Attention", ["q", "k", "v"], ["y"], domain="com.nvidia", name="n"), "domain 'com.nvidia'"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_check_node_rejects_what_the_doc_does_not_allow(node, problem):
    problems = tp.check_node(node)
    assert any(problem in p for p in problems), problems


def test_cpu_model_refuses_undocumented_nodes_and_leaves_the_model_alone():
    rng = np.random.default_rng(17)
    q, k, v = _rand(rng, 1, 2, 3, 8), _rand(rng, 1, 2, 3, 8), _rand(rng, 1, 2, 3, 8)
    model, _ = trt_model("TRT_Attention", {"Q": q, "K": k, "V": v}, causal_kind="upper_left")
    before = model.SerializeToString()
    cpu = tp.cpu_model(model)
    assert model.SerializeToString() == before
    assert [n.domain for n in model.graph.node] == ["trt"]
    assert "trt" not in {n.domain for n in cpu.graph.node}
    model.graph.node[0].attribute.append(helper.make_attribute("scale", 0.5))
    with pytest.raises(tp.TrtOpError, match="attribute 'scale' is not documented"):
        tp.cpu_model(model)


def test_package_imports_neither_torch_nor_tensorrt():
    import subprocess
    import sys

    code = ("import sys, trtattn_plugins; "
            "print(sorted(m for m in ('torch', 'tensorrt', 'onnxruntime_extensions') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_session_imports_neither_torch_nor_transformers(tmp_path):
    """onnxruntime_extensions' import runs its tokenizer converters' imports of transformers and torch (~8 s a
    process): left out; the kernels run as in a process that has them, and the protobuf setting it changes
    is put back."""
    import subprocess
    import sys

    rng = np.random.default_rng(19)
    q, k, v = _rand(rng, 1, 2, 3, 8), _rand(rng, 1, 2, 3, 8), _rand(rng, 1, 2, 3, 8)
    model, feeds = trt_model("TRT_Attention", {"Q": q, "K": k, "V": v}, causal_kind="upper_left")
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "feeds.npz", **feeds)
    code = ("import os, sys, numpy as np, onnx, trtattn_plugins as tp; "
            f"d = {str(tmp_path)!r}; "
            "y = tp.Session(onnx.load(d + '/m.onnx')).run(None, dict(np.load(d + '/feeds.npz')))[0]; "
            "np.save(d + '/y.npy', y); "
            "print(sorted(m for m in ('torch', 'transformers', 'tokenizers', 'onnxruntime_extensions') "
            "if m in sys.modules), os.environ.get('PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['onnxruntime_extensions'] None"
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), run_trt("TRT_Attention", feeds, causal_kind="upper_left"))


def test_no_warning_when_nothing_silent_happens():
    rng = np.random.default_rng(18)
    q, k, v = _rand(rng, 1, 2, 3, 8), _rand(rng, 1, 2, 3, 8), _rand(rng, 1, 2, 3, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tp.TrtOpWarning)
        y = run_trt("TRT_Attention", {"Q": q, "K": k, "V": v}, causal_kind="upper_left")
    assert not np.isnan(y).any()
