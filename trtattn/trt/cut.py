"""Cut the lowered ops out of the form model, leaving the graph TensorRT's OnnxParser parses.

For every planned layer (an IAttention, IRotaryEmbeddingLayer or IKVCacheUpdateLayer):
- the tensors it reads (`reads()`) become graph outputs ("exposed"), so the network has them as tensors
  to feed the TensorRT layers (constants go through an Identity: an initializer cannot be an output);
- the ONNX nodes it replaces (`region`) are removed; its output, where remaining ONNX nodes still read
  it, becomes a graph input ("placeholder"), which the builder rewires to the TensorRT layer's output and
  then removes. What only fed the removed nodes (a mask the form spelled out for ONNX Runtime, index
  arithmetic) is dead and goes with them.
A graph output produced by a lowered layer (an updated KV cache) leaves the ONNX graph and is marked
on the TensorRT layer instead. `static` fixes dims of graph inputs (a cache's capacity) in the cut model
only: the form model keeps them symbolic for ONNX Runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
import onnx_graphsurgeon as gs

from ..errors import TrtattnError
from ..graph.shapes import tensor_types
from ..graph.view import ir_version_like


@dataclass
class CutModel:
    model: onnx.ModelProto
    exposed: dict[str, str] = field(default_factory=dict)  # tensor -> graph output carrying it
    placeholders: list[str] = field(default_factory=list)  # graph inputs standing in for lowered outputs
    layer_outputs: list[str] = field(default_factory=list)  # final outputs the lowered layers produce
    inputs: list[str] = field(default_factory=list)  # the real inputs (the engine's)


def _typed(t: gs.Tensor, types: dict) -> gs.Tensor:
    """Graph inputs and outputs need a type: take it from shape inference where the import has none."""
    if t.dtype is None or t.shape is None:
        elem, shape = types.get(t.name, (None, None))
        if elem is not None and t.dtype is None:
            t.dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        if t.shape is None and shape is not None:
            t.shape = [d if d is not None else f"{t.name}_dim{i}" for i, d in enumerate(shape)]
    return t


def cut(form_model: onnx.ModelProto, lowered: dict, static: dict[str, dict[int, int]] | None = None) -> CutModel:
    """lowered: node -> plan (AttentionPlan, RopePlan, CacheUpdatePlan) with `region`, `reads()`, `output`."""
    types = tensor_types(form_model)
    graph = gs.import_onnx(form_model)
    tensors = graph.tensors()
    graph_inputs = {t.name for t in graph.inputs}
    final_outputs = {t.name for t in graph.outputs}
    plans = list({id(p): p for p in lowered.values()}.values())
    region = {n for p in plans for n in p.region}
    missing = region - {n.name for n in graph.nodes}
    if missing:
        raise TrtattnError(f"the plan replaces nodes the form model does not have: {sorted(missing)[:3]}")
    produced = {p.output for p in plans}
    result = CutModel(model=onnx.ModelProto())  # the cut model is set below
    extra_outputs: list[gs.Tensor] = []
    for p in plans:
        for name in p.reads():
            if name in produced or name in graph_inputs or name in result.exposed:
                continue
            t = tensors.get(name)
            if t is None:
                raise TrtattnError(f"{p.node}: the tensor {name} it reads is not in the form model")
            if isinstance(t, gs.Constant):
                out = gs.Variable(f"trtattn/const/{name}", dtype=t.values.dtype, shape=list(t.values.shape))
                graph.nodes.append(gs.Node("Identity", f"trtattn/expose/{name}", inputs=[t], outputs=[out]))
                result.exposed[name] = out.name
                extra_outputs.append(out)
            else:
                result.exposed[name] = name
                extra_outputs.append(_typed(t, types))
    new_inputs: list[gs.Tensor] = []
    for p in plans:
        out = tensors[p.output]
        if p.output in final_outputs:
            result.layer_outputs.append(p.output)
        if any(c.name not in region for c in out.outputs):
            result.placeholders.append(p.output)
            new_inputs.append(_typed(out, types))
    inside = {o.name for n in graph.nodes if n.name in region for o in n.outputs} - produced
    leaks = sorted({t for n in graph.nodes if n.name not in region for t in (i.name for i in n.inputs) if t in inside})
    if leaks:
        raise TrtattnError(f"nodes outside the lowered layers read {leaks[:3]}, computed inside them")
    for n in [n for n in graph.nodes if n.name in region]:
        n.outputs.clear()
        n.inputs.clear()
    graph.nodes = [n for n in graph.nodes if n.name not in region]
    for t in new_inputs:
        t.inputs.clear()
    graph.inputs = list(graph.inputs) + new_inputs
    keep = [t for t in graph.outputs if t.name not in produced]
    graph.outputs = keep + [t for t in extra_outputs if t.name not in {k.name for k in keep}]
    for t in graph.inputs:
        for axis, value in (static or {}).get(t.name, {}).items():
            t.shape = [value if i == axis else d for i, d in enumerate(t.shape)]
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    model = gs.export_onnx(graph)
    model.ir_version = ir_version_like(form_model)
    result.model = model
    result.inputs = [t.name for t in graph.inputs if t.name not in set(result.placeholders)]
    return result
