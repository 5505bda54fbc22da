"""An Attention node's qk_matmul_output computed beside it, from the op's own definition, so that the node
keeps only what IAttention gives (Y, and the present caches the form turns into cache updates).

IAttention (and TensorRT's ONNX parser, "only Attention nodes with one output") returns only Y. A user who
asked for the attention logits or weights (qk_matmul_output_mode 0: the scaled Q K^T, 1: with the mask, 2:
soft-capped, 3: the softmax) still gets them: the node is inlined by onnx's own function expansion (the
op schema's context-dependent body, `onnx.inliner`), the body is pruned to what computes output 3, and that
subgraph (MatMul, Mul, Add/Where, Tanh, Softmax, shape ops: all plain ONNX the parser takes) is spliced in
beside the node, reading the node's own inputs. Right by construction: it is the standard's definition.

A node that also concatenates a past cache is not split: the kv-cache form turns the past into a preallocated
cache of another length, over which these logits would not be the original's (named by the caller).
"""

from __future__ import annotations

import onnx
import onnx.inliner

from ...errors import SitesRefused, TrtattnError
from ...graph.shapes import tensor_types

QK = 3  # qk_matmul_output's index among Attention's outputs
SOFTCAPPED = "its logits are soft-capped (tanh), which IAttention cannot do"
QK_OVER_CACHE = ("it also outputs its QK matmul (qk_matmul_output) over past + new keys: the kv-cache form makes the "
                 "past a preallocated cache of another length, over which logits computed beside IAttention would "
                 "not be the original's")


def returns_qk(node: onnx.NodeProto) -> bool:
    return node.op_type == "Attention" and node.domain in ("", "ai.onnx") and len(node.output) > QK \
        and bool(node.output[QK])


def qk_outputs_beside(model: onnx.ModelProto, sites: dict, in_op: list[str]) -> tuple[onnx.ModelProto, list[str]]:
    """qk_beside for every site (Attention node -> AttentionSite) that returns its QK matmul; a SitesRefused naming
    those that also take a past cache inside the op (in_op: module doc), and the soft-cap first where they have one."""
    returned = {node for node, site in sites.items() if site.qk_output}
    cached = sorted(returned & set(in_op))
    if cached:
        capped = {n.name for n in model.graph.node if any(a.name == "softcap" and a.f for a in n.attribute)}
        raise SitesRefused(f"sites {', '.join(sites[n].name for n in cached)} also output their QK matmul over a past "
                           "cache", [(sites[n].name, (SOFTCAPPED + "; " if n in capped else "") + QK_OVER_CACHE)
                                     for n in cached])
    return qk_beside(model, returned)


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
    """The nodes of the op's function body (onnx's expansion of this very node, its input types given) that
    compute its output 3, every internal tensor and node name under `prefix`."""
    qk = node.output[QK]
    inputs = []
    for name in dict.fromkeys(x for x in node.input if x):
        elem, shape = types.get(name, (None, None))
        if not elem:
            raise TrtattnError(f"Attention {node.name}: the type of its input {name} is unknown, so the QK output "
                               "cannot be expanded from the op's body")
        inputs.append(onnx.helper.make_tensor_value_info(name, elem, shape))
    alone = onnx.helper.make_model(
        onnx.helper.make_graph([node], "attention", inputs, [onnx.helper.make_tensor_value_info(qk, 0, None)]),
        opset_imports=opsets)
    expanded = onnx.inliner.inline_selected_functions(alone, [(node.domain, "Attention")],
                                                      inline_schema_functions=True)
    producer = {o: n for n in expanded.graph.node for o in n.output if o}
    if any(n.op_type == "Attention" for n in expanded.graph.node) or qk not in producer:
        raise TrtattnError(f"Attention {node.name}: onnx's function expansion gave no body computing its "
                           "qk_matmul_output")
    keep, todo = set(), [qk]
    while todo:  # the nodes output 3 depends on (subgraph attributes: the body has none)
        n = producer.get(todo.pop())
        if n is not None and id(n) not in keep:
            keep.add(id(n))
            todo.extend(x for x in n.input if x)
    given = set(node.input) | {qk}
    rename = lambda name: name if not name or name in given else prefix + name  # noqa: E731
    body = []
    for n in expanded.graph.node:
        if id(n) in keep:
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.name = prefix + (n.name or n.output[0])
            copy.input[:] = [rename(x) for x in n.input]
            copy.output[:] = [rename(x) for x in n.output]
            body.append(copy)
    return body
