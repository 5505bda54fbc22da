"""Numpy reference executor for networks recorded by `checked()`.

`run(network, feeds)` evaluates the layers the builder emitted, following TensorRT's documented
semantics (include/NvInfer.h and the TensorRT developer guide; each layer cites what it follows),
and the opaque ONNX subgraph layers with ONNX Runtime (CPU). An ONNX layer is evaluated in stages
(graph.plan): sub-models extracted with onnx.utils.Extractor compute the outputs whose inputs are
available, TensorRT layers consume them, and later stages compute the outputs that needed those
values (placeholders).

Choices where TensorRT leaves behaviour open, made visible:
- IAttention rows whose every key is masked give zeros (as the ONNX Attention op and ONNX Runtime
  do) and raise a FullyMaskedRowsWarning with the count.
- IKVCacheUpdateLayer drops each write at or past max_S (NvInfer.h: "Out-of-bound updates will be
  ignored silently") and raises a DroppedCacheWritesWarning with the count.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from . import dtypes
from .errors import NotEmulatedError
from .graph import plan


class ExecutionError(RuntimeError):
    """The network cannot be evaluated with these inputs (TensorRT would fail or the result is undefined)."""


class FullyMaskedRowsWarning(UserWarning):
    pass


class DroppedCacheWritesWarning(UserWarning):
    pass


def run(network, feeds: dict, *, return_all: bool = False) -> dict[str, np.ndarray]:
    """Evaluate a recorded network. Returns the network outputs by name (every computed tensor when
    return_all). Feeds must match the network inputs' names, dtypes and static dimensions."""
    real = network._sim.real
    values: dict[int, np.ndarray] = {}
    names = {t._name for t in network._inputs}
    unknown = sorted(set(feeds) - names)
    if unknown:
        raise ExecutionError(f"feeds {unknown} are not network inputs (inputs: {sorted(names)})")
    for t in network._inputs:
        if t._name not in feeds:
            raise ExecutionError(f"network input '{t._name}' is not fed")
        values[id(t)] = _check_value(t, np.asarray(feeds[t._name]), "input")

    steps, unresolved = plan(network)
    for st, outputs in steps:
        if st.kind == "ONNX":
            results = _run_onnx(st, outputs, values)
        else:
            impl = LAYERS.get(st.kind)
            if impl is None:
                raise NotEmulatedError(f"execute: trtsim does not implement {st.kind} ('{st.name}')")
            inputs = [values[id(t)] if t is not None else None for t in st.inputs]
            results = dict(enumerate(impl(st, inputs, real)))
        for j in outputs:
            values[id(st.outputs[j])] = _check_value(st.outputs[j], results[j], f"output of {st.kind} '{st.name}'")

    missing = [t._name for t in network._outputs if id(t) not in values]
    if missing:
        waiting = [f"{st.name} outputs {[st.outputs[j]._name for j in outs]}" for st, outs in unresolved]
        raise ExecutionError(f"outputs {missing} cannot be computed; unresolved: {waiting}")
    tensors = network._outputs
    if return_all:
        tensors = list(network._inputs) + [out for st in network._layers for out in st.outputs]
    return {t._name: values[id(t)] for t in tensors if id(t) in values}


def _check_value(tensor, value: np.ndarray, what: str) -> np.ndarray:
    expected = dtypes.to_numpy(tensor._dtype)
    if value.dtype != expected:
        raise ExecutionError(f"{what} '{tensor._name}' is {value.dtype}, the network declares {tensor._dtype.name} ({expected})")
    if tensor._shape is not None:
        if value.ndim != len(tensor._shape) or any(d >= 0 and d != n for d, n in zip(tensor._shape, value.shape)):
            raise ExecutionError(f"{what} '{tensor._name}' has shape {value.shape}, the network declares {tuple(tensor._shape)}")
    return value


# --------------------------------------------------------------------------- ONNX subgraphs


