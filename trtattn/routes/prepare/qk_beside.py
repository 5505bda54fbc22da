"""An Attention node's qk_matmul_output computed beside it, from the op's own definition, so that the node
keeps only what IAttention gives (Y, and the present caches the form turns into cache updates).

IAttention (and TensorRT's ONNX parser, "only Attention nodes with one output") returns only Y. A user who
asked for the attention logits or weights (qk_matmul_output_mode 0: the scaled Q K^T, 1: with the mask, 2:
soft-capped, 3: the softmax) still gets them: the node's own function body is taken as onnx's function
expansion builds it (the op schema's context-dependent body for this node and its input types; `onnx.inliner`
asks a type of an input left out, such as past_key before nonpad_kv_seqlen), pruned to what computes output 3, and that
subgraph (MatMul, Mul, Add/Where, Tanh, Softmax, shape ops: all plain ONNX the parser takes) is spliced in
beside the node, reading the node's own inputs. Right by construction: it is the standard's definition.

A node that also takes a past cache inside the op is split after the kv-cache form has rewritten and fitted it
(op_cache.py, op_fit.py), from that node's own body: the logits over the preallocated cache (capacity columns;
each row's first write index + new tokens are the original's, which is how the form is verified against it).
"""

from __future__ import annotations

import onnx
import onnx.defs

from ...contract import MAX_CACHE
from ...errors import SitesRefused, TrtattnError
from ...graph.shapes import tensor_types
from ...site import SOFTCAP_WHY, attribute_softcap

QK = 3  # qk_matmul_output's index among Attention's outputs


def returns_qk(node: onnx.NodeProto) -> bool:
    return node.op_type == "Attention" and node.domain in ("", "ai.onnx") and len(node.output) > QK \
        and bool(node.output[QK])


def qk_outputs_beside(model: onnx.ModelProto, sites: dict, in_op: list[str]
                      ) -> tuple[onnx.ModelProto, list[str], set[str]]:
    """qk_beside for every site (Attention node -> AttentionSite) that returns its QK matmul and takes no past
    cache inside the op: (the model, notes, the nodes left for qk_over_cache, which do take one). A SitesRefused
    names those with a past that are soft-capped (their Y cannot be IAttention's, and the kv-cache form has no
    implicit fallback)."""
    returned = {node for node, site in sites.items() if site.qk_output}
    cached = returned & set(in_op)
    capped = sorted(n.name for n in model.graph.node if n.name in cached
                    and attribute_softcap({a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}))
    if capped:
        raise SitesRefused("; ".join(f"{sites[n].name}: {SOFTCAP_WHY}" for n in capped),
                           [(sites[n].name, SOFTCAP_WHY) for n in capped])
    model, notes = qk_beside(model, returned - cached)
    return model, notes, cached


def qk_over_cache(model: onnx.ModelProto, nodes: set[str]) -> tuple[onnx.ModelProto, list[str]]:
    """qk_beside for Attention nodes the kv-cache form rewrote and fitted (op_cache.py, op_fit.py: Q, the updated
    caches, one mask padded to the capacity with the original's causal offsets folded in, nonpad_kv_seqlen = write
    index + new tokens): their own body gives the logits over the cache's capacity, the original's over each row's
    first write index + new keys."""
    before = {n.name: n.output[QK] for n in model.graph.node if n.name in nodes and returns_qk(n)}
    model, notes = qk_beside(model, nodes)
    for value in [*model.graph.output, *model.graph.value_info]:  # its keys axis: the cache's capacity
        dims = value.type.tensor_type.shape.dim
        if value.name in before.values() and len(dims) == 4:
            dims[3].ClearField("dim_value")
            dims[3].dim_param = MAX_CACHE
    return model, [note + "; in the kv-cache form over the cache's capacity: a row's columns past its write index + "
                   "new tokens are not keys of the original" for note in notes]


def qk_beside(model: onnx.ModelProto, nodes: set[str]) -> tuple[onnx.ModelProto, list[str]]:
    """(the model with each named Attention node's qk_matmul_output computed beside it, notes); the model is not
    modified; unchanged (the same object) when no named node returns it."""
    todo = [n for n in model.graph.node if n.name in nodes and returns_qk(n)]
    if not todo:
        return model, []
    types = tensor_types(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph, notes = out.graph, []
    for i, original in enumerate(todo):
        node = next(n for n in graph.node if n.name == original.name)
        body = qk_body(node, types, list(model.opset_import), prefix=f"trtattn/qk/{node.name or i}/")
        at = list(graph.node).index(node)
        node.output[QK] = ""
        while node.output and not node.output[-1]:  # optional outputs left out at the end
            node.output.pop()
        for j, n in enumerate(body):
            graph.node.insert(at + 1 + j, n)
        mode = next((a.i for a in node.attribute if a.name == "qk_matmul_output_mode"), 0)
        notes.append(f"Attention {node.name}: its qk_matmul_output {original.output[QK]} (mode {mode}) computed beside "
                     f"IAttention by the op's own function body ({len(body)} standard ops; IAttention returns only Y)")
    return out, notes


def qk_body(node: onnx.NodeProto, types: dict, opsets: list, prefix: str) -> list[onnx.NodeProto]:
    """The nodes of the op's function body (the schema's context-dependent body for this very node and its input
    types, as onnx's function expansion builds it) that compute its output 3, every internal tensor and node name
    under `prefix`."""
    opset = next((o.version for o in opsets if o.domain in ("", "ai.onnx")), onnx.defs.onnx_opset_version())
    schema = onnx.defs.get_schema("Attention", opset, "")  # (onnx's stubs lack its function members)
    if not schema.has_context_dependent_function:  # type: ignore[attr-defined]
        raise TrtattnError(f"Attention {node.name}: onnx defines no function body for it at opset {opset}")
    input_types = []
    for name in node.input:
        elem = types.get(name, (None, None))[0] if name else None
        if name and not elem:
            raise TrtattnError(f"Attention {node.name}: the type of its input {name} is unknown, so its QK output "
                               "cannot be expanded from the op's body")
        input_types.append(onnx.helper.make_tensor_type_proto(elem, None) if elem else onnx.TypeProto())
    function = onnx.FunctionProto()
    function.ParseFromString(schema.get_context_dependent_function(  # type: ignore[attr-defined]
        node.SerializeToString(), [t.SerializeToString() for t in input_types]))
    outer = dict(zip(function.input, node.input))  # formal -> actual ('' where the node leaves it out)
    qk = function.output[QK]
    producer = {o: n for n in function.node for o in n.output if o}
    if qk not in producer:
        raise TrtattnError(f"Attention {node.name}: onnx's function body computes no qk_matmul_output")
    keep, todo = set(), [qk]
    while todo:  # the nodes output 3 depends on
        n = producer.get(todo.pop())
        if n is not None and id(n) not in keep:
            keep.add(id(n))
            todo.extend(x for x in n.input if x)

    def rename(name: str) -> str:
        return node.output[QK] if name == qk else outer[name] if name in outer else prefix + name if name else ""

    body = []
    for n in function.node:
        if id(n) not in keep:
            continue
        if any(a.ref_attr_name or a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in n.attribute):
            raise TrtattnError(f"Attention {node.name}: its function body's {n.op_type} refers to attributes or "
                               "subgraphs; not spliced")
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        copy.name = prefix + (n.name or n.output[0])
        copy.input[:] = [rename(x) for x in n.input]
        copy.output[:] = [rename(x) for x in n.output]
        body.append(copy)
    return body
