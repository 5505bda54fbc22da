"""ONNX Runtime's own ops around attention lowered to standard ONNX, each checked on ONNX Runtime against the
op it replaces, before anything that knows standard ONNX only (ModelOpt's AutoCast, the precision table,
TensorRT's parser) sees the model. One small unit per op (as torch-tensorrt registers one converter per op):

    com.microsoft SkipLayerNormalization            -> Add (+ bias) + LayerNormalization     (norms.py)
    com.microsoft SkipSimplifiedLayerNormalization  -> Add (+ bias) + RMSNormalization
    SimplifiedLayerNormalization (default domain)   -> RMSNormalization
    com.microsoft MatMulNBits                       -> blocked DequantizeLinear (int4) + MatMul (nbits.py)

    lowered = lower_contrib(model, feeds)   # None: nothing to lower; else .model, .checks, .note()

The lowered model is at opset 23 (RMSNormalization's). An op whose configuration has no exact lowering here
is CannotLower naming the node; one whose lowering is not within its bound on ONNX Runtime is a TrtattnError
naming the node and the error.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx

from ...graph.shapes import upgrade_opset
from . import nbits, norms
from .base import LOWERED_OPSET, CannotLower, Constants, Replacement
from .check import NodeCheck, check_node, node_values

__all__ = ["LOWERINGS", "CannotLower", "Lowered", "lower_contrib", "lowerable"]

Unit = Callable[[onnx.NodeProto, Constants, set[str]], Replacement]

LOWERINGS: dict[tuple[str, str], tuple[Unit, str]] = {  # (domain, op) -> (unit, what it becomes)
    ("com.microsoft", "SkipLayerNormalization"): (norms.skip_layer, "Add + LayerNormalization"),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"): (norms.skip_simplified, "Add + RMSNormalization"),
    ("", "SimplifiedLayerNormalization"): (norms.simplified, "RMSNormalization"),
    ("com.microsoft", "MatMulNBits"): (nbits.lower, "blocked DequantizeLinear + MatMul"),
}


def _key(node: onnx.NodeProto) -> tuple[str, str]:
    return ("" if node.domain == "ai.onnx" else node.domain, node.op_type)


def lowerable(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The main graph's nodes of ops LOWERINGS has a unit for."""
    return [n for n in model.graph.node if _key(n) in LOWERINGS]


@dataclass
class Lowered:
    model: onnx.ModelProto
    checks: list[NodeCheck] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return dict(Counter(c.op for c in self.checks))

    def note(self) -> str:
        """What was lowered and how it was checked, in one line (the build plan's note)."""
        parts = []
        for op, count in self.counts().items():
            domain, _, op_type = op.partition(":")
            mine = [c for c in self.checks if c.op == op]
            worst = max(mine, key=lambda c: c.worst)
            parts.append(f"{count} {op} as {LOWERINGS[('' if domain == 'ai.onnx' else domain, op_type)][1]} "
                         f"(max abs error {worst.max_abs_err:.3g}; bound: {worst.why})")
        return ("ONNX Runtime's own ops lowered to standard ONNX, each checked on ONNX Runtime against the op: "
                + "; ".join(parts))


def _consumed(model: onnx.ModelProto) -> set[str]:
    read = {i for n in model.graph.node for i in n.input}
    for node in model.graph.node:  # names a subgraph reads from the scope around it
        for a in node.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                read |= {i for n in g.node for i in n.input}
    return read | {o.name for o in model.graph.output}


def lower_contrib(model: onnx.ModelProto, feeds: list[dict]) -> Lowered | None:
    """`model` with every lowerable op replaced by standard ONNX, each replacement checked on `feeds` (the
    model's inputs; at least one dict); None when there is nothing to lower. The input model is not changed."""
    nodes = lowerable(model)
    if not nodes:
        return None
    constants, consumed = Constants(model), _consumed(model)
    replacements = {id(n): LOWERINGS[_key(n)][0](n, constants, consumed) for n in nodes}
    values = node_values(model, nodes, feeds)
    checks = []
    for node in nodes:
        outputs = [o for o in node.output if o and o in consumed]
        checks.append(check_node(node, replacements[id(node)], constants,
                                 [{k: v[k] for k in node.input if k in v} for v in values], outputs,
                                 list(model.opset_import)))
    return Lowered(_replaced(model, nodes, replacements), checks)


def _replaced(model: onnx.ModelProto, nodes: list[onnx.NodeProto], replacements: dict) -> onnx.ModelProto:
    """The model at opset 23 with each node in `nodes` replaced where it stood; weights only they read dropped."""
    out = upgrade_opset(model, LOWERED_OPSET)  # contrib nodes come through as they were: matched by outputs
    targets = {tuple(n.output): replacements[id(n)] for n in nodes}
    new_nodes, new_inits = [], []
    for node in out.graph.node:
        target = targets.pop(tuple(node.output), None) if _key(node) in LOWERINGS else None
        if target is not None:
            new_nodes += target.nodes
            new_inits += target.initializers
        else:
            new_nodes.append(node)
    if targets:
        raise CannotLower(f"the opset upgrade to {LOWERED_OPSET} changed the nodes making {next(iter(targets))}")
    del out.graph.node[:]
    out.graph.node.extend(new_nodes)
    read = _consumed(out) | {i for n in new_nodes for i in n.input}
    kept = [t for t in out.graph.initializer if t.name in read]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept + new_inits)
    if not any(n.domain == "com.microsoft" for n in out.graph.node):
        kept_imports = [o for o in out.opset_import if o.domain != "com.microsoft"]
        del out.opset_import[:]
        out.opset_import.extend(kept_imports)
    return out