def _run_onnx(st, outputs: list[int], values: dict) -> dict[int, np.ndarray]:
    """ONNX Runtime's CPU provider, or onnx's reference evaluator where it has no kernel (bf16)."""
    from trtattn.rewrite.precision import cpu_runner

    part = st.onnx
    feeds = {name: values[id(t)] for name, t in zip(part.inputs, st.inputs) if t is not None and id(t) in values}
    wanted = [part.outputs[j] for j in outputs]
    from .graph import onnx_dependencies

    deps = onnx_dependencies(part.model)
    needed = sorted(set().union(*(deps[name] for name in wanted)))
    key = (tuple(needed), tuple(wanted))
    sessions = part.__dict__.setdefault("_sessions", {})
    if key not in sessions:
        if needed == sorted(part.inputs) and wanted == part.outputs:
            model = part.model
        else:
            model = _extract(part, needed, wanted)
        sessions[key] = cpu_runner(model)[0]
    results = sessions[key]({name: feeds[name] for name in needed})
    return {j: results[name] for j, name in zip(outputs, wanted)}


def _extract(part, inputs: list[str], outputs: list[str]):
    """A sub-model computing `outputs` from graph inputs `inputs` only (onnx.utils.Extractor)."""
    from onnx.utils import Extractor

    extractor = part.__dict__.get("_extractor")
    if extractor is None:
        extractor = part.__dict__["_extractor"] = Extractor(part.model)
    return extractor.extract_model(list(inputs), list(outputs))


# --------------------------------------------------------------------------- simple layers


def _np(dtype) -> np.dtype:
    return dtypes.to_numpy(dtype)


def _constant(st, inputs, real):
    return [st.props["weights_array"].reshape(st.props["shape"]).copy()]


def _identity(st, inputs, real):
    return [inputs[0].copy()]


def _cast(st, inputs, real):
    # numpy's cast: float -> int truncates toward zero, nonzero -> True for BOOL.
    return [inputs[0].astype(_np(st.props["to_type"]))]


def _same_rank(st, *arrays):
    if len({a.ndim for a in arrays}) != 1:
        raise ExecutionError(f"{st.kind} '{st.name}': inputs of ranks {[a.ndim for a in arrays]} (TensorRT needs equal ranks)")


def _int_div(a, b):
    # C-style integer division (truncation toward zero), as ONNX Div on integers.
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) ^ (b < 0), -q, q).astype(a.dtype)


ELEMENTWISE = {
    "SUM": np.add,
    "PROD": np.multiply,
    "MAX": np.maximum,
    "MIN": np.minimum,
    "SUB": np.subtract,
    "DIV": lambda a, b: _int_div(a, b) if np.issubdtype(a.dtype, np.integer) else np.divide(a, b),
    "POW": np.power,
    "FLOOR_DIV": lambda a, b: np.floor_divide(a, b) if np.issubdtype(a.dtype, np.integer) else np.floor(a / b),
    "AND": np.logical_and,
    "OR": np.logical_or,
    "XOR": np.logical_xor,
    "EQUAL": np.equal,
    "GREATER": np.greater,
    "LESS": np.less,
}


def _elementwise(st, inputs, real):
    a, b = inputs[:2]
    _same_rank(st, a, b)
    if a.dtype != b.dtype:
        raise ExecutionError(f"{st.kind} '{st.name}': input types {a.dtype} and {b.dtype} differ")
    op = st.props["op"].name
    out = ELEMENTWISE[op](a, b)
    dtype = np.bool_ if op in ("EQUAL", "GREATER", "LESS") else a.dtype
    return [np.asarray(out).astype(dtype)]


_erf = np.vectorize(math.erf, otypes=[np.float64])
UNARY = {
    "EXP": np.exp, "LOG": np.log, "SQRT": np.sqrt, "RECIP": lambda x: 1 / x, "ABS": np.abs, "NEG": np.negative,
    "SIN": np.sin, "COS": np.cos, "TAN": np.tan, "SINH": np.sinh, "COSH": np.cosh, "ASIN": np.arcsin,
    "ACOS": np.arccos, "ATAN": np.arctan, "ASINH": np.arcsinh, "ACOSH": np.arccosh, "ATANH": np.arctanh,
    "CEIL": np.ceil, "FLOOR": np.floor, "ERF": _erf, "SIGN": np.sign,
    "ROUND": np.rint,  # NvInfer.h: "Round to nearest even for floating-point data type"
}


