"""Numpy reference executor for networks recorded by `checked()`.

`run(network, feeds)` evaluates the layers the builder emitted, following TensorRT's documented
semantics (include/NvInfer.h and the TensorRT developer guide; each layer cites what it follows),
and the opaque ONNX subgraph layers with ONNX Runtime (CPU). An ONNX layer is evaluated in stages
(graph.plan): sub-models extracted with onnx.utils.Extractor compute the outputs whose inputs are
available, TensorRT layers consume them, and later stages compute the outputs that needed those
values (placeholders).

IAttention and IKVCacheUpdateLayer follow trtattn_plugins.reference (plugins/), the one numpy home of what
TensorRT's attention ops mean; trtsim only maps the layers' properties onto it. Choices where TensorRT leaves
behaviour open, made visible:
- IAttention rows whose every key is masked give zeros (as the ONNX Attention op and ONNX Runtime
  do) and raise a FullyMaskedRowsWarning with the count.
- IKVCacheUpdateLayer drops each write at or past max_S (NvInfer.h: "Out-of-bound updates will be
  ignored silently") and raises a DroppedCacheWritesWarning with the count.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from . import dtypes, qdq
from .errors import ExecutionError, NotEmulatedError
from .graph import plan


class FullyMaskedRowsWarning(UserWarning):
    pass


class DroppedCacheWritesWarning(UserWarning):
    pass


def run(network, feeds: dict, *, return_all: bool = False) -> dict[str, np.ndarray]:
    """Evaluate a recorded network. Returns the network outputs by name (every computed tensor when
    return_all). Feeds must match the network inputs' names, dtypes and static dimensions."""
    return run_ranks([network], [feeds], return_all=return_all)[0]


def run_ranks(networks: list, feeds: list[dict], *, return_all: bool = False) -> list[dict[str, np.ndarray]]:
    """Evaluate the networks of one rank set (rank r is networks[r]) in lockstep: every layer on every
    rank, and each IDistCollectiveLayer over the ranks' inputs together (NCCL's semantics: ALL_REDUCE
    the elementwise reduction, the same on every rank; ALL_GATHER the ranks' tensors stacked along the
    first axis in rank order). One network is a set of one rank."""
    values = [_fed(net, f) for net, f in zip(networks, feeds)]
    plans = [plan(net) for net in networks]
    if len({tuple((st.kind, tuple(outs)) for st, outs in p[0]) for p in plans}) > 1:
        raise ExecutionError("the ranks' networks differ in their layers: not one rank set")
    for k, (first, outputs) in enumerate(plans[0][0]):
        if first.kind == "IDistCollectiveLayer":
            states = [p[0][k][0] for p in plans]
            result = _dist_collective(states, [v[id(st.inputs[0])] for st, v in zip(states, values)])
            for st, v in zip(states, values):
                v[id(st.outputs[0])] = _check_value(st.outputs[0], result, f"output of IDistCollectiveLayer '{st.name}'")
            continue
        for p, v in zip(plans, values):
            _step(p[0][k][0], outputs, v, p[0][k][0].net._sim.real)
    return [_outputs(net, v, p[1], return_all) for net, v, p in zip(networks, values, plans)]


def _fed(network, feeds: dict) -> dict[int, np.ndarray]:
    values: dict[int, np.ndarray] = {}
    names = {t._name for t in network._inputs}
    unknown = sorted(set(feeds) - names)
    if unknown:
        raise ExecutionError(f"feeds {unknown} are not network inputs (inputs: {sorted(names)})")
    for t in network._inputs:
        if t._name not in feeds:
            raise ExecutionError(f"network input '{t._name}' is not fed")
        values[id(t)] = _check_value(t, np.asarray(feeds[t._name]), "input")
    return values


def _step(st, outputs: list[int], values: dict, real) -> None:
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


def _outputs(network, values: dict, unresolved, return_all: bool) -> dict[str, np.ndarray]:
    missing = [t._name for t in network._outputs if id(t) not in values]
    if missing:
        waiting = [f"{st.name} outputs {[st.outputs[j]._name for j in outs]}" for st, outs in unresolved]
        raise ExecutionError(f"outputs {missing} cannot be computed; unresolved: {waiting}")
    tensors = network._outputs
    if return_all:
        tensors = list(network._inputs) + [out for st in network._layers for out in st.outputs]
    return {t._name: values[id(t)] for t in tensors if id(t) in values}


def _dist_collective(states: list, inputs: list[np.ndarray]) -> np.ndarray:
    """IDistCollectiveLayer over the ranks (states[r] is rank r's layer): each layer's num_ranks must be
    the ranks present."""
    st = states[0]
    op = st.props["dist_collective_op"].name
    for s in states:  # ALL_GATHER's shape needs num_ranks; ALL_REDUCE may leave it at its default
        ranks = int(s.props.get("num_ranks", 1))
        if ranks != len(states) and not (op == "ALL_REDUCE" and ranks == 1):
            raise ExecutionError(f"IDistCollectiveLayer '{s.name}': num_ranks {ranks} for {len(states)} ranks")
    if op == "ALL_REDUCE":
        reduce = st.props["reduce_op"].name
        wide = [x.astype(np.float64) if x.dtype.kind == "f" else x for x in inputs]
        combine = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}.get(reduce)
        if combine is None and reduce != "AVG":
            raise NotEmulatedError(f"ALL_REDUCE with {reduce}")
        total = wide[0]
        for x in wide[1:]:
            total = (combine or np.add)(total, x)
        if reduce == "AVG":
            total = total / len(inputs)
        return np.asarray(total).astype(inputs[0].dtype)
    if op == "ALL_GATHER":
        return np.concatenate(inputs, axis=0)
    raise NotEmulatedError(f"execute: the {op} collective")


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


