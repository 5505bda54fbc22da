"""Each planned op as TensorRT layers. `trt` is the tensorrt module (or a checked stand-in in
tests), `net` the INetworkDefinition, `get(name)` returns the ITensor carrying an ONNX tensor.

Attention computes in the form's dtype (strongly typed networks run each layer in its tensors' types;
the whole-model conversion chose it): Q, K and V enter as they are, nothing is cast that need not be.
Q is multiplied by the softmax scale first (IAttention has no scale attribute; TensorRT wants it on Q),
by a constant in Q's dtype: fp32/fp16 constants are numpy arrays, a bf16 one is an fp32 constant cast to
BF16 (the bindings make Weights only from float32/float16/int/bool arrays; TensorRT folds the cast).
An additive mask is in the logits' dtype (an fp32 mask feeding fp16 attention is clamped to fp16's range
first, so finfo(float32).min does not become -inf); packed forms reshape [1, N, T, H] <-> [T, N, H]
around the layer; a quantized site sets the normalization quantize type and scale of its softmax Q/DQ.
"""

from __future__ import annotations

import numpy as np

from ..errors import TrtattnError
from ..graph.precision import NUMPY_NAMES
from . import compat
from .plan import AttentionPlan, CacheUpdatePlan, CollectivePlan, RopePlan


def _out(layer, name: str):
    layer.name = name
    return layer.get_output(0)


def _cast(trt, net, t, dtype, name):
    if t.dtype == dtype:
        return t
    return _out(net.add_cast(t, dtype), name)


def _constant(trt, net, value: np.ndarray, name: str):
    return _out(net.add_constant(tuple(value.shape), value), name)


def scalar(trt, net, value: float, dtype, name: str, rank: int = 4):
    """A [1]*rank constant of `dtype` (trt.DataType): float32/float16 directly, bf16 through a cast."""
    shape = (1,) * rank
    if dtype == trt.DataType.HALF:
        return _constant(trt, net, np.full(shape, value, np.float16), name)
    const = _constant(trt, net, np.full(shape, value, np.float32), name)
    return _cast(trt, net, const, dtype, f"{name}/cast")


def _shuffle(net, t, name, first=None, reshape=None, second=None):
    layer = net.add_shuffle(t)
    if first is not None:
        layer.first_transpose = tuple(first)
    if reshape is not None:
        layer.reshape_dims = tuple(reshape)
    if second is not None:
        layer.second_transpose = tuple(second)
    return _out(layer, name)


def _packed(net, t, name, head_size):
    """[1, N, T, H] -> [T, N, H]. (A site fused with batch and heads merged carries [N, 1, T, H]: the two
    leading axes are merged either way.)"""
    return _shuffle(net, t, name, first=(2, 0, 1, 3), reshape=(0, -1, head_size))


def _lengths(trt, net, t, name):
    """INT32 lengths in a tensor of their own (TensorRT crashed when one tensor fed both lengths)."""
    t = _cast(trt, net, t, trt.DataType.INT32, f"{name}_int32")
    return _out(net.add_identity(t), name)


def lower_attention(trt, net, p: AttentionPlan, get):
    base = p.layer
    q, k, v = get(p.query), get(p.key), get(p.value)
    # the dtype the form's Attention computes in; a quantized site computes in its dequantized inputs' type
    compute = q.dtype if p.normalization_quantize_to_type else compat.datatype(trt, NUMPY_NAMES[p.dtype])
    if p.normalization_quantize_to_type and (k.dtype != compute or v.dtype != compute):
        raise TrtattnError(f"{p.site}: quantized query {q.dtype}, key {k.dtype} and value {v.dtype} must share one "
                           "dtype (IAttention computes in its query's)")
    # a boundary tensor of another dtype (fp32 caches of an fp16 model) is cast, as the form's Attention reads it
    q, k, v = (_cast(trt, net, t, compute, f"{base}/{n}_{p.dtype}") for t, n in ((q, "q"), (k, "k"), (v, "v")))
    if p.rank == 3:  # [B, S, N*H] -> [B, N, S, H]
        q = _shuffle(net, q, f"{base}/q_heads", reshape=(0, 0, p.q_heads, p.head_size), second=(0, 2, 1, 3))
        k = _shuffle(net, k, f"{base}/k_heads", reshape=(0, 0, p.kv_heads, p.head_size), second=(0, 2, 1, 3))
        v = _shuffle(net, v, f"{base}/v_heads", reshape=(0, 0, p.kv_heads, -1), second=(0, 2, 1, 3))  # V's own H
    if abs(p.q_scale - 1.0) > 1e-12:
        scale = scalar(trt, net, p.q_scale, compute, f"{base}/scale")
        q = _out(net.add_elementwise(q, scale, trt.ElementWiseOperation.PROD), f"{base}/q_scale")
    if p.query_form == "packed":
        q = _packed(net, q, f"{base}/q_packed", p.head_size)
    if p.kv_form == "packed":
        k, v = (_packed(net, t, f"{base}/{n}_packed", p.head_size) for t, n in ((k, "k"), (v, "v")))
    attn = compat.add_attention(trt, net, q, k, v, p.causal)
    attn.name = base
    attn.metadata = p.metadata()
    attn.decomposable = p.decomposable
    if p.mask:
        attn.mask = _mask(trt, net, get(p.mask), p.mask_kind, compute, base)
    if p.query_form == "packed":
        attn.query_form = trt.AttentionIOForm.PACKED_NHD
        compat.set_query_lengths(attn, _lengths(trt, net, get(p.q_lengths), f"{base}/q_lengths"))
    if p.kv_form == "packed":
        attn.key_value_form = trt.AttentionIOForm.PACKED_NHD
    if p.kv_lengths:
        compat.set_key_value_lengths(attn, _lengths(trt, net, get(p.kv_lengths), f"{base}/kv_lengths"))
    if p.normalization_quantize_to_type:
        attn.normalization_quantize_to_type = compat.datatype(trt, p.normalization_quantize_to_type)
        attn.normalization_quantize_scale = _constant(
            trt, net, np.asarray(p.normalization_quantize_scale, np.float32), f"{base}/normalization_quantize_scale")
    y = attn.get_output(0)
    if p.query_form == "packed":  # [T, N, H] -> [1, N, T, H] (or [N, 1, T, H]: q_heads is the form's axis 1)
        y = _shuffle(net, y, f"{base}/unpacked", reshape=(0, -1, p.q_heads, p.head_size), second=(1, 2, 0, 3))
    if p.rank == 3:
        y = _shuffle(net, y, f"{base}/merge_heads", first=(0, 2, 1, 3), reshape=(0, 0, -1))
    return y


