"""Build-time output shapes and dtypes of the layers trtsim emulates, as TensorRT documents them
(include/NvInfer.h). -1 marks a dimension only known at run time; a shape of None means even the
rank is unknown (trtsim then refuses to report it rather than guess).

`infer(layer)` sets layer.outputs[i]._shape / ._dtype. It raises ShapeError only for mistakes that
are certain from what is known; everything else is checked again at build and at execution.
"""

from __future__ import annotations

import numpy as np

from .errors import ShapeError


def known(d: int) -> bool:
    return d >= 0


def volume(shape) -> int | None:
    if shape is None or any(not known(d) for d in shape):
        return None
    return int(np.prod(shape, dtype=np.int64))


def broadcast(where: str, *shapes) -> tuple | None:
    """TensorRT broadcasting: equal ranks; per axis lengths match or one of them is 1."""
    if any(s is None for s in shapes):
        return None
    ranks = {len(s) for s in shapes}
    if len(ranks) != 1:
        raise ShapeError(f"{where}: inputs must have the same rank (TensorRT does not broadcast ranks), got {list(shapes)}")
    out = []
    for dims in zip(*shapes):
        sized = {d for d in dims if known(d) and d != 1}
        if len(sized) > 1:
            raise ShapeError(f"{where}: dimensions {dims} cannot be broadcast (shapes {list(shapes)})")
        if sized:
            out.append(sized.pop())
        elif any(not known(d) for d in dims):
            out.append(-1)
        else:
            out.append(1)
    return tuple(out)


def const_value(tensor) -> np.ndarray | None:
    """The value of a tensor known at build time: a constant's weights or the shape of a static tensor."""
    producer = tensor._producer
    if producer is None:
        return None
    if producer.kind == "IConstantLayer":
        return np.asarray(producer.props["weights_array"]).reshape(producer.props["shape"])
    if producer.kind == "IShapeLayer":
        shape = producer.inputs[0]._shape
        if shape is not None and all(known(d) for d in shape):
            return np.array(shape, dtype=np.int64)
    return None


def permute(shape, perm, where: str):
    if shape is None:
        return None
    if perm is None:
        return tuple(shape)
    rank = len(shape)
    head = list(perm)[:rank]
    if len(perm) < rank or sorted(head) != list(range(rank)):
        raise ShapeError(f"{where}: {tuple(perm)} is not a permutation of the {rank} axes of {tuple(shape)}")
    return tuple(shape[i] for i in head)


def reshape(source, dims, zero_is_placeholder: bool, where: str):
    """IShuffleLayer reshape: 0 copies the corresponding dimension (when zero_is_placeholder), -1 is inferred."""
    if dims is None:
        return source
    dims = [int(d) for d in dims]
    if dims.count(-1) > 1:
        raise ShapeError(f"{where}: at most one -1 in reshape dimensions {tuple(dims)}")
    out = []
    for i, d in enumerate(dims):
        if d == 0 and zero_is_placeholder:
            if source is None or i >= len(source):
                return None if source is None else _fail(where, f"0 at axis {i} has no input dimension to copy")
            out.append(source[i])
        else:
            out.append(d)
    if -1 in dims:
        total = volume(source)
        rest = [d for i, d in enumerate(out) if dims[i] != -1]
        if total is not None and all(known(d) for d in rest):
            known_part = int(np.prod(rest, dtype=np.int64))
            if known_part == 0 or total % known_part:
                raise ShapeError(f"{where}: cannot reshape {tuple(source)} into {tuple(dims)}")
            out[dims.index(-1)] = total // known_part
    total, new = volume(source), volume(out)
    if total is not None and new is not None and total != new:
        raise ShapeError(f"{where}: cannot reshape {tuple(source)} ({total} elements) into {tuple(out)} ({new})")
    return tuple(out)


def _fail(where, message):
    raise ShapeError(f"{where}: {message}")


def infer(layer, trt) -> None:
    """Set the output shapes and dtypes of one layer (see the module docstring)."""
    if layer.kind == "ONNX":
        return  # the parser sets these from the ONNX graph
    rule = RULES.get(layer.kind)
    inputs = layer.inputs
    where = f"{layer.kind} '{layer.name}'"
    if rule is None:
        # Unemulated layer: dtype of the first input, shape unknown.
        first = next((t for t in inputs if t is not None), None)
        for out in layer.outputs:
            out._shape, out._dtype = None, (first._dtype if first is not None else trt.DataType.FLOAT)
        return
    results = rule(layer, inputs, trt, where)
    for out, (shape, dtype) in zip(layer.outputs, results):
        out._shape = None if shape is None else tuple(int(d) for d in shape)
        out._dtype = dtype


