"""The runner-side copy of a model with trt:: ops that ONNX Runtime can run with our kernels.

Never the written model: `cpu_model(model)` checks the model against the documented schema, then
returns a copy in which every trt node N becomes

    Cast(float inputs -> float32) -> <variant of N>(ai.onnx.contrib) -> CastLike(Y, N's Q or past_cache)

The variant (ort_ops.variant_name) is chosen from the inputs N gives and its mask's dtype (bool
or additive), read from ONNX shape inference on the copy. The float32 round trip is exact for
float16 and bfloat16 inputs (which Python ops cannot take), and the result is rounded once to
the I/O dtype by CastLike. Every documented attribute is written explicitly (Python ops need
them all); the ones the node left unset are listed in `absent`.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import TensorProto, helper

from . import ort_ops, schema
from .reference import TrtOpError

_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}
_ZERO = {"INT": 0, "FLOAT": 0.0, "STRING": ""}


def cpu_model(model: onnx.ModelProto, *, fully_masked: str = "nan", tag: str = "") -> onnx.ModelProto:
    """A copy of `model` whose trt nodes run on ONNX Runtime through `session_options()`.

    fully_masked: "nan" (default) or "zero", what a query row with no key to attend to gives
    (TensorRT leaves it undefined). tag: the session tag errors are recorded under (Session sets it).
    Raises TrtOpError when a trt node departs from the documented schema or its inputs' dtypes."""
    if fully_masked not in ("nan", "zero"):
        raise TrtOpError(f"fully_masked must be 'nan' or 'zero', got {fully_masked!r}")
    problems = schema.check_model(model)
    if problems:
        raise TrtOpError("trt ops that depart from docs/TRT_custom_ops.md:\n  " + "\n  ".join(problems))
    nested = [n for node in model.graph.node for g in schema.subgraphs(node) for n in schema.all_nodes(g)
              if n.domain == schema.DOMAIN]
    nested += [n for f in model.functions for n in f.node if n.domain == schema.DOMAIN]
    if nested:
        raise TrtOpError(f"{nested[0].op_type} node '{nested[0].name}' sits in a subgraph or function: "
                         f"only trt nodes of the main graph are run on CPU")
    if not any(n.domain == schema.DOMAIN for n in model.graph.node):
        return model  # nothing to run differently
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 15:
        raise TrtOpError(f"default-domain opset {opset}: the CPU copy needs CastLike (opset >= 15)")

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    names = _tensor_names(graph)
    rewrites, pieces = [], []
    for node in graph.node:
        if node.domain == schema.DOMAIN:
            rewrite = _Rewrite(node, names, fully_masked, tag)
            rewrites.append(rewrite)
            pieces.append(rewrite)
        else:
            pieces.append(node)
    _set_nodes(graph, pieces)
    kept = [o for o in copy.opset_import if o.domain != schema.DOMAIN]
    del copy.opset_import[:]
    copy.opset_import.extend(kept)
    if not any(o.domain == ort_ops.CONTRIB for o in kept):
        copy.opset_import.append(helper.make_opsetid(ort_ops.CONTRIB, 1))

    types = _elem_types(copy)
    for rewrite in rewrites:
        rewrite.finish(types)
    _set_nodes(graph, pieces)
    return copy


