"""What build_serialized_network checks before declining to build: the mistakes a real TensorRT
build (or NvInfer.h) rejects, found without a GPU. Each check cites the rule it enforces."""

from __future__ import annotations

from . import shapes
from .dtypes import FLOATING
from .graph import plan


def _shape(t):
    return t._shape if t is not None else None


def _dim(t, axis):
    s = _shape(t)
    if s is None or not -len(s) <= axis < len(s):
        return -1
    return s[axis]


def validate_build(sim, network, config) -> list[str]:
    problems: list[str] = []
    if not network._outputs:
        problems.append("the network has no outputs")

    names = [t._name for t in network._inputs + network._outputs]
    duplicates = sorted({n for n in names if names.count(n) > 1 and not _same_tensor(network, n)})
    if duplicates:
        problems.append(f"network input/output names must be unique: {duplicates}")

    for st in network._layers:
        for i, t in enumerate(st.inputs):
            if t is not None and getattr(t, "_removed", False):
                problems.append(f"{st.kind} '{st.name}' input {i} is the removed tensor '{t._name}'")
        if st.kind == "ONNX":
            problems += _check_onnx_inputs(st)
        else:
            try:
                st.infer()
            except shapes.ShapeError as error:
                problems.append(str(error))

    steps, unresolved = plan(network)
    computed = {id(st.outputs[j]) for st, outs in steps for j in outs} | {id(t) for t in network._inputs}
    for t in network._outputs:
        if id(t) not in computed:
            problems.append(f"network output '{t._name}' cannot be computed (a cycle through the ONNX subgraph, "
                            f"or an input that is never produced)")

    problems += _check_profiles(network, config)
    seen = set()
    for st in network._layers:
        if st.attention is not None and id(st.attention) not in seen:
            seen.add(id(st.attention))
            problems += [f"IAttention '{st.attention._name}': {p}" for p in _check_attention(st.attention)]
        check = LAYER_CHECKS.get(st.kind)
        if check:
            problems += [f"{st.kind} '{st.name}': {p}" for p in check(st)]
    return problems


def _check_onnx_inputs(st) -> list[str]:
    """A tensor wired into a parsed graph's input must have that input's type and rank."""
    problems = []
    for name, t in zip(st.onnx.inputs, st.inputs):
        dtype, dims = st.onnx.input_types[name]
        if t is None:
            problems.append(f"ONNX input '{name}' of '{st.name}' is not connected")
        elif t._dtype != dtype:
            problems.append(f"ONNX input '{name}' is {dtype.name} but is fed {t._dtype.name} from {t!r}")
        elif t._shape is not None and len(t._shape) != len(dims):
            problems.append(f"ONNX input '{name}' has rank {len(dims)} but is fed {t!r}")
    return problems


def _same_tensor(network, name):
    # A tensor that is both a network input and output is one name, not a clash.
    tensors = {id(t) for t in network._inputs + network._outputs if t._name == name}
    return len(tensors) == 1


def _check_profiles(network, config) -> list[str]:
    problems = []
    dynamic = [t for t in network._inputs if t._shape is not None and any(d < 0 for d in t._shape)]
    profiles = config._profiles
    if dynamic and not profiles:
        problems.append(f"dynamic inputs {[t._name for t in dynamic]} need an optimization profile")
    inputs = {t._name: t for t in network._inputs}
    for index, profile in enumerate(profiles):
        for name in profile._shapes:
            if name not in inputs:
                problems.append(f"profile {index} sets a shape for '{name}', which is not a network input")
        for t in dynamic:
            if t._name not in profile._shapes:
                problems.append(f"profile {index} has no shape for dynamic input '{t._name}' {tuple(t._shape)}")
                continue
            for label, dims in zip(("min", "opt", "max"), profile._shapes[t._name]):
                if len(dims) != len(t._shape):
                    problems.append(f"profile {index} '{t._name}' {label} {tuple(dims)} has rank {len(dims)}, "
                                    f"the input has rank {len(t._shape)}")
                elif any(d >= 0 and d != p for d, p in zip(t._shape, dims)):
                    problems.append(f"profile {index} '{t._name}' {label} {tuple(dims)} contradicts the static "
                                    f"dimensions of {tuple(t._shape)}")
    return problems