def _same(layer, inputs, trt, where):
    x = inputs[0]
    return [(x._shape, x._dtype)]


def _constant(layer, inputs, trt, where):
    return [(layer.props["shape"], layer.props["weights_dtype"])]


def _cast(layer, inputs, trt, where):
    return [(inputs[0]._shape, layer.props["to_type"])]


def _elementwise(layer, inputs, trt, where):
    a, b = inputs[0], inputs[1]
    op = layer.props["op"]
    dtype = trt.DataType.BOOL if op.name in ("EQUAL", "GREATER", "LESS") else a._dtype
    return [(broadcast(where, a._shape, b._shape), dtype)]


def _unary(layer, inputs, trt, where):
    op = layer.props["op"]
    x = inputs[0]
    dtype = trt.DataType.BOOL if op.name in ("NOT", "ISINF", "ISNAN") else x._dtype
    return [(x._shape, dtype)]


def _shuffle(layer, inputs, trt, where):
    x = inputs[0]
    s1 = permute(x._shape, layer.props.get("first_transpose"), where + " first_transpose")
    placeholder = layer.props.get("zero_is_placeholder", True)
    if len(inputs) > 1 and inputs[1] is not None:
        value = const_value(inputs[1])
        if value is not None:
            s2 = reshape(s1, value.tolist(), placeholder, where)
        else:
            rank = inputs[1]._shape[0] if inputs[1]._shape else -1
            s2 = None if rank < 0 else (-1,) * rank
    else:
        s2 = reshape(s1, layer.props.get("reshape_dims"), placeholder, where)
    return [(permute(s2, layer.props.get("second_transpose"), where + " second_transpose"), x._dtype)]


def _slice(layer, inputs, trt, where):
    x = inputs[0]
    size_input = inputs[2] if len(inputs) > 2 else None
    if size_input is not None:
        value = const_value(size_input)
        size = value.tolist() if value is not None else [-1] * (size_input._shape[0] if size_input._shape else 0)
    else:
        size = list(layer.props["shape"])
    axes = layer.props.get("axes")
    if len(inputs) > 5 and inputs[5] is not None:
        value = const_value(inputs[5])
        axes = value.tolist() if value is not None else None
        if axes is None:
            return [(None if x._shape is None else (-1,) * len(x._shape), x._dtype)]
    if axes is None:
        if x._shape is not None and len(size) != len(x._shape):
            raise ShapeError(f"{where}: size {tuple(size)} must have one entry per axis of {tuple(x._shape)}")
        return [(tuple(size), x._dtype)]
    if x._shape is None:
        return [(None, x._dtype)]
    out = list(x._shape)
    for axis, n in zip(axes, size):
        out[axis % len(out)] = n
    return [(tuple(out), x._dtype)]


def default_concat_axis(rank: int) -> int:
    # NvInfer.h: "the number of tensor dimensions minus three, or zero if fewer than three dimensions".
    return rank - 3 if rank >= 3 else 0


def _concatenation(layer, inputs, trt, where):
    shapes = [t._shape for t in inputs]
    dtypes = {t._dtype for t in inputs}
    if len(dtypes) > 1:
        raise ShapeError(f"{where}: inputs have different types {sorted(d.name for d in dtypes)}")
    if any(s is None for s in shapes):
        return [(None, inputs[0]._dtype)]
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        raise ShapeError(f"{where}: inputs must have the same rank, got {shapes}")
    axis = layer.props.get("axis")
    axis = default_concat_axis(rank) if axis is None else axis
    if not 0 <= axis < rank:
        raise ShapeError(f"{where}: axis {axis} is outside [0, {rank})")
    out = []
    for i in range(rank):
        dims = [s[i] for s in shapes]
        if i == axis:
            out.append(sum(dims) if all(known(d) for d in dims) else -1)
        else:
            sized = {d for d in dims if known(d)}
            if len(sized) > 1:
                raise ShapeError(f"{where}: axis {i} differs between inputs {shapes}")
            out.append(sized.pop() if sized else -1)
    return [(tuple(out), inputs[0]._dtype)]


