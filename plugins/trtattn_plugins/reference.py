"""What TensorRT's ONNX attention ops compute, in numpy: the one reference of their meaning.

Each function follows docs/TRT_custom_ops.md (onnx-tensorrt) and, where that doc defers to them,
TensorRT's IAttention / IKVCacheUpdateLayer docs and ONNX Attention-23. Where the docs leave the
result open the choice is explicit (plugins/README.md, "Choices"):

- a query row with no key it may attend to (kv length 0, an all-False mask, an all -inf additive
  mask, lower-right causal rows before the first key) is undefined in TensorRT's docs: it gives NaN
  (`fully_masked="nan"`, the default) so that no comparison can pass on it by accident, or zeros
  (`fully_masked="zero"`, the ONNX Attention op's convention) when asked;
- lower-right causal alignment uses each row's own lengths: j <= i + (kv_len_b - q_len_b);
- cache writes at or past the capacity are dropped, as TensorRT documents.

Arithmetic is float32 (TensorRT's fused kernels accumulate and normalise in fp32); inputs of any
float dtype are widened exactly and the result is returned as float32 for the caller to round.
Inputs that TensorRT rejects raise TrtOpError naming the input at fault.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from . import schema

F32 = np.float32


class TrtOpError(ValueError):
    """Inputs or attributes that TensorRT rejects or whose result its docs do not define."""


# ----------------------------------------------------------------------------- layouts


def _cumulative(lengths, total: int, what: str) -> np.ndarray:
    cu = np.asarray(lengths)
    if cu.ndim != 1 or cu.size < 1:
        raise TrtOpError(f"{what} must be 1-D [B+1] cumulative token counts, got shape {list(cu.shape)}")
    cu = cu.astype(np.int64)
    if cu[0] != 0 or np.any(np.diff(cu) < 0) or cu[-1] != total:
        raise TrtOpError(f"{what} {cu.tolist()} must start at 0, never decrease and end at the {total} tokens "
                         f"of the packed tensor")
    return cu


def _rows(x: np.ndarray, form: str, lengths, what: str) -> list[np.ndarray]:
    """Split a padded [B, N, S, H] or packed [T, N, H] tensor into per-row [N, S_b, H] views."""
    if form not in schema.FORMS:
        raise TrtOpError(f"{what}: form {form!r} is not one of {list(schema.FORMS)}")
    if form == "padded_bhnd":
        if x.ndim != 4:
            raise TrtOpError(f"{what} is padded_bhnd, so 4-D [B, H, N, D]; got shape {list(x.shape)}")
        return list(x)
    if x.ndim != 3:
        raise TrtOpError(f"{what} is packed_nhd, so 3-D [T, H, D]; got shape {list(x.shape)}")
    if lengths is None:
        raise TrtOpError(f"{what} is packed_nhd and needs its cumulative lengths")
    cu = _cumulative(lengths, x.shape[0], f"{what}'s lengths")
    return [x[cu[b]:cu[b + 1]].transpose(1, 0, 2) for b in range(cu.size - 1)]


def _join(rows: list[np.ndarray], form: str, like: np.ndarray) -> np.ndarray:
    if form == "padded_bhnd":
        return np.stack(rows) if rows else np.zeros(like.shape, F32)
    if not rows:
        return np.zeros(like.shape, F32)
    return np.concatenate([r.transpose(1, 0, 2) for r in rows], axis=0)


# ----------------------------------------------------------------------------- attention


def _attend(q, k, v, allowed, bias, normalization: str, probs_hook, fully_masked: str):
    """One batch row: q [Nq, Sq, H], k/v [Nkv, Skv, H]; allowed (bool) and bias (float) broadcast
    to [Nq, Sq, Skv]. Query head h reads key/value head h // (Nq / Nkv). Returns (out, dead rows)."""
    nq, nkv = q.shape[0], k.shape[0]
    k = np.repeat(k, nq // nkv, axis=0)
    v = np.repeat(v, nq // nkv, axis=0)
    logits = q @ k.transpose(0, 2, 1)
    if bias is not None:
        logits = logits + bias
    allowed = np.broadcast_to(allowed, logits.shape)
    if normalization == "softmax":
        logits = np.where(allowed, logits, F32(-np.inf))
        top = logits.max(axis=-1, keepdims=True, initial=-np.inf)
        dead = ~np.isfinite(top)
        weights = np.exp(logits - np.where(dead, F32(0), top))
        probs = weights / np.where(dead, F32(1), weights.sum(axis=-1, keepdims=True))
    else:  # "none": the masked-out products take no part (they are not keys this row may attend)
        probs = np.where(allowed, logits, F32(0))
        dead = np.zeros(logits.shape[:-1] + (1,), bool)
    if probs_hook is not None:
        probs = probs_hook(probs)
    out = (probs @ v).astype(F32)
    out = np.where(dead, F32(np.nan) if fully_masked == "nan" else F32(0), out)
    return out, int(dead.sum())


def _causal(kind: str, sq: int, skv: int) -> np.ndarray | bool:
    i = np.arange(sq)[:, None]
    j = np.arange(skv)[None, :]
    if kind == "upper_left":
        return j <= i  # IAttention CausalMaskKind: diagonal anchored at the top-left corner
    if kind == "lower_right":
        return j <= i + (skv - sq)  # anchored at the bottom-right corner
    if kind == "none":
        return True
    raise TrtOpError(f"causal_kind {kind!r} is not one of none, upper_left, lower_right")


def _mask_rows(mask, batch: int, nq: int, sq: int, skv: int, kv_lens: list[int]):
    """The mask broadcast to [B, Nq, Sq, Skv] and cut to each row's keys: (allowed, bias) per row."""
    if mask is None:
        return [(True, None)] * batch
    mask = np.asarray(mask)
    if mask.ndim > 4:
        raise TrtOpError(f"attn_mask has rank {mask.ndim}; the doc allows rank <= 4")
    try:
        full = np.broadcast_to(mask, (batch, nq, sq, skv))
    except ValueError:
        raise TrtOpError(f"attn_mask of shape {list(mask.shape)} does not broadcast to "
                         f"[B, Nq, Sq, Skv] = {[batch, nq, sq, skv]}") from None
    if mask.dtype == np.bool_:
        return [(full[b][..., :kv_lens[b]], None) for b in range(batch)]
    return [(True, full[b][..., :kv_lens[b]].astype(F32)) for b in range(batch)]


def _attention(q, k, v, mask, query_lengths, kv_lengths, *, query_form, kv_form, causal_kind,
               normalization, probs_hook, fully_masked, notes):
    if fully_masked not in ("nan", "zero"):
        raise TrtOpError(f"fully_masked must be 'nan' or 'zero', got {fully_masked!r}")
    if normalization not in ("softmax", "none"):
        raise TrtOpError(f"TRT_normalization_op {normalization!r} is not one of softmax, none")
    q, k, v = (np.asarray(x, F32) for x in (q, k, v))
    queries = _rows(q, query_form, query_lengths, "Q")
    keys = _rows(k, kv_form, kv_lengths, "K")
    values = _rows(v, kv_form, kv_lengths, "V")
    batch = len(queries)
    if len(keys) != batch:
        raise TrtOpError(f"Q holds {batch} sequences, K and V {len(keys)}")
    if k.shape != v.shape:
        raise TrtOpError(f"K {list(k.shape)} and V {list(v.shape)} differ in shape")
    nq, nkv, h = q.shape[1], k.shape[1], q.shape[-1]  # heads are axis 1 in [B, N, S, H] and [T, N, H]
    if k.shape[-1] != h:
        raise TrtOpError(f"Q head size {h} differs from K's {k.shape[-1]}")
    if nkv == 0 or nq % nkv:
        raise TrtOpError(f"{nq} query heads are not a multiple of {nkv} key/value heads (GQA needs Nq % Nkv == 0)")
    kv_lens = [kk.shape[1] for kk in keys]
    if kv_form == "padded_bhnd" and kv_lengths is not None:
        lens = np.asarray(kv_lengths)
        if lens.shape != (batch,) or np.any(lens < 0) or np.any(lens > k.shape[2]):
            raise TrtOpError(f"kv_lengths {lens.tolist()} must be [B] = [{batch}] per-row lengths within "
                             f"0..{k.shape[2]} (the padded K/V length)")
        kv_lens = [int(n) for n in lens]
    if mask is not None and query_form == "packed_nhd":
        raise TrtOpError("attn_mask is not supported when query_form is packed_nhd")
    if mask is not None and kv_form == "packed_nhd":
        raise TrtOpError("attn_mask with packed_nhd K/V: the doc does not define the mask's key axis")
    if mask is not None and causal_kind != "none":
        raise TrtOpError("attn_mask cannot be used together with a causal mask")
    masks = _mask_rows(mask, batch, nq, q.shape[2] if q.ndim == 4 else 0, k.shape[-2], kv_lens)

    outs, dead = [], 0
    for b in range(batch):
        kb, vb = keys[b][:, :kv_lens[b]], values[b][:, :kv_lens[b]]
        allowed, bias = masks[b]
        allowed = allowed & _causal(causal_kind, queries[b].shape[1], kv_lens[b])
        out, n = _attend(queries[b], kb, vb, allowed, bias, normalization, probs_hook, fully_masked)
        outs.append(out)
        dead += n
    if dead and notes is not None:
        notes.append(f"{dead} query rows attend to no key (TensorRT leaves them undefined): "
                     f"{'NaN' if fully_masked == 'nan' else 'zeros'}")
    return _join(outs, query_form, q)


def trt_attention(q, k, v, attn_mask=None, query_lengths=None, kv_lengths=None, *,
                  query_form="padded_bhnd", kv_form="padded_bhnd", causal_kind="none",
                  normalization_op="softmax", nb_rank=1, fully_masked="nan", notes=None) -> np.ndarray:
    """trt::TRT_Attention: Y = softmax(Q K^T (+ mask)) V with no scale (Q is pre-scaled), GQA,
    padded [B, N, S, H] or packed [T, N, H] forms, causal kinds and lengths. Y has Q's shape."""
    if nb_rank != 1:
        raise TrtOpError(f"nb_rank={nb_rank}: multi-device attention is not emulated on CPU")
    return _attention(q, k, v, attn_mask, query_lengths, kv_lengths, query_form=query_form, kv_form=kv_form,
                      causal_kind=causal_kind, normalization=normalization_op, probs_hook=None,
                      fully_masked=fully_masked, notes=notes)


# ----------------------------------------------------------------------------- quantized attention

FP8_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)  # 448


def quantize_dequantize(x: np.ndarray, scale: float, to_type: int) -> np.ndarray:
    """Q/DQ as TensorRT's IQuantizeLayer / IDequantizeLayer and ONNX QuantizeLinear (saturating):
    round(x / scale) to INT8 (ties to even, clamped to [-128, 127]) or FP8 E4M3 (nearest, clamped to
    +-448), then times scale."""
    y = np.asarray(x, F32) / F32(scale)
    if to_type == schema.INT8:
        q = np.clip(np.rint(y), -128, 127)
    elif to_type in (schema.FP8, schema.UNDEFINED):
        q = np.clip(y, -FP8_MAX, FP8_MAX).astype(ml_dtypes.float8_e4m3fn).astype(F32)
    else:
        raise TrtOpError(f"normalization_quantize_to_type {to_type} is neither FP8 ({schema.FP8}) nor INT8 ({schema.INT8})")
    return (q * F32(scale)).astype(F32)


def _heads_first(x: np.ndarray, heads, what: str) -> np.ndarray:
    """Attention-23's 3-D [B, S, N*H] -> [B, N, S, H] (4-D passes through)."""
    if x.ndim != 3:
        return x
    if not heads or x.shape[2] % heads:
        raise TrtOpError(f"{what} is 3-D {list(x.shape)}: Attention-23 needs its head count "
                         f"(q_num_heads / kv_num_heads) dividing {x.shape[2]}")
    b, s, hidden = x.shape
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def trt_quantized_attention(q, k, v, attn_mask=None, normalization_quantize_scale=None, query_lengths=None,
                            kv_lengths=None, *, query_form="padded_bhnd", kv_form="padded_bhnd", is_causal=0,
                            scale=None, q_num_heads=None, kv_num_heads=None,
                            normalization_quantize_to_type=schema.FP8, normalization_op="softmax",
                            fully_masked="nan", notes=None) -> np.ndarray:
    """trt::TRT_QuantizedAttention: ONNX Attention-23 (scale default 1/sqrt(head size), applied as
    sqrt(scale) on Q and on K as the parser does; is_causal is upper-left) on the dequantized Q/K/V,
    with the normalization output quantized and dequantized with normalization_quantize_scale."""
    if normalization_quantize_scale is None:
        raise TrtOpError("normalization_quantize_scale is missing (the doc lists 5-7 inputs)")
    given = np.asarray(normalization_quantize_scale, np.float64)
    if given.size != 1 or not given.reshape(-1)[0] > 0:
        raise TrtOpError(f"normalization_quantize_scale must be one positive number, got {given.tolist()}")
    s = float(given.reshape(-1)[0])
    q, k, v = (np.asarray(x, F32) for x in (q, k, v))
    three_d = query_form == "padded_bhnd" and q.ndim == 3
    if query_form == "padded_bhnd":
        q = _heads_first(q, q_num_heads, "Q")
    if kv_form == "padded_bhnd":
        k, v = _heads_first(k, kv_num_heads, "K"), _heads_first(v, kv_num_heads, "V")
    root = F32(math.sqrt(scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])))
    y = _attention(q * root, k * root, v, attn_mask, query_lengths, kv_lengths, query_form=query_form,
                   kv_form=kv_form, causal_kind="upper_left" if is_causal else "none",
                   normalization=normalization_op,
                   probs_hook=lambda p: quantize_dequantize(p, s, normalization_quantize_to_type),
                   fully_masked=fully_masked, notes=notes)
    if three_d:
        b, n, sq, h = y.shape
        y = y.transpose(0, 2, 1, 3).reshape(b, sq, n * h)
    return y


