"""A rotary embedding read by what it computes, not by how it is written.

The candidate is the cone of ops between a tensor x (the same shape as the rotated output y) and y that reads
nothing but x, two float tables of one shape ([max_pos, R/2] indexed by an integer position tensor, or [B, S, R/2]
used as they are) and constants. It is a rotation when it computes, on random probe values run on ONNX Runtime,
what one RotaryEmbedding op (opset 23) computes from the same inputs, for some choice of the op's attributes:
pairs of lanes mixed by the tables, half-split or interleaved (`interleaved`), the first R of the head's lanes
rotated and the rest passed through (`rotary_embedding_dim`), heads folded into a 3-D input (`num_heads`).
ONNX's own RotaryEmbedding function body is such a cone, whatever its Split/Slice/Concat spelling.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ..graph.external import set_session_folder
from ..graph.rotary import OP, OPSET, RotaryAttrs
from ..graph.view import GraphView

# ops a rotation does not contain: the walk up from y stops at their outputs
STOP = {"MatMul", "Gemm", "Conv", "Einsum", "MatMulInteger", "Softmax", "Attention", "If", "Loop", "Scan",
        "RotaryEmbedding"}
MAX_NODES = 96  # a rotation body is ~40 ops (onnx's interleaved one: 38)
MAX_CANDIDATES = 4  # tensors tried as x, nearest to y first
PROBE_DIM = 3  # a symbolic dim the run's dims do not name
PROBE_POSITIONS = 64  # rows of a 2-D table whose length is symbolic


@dataclass(frozen=True)
class Rotation:
    x: gs.Tensor
    y: gs.Tensor
    cos: gs.Tensor
    sin: gs.Tensor
    position_ids: gs.Tensor | None
    interleaved: bool
    rotary_dim: int  # rotated lanes of each head
    head_size: int
    num_heads: int  # for a 3-D x (its heads folded into the last axis); 0 for 4-D

    @property
    def attrs(self) -> dict:
        """The RotaryEmbedding op's attributes (0 / absent where the op's default says the same)."""
        return RotaryAttrs.for_head(self.interleaved, self.rotary_dim, self.head_size, self.num_heads).as_attrs()


def read_rotation(view: GraphView, y: gs.Tensor) -> Rotation | None:
    """The rotation that computes `y`, or None when no cone above it computes one."""
    shape = view.shape(y)
    if shape is None or len(shape) not in (3, 4) or not isinstance(shape[-1], int):
        return None
    order = _walk(view, y, None)
    if order is None:
        return None
    candidates = [t for t in order[1] if t is not y and not _literal(view, t) and view.shape(t) == shape
                  and _is_float(view, t)]
    for x in candidates[:MAX_CANDIDATES]:
        found = _try(view, x, y)
        if found is not None:
            return found
    return None


def _walk(view: GraphView, y: gs.Tensor, stop: gs.Tensor | None):
    """(nodes, tensors in breadth-first order from y, leaves) of y's cone up to `stop`, graph inputs,
    constants and STOP ops; None past MAX_NODES."""
    nodes: dict[int, gs.Node] = {}
    seen: dict[int, gs.Tensor] = {}
    leaves: list[gs.Tensor] = []
    queue = [y]
    while queue:
        t = queue.pop(0)
        if id(t) in seen:
            continue
        seen[id(t)] = t
        n = view.producer(t)
        if t is stop or n is None or _literal(view, t) or n.op in STOP or (n.domain or "") not in ("", "ai.onnx"):
            leaves.append(t)
            continue
        if id(n) not in nodes:
            nodes[id(n)] = n
            if len(nodes) > MAX_NODES:
                return None
            queue.extend(i for i in n.inputs if i.name)
    return list(nodes.values()), list(seen.values()), leaves


def _is_float(view: GraphView, t: gs.Tensor) -> bool:
    dtype = view.dtype(t)
    if dtype is None or isinstance(dtype, int):  # an ONNX type numpy cannot name (onnx-graphsurgeon keeps fp8's enum)
        return False
    return np.dtype(dtype).kind == "f"


def _try(view: GraphView, x: gs.Tensor, y: gs.Tensor) -> Rotation | None:
    walked = _walk(view, y, x)
    if walked is None:
        return None
    nodes, _, leaves = walked
    others = [t for t in leaves if t is not x and not _small_constant(view, t)]
    tables = [t for t in others if _is_float(view, t)]
    positions = [t for t in others if not _is_float(view, t)]
    if len(tables) != 2 or len(positions) > 1 or view.shape(tables[0]) != view.shape(tables[1]):
        return None
    table_shape = view.shape(tables[0]) or []
    if len(table_shape) != (2 if positions else 3) or not isinstance(table_shape[-1], int):
        return None
    x_shape = view.shape(x) or []
    half = table_shape[-1]
    heads = [0] if len(x_shape) == 4 else [n for n in range(1, x_shape[-1] + 1) if x_shape[-1] % n == 0]
    hypotheses = []
    for num_heads in heads:
        head = x_shape[-1] // num_heads if num_heads else x_shape[-1]
        if 2 * half > head or head % 2:
            continue
        for interleaved in (False, True):
            for cos, sin in ((tables[0], tables[1]), (tables[1], tables[0])):
                hypotheses.append(Rotation(x, y, cos, sin, positions[0] if positions else None, interleaved,
                                           2 * half, head, num_heads))
    if not hypotheses:
        return None
    return _agreeing(view, nodes, x, y, tables, positions, hypotheses)


def _small_constant(view: GraphView, t: gs.Tensor) -> bool:
    """A constant that is not a table: a scalar or a short vector (shapes, axes, factors)."""
    shape = view.shape(t)
    return _literal(view, t) and shape is not None and len(shape) <= 1


def _literal(view: GraphView, t: gs.Tensor) -> bool:
    """A constant the graph writes (not one folded from shapes: the probes have their own shapes)."""
    n = view.producer(t)
    return isinstance(t, gs.Constant) or (n is not None and n.op == "Constant")


def _concrete(view: GraphView, shape: list, default: int) -> list[int]:
    dims = view.dims or {}
    return [d if isinstance(d, int) and d > 0 else int(dims.get(d, default)) if isinstance(d, str) else default
            for d in shape]


def _agreeing(view: GraphView, nodes, x, y, tables, positions, hypotheses) -> Rotation | None:
    """The first hypothesis whose RotaryEmbedding op computes what the cone computes on probe inputs."""
    import onnxruntime as ort

    dtype = np.dtype(view.dtype(x))
    x_shape = _concrete(view, view.shape(x) or [], PROBE_DIM)
    rows = view.shape(tables[0]) or []
    rng = np.random.default_rng(0)
    feeds = {x.name: rng.standard_normal(x_shape).astype(dtype)}
    # positions and tables at the graph's own shapes: one the op would not take as they are (positions
    # [1, S] for a batch of 3) makes the op refuse or disagree, and the rotation is not read
    if positions:
        table_shape = _concrete(view, rows, PROBE_POSITIONS)
        pos_shape = _concrete(view, view.shape(positions[0]) or [], PROBE_DIM)
        pos_dtype = np.dtype(view.dtype(positions[0]) or np.int64)
        feeds[positions[0].name] = rng.integers(0, table_shape[0], pos_shape).astype(pos_dtype)
    else:
        table_shape = _concrete(view, rows, PROBE_DIM)
    for t in tables:
        feeds[t.name] = rng.uniform(-1, 1, table_shape).astype(dtype)
    inputs = [x, *tables, *positions]
    try:
        cone = _cone_model(nodes, inputs, y, feeds, view)
        options = ort.SessionOptions()
        set_session_folder(options, view.model)  # the cone's weights left on disk: from the model's folder
        got = ort.InferenceSession(cone.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        ops = _reference_model(hypotheses, inputs, feeds)
        wants = ort.InferenceSession(ops.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception:  # a cone ONNX Runtime cannot run on the probes, or an op it refuses: not this rotation
        return None
    tol = 1e-2 if dtype == np.float16 else 1e-5
    for hypothesis, want in zip(hypotheses, wants):
        if got.shape == want.shape and np.allclose(got, want, rtol=tol, atol=tol):
            return hypothesis
    return None


def _cone_model(nodes, inputs, y, feeds, view: GraphView) -> onnx.ModelProto:
    graph = gs.Graph(nodes=nodes, outputs=[y], opset=view.opset).copy()
    by_name = graph.tensors()
    graph.inputs = []
    for t in inputs:  # the probed tensors as inputs, a stored table too
        made = by_name[t.name]
        if isinstance(made, gs.Constant):
            made = gs.Variable(t.name)
            for node in list(by_name[t.name].outputs):
                for k, i in enumerate(node.inputs):
                    if i.name == t.name:
                        node.inputs[k] = made
        made.dtype, made.shape = feeds[t.name].dtype, list(feeds[t.name].shape)
        graph.inputs.append(made)
    for name, t in graph.tensors().items():  # Constant nodes the walk stopped at: their values
        if isinstance(t, gs.Variable) and not t.inputs and name not in feeds:
            t.to_constant(view.const(view.tensors[name]))
    graph.outputs[0].dtype = feeds[inputs[0].name].dtype
    model = gs.export_onnx(graph, do_type_check=False)
    _raise_opset(model, view.opset)
    return model


def _reference_model(hypotheses, inputs, feeds) -> onnx.ModelProto:
    values = [onnx.helper.make_tensor_value_info(t.name, onnx.helper.np_dtype_to_tensor_dtype(feeds[t.name].dtype),
                                                 feeds[t.name].shape) for t in inputs]
    nodes, outputs = [], []
    for i, h in enumerate(hypotheses):
        ins = [h.x.name, h.cos.name, h.sin.name] + ([h.position_ids.name] if h.position_ids is not None else [])
        nodes.append(onnx.helper.make_node(OP, ins, [f"y{i}"], **h.attrs))
        outputs.append(onnx.helper.make_tensor_value_info(f"y{i}", values[0].type.tensor_type.elem_type, None))
    model = onnx.helper.make_model(onnx.helper.make_graph(nodes, "rotations", values, outputs),
                                   opset_imports=[onnx.helper.make_opsetid("", OPSET)])
    return model


def _raise_opset(model: onnx.ModelProto, opset: int) -> None:
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            imp.version = max(imp.version, opset)