def _select(layer, inputs, trt, where):
    cond, a, b = inputs
    return [(broadcast(where, cond._shape, a._shape, b._shape), a._dtype)]


def _shape(layer, inputs, trt, where):
    x = inputs[0]
    return [(None if x._shape is None else (len(x._shape),), trt.DataType.INT64)]


def _gather(layer, inputs, trt, where):
    data, indices = inputs[0], inputs[1]
    mode = layer.props["mode"].name
    if data._shape is None or indices._shape is None:
        return [(None, data._dtype)]
    d, q = list(data._shape), list(indices._shape)
    if mode == "ELEMENT":
        return [(tuple(q), data._dtype)]
    if mode != "DEFAULT":
        return [(None, data._dtype)]
    axis = layer.props["axis"]
    if not 0 <= axis < len(d):
        raise ShapeError(f"{where}: axis {axis} is outside [0, {len(d)})")
    if layer.props.get("num_elementwise_dims", 0) == 1:
        lead = broadcast(where, (d[0],), (q[0],))
        return [(tuple(lead) + tuple(d[1:axis]) + tuple(q[1:]) + tuple(d[axis + 1:]), data._dtype)]
    return [(tuple(d[:axis]) + tuple(q) + tuple(d[axis + 1:]), data._dtype)]


def _axes_of(layer, inputs):
    if len(inputs) < 2 or inputs[1] is None:
        return None
    value = const_value(inputs[1])
    return None if value is None else [int(a) for a in value.reshape(-1)]


def _unsqueeze(layer, inputs, trt, where):
    x = inputs[0]
    axes = _axes_of(layer, inputs)
    if x._shape is None or axes is None:
        return [(None, x._dtype)]
    rank = len(x._shape) + len(axes)
    axes = sorted(a % rank for a in axes)
    out = list(x._shape)
    for a in axes:
        out.insert(a, 1)
    return [(tuple(out), x._dtype)]


def _squeeze(layer, inputs, trt, where):
    x = inputs[0]
    if x._shape is None:
        return [(None, x._dtype)]
    axes = _axes_of(layer, inputs)
    if axes is None:
        if len(inputs) > 1 and inputs[1] is not None:
            return [(None, x._dtype)]
        if any(not known(d) for d in x._shape):
            return [(None, x._dtype)]
        axes = [i for i, d in enumerate(x._shape) if d == 1]
    rank = len(x._shape)
    axes = {a % rank for a in axes}
    for a in axes:
        if known(x._shape[a]) and x._shape[a] != 1:
            raise ShapeError(f"{where}: cannot squeeze axis {a} of {tuple(x._shape)}")
    return [(tuple(d for i, d in enumerate(x._shape) if i not in axes), x._dtype)]


def _quantize(layer, inputs, trt, where):
    return [(inputs[0]._shape, layer.props["to_type"])]


def _attention_input(layer, inputs, trt, where):
    q = inputs[0]
    return [(q._shape, q._dtype)]  # the output has the query's shape, form and type


def _kv_cache_update(layer, inputs, trt, where):
    cache = inputs[0]
    return [(cache._shape, cache._dtype)]


def _dist_collective(layer, inputs, trt, where):
    """ALL_REDUCE keeps the shape; ALL_GATHER stacks the ranks along the first axis (num_ranks times it)."""
    x = inputs[0]
    op = layer.props["dist_collective_op"].name
    ranks = int(layer.props.get("num_ranks", 1))
    if op == "ALL_REDUCE":
        return [(x._shape, x._dtype)]
    if op == "ALL_GATHER":
        if x._shape is None or not len(x._shape):
            raise ShapeError(f"{where}: ALL_GATHER needs a tensor of rank >= 1")
        first = x._shape[0]
        return [((first * ranks if isinstance(first, int) and first >= 0 else -1,) + tuple(x._shape[1:]), x._dtype)]
    raise ShapeError(f"{where}: trtsim does not emulate the {op} collective")


RULES = {
    "IConstantLayer": _constant,
    "IIdentityLayer": _same,
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
    "IDequantizeLayer": _quantize,
    "IAttentionInputLayer": _attention_input,
    "IAttentionOutputLayer": _same,
    "IRotaryEmbeddingLayer": _same,
    "IKVCacheUpdateLayer": _kv_cache_update,
    "IDistCollectiveLayer": _dist_collective,
}
