"""How much memory a run of a model at given dims needs, estimated before it runs; the budget runs must fit.

A probe (the dims search, verification's runs) on ONNX Runtime allocates the model's activations; at a
sequence length of 65536 one [B, N, S, S] attention matrix alone is terabytes. `activation_bytes` infers
the shapes at the candidate dims (onnx shape inference with the inputs made static, on a copy without
the weights) and walks the nodes in order, keeping each tensor alive from its node to its last reader:
the peak of that walk is what the run will hold at once (subgraphs add their own peak at their node).
Tensors whose shape inference cannot size are left out (the estimate is then a lower bound).

The budget: `--max-memory` (set_budget), else TRTATTN_MAX_MEMORY (bytes, or 8G / 512M), else a quarter of
the memory available, at most DEFAULT_CAP: a search never needs big dims to find ones a model runs on,
and a small model's run stays well under 2 GB whatever the machine.
"""

from __future__ import annotations

import os
import re
from math import prod

import numpy as np
import onnx

from ..errors import TrtattnError

BUDGET_ENV = "TRTATTN_MAX_MEMORY"
DEFAULT_CAP = 1 << 30
_budget: int | None = None


def available_memory() -> int:
    """Bytes the kernel says can be used without swapping (MemAvailable); 0 when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*", str(text).upper())
    if not m:
        raise TrtattnError(f"{BUDGET_ENV}={text!r} is not a memory size (e.g. 8G, 512M)")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2)])


def set_budget(nbytes: int | None) -> None:
    """The activation memory every probe may use (None: back to the default)."""
    global _budget
    _budget = nbytes


def budget() -> int:
    if _budget is not None:
        return _budget
    if os.environ.get(BUDGET_ENV):
        return parse_size(os.environ[BUDGET_ENV])
    available = available_memory()
    return min(available // 4, DEFAULT_CAP) if available else DEFAULT_CAP


def show(nbytes: int) -> str:
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f}{unit}"
    return f"{nbytes}B"


def input_shapes(model: onnx.ModelProto, dims: dict) -> dict[str, list[int]]:
    """Each input's shape at `dims`, as make_feeds would make it."""
    from .dim_names import dim_value
    from .roles import input_specs

    return {s.name: [d if isinstance(d, int) else dim_value(d, dims) for d in s.shape] for s in input_specs(model)}


def activation_bytes(model: onnx.ModelProto, dims: dict) -> int:
    """Estimated peak bytes of activations (inputs included) of one run of `model` at `dims`."""
    shapes = input_shapes(model, dims)
    skeleton = _without_weights(model)
    for vi in skeleton.graph.input:
        if vi.name in shapes:
            shape = vi.type.tensor_type.shape
            del shape.dim[:]
            for v in shapes[vi.name]:
                shape.dim.add().dim_value = int(v)
    del skeleton.graph.value_info[:]
    for o in skeleton.graph.output:  # exporters' output shapes are symbolic: let inference say
        o.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, data_prop=True)
    except Exception:  # a model shape inference cannot follow: size what the inputs alone take
        inferred = skeleton
    sizes: dict[str, int] = {}
    shapes = {}  # now of every value, not only the inputs
    for vi in _values(inferred.graph):
        n = _nbytes(vi)
        if n is not None:
            sizes[vi.name] = max(sizes.get(vi.name, 0), n)
            shapes[vi.name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    return _peak(inferred.graph, sizes, set(), shapes)


def _scores(node: onnx.NodeProto, shapes: dict) -> int:
    """What a fused attention op holds inside: its [B, N, Sq, Skv] fp32 scores (ONNX Runtime's CPU kernels
    materialize them)."""
    if node.op_type not in ("Attention", "MultiHeadAttention", "GroupQueryAttention") or len(node.input) < 2:
        return 0
    q, k = shapes.get(node.input[0]), shapes.get(node.input[1])
    if not q or not k or len(q) < 3:
        return 0
    heads = next((a.i for a in node.attribute if a.name in ("q_num_heads", "num_heads")), 1) if len(q) == 3 else 1
    return prod(q[:-1]) * heads * k[-2 if len(k) == 4 else 1] * 4


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the graph with tensors over 1 KB emptied (their dims and type kept, marked external)."""
    from .external import all_tensors

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for t in all_tensors(copy):
        if t.HasField("raw_data") and len(t.raw_data) > 1024:
            t.ClearField("raw_data")
            t.data_location = onnx.TensorProto.EXTERNAL
            del t.external_data[:]
            t.external_data.add(key="location", value="trtattn-memory-estimate")
    return copy


def _values(graph: onnx.GraphProto):
    yield from graph.input
    yield from graph.value_info
    yield from graph.output
    for node in graph.node:
        for a in node.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                yield from _values(sub)


def _nbytes(vi: onnx.ValueInfoProto) -> int | None:
    tt = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        return None
    if any(not d.HasField("dim_value") for d in tt.shape.dim):
        return None
    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 4
    return prod(d.dim_value for d in tt.shape.dim) * itemsize


def _peak(graph: onnx.GraphProto, sizes: dict[str, int], outer: set[str], shapes: dict) -> int:
    """The largest sum of tensors alive at once, walking the nodes in order; a node's subgraphs add
    their own peak while it runs."""
    last: dict[str, int] = {}
    for k, node in enumerate(graph.node):
        for name in node.input:
            last[name] = k
    keep = {o.name for o in graph.output}
    alive = {vi.name: sizes.get(vi.name, 0) for vi in graph.input if vi.name not in outer}
    peak = current = sum(alive.values())
    for k, node in enumerate(graph.node):
        inner = 0
        for a in node.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                inner = max(inner, _peak(sub, sizes, outer | set(alive), shapes))
        inner += _scores(node, shapes)
        made = {o: sizes.get(o, 0) for o in node.output if o}
        current += sum(made.values())
        alive.update(made)
        peak = max(peak, current + inner)
        for name in [n for n in alive if last.get(n, -1) <= k and n not in keep]:
            current -= alive.pop(name)
    return peak