class _Rewrite:
    def __init__(self, node: onnx.NodeProto, names: set[str], fully_masked: str, tag: str):
        self.spec = spec = schema.OPS[node.op_type]
        self.node = node
        self.name = node.name or f"{node.op_type}->{node.output[0]}"
        self.given = schema.present_inputs(node)
        self.casts: list[onnx.NodeProto] = []
        inputs = []
        for name, tensor in self.given.items():
            if name == "attn_mask" or spec.inputs[spec.index(name)].dtypes == ("int32",):
                inputs.append(tensor)  # the mask's kind is known after type inference (finish)
                continue
            wide = _fresh(names, f"{tensor}__f32")
            self.casts.append(helper.make_node("Cast", [tensor], [wide], name=_fresh(names, wide), to=TensorProto.FLOAT))
            inputs.append(wide)
        values = schema.attributes(node)
        attrs: dict[str, Any] = {a.name: values.get(a.name, _ZERO[a.type]) for a in spec.attributes}
        absent = [a.name for a in spec.attributes if values.get(a.name) is None]
        result = _fresh(names, f"{node.output[0]}__f32")
        self.kernel = helper.make_node(
            node.op_type, inputs, [result], name=_fresh(names, f"{self.name}__cpu"), domain=ort_ops.CONTRIB,
            trt_node=self.name, trt_session=tag, fully_masked=fully_masked, absent=",".join(absent), **attrs)
        self.back = helper.make_node("CastLike", [result, node.input[0]], [node.output[0]],
                                     name=_fresh(names, f"{self.name}__io_dtype"))
        self.names = names

    def nodes(self) -> list[onnx.NodeProto]:
        return self.casts + [self.kernel, self.back]

    def finish(self, types: dict[str, int]) -> None:
        """Check the inputs' dtypes and pick the registered variant (and cast an additive mask)."""
        where = f"{self.node.op_type} node '{self.name}'"
        mask_kind = None
        for name, tensor in self.given.items():
            dtype = types.get(tensor)
            allowed = self.spec.inputs[self.spec.index(name)].dtypes
            if name == "attn_mask":
                if dtype is None:
                    raise TrtOpError(f"{where}: cannot tell whether attn_mask '{tensor}' is bool or additive "
                                     f"(shape inference gives it no type); declare its type in value_info")
                mask_kind = "bool" if dtype == TensorProto.BOOL else "float"
                if mask_kind == "float":
                    wide = _fresh(self.names, f"{tensor}__f32")
                    self.casts.append(helper.make_node("Cast", [tensor], [wide], name=_fresh(self.names, wide),
                                                       to=TensorProto.FLOAT))
                    self.kernel.input[list(self.kernel.input).index(tensor)] = wide
            if dtype is not None and _dtype_name(dtype) not in allowed:
                raise TrtOpError(f"{where}: input {name} '{tensor}' is {_dtype_name(dtype)}; "
                                 f"the doc allows {', '.join(allowed)}")
        self.kernel.op_type = ort_ops.variant_name(self.node.op_type, tuple(self.given), mask_kind)


_DTYPE_NAMES: dict[int, str] = {TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16",
                                 TensorProto.BFLOAT16: "bfloat16", TensorProto.BOOL: "bool", TensorProto.INT32: "int32"}


def _dtype_name(dtype: int) -> str:
    return _DTYPE_NAMES.get(dtype) or TensorProto.DataType.Name(dtype).lower()


def _set_nodes(graph: onnx.GraphProto, pieces) -> None:
    nodes = [n for p in pieces for n in (p.nodes() if isinstance(p, _Rewrite) else [p])]
    del graph.node[:]
    graph.node.extend(nodes)


def _tensor_names(graph: onnx.GraphProto) -> set[str]:
    names = {v.name for v in list(graph.input) + list(graph.output) + list(graph.value_info)}
    names |= {i.name for i in graph.initializer}
    for node in graph.node:
        names |= set(node.input) | set(node.output) | {node.name}
    return names


def _fresh(names: set[str], base: str) -> str:
    name, i = base, 1
    while name in names:
        name, i = f"{base}_{i}", i + 1
    names.add(name)
    return name


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor ONNX shape inference can type, without the weights' bytes
    (initializers become typed inputs, so models over 2 GB are inferred too)."""
    g = model.graph
    declared = {i.name for i in g.input}
    inputs = list(g.input) + [helper.make_tensor_value_info(i.name, i.data_type, list(i.dims))
                              for i in g.initializer if i.name not in declared]
    light = helper.make_model(helper.make_graph(list(g.node), g.name, inputs, list(g.output),
                                                value_info=list(g.value_info)),
                              opset_imports=list(model.opset_import), ir_version=model.ir_version,
                              functions=list(model.functions))
    inferred = onnx.shape_inference.infer_shapes(light)
    types = {}
    for value in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types[value.name] = value.type.tensor_type.elem_type
    return types