# IAttention and IKVCacheUpdateLayer mean what TensorRT's own ONNX ops TRT_Attention, TRT_QuantizedAttention and
# TRT_KVCacheUpdate mean: plugins/trtattn_plugins/reference.py is the one home of that meaning. trtsim maps the
# layers' properties onto it and gives rows that attend to no key zeros (as the ONNX Attention op does), with a
# warning, where TensorRT documents nothing.
FORMS = {"PADDED_BHND": "padded_bhnd", "PACKED_NHD": "packed_nhd"}
QUANTIZE_TO = {"FP8": 17, "INT8": 3}  # normalization_quantize_to_type as the reference takes it (ONNX types)


def _reference(call, name: str, **kwargs):
    from trtattn_plugins import reference

    notes: list[str] = []
    try:
        return getattr(reference, call)(**kwargs, notes=notes), notes
    except reference.TrtOpError as error:
        raise ExecutionError(f"{name}: {error}") from None


def _attention(st, inputs, real):
    """IAttention (NvInfer.h): softmax(Q K^T (+ mask)) V with forms, lengths, causal kinds, GQA and the
    normalization quantize of its softmax output."""
    attention = st.attention
    props = attention._props
    q, k, v, mask, norm_scale, q_lengths, kv_lengths = (list(inputs) + [None] * 7)[:7]
    if props["norm_op"].name != "SOFTMAX":
        raise NotEmulatedError(f"IAttention norm_op {props['norm_op'].name}")
    causal = props["causal_kind"].name
    if mask is not None and causal != "NONE":
        raise ExecutionError(f"IAttention '{attention._name}': a mask together with causal_kind {causal} fails validation")
    forms = {"query_form": FORMS[props["query_form"].name], "kv_form": FORMS[props["key_value_form"].name]}
    if mask is not None and "packed_nhd" in forms.values():
        raise NotEmulatedError("IAttention masks with PACKED_NHD forms (the mask layout is not documented)")
    common = dict(q=q, k=k, v=v, attn_mask=mask, query_lengths=q_lengths, kv_lengths=kv_lengths, fully_masked="zero",
                  **forms)
    if norm_scale is None:
        out, notes = _reference("trt_attention", attention._name, causal_kind=causal.lower(), **common)
    elif causal == "LOWER_RIGHT":
        raise NotEmulatedError("a quantized IAttention with LOWER_RIGHT causal kind (TRT_QuantizedAttention's is_causal "
                               "is upper-left)")
    else:  # Q is pre-scaled: scale 1, and TRT_QuantizedAttention's sqrt(scale) on Q and K is nothing
        to_type = QUANTIZE_TO[props["normalization_quantize_to_type"].name]
        out, notes = _reference("trt_quantized_attention", attention._name, scale=1.0, is_causal=int(causal != "NONE"),
                                normalization_quantize_scale=norm_scale, normalization_quantize_to_type=to_type,
                                **common)
    for note in notes:
        warnings.warn(f"IAttention '{attention._name}': {note}", FullyMaskedRowsWarning, stacklevel=2)
    return [np.asarray(out).astype(q.dtype)]


# --------------------------------------------------------------------------- KV cache and RoPE


def _kv_cache_update(st, inputs, real):
    """IKVCacheUpdateLayer LINEAR: output[b, :, w[b] + s, :] = update[b, :, s, :]; the output is the cache."""
    cache, update, write_indices = inputs[:3]
    update_lengths = inputs[3] if len(inputs) > 3 else None
    if cache.dtype != update.dtype:
        raise ExecutionError(f"IKVCacheUpdateLayer '{st.name}': cache {cache.dtype} and update {update.dtype} differ")
    out, notes = _reference("trt_kv_cache_update", f"IKVCacheUpdateLayer '{st.name}'", past_cache=cache,
                            update=update, write_indices=write_indices, update_lengths=update_lengths,
                            update_form=FORMS[st.props["update_form"].name])
    for note in notes:
        warnings.warn(f"IKVCacheUpdateLayer '{st.name}': {note}", DroppedCacheWritesWarning, stacklevel=2)
    return [np.asarray(out).astype(cache.dtype)]  # the reference computes in float32: exact for fp16 / bf16


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
        raise ExecutionError(f"IRotaryEmbeddingLayer '{st.name}': cos/sin last dimension {wide_cos.shape[-1]} "
                             f"!= {rotary_dim // 2}")
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
    "IQuantizeLayer": qdq.quantize_layer,
    "IDequantizeLayer": qdq.dequantize_layer,
    "IAttentionInputLayer": _attention,
    "IAttentionOutputLayer": _identity,
    "IKVCacheUpdateLayer": _kv_cache_update,
    "IRotaryEmbeddingLayer": _rotary_embedding,
}

__all__ = ["run", "run_ranks", "ExecutionError", "FullyMaskedRowsWarning", "DroppedCacheWritesWarning", "rotate"]
