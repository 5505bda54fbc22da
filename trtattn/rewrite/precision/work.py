"""Matmul work per dtype: the share of multiply-accumulates (MatMul, Gemm, Conv, Attention) each dtype runs."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from ...graph import external, io
from ...graph.precision import ELEM_PRECISIONS
from .check import cpu_runner
from .common import (
    DEFAULT_DIM,
    MATMUL_OPS,
    ONNX_DOMAINS,
    UNCOUNTED,
    PrecisionError,
    declared_types,
)


@dataclass(frozen=True)
class Work:
    node: str
    op_type: str
    dtype: str
    macs: int


def precision_table(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray] | None = None, *,
                    shapes: Mapping[str, Sequence[int]] | None = None,
                    dims: Mapping[str, int] | None = None) -> dict[str, float]:
    """Share of the matmul work (multiply-accumulates of every MatMul, Gemm, Conv and Attention) per
    dtype it runs in, largest first; counted at the shapes matmul_work explains."""
    return shares(matmul_work(model, feeds, shapes=shapes, dims=dims))


def matmul_work(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray] | None = None, *,
                shapes: Mapping[str, Sequence[int]] | None = None, dims: Mapping[str, int] | None = None) -> list[Work]:
    """One Work per matmul node: its multiply-accumulates and its dtype (its first input's, or the
    quantized type behind a DequantizeLinear).

    The inputs take the shapes of `feeds`, else `shapes` (a profile's opt shapes), else their symbolic
    dims take `dims`, else DEFAULT_DIM; ONNX's shape inference carries them through the graph. Where
    it loses a dim (RoPE's Slice at x.shape[-1] // 2, a broadcast against batch 1) the model is run
    on `feeds` for the exact shapes; without feeds that is an error naming the tensor."""
    return count_work(model, feeds, shapes, dims)


def count_work(model, feeds, shapes, dims, weights_dir: Path | None = None) -> list[Work]:
    """matmul_work; weights_dir: where the external data of a model loaded without it lives."""
    nodes = _matmul_nodes(model)
    if feeds is not None:
        shapes = {k: np.shape(v) for k, v in feeds.items()}
    types, static = infer_static(model, shapes, dims)
    missing = sorted({t for n in nodes for t in _shaped(n) if t not in static})
    if missing and feeds is not None:  # a lazily loaded model's weights are where it records them
        static.update(_run_shapes(model, missing, feeds, weights_dir or external.data_dir(model)))
    for n in nodes:
        for t in _shaped(n):
            if t not in static:
                raise PrecisionError(f"no static shape for '{t}' ({n.op_type} {n.name}) from ONNX's shape "
                                     "inference: pass feeds to count it from a run")
    producer = {o: n for n in model.graph.node for o in n.output}
    return [Work(n.name, n.op_type, _dtype_of(n.input[0], types, producer), _macs(n, static)) for n in nodes]


def shares(work: list[Work]) -> dict[str, float]:
    totals: dict[str, int] = {}
    for w in work:
        totals[w.dtype] = totals.get(w.dtype, 0) + w.macs
    total = sum(totals.values())
    return {k: v / total for k, v in sorted(totals.items(), key=lambda kv: -kv[1])} if total else {}


def declared_dtypes(model: onnx.ModelProto) -> list[Work]:
    """The dtype of each matmul node from the types the model declares (AutoCast writes them all)."""
    types, producer = declared_types(model), {o: n for n in model.graph.node for o in n.output}
    return [Work(n.name, n.op_type, _dtype_of(n.input[0], types, producer), 0) for n in _matmul_nodes(model)]


def _matmul_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    nodes = []
    for n in model.graph.node:
        counted = n.domain in ONNX_DOMAINS and n.op_type in MATMUL_OPS
        if not counted and (n.op_type in UNCOUNTED or n.op_type in MATMUL_OPS or "Attention" in n.op_type
                            or "MatMul" in n.op_type):
            raise PrecisionError(f"precision_table cannot count the matmul work of {n.domain or 'ai.onnx'}:"
                                 f"{n.op_type} (node {n.name}); convert it to standard ONNX ops first")
        if counted:
            nodes.append(n)
    return nodes


def _shaped(n: onnx.NodeProto) -> list[str]:
    """The tensors whose shapes give a matmul node's work."""
    if n.op_type == "Einsum":
        return [t for t in n.input if t]
    if n.op_type == "Conv":
        return [n.input[1], n.output[0]]
    if n.op_type == "Attention":  # Q, K, V, past_key
        return [t for i, t in enumerate(n.input[:5]) if t and i != 3]
    return list(n.input[:2])


def _einsum_macs(n: onnx.NodeProto, equation: str, static: dict[str, list[int]]) -> int:
    """Every index of the equation spans its size once: the product of the sizes of all its letters."""
    terms = equation.replace(" ", "").split("->")[0].split(",")
    if "." in equation or len(terms) != len([t for t in n.input if t]):
        raise PrecisionError(f"precision_table cannot count Einsum {n.name} ('{equation}'): an ellipsis or a "
                             "term per input is missing")
    sizes: dict[str, int] = {}
    for term, tensor in zip(terms, n.input):
        for letter, size in zip(term, static[tensor]):
            sizes[letter] = max(sizes.get(letter, 1), int(size))
    return int(np.prod(list(sizes.values()), dtype=np.int64))


def _macs(n: onnx.NodeProto, static: dict[str, list[int]]) -> int:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    if n.op_type == "Einsum":
        equation = attrs["equation"]
        return _einsum_macs(n, equation.decode() if isinstance(equation, bytes) else equation, static)
    if n.op_type == "Conv":  # every output element: in_channels / group x kernel volume (its input's shape unneeded)
        return int(np.prod(static[n.output[0]], dtype=np.int64)) * int(np.prod(static[n.input[1]][1:], dtype=np.int64))
    a, b = static[n.input[0]], static[n.input[1]]
    if n.op_type == "MatMul":
        lead = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))  # the broadcast batch dims
        return int(np.prod(lead, dtype=np.int64)) * (a[-2] if len(a) > 1 else 1) * a[-1] * (b[-1] if len(b) > 1 else 1)
    if n.op_type == "Gemm":
        m, k = (a[1], a[0]) if attrs.get("transA") else (a[0], a[1])
        return m * k * (b[0] if attrs.get("transB") else b[1])
    # Attention: Q [B, Nq, Sq, H] or [B, Sq, Nq*H]; K, V likewise with Nkv; a past_key adds to Skv
    v = static[n.input[2]]
    if len(a) == 4:
        (batch, heads, sq, head), skv, head_v = a, b[2], v[3]
    elif attrs.get("q_num_heads") and attrs.get("kv_num_heads"):
        heads = attrs["q_num_heads"]
        batch, sq, head, skv, head_v = a[0], a[1], a[2] // heads, b[1], v[2] // attrs["kv_num_heads"]
    else:
        raise PrecisionError(f"Attention {n.name} has 3-D inputs but no q_num_heads/kv_num_heads")
    if len(n.input) > 4 and n.input[4]:
        skv += static[n.input[4]][2]
    return batch * heads * sq * skv * (head + head_v)