# ----------------------------------------------------------------------------- KV cache update


def trt_kv_cache_update(past_cache, update, write_indices=None, update_lengths=None, *,
                        update_form="padded_bhnd", mode="linear", axis=-2, notes=None) -> np.ndarray:
    """trt::TRT_KVCacheUpdate (linear): Y = past_cache with Y[b, :, w[b] + s, :] = row b's update[s]
    for every s with w[b] + s < capacity; writes at or past the capacity are dropped, as TensorRT
    does. Without write_indices every row writes at 0 (TensorScatter's default)."""
    if mode != "linear":
        raise TrtOpError(f"mode {mode!r}: only 'linear' is documented")
    if axis != -2:
        raise TrtOpError(f"axis {axis}: the doc requires -2")
    cache = np.asarray(past_cache, F32)
    if cache.ndim != 4:
        raise TrtOpError(f"past_cache must be 4-D [B, H, N, D], got shape {list(cache.shape)}")
    rows = _rows(np.asarray(update, F32), update_form, update_lengths, "update")
    batch, heads, capacity, size = cache.shape
    if len(rows) != batch:
        raise TrtOpError(f"past_cache holds {batch} rows, the update {len(rows)}")
    bad = [r.shape for r in rows if r.shape[0] != heads or r.shape[2] != size]
    if bad:
        raise TrtOpError(f"update heads/head size {bad[0][0]}/{bad[0][2]} differ from the cache's {heads}/{size}")
    indices = np.zeros(batch, np.int64) if write_indices is None else np.asarray(write_indices).astype(np.int64)
    if indices.shape != (batch,) or np.any(indices < 0):
        raise TrtOpError(f"write_indices {indices.tolist()} must be [B] = [{batch}] non-negative positions")
    out = cache.copy()
    dropped = 0
    for b, row in enumerate(rows):
        start = int(indices[b])
        kept = max(0, min(row.shape[1], capacity - start))
        out[b, :, start:start + kept] = row[:, :kept]
        dropped += row.shape[1] - kept
    if dropped and notes is not None:
        notes.append(f"{dropped} cache writes at or past the capacity {capacity} were dropped (as TensorRT does)")
    return out