def _unary(st, inputs, real):
    x = inputs[0]
    op = st.props["op"].name
    if op == "NOT":
        return [np.logical_not(x)]
    if op in ("ISINF", "ISNAN"):
        return [(np.isinf if op == "ISINF" else np.isnan)(x.astype(np.float64))]
    wide = x if x.dtype.kind in "iub" else x.astype(np.float64)  # float16/bf16/fp8 computed wide
    return [np.asarray(UNARY[op](wide)).astype(x.dtype)]


def _perm(p, rank):
    return None if p is None else [int(i) for i in list(p)[:rank]]


def _shuffle(st, inputs, real):
    """IShuffleLayer: first transpose, reshape (0 = copy when zero_is_placeholder, -1 = infer), second transpose."""
    x = inputs[0]
    first = _perm(st.props.get("first_transpose"), x.ndim)
    if first is not None:
        x = np.transpose(x, first)
    if len(inputs) > 1 and inputs[1] is not None:
        dims = [int(d) for d in inputs[1].reshape(-1)]
    else:
        dims = st.props.get("reshape_dims")
        dims = None if dims is None else [int(d) for d in dims]
    if dims is not None:
        if st.props.get("zero_is_placeholder", True):
            dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
        try:
            x = x.reshape(dims)
        except ValueError as error:
            raise ExecutionError(f"IShuffleLayer '{st.name}': cannot reshape {x.shape} to {dims}") from error
    second = _perm(st.props.get("second_transpose"), x.ndim)
    if second is not None:
        x = np.transpose(x, second)
    return [np.ascontiguousarray(x)]


def _slice(st, inputs, real):
    """ISliceLayer: per sliced axis, element i is start + i * stride; inputs 1..5 override the Dims."""
    x = inputs[0]
    get = lambda i: inputs[i] if len(inputs) > i else None  # noqa: E731
    start = get(1).tolist() if get(1) is not None else list(st.props["start"])
    size = get(2).tolist() if get(2) is not None else list(st.props["shape"])
    stride = get(3).tolist() if get(3) is not None else list(st.props["stride"])
    axes = get(5).tolist() if get(5) is not None else st.props.get("axes")
    axes = list(range(x.ndim)) if axes is None else [int(a) % x.ndim for a in axes]
    mode = st.props["mode"].name
    index = [np.arange(n) for n in x.shape]
    outside = np.zeros((), dtype=bool)
    for axis, s, n, step in zip(axes, start, size, stride):
        idx = int(s) + np.arange(int(n)) * int(step)
        dim = x.shape[axis]
        bad = (idx < 0) | (idx >= dim)
        if mode == "STRICT_BOUNDS" and bad.any():
            raise ExecutionError(f"ISliceLayer '{st.name}': axis {axis} indices {idx.tolist()} leave [0, {dim})")
        if mode == "CLAMP":
            idx = np.clip(idx, 0, dim - 1)
        elif mode == "WRAP":
            idx = np.mod(idx, dim)
        elif mode == "FILL":
            shape = [1] * x.ndim
            shape[axis] = len(idx)
            outside = outside | bad.reshape(shape)
            idx = np.clip(idx, 0, max(dim - 1, 0))
        elif mode != "STRICT_BOUNDS":
            raise NotEmulatedError(f"ISliceLayer mode {mode}")
        index[axis] = idx
    out = x[np.ix_(*index)]
    if mode == "FILL":
        fill = get(4).reshape(()) if get(4) is not None else np.zeros((), x.dtype)
        out = np.where(outside, fill, out).astype(x.dtype)
    return [out]


def _concatenation(st, inputs, real):
    return [np.concatenate(inputs, axis=st.props["axis"])]


def _select(st, inputs, real):
    cond, a, b = inputs
    _same_rank(st, cond, a, b)
    return [np.where(cond, a, b).astype(a.dtype)]


def _shape(st, inputs, real):
    return [np.array(inputs[0].shape, dtype=np.int64)]


