"""What the split finder reads off the original model by running it once: every tensor's shape and the
values of the small integer tensors (shape arithmetic), at dims the model runs on.

The finder maps a sharded axis through Reshape and Flatten by these shapes (numbers, not patterns), and
tells a shape entry the graph computes from a sharded tensor's Shape from one it holds as a constant by
evaluating the shape arithmetic again with the rank's shapes (`rank_value`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...graph.evaluate import ort_session
from ...graph.io import extra_outputs

SMALL = 64  # integer tensors up to this many elements keep their values (shapes, indices, axes)


@dataclass
class Facts:
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    values: dict[str, np.ndarray] = field(default_factory=dict)  # small integer tensors and every feed
    dtypes: dict[str, np.dtype] = field(default_factory=dict)


def measure_all(model: onnx.ModelProto, feeds: dict[str, np.ndarray], budget: int | None = None) -> Facts:
    """Run `model` (main graph only) on ONNX Runtime with every node output fetched; in slices of layers of
    at most `budget` resident bytes of weights each (graph/slices.py) when given, one session at a time."""
    names = [o for n in model.graph.node for o in n.output if o]
    addresses = {n.input[1] for n in model.graph.node if n.op_type == "ScatterND"}  # read by value: any size
    if budget:
        from ...graph import slices

        wanted = {i.name for i in model.graph.input}
        (values,) = slices.run(model, slices.plan(model, names, budget), [{k: v for k, v in feeds.items() if k in
                                                                           wanted}], names, level="disable")
        fetched, results = names, [values[n] for n in names]
    else:
        with extra_outputs(model, names) as wide:
            session = ort_session(wide, level="disable")
            fetched = [o.name for o in session.get_outputs()]
            results = session.run(fetched, {i.name: feeds[i.name] for i in session.get_inputs()})
    facts = Facts()
    for name, value in zip(fetched, results):
        value = np.asarray(value)
        facts.shapes[name] = tuple(int(d) for d in value.shape)
        facts.dtypes[name] = value.dtype
        if value.dtype.kind in "iub" and (value.size <= SMALL or name in addresses):
            facts.values[name] = value
    for name, value in feeds.items():
        facts.shapes[name] = tuple(int(d) for d in np.shape(value))
        facts.dtypes[name] = np.asarray(value).dtype
        facts.values[name] = np.asarray(value)
    return facts


def addressed_block(indices: np.ndarray | None, data: tuple[int, ...], ranks: int, data_shard=None,
                    updates_shard=None) -> tuple[int, int] | None:
    """(data axis a, indices axis j) such that the ranks' blocks of ScatterND `indices` along j address only
    the rank's block of data axis a, by their measured values (a cache update's head index: j its heads axis)."""
    if indices is None:
        return None
    axes = [data_shard.axis] if data_shard is not None else range(indices.shape[-1])
    js = [updates_shard.axis] if updates_shard is not None else range(indices.ndim - 1)
    for a in axes:
        for j in js:
            if a >= indices.shape[-1] or j >= indices.ndim - 1 or data[a] % ranks or indices.shape[j] % ranks:
                continue
            block = data[a] // ranks
            parts = np.split(np.asarray(indices)[..., a], ranks, axis=j)
            if all(((p >= r * block) & (p < (r + 1) * block)).all() for r, p in enumerate(parts)):
                return a, j
    return None


def constant_value(t: gs.Tensor) -> np.ndarray | None:
    """The value of a weight or of a Constant node's output; None for an activation."""
    if isinstance(t, gs.Constant):
        return np.asarray(t.values)
    if len(t.inputs) == 1 and t.inputs[0].op == "Constant":
        attrs = t.inputs[0].attrs
        if "value" in attrs:
            return np.asarray(attrs["value"].values)
        for key in ("value_int", "value_float"):
            if key in attrs:
                return np.asarray(attrs[key])
        for key in ("value_ints", "value_floats"):
            if key in attrs:
                return np.asarray(attrs[key])
    return None


class RankValues:
    """Integer tensors evaluated as the rank computes them: Shape of a sharded tensor gives the rank's
    shape, everything else as the graph says (onnx's reference evaluator, one node at a time, memoized)."""

    def __init__(self, facts: Facts, rank_shape, opset: int):
        self.facts = facts
        self.rank_shape = rank_shape  # tensor name -> its shape on a rank
        self.opset = opset
        self.memo: dict[str, np.ndarray] = {}

    def value(self, t: gs.Tensor) -> np.ndarray:
        if t.name in self.memo:
            return self.memo[t.name]
        const = constant_value(t)
        if const is not None:
            return const
        if not t.inputs:  # a graph input: the feed
            return self.facts.values[t.name]
        node = t.inputs[0]
        if node.op == "Shape":
            shape = np.asarray(self.rank_shape(node.inputs[0].name), dtype=np.int64)
            start, end = node.attrs.get("start", 0), node.attrs.get("end")
            out = shape[start:end]
        elif node.op == "Size":
            out = np.asarray(np.prod(self.rank_shape(node.inputs[0].name)), dtype=np.int64)
        else:
            for i in node.inputs:
                if i.name and i.dtype is not None and np.dtype(i.dtype).kind == "f" and constant_value(i) is None:
                    raise ValueError(f"{node.op} node '{node.name}' computes a shape from float data")
            out = self._evaluate(node)[node.outputs.index(t)]
        self.memo[t.name] = out
        return out

    def _evaluate(self, node: gs.Node) -> list[np.ndarray]:
        from onnx.reference import ReferenceEvaluator

        ins = [self.value(i) if i.name else None for i in node.inputs]
        names = [f"in{k}" if i.name else "" for k, i in enumerate(node.inputs)]
        outs = [f"out{k}" for k in range(len(node.outputs))]
        attrs = {k: (v.values if isinstance(v, gs.Constant) else v) for k, v in node.attrs.items()}
        proto = onnx.helper.make_node(node.op, names, outs, domain=node.domain or "", **_attrs(attrs))
        graph = onnx.helper.make_graph(
            [proto], "eval",
            [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype), None)
             for n, v in zip(names, ins) if n],
            [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs])
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", self.opset)])
        feeds = {n: np.asarray(v) for n, v in zip(names, ins) if n}
        return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, feeds)]


def _attrs(attrs: dict) -> dict:
    out = {}
    for k, v in attrs.items():
        if isinstance(v, np.ndarray):
            out[k] = onnx.numpy_helper.from_array(v)
        else:
            out[k] = v
    return out
