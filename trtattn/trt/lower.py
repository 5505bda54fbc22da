"""Each planned op as TensorRT layers. `trt` is the tensorrt module (or a checked stand-in in
tests), `net` the INetworkDefinition, `get(name)` returns the ITensor carrying an ONNX tensor.

Attention: Q is multiplied by the softmax scale first (IAttention has no scale attribute and
TensorRT wants the scale on Q); inputs are cast to the attention precision (TensorRT fuses these
casts: strongly typed networks choose precision by dtype); the mask is 4-D, boolean or in the
logits' dtype; packed forms reshape [1, N, T, H] <-> [T, N, H] around the layer.
"""

from __future__ import annotations

import numpy as np

from . import compat
from .plan import AttentionPlan, CacheUpdatePlan, RopePlan


def _out(layer, name: str):
    layer.name = name
    return layer.get_output(0)


def _cast(trt, net, t, dtype, name):
    if t.dtype == dtype:
        return t
    return _out(net.add_cast(t, dtype), name)


def _constant(trt, net, value: np.ndarray, name: str):
    return _out(net.add_constant(tuple(value.shape), value), name)


def _shuffle(net, t, name, first=None, reshape=None, second=None):
    layer = net.add_shuffle(t)
    if first is not None:
        layer.first_transpose = tuple(first)
    if reshape is not None:
        layer.reshape_dims = tuple(reshape)
    if second is not None:
        layer.second_transpose = tuple(second)
    return _out(layer, name)


def lower_attention(trt, net, p: AttentionPlan, get):
    base = p.layer
    q, k, v = get(p.query), get(p.key), get(p.value)
    io_dtype = q.dtype
    compute = compat.datatype(trt, compat.PRECISION_DTYPES[p.precision]) if p.precision in compat.PRECISION_DTYPES \
        else io_dtype
    if p.rank == 3:  # [B, S, N*H] -> [B, N, S, H]
        q = _shuffle(net, q, f"{base}/q_heads", reshape=(0, 0, p.q_heads, p.head_size), second=(0, 2, 1, 3))
        k = _shuffle(net, k, f"{base}/k_heads", reshape=(0, 0, p.kv_heads, p.head_size), second=(0, 2, 1, 3))
        v = _shuffle(net, v, f"{base}/v_heads", reshape=(0, 0, p.kv_heads, p.head_size), second=(0, 2, 1, 3))
    q, k, v = (_cast(trt, net, t, compute, f"{base}/{n}_cast") for t, n in ((q, "q"), (k, "k"), (v, "v")))
    if abs(p.q_scale - 1.0) > 1e-12:
        scale = _constant(trt, net, np.full((1, 1, 1, 1), p.q_scale, dtype=compat.numpy_dtype(trt, compute)), f"{base}/scale")
        q = _out(net.add_elementwise(q, scale, trt.ElementWiseOperation.PROD), f"{base}/q_scale")
    if p.form == "packed":  # [1, N, T, H] -> [T, N, H]
        q, k, v = (_shuffle(net, t, f"{base}/{n}_packed", first=(0, 2, 1, 3), reshape=(-1, heads, p.head_size))
                   for t, n, heads in ((q, "q", p.q_heads), (k, "k", p.kv_heads), (v, "v", p.kv_heads)))
    attn = compat.add_attention(trt, net, q, k, v, p.causal)
    attn.name = base
    attn.metadata = p.metadata()
    attn.decomposable = p.decomposable
    if p.mask:
        mask = get(p.mask)
        if p.mask_kind == "additive":
            if compute == trt.DataType.HALF and mask.dtype == trt.DataType.FLOAT:
                # float32's -3.4e38 "masked" values would become -inf in fp16: clamp to fp16's range first
                floor = _constant(trt, net, np.full((1, 1, 1, 1), np.finfo(np.float16).min, np.float32), f"{base}/mask_floor")
                mask = _out(net.add_elementwise(mask, floor, trt.ElementWiseOperation.MAX), f"{base}/mask_clamp")
            mask = _cast(trt, net, mask, compute, f"{base}/mask_cast")
        attn.mask = mask
    if p.form == "packed":
        attn.query_form = trt.AttentionIOForm.PACKED_NHD
        attn.key_value_form = trt.AttentionIOForm.PACKED_NHD
        lengths = _cast(trt, net, get(p.q_lengths), trt.DataType.INT32, f"{base}/lengths")
        compat.set_query_lengths(attn, lengths)
        compat.set_key_value_lengths(attn, lengths)
    elif p.kv_lengths:
        compat.set_key_value_lengths(attn, _cast(trt, net, get(p.kv_lengths), trt.DataType.INT32, f"{base}/kv_lengths"))
    y = attn.get_output(0)
    if p.form == "packed":  # [T, N, H] -> [1, N, T, H]
        y = _shuffle(net, y, f"{base}/unpacked", reshape=(1, -1, p.q_heads, p.head_size), second=(0, 2, 1, 3))
    y = _cast(trt, net, y, io_dtype, f"{base}/out_cast")
    if p.rank == 3:
        y = _shuffle(net, y, f"{base}/merge_heads", first=(0, 2, 1, 3), reshape=(0, 0, -1))
    return y


def lower_rope(trt, net, p: RopePlan, get):
    layer = net.add_rotary_embedding(get(p.input), get(p.cos), get(p.sin), p.interleaved, p.rotary_dim)
    if p.position_ids:
        layer.set_input(3, _cast(trt, net, get(p.position_ids), trt.DataType.INT32, f"trtattn/rope/{p.node}/positions"))
    return _out(layer, f"trtattn/rope/{p.node}")


def lower_cache_update(trt, net, p: CacheUpdatePlan, get):
    indices = get(p.write_indices) if p.write_indices else None
    if indices is None:
        raise ValueError(f"TensorScatter {p.node} has no write indices; IKVCacheUpdateLayer needs them")
    layer = net.add_kv_cache_update(get(p.cache), get(p.update), indices, trt.KVCacheMode.LINEAR)
    return _out(layer, f"trtattn/kv_cache/{p.node}")


LOWER = {AttentionPlan: lower_attention, RopePlan: lower_rope, CacheUpdatePlan: lower_cache_update}
