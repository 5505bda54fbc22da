"""Each lowering checked on ONNX Runtime against the op it replaces: both run as models of their own on the
values the op reads in the model (evaluated on the model's feeds), the op with default session options, the
lowering at the basic level (as every verification runs: the default level fuses DequantizeLinear + MatMul
back into MatMulNBits), and every element of every output read must be within the unit's bound
(base.Replacement: why it is that)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx import helper, numpy_helper

from ...errors import TrtattnError
from ...graph.evaluate import evaluator, session_options
from .base import LOWERED_OPSET, Constants, Replacement, rounding_bound


@dataclass(frozen=True)
class NodeCheck:
    node: str
    op: str  # domain:op_type
    max_abs_err: float
    worst: float  # the largest error / bound over the elements: <= 1
    why: str  # what the bound allows for


def node_values(model: onnx.ModelProto, nodes: list[onnx.NodeProto], feeds: list[dict]) -> list[dict]:
    """Per feed dict, the value of every input of `nodes` that is not a constant (graph inputs from the feeds,
    the others evaluated on ONNX Runtime from one session)."""
    constants = {t.name for t in model.graph.initializer}
    graph_inputs = {i.name for i in model.graph.input}
    wanted = sorted({i for n in nodes for i in n.input if i and i not in constants})
    computed = [name for name in wanted if name not in graph_inputs]
    run = None
    if computed:
        graph = gs.import_onnx(model)
        tensors = graph.tensors()
        run = evaluator(graph, [tensors[name] for name in computed], model)
    values = []
    for feed in feeds:
        found = {name: feed[name] for name in wanted if name in graph_inputs}
        if run is not None:
            found.update(zip(computed, run(feed)))
        values.append(found)
    return values


def _single(nodes, inputs: dict[str, np.ndarray], inits: list, outputs: list[str], opsets) -> bytes:
    graph = helper.make_graph(
        nodes, "lowering_check",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), None) for k, v in inputs.items()],
        [onnx.ValueInfoProto(name=o) for o in outputs], inits)
    model = helper.make_model(graph, opset_imports=opsets)
    standard = [o for o in opsets if o.domain in ("", "ai.onnx")]  # onnx knows no IR version for contrib domains
    model.ir_version = max(10, helper.find_min_ir_version_for(standard))
    return model.SerializeToString()


def check_node(node: onnx.NodeProto, lowered: Replacement, constants: Constants, values: list[dict],
               outputs: list[str], opsets) -> NodeCheck:
    """The op and its lowering on the op's own input values (each feed's), compared output by output."""
    import onnxruntime as ort

    fixed = [numpy_helper.from_array(np.asarray(constants.get(node, i, "input")), name)
             for i, name in enumerate(node.input) if name and name in constants.tensors]
    read = {i for n in lowered.nodes for i in n.input}
    original = _single([node], values[0], fixed, outputs, opsets)
    standard = [helper.make_opsetid("", LOWERED_OPSET)]
    candidate = _single(lowered.nodes, values[0], [t for t in fixed if t.name in read] + lowered.initializers,
                        outputs, standard)
    # the op as a user's session runs it; the lowering without ONNX Runtime's fusions, which would turn a
    # DequantizeLinear + MatMul back into MatMulNBits (and round A to int8 at its default accuracy level 4)
    sessions = [ort.InferenceSession(original, providers=["CPUExecutionProvider"]),
                ort.InferenceSession(candidate, session_options("basic"), providers=["CPUExecutionProvider"])]
    bound = lowered.bound or rounding_bound
    worst, err = 0.0, 0.0
    for feed in values:
        reference, result = (s.run(outputs, feed) for s in sessions)
        for name, ref, got, limit in zip(outputs, reference, result, bound(reference, feed)):
            if ref.shape != got.shape:
                raise TrtattnError(f"the lowering of {node.op_type} node '{node.name}' gives '{name}' the shape "
                                   f"{list(got.shape)} where ONNX Runtime's op gives {list(ref.shape)}")
            diff = np.abs(ref.astype(np.float64) - got.astype(np.float64))
            err = max(err, float(np.max(diff, initial=0.0)))
            worst = max(worst, float(np.max(diff / np.maximum(limit, np.finfo(np.float64).tiny), initial=0.0)))
    if not worst <= 1.0:
        raise TrtattnError(f"the lowering of {node.op_type} node '{node.name}' to standard ONNX differs from ONNX "
                           f"Runtime's op by {err:.3g}, {worst:.3g} times its bound ({lowered.why})")
    return NodeCheck(node.name, f"{node.domain or 'ai.onnx'}:{node.op_type}", err, worst, lowered.why)
