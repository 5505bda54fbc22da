"""The attention core re-emitted in TensorRT's documented pattern, for sites whose logits change layout on
the way to the Softmax (heads merged into a [B*N, S, S] batch around it, Einsum products, a mask added in
another view): the in-place rewrite of q_prescale + mask_form cannot give those one Softmax input.

From the site's layout (match/axes.py frames), as the fuse rewrite reads it (rewrite/layout.py):

    Q, K, V -> [batch, heads, seq, dim];  MatMul(Q * scale, K^T) -> one Where/Add -> Softmax -> MatMul(., V)
            -> the output in the layout the graph had

A NaN guard the original had after its Softmax goes after the second MatMul (probabilities.py), and so does the
ONNX Attention op's fully-masked-row guard, testing the bias it tested as the new core adds it.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...graph.emit import Emitter, float_dtype
from ...graph.view import GraphView
from ...match import logit_ops
from ...site import AttentionSite, MaskKind
from ...site_names import site_scope
from ..layout import Dims, convert


def needed(site: AttentionSite) -> bool:
    """Does the site need the core re-emitted (the in-place rewrite assumes logits, mask and Softmax in one
    4-D view, and a K^T the first MatMul reads)?"""
    frames = {tuple(map(tuple, s.frame)) for s in site.mask_steps if s.frame is not None}
    einsum = site.layout is not None and site.key_transposed is None  # matched, but no K^T a MatMul reads
    return site.rank != 4 or einsum or len(frames) > 1 or any(len(f) != 4 for f in frames)


def _produce(target: gs.Tensor, made: gs.Tensor) -> None:
    """`target` (a tensor the graph reads) is now computed by the node that made `made`."""
    node = made.inputs[0]
    target.inputs.clear()
    node.outputs = [target if o is made else o for o in node.outputs]


def _shape_of(emit: Emitter, dims: Dims, read: gs.Tensor, frame) -> gs.Tensor:
    """What the Shape node making `read` gives for a tensor (of `frame`) the re-emitted core no longer has."""
    shape = read.inputs[0]
    full = dims.shape(frame)
    start, end = shape.attrs.get("start"), shape.attrs.get("end")
    if start is None and end is None:
        return full
    rank = len(frame)
    lo = (start or 0) % rank if (start or 0) < 0 else (start or 0)
    hi = rank if end is None else (end % rank if end < 0 else min(end, rank))
    return emit("Slice", [full, emit.const([lo], np.int64), emit.const([hi], np.int64)], dtype=np.int64)


def canonical_core(graph: gs.Graph, tensors: dict, site: AttentionSite, softmax: gs.Node, *, guard: bool,
                   row_guard: tuple | None = None) -> str:
    """Replace the site's core by the documented pattern (module doc). Returns the mask's description;
    raises ValueError naming what the pattern cannot hold (the caller leaves the site as it was).
    `row_guard`: probabilities.row_guard's (Where, MatMul, bias, condition) after the site's Softmax."""
    lay = site.layout
    if lay is None:
        raise ValueError("no layout to re-emit the attention from")
    if site.quant is not None:
        raise ValueError("a quantized attention (its Q/DQ would have to move with the core)")
    if tuple(lay.kv_heads) != tuple(lay.heads):
        raise ValueError("grouped K/V heads in a merged layout (they would have to be repeated)")
    guarded_step = _guarded_step(graph, tensors, site, row_guard[2], row_guard[3]) if row_guard else None
    fill = row_guard[0].inputs[1] if row_guard else None  # CastLike(0, P): goes with the guard it fills
    for name, _ in lay.shape_reads:
        if fill is not None and tensors[name] is fill:
            continue
        if not tensors[name].inputs or tensors[name].inputs[0].op != "Shape":
            raise ValueError(f"{name} reads the size of a tensor inside the attention, not through a Shape node")
    if logit_ops.softcap(site.mask_steps):
        raise ValueError("soft-capped logits: TensorRT's pattern has no Tanh before the Softmax")
    dtype = float_dtype(site.dtype)
    emit = Emitter(graph, site_scope(site.name, "core"))
    dims = Dims(emit, tensors, lay.dims)
    q = convert(emit, tensors[lay.query], lay.q, (lay.batch, lay.heads, ("q",), ("d",)), dims)
    k = convert(emit, tensors[lay.key], lay.k, (lay.batch, lay.kv_heads, ("k",), ("d",)), dims)
    v = convert(emit, tensors[lay.value], lay.v, (lay.batch, lay.kv_heads, ("k",), ("e",)), dims)
    if abs(lay.scale - 1.0) > 1e-12:
        q = emit("Mul", [q, emit.const(lay.scale, dtype)], dtype=dtype, name="q_scale")
    mask_emit = Emitter(graph, site_scope(site.name, "mask_operands"))
    built = logit_ops.build(graph, tensors, list(site.mask_steps), site_scope(site.name, "mask"), dtype,
                            lambda t, step: convert(mask_emit, t, step.frame, lay.scores, dims, broadcast=True))
    for factor in built.q_scales:  # a per-head logit scale (Swin-v2): [.., heads, 1, 1] on Q, as fuse puts it
        q = emit("Mul", [q, factor], dtype=dtype, name="q_head_scale")
    logits = emit("MatMul", [q, emit("Transpose", [k], {"perm": [0, 1, 3, 2]}, dtype=dtype, name="k_t")],
                  dtype=dtype, name="qk")
    if built.m is None:
        x, desc = logits, "none"
    elif built.kind == MaskKind.BOOLEAN:
        fill = logit_ops.fill_value(site.mask_steps)
        fill = float(np.finfo(dtype).min) if fill is None else fill
        x = emit("Where", [built.m, logits, emit.const(fill, dtype)], dtype=dtype, name="where_mask")
        desc = "Where (boolean)"
    else:
        x, desc = emit("Add", [logits, built.m], dtype=dtype, name="add_mask"), "Add (float)"
    if site.logits_cast is not None:
        x = emit("Cast", [x], {"to": site.logits_cast}, name="softmax_precision")
    old_name, softmax.name = softmax.name, f"{softmax.name}/replaced"  # the new Softmax keeps the site's name
    softmax_dtype = dtype if site.logits_cast is None else onnx.helper.tensor_dtype_to_np_dtype(site.logits_cast)
    p = gs.Variable(site_scope(site.name, "core", "probabilities"), dtype=softmax_dtype)
    graph.nodes.append(gs.Node("Softmax", old_name, {"axis": -1}, inputs=[x], outputs=[p]))
    y = emit("MatMul", [emit.cast(p, dtype), v], dtype=dtype, name="pv")  # back in V's precision, as the original
    if guard:  # rows that attend to no key stay 0, as the original's guard made them
        y = emit("Where", [emit("IsNaN", [y], dtype=np.bool_), emit.const(0.0, dtype), y], dtype=dtype,
                 name="nan_guard")
    if guarded_step is not None:  # rows where the bias is -inf at every key stay 0, as the op's guard made them
        bias = convert(mask_emit, tensors[guarded_step.operand], guarded_step.frame, lay.scores, dims, broadcast=True)
        axes = emit.const([-1], np.int64)
        row_max = (emit("ReduceMax", [bias, axes], {"keepdims": 1}, name="bias_row_max") if int(graph.opset) >= 18
                   else emit("ReduceMax", [bias], {"axes": [-1], "keepdims": 1}, name="bias_row_max"))
        masked = emit("Equal", [row_max, emit.const(float("-inf"), np.dtype(tensors[guarded_step.operand].dtype
                                                                               or dtype))], dtype=np.bool_)
        y = emit("Where", [masked, emit.const(0.0, dtype), y], dtype=dtype, name="masked_rows")
    shapes = [(tensors[name], _shape_of(emit, dims, tensors[name], frame)) for name, frame in lay.shape_reads
              if fill is None or tensors[name] is not fill]
    _produce(tensors[site.output], convert(emit, y, (lay.batch, lay.heads, ("q",), ("e",)), lay.out, dims))
    for read, shape in shapes:  # Shape nodes of tensors that go away read the sizes instead
        read.inputs[0].outputs.clear()
        _produce(read, shape)
    return desc + " (core re-emitted as [batch, heads, seq, dim])"


def _guarded_step(graph: gs.Graph, tensors: dict, site: AttentionSite, bias: gs.Tensor | None, cond: gs.Tensor):
    """The site's mask step that adds the bias the fully-masked-row guard tests (match/core.py took the guard as the
    op's own only so). A guard folded to a constant (a constant bias) is the step whose constant bias gives its
    values: ReduceMax over the keys == -inf. ValueError when there is none."""
    adds = [s for s in site.mask_steps if s.op == "add" and s.operand in tensors and s.frame is not None]
    if bias is not None:
        view = GraphView(graph, fold=False)
        own = view.skip_passthrough_up(bias)
        found = [s for s in adds if view.skip_passthrough_up(tensors[s.operand]) is own]
    else:
        rows = np.asarray(cond.values) if isinstance(cond, gs.Constant) else None
        found = [s for s in adds if rows is not None and isinstance(tensors[s.operand], gs.Constant)
                 and _all_masked(np.asarray(tensors[s.operand].values)).shape == rows.shape
                 and np.array_equal(_all_masked(np.asarray(tensors[s.operand].values)), rows)]
    if not found:
        raise ValueError(f"the probabilities' rows are zeroed where {(bias or cond).name} says (the op's "
                         "fully-masked-row guard), and no bias the logits add gives those rows")
    return found[0]


def _all_masked(bias: np.ndarray) -> np.ndarray:
    return np.max(bias, axis=-1, keepdims=True) == -np.inf
