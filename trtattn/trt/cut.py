"""Cut the lowered ops out of the form model, leaving the graph TensorRT's OnnxParser parses.

For every planned op (Attention, RotaryEmbedding, TensorScatter):
- its inputs become graph outputs ("exposed"), so the network has them as tensors to feed the
  TensorRT layers (constants go through an Identity: an initializer cannot be an output);
- the op is removed; an output that remaining ONNX nodes still read becomes a graph input
  ("placeholder"), which the builder rewires to the TensorRT layer's output and then removes.
A graph output produced by a lowered op (an updated KV cache) leaves the ONNX graph and is marked
on the TensorRT layer instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
import onnx_graphsurgeon as gs

from ..graph.shapes import tensor_types


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


def cut(form_model: onnx.ModelProto, lowered: dict) -> CutModel:
    types = tensor_types(form_model)
    graph = gs.import_onnx(form_model)
    graph_inputs = {t.name for t in graph.inputs}
    final_outputs = [t.name for t in graph.outputs]
    produced = {p.output for p in lowered.values()}
    result = CutModel(model=None)
    keep_outputs = [t for t in graph.outputs if t.name not in produced]
    extra_outputs: list[gs.Tensor] = []
    new_inputs: list[gs.Tensor] = []
    for node in [n for n in graph.nodes if n.name in lowered]:
        for t in node.inputs:
            if not t.name or t.name in produced or t.name in graph_inputs or t.name in result.exposed:
                continue
            if isinstance(t, gs.Constant):
                out = gs.Variable(f"trtattn/const/{t.name}", dtype=t.values.dtype, shape=list(t.values.shape))
                graph.nodes.append(gs.Node("Identity", f"trtattn/expose/{t.name}", inputs=[t], outputs=[out]))
                result.exposed[t.name] = out.name
                extra_outputs.append(out)
            else:
                result.exposed[t.name] = t.name
                extra_outputs.append(_typed(t, types))
        for o in node.outputs:
            readers = [c for c in o.outputs if c.name not in lowered and c is not node]
            if o.name in final_outputs:
                result.layer_outputs.append(o.name)
            if readers:
                result.placeholders.append(o.name)
                new_inputs.append(_typed(o, types))
        node.outputs.clear()
        node.inputs.clear()
    graph.nodes = [n for n in graph.nodes if n.name not in lowered]
    for t in new_inputs:
        t.inputs.clear()
    graph.inputs = list(graph.inputs) + new_inputs
    graph.outputs = keep_outputs + [t for t in extra_outputs if t.name not in {k.name for k in keep_outputs}]
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    model = gs.export_onnx(graph)
    model.ir_version = form_model.ir_version
    result.model = model
    result.inputs = [t.name for t in graph.inputs if t.name not in set(result.placeholders)]
    return result