def _gather(st, inputs, real):
    """IGatherLayer DEFAULT / ELEMENT; negative indices count from the end; "Zero will be stored for OOB access"."""
    data, indices = inputs[0], inputs[1].astype(np.int64)
    mode = st.props["mode"].name
    axis = st.props["axis"]
    dim = data.shape[axis]
    idx = np.where(indices < 0, indices + dim, indices)
    oob = (idx < 0) | (idx >= dim)
    safe = np.where(oob, 0, idx)
    if mode == "ELEMENT":
        out = np.take_along_axis(data, safe, axis)
        return [np.where(oob, np.zeros((), data.dtype), out)]
    if mode != "DEFAULT":
        raise NotEmulatedError(f"IGatherLayer mode {mode}")
    if st.props.get("num_elementwise_dims", 0) == 1:
        batch = max(data.shape[0], idx.shape[0])
        parts = [_gather_default(data[b % data.shape[0]], safe[b % idx.shape[0]], oob[b % idx.shape[0]], axis - 1)
                 for b in range(batch)]
        return [np.stack(parts)]
    return [_gather_default(data, safe, oob, axis)]


def _gather_default(data, safe, oob, axis):
    out = np.take(data, safe, axis=axis)
    mask = oob.reshape((1,) * axis + oob.shape + (1,) * (data.ndim - axis - 1))
    return np.where(mask, np.zeros((), data.dtype), out)


def _unsqueeze(st, inputs, real):
    x, axes = inputs[0], [int(a) for a in inputs[1].reshape(-1)]
    rank = x.ndim + len(axes)
    return [np.expand_dims(x, tuple(sorted(a % rank for a in axes)))]


def _squeeze(st, inputs, real):
    x = inputs[0]
    if len(inputs) > 1 and inputs[1] is not None:
        axes = tuple(int(a) % x.ndim for a in inputs[1].reshape(-1))
    else:
        axes = tuple(i for i, n in enumerate(x.shape) if n == 1)
    return [np.squeeze(x, axis=axes)]


# --------------------------------------------------------------------------- quantization