def _check_attention(attention) -> list[str]:
    """NvInfer.h, class IAttention and addAttentionV2."""
    props = attention._props
    q, k, v = (attention._in.slot(i) for i in range(3))
    mask = attention.slot("mask")
    q_packed = props["query_form"].name == "PACKED_NHD"
    kv_packed = props["key_value_form"].name == "PACKED_NHD"
    problems = []
    if mask is not None and props["causal_kind"].name != "NONE":
        problems.append("a mask together with causal_kind != NONE fails validation (use one or the other)")
    types = {t._dtype.name for t in (q, k, v)}
    if not types <= FLOATING or len(types) != 1:
        problems.append(f"query, key and value must share one of FLOAT, HALF, BF16; got {[t._dtype.name for t in (q, k, v)]}")
    for name, t, packed in (("query", q, q_packed), ("key", k, kv_packed), ("value", v, kv_packed)):
        rank = 3 if packed else 4
        if _shape(t) is not None and len(t._shape) != rank:
            form = "PACKED_NHD [T, N, H]" if packed else "PADDED_BHND [B, N, S, H]"
            problems.append(f"{name} {tuple(t._shape)} does not match its form {form}")
    if q_packed and attention.slot("query_lengths") is None:
        problems.append("query_form PACKED_NHD needs query_lengths (cumulative [B+1])")
    if kv_packed and attention.slot("key_value_lengths") is None:
        problems.append("key_value_form PACKED_NHD needs key_value_lengths (cumulative [B+1])")
    for slot in ("query_lengths", "key_value_lengths"):
        t = attention.slot(slot)
        if t is not None and t._dtype.name != "INT32":
            problems.append(f"{slot} must be INT32, got {t._dtype.name}")
        if t is not None and _shape(t) is not None and len(t._shape) != 1:
            problems.append(f"{slot} must be 1-D, got {tuple(t._shape)}")
    nq, nkv = _dim(q, 1), _dim(k, 1)
    if nq > 0 and nkv > 0 and nq % nkv:
        problems.append(f"query heads {nq} must be a multiple of key/value heads {nkv}")
    sizes = {d for d in (_dim(q, -1), _dim(k, -1), _dim(v, -1)) if d >= 0}
    if len(sizes) > 1:
        problems.append(f"query, key and value head sizes differ: {sorted(sizes)}")
    if mask is not None:
        if mask._dtype.name != "BOOL" and mask._dtype != q._dtype:
            problems.append(f"mask must be BOOL or the query's type {q._dtype.name}, got {mask._dtype.name}")
        if _shape(mask) is not None and len(mask._shape) != 4:
            problems.append(f"mask must be 4-D (broadcastable to [B, Nq, Sq, Skv]), got {tuple(mask._shape)}")
    scale = attention.slot("normalization_quantize_scale")
    to_type = props["normalization_quantize_to_type"].name
    if scale is not None and to_type not in ("FP8", "INT8"):
        problems.append("normalization_quantize_scale needs normalization_quantize_to_type FP8 or INT8")
    return problems


def _check_kv_cache_update(st) -> list[str]:
    """NvInfer.h, addKVCacheUpdate and IKVCacheUpdateLayer."""
    cache, update, indices = st.inputs[:3]
    packed = st.props["update_form"].name == "PACKED_NHD"
    problems = []
    if cache._dtype != update._dtype or cache._dtype.name not in FLOATING:
        problems.append(f"cache and update must share FLOAT, HALF or BF16; got {cache._dtype.name}, {update._dtype.name}")
    if indices._dtype.name not in ("INT32", "INT64"):
        problems.append(f"write_indices must be INT32 or INT64, got {indices._dtype.name}")
    if _shape(cache) is not None and len(cache._shape) != 4:
        problems.append(f"cache must be [B, N, max_S, H], got {tuple(cache._shape)}")
    rank = 3 if packed else 4
    if _shape(update) is not None and len(update._shape) != rank:
        problems.append(f"update {tuple(update._shape)} does not match update_form {st.props['update_form'].name}")
    if packed and st.slot(3) is None:
        problems.append("update_form PACKED_NHD needs update_lengths (cumulative [B+1])")
    for axis_c, axis_u in ((1, -2 if packed else 1), (-1, -1)):
        a, b = _dim(cache, axis_c), _dim(update, axis_u)
        if a >= 0 and b >= 0 and a != b:
            problems.append(f"cache {tuple(cache._shape)} and update {tuple(update._shape)} disagree on heads or head size")
    return problems


