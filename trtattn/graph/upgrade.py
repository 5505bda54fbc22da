"""The opset upgrade node by node, where ONNX's and onnxscript's converters refuse the whole model: each
default-domain node whose op ONNX changed between the two opsets is converted on its own (a model of that one
node through ONNX's converter); the others are kept. An op ONNX does not define at the model's opset is ONNX
Runtime's own in the default domain (its LayerNormalization below 17, SimplifiedLayerNormalization): kept, and
where ONNX defines it at the target opset under the same name, without the attributes ONNX's schema does not
have (ONNX Runtime ran the model without reading them: ORT's transformer-optimizer test models misspell
LayerNormalization's epsilon as "epsion"). Whatever is written is verified against the model read.
"""

from __future__ import annotations

import onnx
import onnx.defs
from onnx import helper, version_converter

from ..errors import TrtattnError

STANDARD = ("", "ai.onnx")


def _schema(op: str, version: int):
    try:
        return onnx.defs.get_schema(op, version, "")
    except onnx.defs.SchemaError:
        return None


def _types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Every tensor's type that ONNX's inference (at the model's own opset) or the model states."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # onnx's inference errors share no base: the types the model states
        inferred = model
    g = inferred.graph
    types = {v.name: v.type for v in [*g.value_info, *g.input, *g.output]}
    for t in g.initializer:
        types.setdefault(t.name, helper.make_tensor_type_proto(t.data_type, list(t.dims)))
    return types


def _converted_node(node: onnx.NodeProto, source: int, target: int, types: dict, constants: dict) -> tuple[list, list]:
    """(nodes, initializers) computing `node` at opset `target`, from ONNX's converter on a model of it alone
    (its constant inputs as initializers: adapters read attributes moved to inputs from them)."""
    float_type = helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, None)
    inputs = [helper.make_value_info(i, types.get(i, float_type)) for i in dict.fromkeys(node.input)
              if i and i not in constants]
    outputs = [helper.make_value_info(o, types[o]) if o in types else onnx.ValueInfoProto(name=o)
               for o in node.output if o]
    inits = [constants[i] for i in dict.fromkeys(node.input) if i in constants]
    single = helper.make_model(helper.make_graph([node], "node", inputs, outputs, inits),
                               opset_imports=[helper.make_opsetid("", source)])
    try:
        converted = version_converter.convert_version(single, target)
    except Exception as e:  # the converter's errors share no base
        raise TrtattnError(f"cannot convert {node.op_type} node '{node.name}' from opset {source} to {target}: "
                           f"{str(e).splitlines()[0]}") from None
    prefix = f"trtattn/upgrade/{node.name or node.output[0]}/"
    kept = {*node.input, *node.output}
    renamed = {t.name: prefix + t.name for t in converted.graph.initializer if t.name not in kept}
    renamed.update({o: prefix + o for n in converted.graph.node for o in n.output if o not in kept})
    for n in converted.graph.node:
        n.input[:] = [renamed.get(i, i) for i in n.input]
        n.output[:] = [renamed.get(o, o) for o in n.output]
    new_inits = [t for t in converted.graph.initializer if t.name in renamed]
    for t in new_inits:
        t.name = renamed[t.name]
    return list(converted.graph.node), new_inits


def _kept_contrib(node: onnx.NodeProto, target: int) -> onnx.NodeProto:
    """ONNX Runtime's own op in the default domain: as it is, its attributes ONNX's schema (if any) lacks dropped."""
    schema = _schema(node.op_type, target)
    if schema is None:
        return node
    kept = onnx.NodeProto()
    kept.CopyFrom(node)
    del kept.attribute[:]
    kept.attribute.extend(a for a in node.attribute if a.name in schema.attributes)
    return kept


def _graph_by_node(graph: onnx.GraphProto, source: int, target: int, types: dict, constants: dict) -> None:
    nodes, inits = [], []
    for node in graph.node:
        for a in node.attribute:  # bodies first: their nodes are the model's too
            for body in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                _graph_by_node(body, source, target, types, constants)
        if node.domain not in STANDARD:
            nodes.append(node)
            continue
        here, there = _schema(node.op_type, source), _schema(node.op_type, target)
        if here is None:
            nodes.append(_kept_contrib(node, target))
        elif there is not None and there.since_version <= source or any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            nodes.append(node)  # unchanged between the opsets (or control flow, whose changes are types only)
        else:
            more, new = _converted_node(node, source, target, types, constants)
            nodes += more
            inits += new
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(inits)


def upgrade_by_node(model: onnx.ModelProto, source: int, target: int) -> onnx.ModelProto:
    """`model` (weights set aside by the caller) at default-domain opset `target`, node by node (module doc)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    constants = {t.name: t for t in model.graph.initializer}
    _graph_by_node(out.graph, source, target, _types(model), constants)
    for o in out.opset_import:
        if o.domain in STANDARD:
            o.version = target
    return out