def _dtype_of(tensor: str, types: dict[str, int], producer) -> str:
    p, hops = producer.get(tensor), 0
    while p is not None and p.op_type in ("Transpose", "Reshape") and hops < 4:
        p, hops = producer.get(p.input[0]), hops + 1
    if p is not None and p.op_type == "DequantizeLinear":
        tensor = p.input[0]
    return ELEM_PRECISIONS.get(types.get(tensor, 0), "unknown")




def infer_static(model: onnx.ModelProto, shapes: Mapping | None = None, dims: Mapping | None = None) -> tuple[dict, dict]:
    """Elem types and fully static shapes from ONNX's inference (data propagation on), run on the
    model's structure (no weight bytes; small initializers keep their values: Reshape targets) with
    every graph input bound to a static shape."""
    view = onnx.ModelProto(ir_version=model.ir_version)
    view.opset_import.extend(model.opset_import)
    view.functions.extend(model.functions)
    g = model.graph
    view.graph.node.extend(g.node)
    view.graph.input.extend(g.input)
    view.graph.output.extend(g.output)  # value_info is left out: inference starts from the inputs
    for init in g.initializer:
        if int(np.prod(init.dims, dtype=np.int64)) <= 1024 and init.data_location != TensorProto.EXTERNAL:
            view.graph.initializer.append(init)
        else:
            stub = view.graph.initializer.add(name=init.name, data_type=init.data_type, dims=init.dims,
                                              data_location=TensorProto.EXTERNAL)
            stub.external_data.add(key="location", value="trtattn-weightless")
    inits, shapes, dims = {i.name for i in g.initializer}, shapes or {}, dims or {}
    for vi in view.graph.input:
        given, dim_list = shapes.get(vi.name), vi.type.tensor_type.shape.dim
        if vi.name in inits:
            continue
        if given is not None and len(given) != len(dim_list):
            raise PrecisionError(f"shape {list(given)} for input '{vi.name}': rank {len(given)}, not {len(dim_list)}")
        for i, d in enumerate(dim_list):
            bound = d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, DEFAULT_DIM)
            value = given[i] if given is not None else bound
            d.Clear()
            d.dim_value = int(value)
    try:
        inferred = onnx.shape_inference.infer_shapes(view, data_prop=True)
    except Exception as e:
        raise PrecisionError(f"ONNX shape inference failed: {(str(e).splitlines() or [type(e).__name__])[0]}") from None
    types = {i.name: i.data_type for i in g.initializer}
    static = {i.name: list(i.dims) for i in g.initializer}
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        tt = vi.type.tensor_type
        types[vi.name] = tt.elem_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            static[vi.name] = [d.dim_value for d in tt.shape.dim]
    return types, static


def _run_shapes(model: onnx.ModelProto, names: list[str], feeds, weights_dir: Path | None) -> dict[str, list[int]]:
    """The shapes of `names` in a run of the model on `feeds` (from weights_dir when it has one); a model too
    large for one session (an 8B fp16 cache model) runs in slices of layers, one session at a time."""
    from ...graph import slices

    probe = copy.deepcopy(model)  # a lazily loaded model: no weight bytes, they stay in weights_dir
    budget = None
    if weights_dir is not None:
        external.set_data_dir(probe, weights_dir)
        budget = slices.slice_budget(probe)
    if budget:
        pieces = slices.plan(probe, names, budget)
        return {t: list(np.shape(v)) for t, v in slices.run(probe, pieces, [feeds], names)[0].items()}
    outputs = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=t) for t in names if t not in outputs)
    with io.session_source(probe) as source:  # weights linked in a scratch folder, never beside the user's
        run, _ = cpu_runner(source if isinstance(source, str) else probe)
        return {t: list(np.shape(v)) for t, v in run(feeds).items() if t in names}