def _mask(trt, net, mask, kind: str, compute, base: str):
    if kind != "additive" or mask.dtype == compute:
        return mask
    if compute == trt.DataType.HALF and mask.dtype == trt.DataType.FLOAT:
        # float32's -3.4e38 "masked" values would become -inf in fp16: clamp to fp16's range first
        floor = _constant(trt, net, np.full((1, 1, 1, 1), np.finfo(np.float16).min, np.float32), f"{base}/mask_floor")
        mask = _out(net.add_elementwise(mask, floor, trt.ElementWiseOperation.MAX), f"{base}/mask_clamp")
    return _cast(trt, net, mask, compute, f"{base}/mask_cast")


def lower_rope(trt, net, p: RopePlan, get):
    base = f"trtattn/rope/{p.node}"
    x = get(p.input)
    if p.num_heads:  # [B, S, N*H] -> [B, N, S, H]: the layer reads a 3-D input as packed [T, N, H]
        x = _shuffle(net, x, f"{base}/heads", reshape=(0, 0, p.num_heads, -1), second=(0, 2, 1, 3))
    layer = net.add_rotary_embedding(x, get(p.cos), get(p.sin), p.interleaved, p.rotary_dim)
    if p.position_ids:
        layer.set_input(3, _cast(trt, net, get(p.position_ids), trt.DataType.INT32, f"{base}/positions"))
    y = _out(layer, base)
    if p.num_heads:
        y = _shuffle(net, y, f"{base}/merge_heads", first=(0, 2, 1, 3), reshape=(0, 0, -1))
    return y


def lower_cache_update(trt, net, p: CacheUpdatePlan, get):
    if not p.write_indices:
        raise TrtattnError(f"cache update {p.node} has no write indices; IKVCacheUpdateLayer needs them")
    cache, update = get(p.cache), get(p.update)
    if p.update_form == "packed":  # [1, N, T, H] -> [T, N, H]
        update = _packed(net, update, f"trtattn/kv_cache/{p.node}/packed", cache.shape[3])
    layer = net.add_kv_cache_update(cache, update, get(p.write_indices), trt.KVCacheMode.LINEAR)  # INT32 or INT64
    if p.update_form == "packed":
        layer.update_form = trt.AttentionIOForm.PACKED_NHD
        compat.set_update_lengths(layer, _lengths(trt, net, get(p.update_lengths), f"trtattn/kv_cache/{p.node}/lengths"))
    return _out(layer, f"trtattn/kv_cache/{p.node}")


def lower_collective(trt, net, p: CollectivePlan, get):
    """IDistCollectiveLayer over all `p.ranks` ranks. ALL_REDUCE sums; ALL_GATHER stacks the ranks' tensors
    along the first axis (NCCL's rank-major buffer; num_ranks gives TensorRT the output shape), so a
    gather along another axis is moved there and back by shuffles."""
    x = get(p.input)
    base = f"trtattn/dist/{p.node}"
    groups = list(range(p.ranks))
    if p.kind == "ALL_REDUCE":
        layer = net.add_dist_collective(x, trt.CollectiveOperation.ALL_REDUCE, trt.ReduceOperation.SUM, 0, groups)
        layer.num_ranks = p.ranks
        return _out(layer, base)
    if p.kind != "ALL_GATHER":
        raise TrtattnError(f"collective {p.node}: {p.kind} is not lowered (ALL_REDUCE, ALL_GATHER)")
    rank = len(x.shape)
    axis = p.axis % rank
    perm = [axis] + [i for i in range(rank) if i != axis]
    front = _shuffle(net, x, f"{base}/front", first=perm) if axis else x
    layer = net.add_dist_collective(front, trt.CollectiveOperation.ALL_GATHER, trt.ReduceOperation.NONE, 0, groups)
    layer.num_ranks = p.ranks
    gathered = _out(layer, base)  # [ranks * d_axis, ...rest]: rank-major, so the slices are in order
    if not axis:
        return gathered
    back = [perm.index(i) for i in range(rank)]
    return _shuffle(net, gathered, f"{base}/back", first=back)


LOWER = {AttentionPlan: lower_attention, RopePlan: lower_rope, CacheUpdatePlan: lower_cache_update,
         CollectivePlan: lower_collective}
