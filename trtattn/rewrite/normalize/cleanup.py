"""cleanup: fold constants and infer shapes with Polygraphy, then drop nodes that do nothing at
inference (Identity, Dropout, Cast to the same type) so attention chains are what TensorRT expects."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...graph.view import GraphView, bf16_as_numpy, ir_version_like

FOLD_LIMIT = 16 << 20  # never fold a constant bigger than this (an Expand of a mask, say)


def fold(model: onnx.ModelProto) -> onnx.ModelProto:
    from polygraphy.backend.onnx import fold_constants
    from polygraphy.logger import G_LOGGER

    G_LOGGER.module_severity = G_LOGGER.ERROR
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


def _training(view: GraphView, node: gs.Node) -> bool:
    if len(node.inputs) < 3 or not node.inputs[2].name:
        return False
    v = view.const(node.inputs[2])
    return v is None or bool(np.asarray(v).reshape(-1)[0])


def cleanup(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    folded = fold(model)
    graph = gs.import_onnx(folded)
    bf16_as_numpy(graph)
    removed = remove_noops(graph)
    out = gs.export_onnx(graph.toposort())
    out.ir_version = ir_version_like(model)
    return out, {"folded_nodes": len(model.graph.node) - len(folded.graph.node), "noops_removed": removed}