def _check_rotary(st) -> list[str]:
    """NvInfer.h, addRotaryEmbedding and IRotaryEmbeddingLayer."""
    x, cos, sin = st.inputs[:3]
    problems = []
    dim = st.props["rotary_embedding_dim"]
    head = _dim(x, -1)
    if dim % 2 or dim < 0:
        problems.append(f"rotary_embedding_dim must be non-negative and even, got {dim}")
    if head >= 0 and dim > head:
        problems.append(f"rotary_embedding_dim {dim} exceeds the head size {head}")
    if _shape(x) is not None and len(x._shape) not in (3, 4):
        problems.append(f"input must be [B, N, S, H] or packed [T, N, H], got {tuple(x._shape)}")
    half = (dim or head) // 2 if (dim or head) > 0 else -1
    for name, t in (("cos_cache", cos), ("sin_cache", sin)):
        if t._dtype != x._dtype:
            problems.append(f"{name} type {t._dtype.name} differs from the input's {x._dtype.name}")
        last = _dim(t, -1)
        if half > 0 and last >= 0 and last != half:
            problems.append(f"{name} last dimension {last} must be rotary_embedding_dim / 2 = {half}")
    return problems


def _check_elementwise(st) -> list[str]:
    a, b = st.inputs[:2]
    # Strongly typed networks (all networks in TensorRT 11) do not convert types implicitly.
    if a._dtype != b._dtype:
        return [f"input types differ ({a._dtype.name}, {b._dtype.name}); add a cast"]
    return []


def _check_select(st) -> list[str]:
    cond, a, b = st.inputs
    problems = []
    if cond._dtype.name != "BOOL":
        problems.append(f"condition must be BOOL, got {cond._dtype.name}")
    if a._dtype != b._dtype:
        problems.append(f"then/else types differ ({a._dtype.name}, {b._dtype.name})")
    return problems


def _check_unary(st) -> list[str]:
    if st.props["op"].name == "NOT" and st.inputs[0]._dtype.name != "BOOL":
        return ["NOT needs a BOOL input"]  # NvInfer.h: "Operations kNOT must have inputs of DataType::kBOOL"
    return []


def _check_dist_collective(st) -> list[str]:
    """NvInfer.h, addDistCollective: reduce_op applies to ALL_REDUCE, REDUCE and REDUCE_SCATTER only."""
    op, reduce_op = st.props["dist_collective_op"].name, st.props["reduce_op"]
    reduce_name = getattr(reduce_op, "name", None)
    problems = []
    if op in ("ALL_REDUCE", "REDUCE", "REDUCE_SCATTER") and reduce_name in (None, "NONE"):
        problems.append(f"{op} needs a reduce operation, got {reduce_op}")
    if op not in ("ALL_REDUCE", "REDUCE", "REDUCE_SCATTER") and reduce_name not in (None, "NONE"):
        problems.append(f"{op} takes no reduce operation, got {reduce_name}")
    groups, ranks = st.props["groups"], int(st.props.get("num_ranks", 1))
    if op in ("ALL_GATHER", "REDUCE_SCATTER") and ranks < 2:
        problems.append(f"{op} with num_ranks {ranks}: its output shape needs the number of ranks")
    if groups is not None and ranks > 1 and len(groups) != ranks:
        problems.append(f"groups {groups} do not name num_ranks = {ranks} ranks")
    return problems


LAYER_CHECKS = {
    "IDistCollectiveLayer": _check_dist_collective,
    "IKVCacheUpdateLayer": _check_kv_cache_update,
    "IRotaryEmbeddingLayer": _check_rotary,
    "IElementWiseLayer": _check_elementwise,
    "ISelectLayer": _check_select,
    "IUnaryLayer": _check_unary,
}