def _expand_scale(st, scale: np.ndarray, shape) -> np.ndarray:
    """Per-tensor (scalar), per-axis (1-D along `axis`) or block (same rank, repeated per block)."""
    scale = scale.astype(np.float64)
    if scale.size == 1:
        return scale.reshape(())
    if scale.ndim == 1:
        axis = st.props.get("axis")
        if axis is None:
            raise NotEmulatedError(f"{st.kind} '{st.name}': a 1-D scale needs the `axis` property set")
        view = [1] * len(shape)
        view[axis] = scale.size
        return scale.reshape(view)
    if scale.ndim == len(shape):
        for d, (n, s) in enumerate(zip(shape, scale.shape)):
            if s != n:
                scale = np.repeat(scale, n // s, axis=d)
        return scale
    raise ExecutionError(f"{st.kind} '{st.name}': scale of shape {scale.shape} does not fit input {tuple(shape)}")


# IQuantizeLayer: output = clamp(round(input / scale)), ties to even; clamp ranges from NvInfer.h.
QUANT_RANGE = {"INT8": (-128, 127, True), "FP8": (-448, 448, False), "INT4": (-8, 7, True), "FP4": (-6, 6, False)}


def quantize(x: np.ndarray, scale: np.ndarray, to_type: str) -> np.ndarray:
    lo, hi, integer = QUANT_RANGE[to_type]
    y = x.astype(np.float64) / scale
    if integer:
        y = np.rint(y)
    return np.clip(y, lo, hi).astype(dtypes.NUMPY[to_type])


def _quantize(st, inputs, real):
    x, scale = inputs[0], inputs[1]
    if len(inputs) > 2 and inputs[2] is not None and np.any(inputs[2].astype(np.float64) != 0):
        raise ExecutionError(f"IQuantizeLayer '{st.name}': only zero zero-points are supported (symmetric quantization)")
    return [quantize(x, _expand_scale(st, scale, x.shape), st.props["to_type"].name)]


def _dequantize(st, inputs, real):
    x, scale = inputs[0], inputs[1]
    y = x.astype(np.float64) * _expand_scale(st, scale, x.shape)
    return [y.astype(_np(st.props["to_type"]))]


# --------------------------------------------------------------------------- attention


def _cumulative(lengths: np.ndarray, total: int, what: str) -> np.ndarray:
    cu = np.asarray(lengths).astype(np.int64).reshape(-1)
    if cu.size < 1 or cu[0] != 0 or np.any(np.diff(cu) < 0) or cu[-1] > total:
        raise ExecutionError(f"{what} {cu.tolist()} must start at 0, not decrease and end at most at {total} "
                             f"(NvInfer.h: cumulative [B+1])")
    return cu


def sdpa(q, k, v, causal: str, mask=None, probs_qdq=None):
    """Attention for one batch element: q [Nq, Sq, H], k/v [Nkv, Skv, H], mask broadcastable to
    [Nq, Sq, Skv] (bool: True = attend; float: added). No scale: TensorRT needs Q pre-scaled.
    Query head h uses key/value head h // (Nq / Nkv). Returns (out [Nq, Sq, H], fully masked rows)."""
    nq, sq, _ = q.shape
    nkv, skv, _ = k.shape
    if nq % nkv:
        raise ExecutionError(f"IAttention: {nq} query heads are not a multiple of {nkv} key/value heads")
    k = np.repeat(k, nq // nkv, axis=0)
    v = np.repeat(v, nq // nkv, axis=0)
    logits = q @ k.transpose(0, 2, 1)
    allowed = np.ones(logits.shape, dtype=bool)
    i = np.arange(sq)[:, None]
    j = np.arange(skv)[None, :]
    if causal == "UPPER_LEFT":
        allowed &= j <= i  # NvInfer.h CausalMaskKind: diagonal anchored at the top-left corner
    elif causal == "LOWER_RIGHT":
        allowed &= j <= i + (skv - sq)  # anchored at the bottom-right: j <= i + (s_kv - s_q)
    if mask is not None:
        if mask.dtype == np.bool_:
            allowed &= mask
        else:
            logits = logits + mask.astype(np.float64)
    logits = np.where(allowed, logits, -np.inf)
    if skv == 0:
        return np.zeros(q.shape[:2] + (v.shape[2],)), nq * sq
    top = logits.max(axis=-1, keepdims=True)
    dead = ~np.isfinite(top)
    weights = np.exp(logits - np.where(dead, 0.0, top))
    total = weights.sum(axis=-1, keepdims=True)
    probs = np.where(dead, 0.0, weights / np.where(dead, 1.0, total))
    if probs_qdq is not None:
        probs = probs_qdq(probs)
    return probs @ v, int(dead.sum())


def _attention(st, inputs, real):
    """IAttention (NvInfer.h): softmax(Q K^T (+ mask)) V with forms, lengths, causal kinds and GQA."""
    attention = st.attention
    props = attention._props
    q, k, v, mask, norm_scale, q_lengths, kv_lengths = (list(inputs) + [None] * 7)[:7]
    if props["norm_op"].name != "SOFTMAX":
        raise NotEmulatedError(f"IAttention norm_op {props['norm_op'].name}")
    causal = props["causal_kind"].name
    if mask is not None and causal != "NONE":
        raise ExecutionError(f"IAttention '{attention._name}': a mask together with causal_kind {causal} fails validation")
    q_packed = props["query_form"].name == "PACKED_NHD"
    kv_packed = props["key_value_form"].name == "PACKED_NHD"
    if mask is not None and (q_packed or kv_packed):
        raise NotEmulatedError("IAttention masks with PACKED_NHD forms (the mask layout is not documented)")
    probs_qdq = None
    if norm_scale is not None:
        # Softmax output quantized to normalization_quantize_to_type and back, as the fused kernel would.
        to_type = props["normalization_quantize_to_type"].name
        s = float(norm_scale.astype(np.float64).reshape(-1)[0])
        probs_qdq = lambda p: quantize(p, s, to_type).astype(np.float64) * s  # noqa: E731

    wide = [a.astype(np.float64) for a in (q, k, v)]
    if q_packed:
        if q_lengths is None:
            raise ExecutionError(f"IAttention '{attention._name}': PACKED_NHD query needs query_lengths")
        cu_q = _cumulative(q_lengths, q.shape[0], "query_lengths")
        queries = [wide[0][cu_q[b]:cu_q[b + 1]].transpose(1, 0, 2) for b in range(len(cu_q) - 1)]
    else:
        queries = list(wide[0])
    batch = len(queries)
    if kv_packed:
        if kv_lengths is None:
            raise ExecutionError(f"IAttention '{attention._name}': PACKED_NHD key/value need key_value_lengths")
        cu = _cumulative(kv_lengths, k.shape[0], "key_value_lengths")
        if len(cu) != batch + 1:
            raise ExecutionError(f"key_value_lengths has {len(cu) - 1} sequences, the query {batch}")
        keys = [wide[1][cu[b]:cu[b + 1]].transpose(1, 0, 2) for b in range(batch)]
        values = [wide[2][cu[b]:cu[b + 1]].transpose(1, 0, 2) for b in range(batch)]
    else:
        if k.shape[0] != batch:
            raise ExecutionError(f"key/value batch {k.shape[0]} differs from the query's {batch}")
        lengths = [k.shape[2]] * batch
        if kv_lengths is not None:
            # Padded: per-batch lengths [B]; keys beyond the length are ignored.
            lengths = [int(n) for n in kv_lengths.reshape(-1)]
            if len(lengths) != batch or any(not 0 <= n <= k.shape[2] for n in lengths):
                raise ExecutionError(f"key_value_lengths {lengths} must be [B] with 0 <= length <= {k.shape[2]}")
        keys = [wide[1][b][:, :lengths[b]] for b in range(batch)]
        values = [wide[2][b][:, :lengths[b]] for b in range(batch)]
    masks = [None] * batch
    if mask is not None:
        sq, skv = q.shape[2], k.shape[2]
        try:
            full = np.broadcast_to(mask, (batch, q.shape[1], sq, skv))
        except ValueError as error:
            raise ExecutionError(f"mask {mask.shape} does not broadcast to [B, Nq, Sq, Skv] = {(batch, q.shape[1], sq, skv)}") from error
        masks = [full[b][:, :, :keys[b].shape[1]] for b in range(batch)]

    outs, dead = [], 0
    for b in range(batch):
        out, n = sdpa(queries[b], keys[b], values[b], causal, masks[b], probs_qdq)
        outs.append(out)
        dead += n
    if dead:
        warnings.warn(f"IAttention '{attention._name}': {dead} query rows attend to no key; trtsim outputs zeros "
                      f"for them (TensorRT does not document this case)", FullyMaskedRowsWarning, stacklevel=2)
    if q_packed:
        result = np.concatenate([o.transpose(1, 0, 2) for o in outs], axis=0) if outs else np.zeros_like(wide[0])
        if result.shape[0] < q.shape[0]:  # tokens past the last length are padding
            result = np.concatenate([result, np.zeros((q.shape[0] - result.shape[0],) + result.shape[1:])])
    else:
        result = np.stack(outs)
    return [result.astype(q.dtype)]


# --------------------------------------------------------------------------- KV cache and RoPE


def _kv_cache_update(st, inputs, real):
    """IKVCacheUpdateLayer LINEAR: output[b, :, w[b] + s, :] = update[b, :, s, :]; the output is the cache."""
    cache, update, write_indices = inputs[:3]
    update_lengths = inputs[3] if len(inputs) > 3 else None
    if cache.dtype != update.dtype:
        raise ExecutionError(f"IKVCacheUpdateLayer '{st.name}': cache {cache.dtype} and update {update.dtype} differ")
    batch, _, max_s, _ = cache.shape
    if st.props["update_form"].name == "PACKED_NHD":
        if update_lengths is None:
            raise ExecutionError(f"IKVCacheUpdateLayer '{st.name}': PACKED_NHD update needs update_lengths")
        cu = _cumulative(update_lengths, update.shape[0], "update_lengths")
        updates = [update[cu[b]:cu[b + 1]].transpose(1, 0, 2) for b in range(len(cu) - 1)]
    else:
        updates = list(update)
    indices = [int(i) for i in write_indices.reshape(-1)]
    if len(updates) != batch or len(indices) != batch:
        raise ExecutionError(f"IKVCacheUpdateLayer '{st.name}': cache batch {batch}, update batch {len(updates)}, "
                             f"write_indices {len(indices)}")
    out = cache.copy()
    dropped = 0
    for b in range(batch):
        if indices[b] < 0:
            raise ExecutionError(f"IKVCacheUpdateLayer '{st.name}': negative write index {indices[b]}")
        positions = indices[b] + np.arange(updates[b].shape[1])
        keep = positions < max_s
        dropped += int((~keep).sum())
        out[b][:, positions[keep], :] = updates[b][:, keep, :]
    if dropped:
        warnings.warn(f"IKVCacheUpdateLayer '{st.name}': {dropped} writes at or past max_S={max_s} dropped",
                      DroppedCacheWritesWarning, stacklevel=2)
    return [out]


def rotate(x, cos, sin, interleaved: bool, rotary_dim: int):
    """RoPE on the last axis: the first rotary_dim channels rotate, the rest pass through.
    cos/sin broadcast against x[..., :rotary_dim // 2]."""
    half = rotary_dim // 2
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]  # adjacent pairs (GPT-J)
    else:
        x1, x2 = rot[..., :half], rot[..., half:]  # halves (HF rotate_half)
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if interleaved:
        rotated = np.stack([o1, o2], axis=-1).reshape(rot.shape)
    else:
        rotated = np.concatenate([o1, o2], axis=-1)
    return np.concatenate([rotated, rest], axis=-1)


def _rotary_embedding(st, inputs, real):
    """IRotaryEmbeddingLayer: input [B, N, S, H] (or packed [T, N, H]); cos/sin [B, S, R/2] without
    position ids, [max_pos, R/2] with position ids [B, S] (packed: [T]) set as input 3."""
    x, cos, sin = inputs[:3]
    position_ids = inputs[3] if len(inputs) > 3 else None
    head = x.shape[-1]
    rotary_dim = st.props["rotary_embedding_dim"] or head
    if rotary_dim > head or rotary_dim % 2:
        raise ExecutionError(f"IRotaryEmbeddingLayer '{st.name}': rotary_embedding_dim {rotary_dim} vs head size {head}")
    packed = x.ndim == 3
    wide_cos, wide_sin = cos.astype(np.float64), sin.astype(np.float64)
    if position_ids is not None:
        ids = position_ids.astype(np.int64)
        if ids.min(initial=0) < 0 or ids.max(initial=0) >= cos.shape[0]:
            raise ExecutionError(f"IRotaryEmbeddingLayer '{st.name}': position ids outside [0, {cos.shape[0]})")
        wide_cos, wide_sin = wide_cos[ids], wide_sin[ids]  # [B, S, R/2] or packed [T, R/2]
    elif packed:
        raise NotEmulatedError("IRotaryEmbeddingLayer with a packed input and no position ids (cos/sin layout not documented)")
    if wide_cos.shape[-1] != rotary_dim // 2:
        raise ExecutionError(f"IRotaryEmbeddingLayer '{st.name}': cos/sin last dimension {wide_cos.shape[-1]} != {rotary_dim // 2}")
    # Broadcast over heads: padded [B, 1, S, R/2], packed [T, 1, R/2].
    axis = 1
    out = rotate(x.astype(np.float64), np.expand_dims(wide_cos, axis), np.expand_dims(wide_sin, axis),
                 st.props["interleaved"], rotary_dim)
    return [out.astype(x.dtype)]


LAYERS = {
    "IConstantLayer": _constant,
    "IIdentityLayer": _identity,
    "ICastLayer": _cast,
    "IElementWiseLayer": _elementwise,
    "IUnaryLayer": _unary,
    "IShuffleLayer": _shuffle,
    "ISliceLayer": _slice,
    "IConcatenationLayer": _concatenation,
    "ISelectLayer": _select,
    "IShapeLayer": _shape,
    "IGatherLayer": _gather,
    "IUnsqueezeLayer": _unsqueeze,
    "ISqueezeLayer": _squeeze,
    "IQuantizeLayer": _quantize,
    "IDequantizeLayer": _dequantize,
    "IAttentionInputLayer": _attention,
    "IAttentionOutputLayer": _identity,
    "IKVCacheUpdateLayer": _kv_cache_update,
    "IRotaryEmbeddingLayer": _rotary_embedding,
}

__all__ = ["run", "ExecutionError", "FullyMaskedRowsWarning", "DroppedCacheWritesWarning", "sdpa", "rotate", "quantize"]
