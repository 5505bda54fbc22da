"""cleanup: fold constants and infer shapes with Polygraphy, then drop nodes that do nothing at
inference (Identity, Dropout, Cast to the same type) so attention chains are what TensorRT expects.
Shape nodes with a start or an end are folded as a Slice of the whole shape (graph/shape_slices.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...graph import shape_slices
from ...graph.view import GraphView, bf16_as_numpy, ir_version_like

FOLD_LIMIT = 16 << 20  # never fold a constant bigger than this (an Expand of a mask, say)


def fold(model: onnx.ModelProto) -> onnx.ModelProto:
    from polygraphy.backend.onnx import fold_constants
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR
    graph = gs.import_onnx(model)
    if shape_slices.explicit(graph):  # folded right only in this form: merge() puts the rest back
        model = gs.export_onnx(graph, do_type_check=False)
    return fold_constants(model, copy=True, error_ok=True, partitioning="basic", size_threshold=FOLD_LIMIT)


def remove_noops(graph: gs.Graph) -> int:
    """Bypass Identity, Dropout (inference) and same-type Cast nodes, in If/Loop/Scan bodies too. Returns how
    many went."""
    from ...match.subgraphs import subgraphs

    removed = sum(remove_noops(sub) for _, _, sub in list(subgraphs(graph)))
    view = GraphView(graph, fold=False)
    outputs = {t.name for t in graph.outputs}
    for node in list(graph.nodes):
        noop = node.op == "Identity" or (node.op == "Dropout" and not _training(view, node)) or view.is_noop_cast(node)
        if not noop or not node.outputs:
            continue
        src, dst = node.inputs[0], node.outputs[0]
        if dst.name in outputs or (node.op == "Dropout" and len(node.outputs) > 1 and node.outputs[1].outputs):
            continue
        for consumer in list(dst.outputs):
            for i, t in enumerate(consumer.inputs):
                if t is dst:
                    consumer.inputs[i] = src
        node.outputs.clear()
        removed += 1
    graph.cleanup()
    return removed


def name_nodes(graph: gs.Graph) -> None:
    """A name for every node that has none or shares one (function bodies inlined leave them unnamed): sites name
    their Softmax, and the rewrite finds it by that name."""
    from ...match.subgraphs import subgraphs

    seen: set[str] = set()
    for node in graph.nodes:
        if not node.name or node.name in seen:
            out = node.outputs[0].name if node.outputs else str(len(seen))
            node.name = next(n for n in (f"{node.op}:{out}", *(f"{node.op}:{out}:{i}" for i in range(1, 1 << 16)))
                             if n not in seen)
        seen.add(node.name)
    for _, _, sub in subgraphs(graph):
        name_nodes(sub)


def _training(view: GraphView, node: gs.Node) -> bool:
    if len(node.inputs) < 3 or not node.inputs[2].name:
        return False
    v = view.const(node.inputs[2])
    return v is None or bool(np.asarray(v).reshape(-1)[0])


@dataclass(frozen=True)
class CleanupStats:
    """What cleanup removed: the nodes constant folding took, the no-ops after it (normalize's report)."""

    folded_nodes: int = 0
    noops_removed: int = 0

    def __add__(self, other: CleanupStats) -> CleanupStats:  # a merged decoder's branches, counted together
        return CleanupStats(self.folded_nodes + other.folded_nodes, self.noops_removed + other.noops_removed)

    @property
    def changed(self) -> bool:
        return self.folded_nodes > 0 or self.noops_removed > 0

    def to_json(self) -> dict:
        return {"folded_nodes": self.folded_nodes, "noops_removed": self.noops_removed}


def cleanup(model: onnx.ModelProto) -> tuple[onnx.ModelProto, CleanupStats]:
    graph = gs.import_onnx(fold(model))
    bf16_as_numpy(graph)
    shape_slices.merge(graph)
    graph.cleanup()
    folded_nodes = len(model.graph.node) - len(graph.nodes)
    removed = remove_noops(graph)
    name_nodes(graph)
    out = gs.export_onnx(graph.toposort())
    out.ir_version = ir_version_like(model)
    return out, CleanupStats(folded_nodes, removed)
