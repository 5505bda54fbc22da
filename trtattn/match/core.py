"""The scaled-dot-product core: product(Q, K) -> logit ops -> Softmax -> product(P, V), by axis meaning.

Anchored on each Softmax. Upstream, the logits may pass through logit ops (scale, masks, biases,
soft-cap: logit_ops/), layout ops (layout_ops.py: heads merged into the batch around the softmax, the
Flatten -> Softmax -> Reshape of an opset-12 export, Swin's 5-D view), float Casts and Q/DQ pairs, up
to a MatMul or Einsum of two activations, or of an activation and weights (a learned query) when the
softmax normalises over the activation's positions (_over_input). Downstream, the probabilities may pass through
layout ops, Cast, Identity, Dropout, Q/DQ, torch's NaN guard (Where(IsNaN(p), 0, p)) and a mask re-applied to them
(P * mask, masked_fill by Where: logit_ops/probs_mask.py, one more mask step) to a product with V. The ONNX Attention
op's own guard, the rows where the logits' bias is -inf everywhere set to 0, is what the fused op does with that
bias as its mask: no step (logit_ops.masked_rows, _own_masked_rows). Probabilities the model also returns (a graph
output) are the op's qk_matmul_output in mode 3 where they are what it gives, and so are logits at the points of
modes 0-2 (returned.py).
Shape nodes may read any tensor on the way (the rewrite recomputes what they read), and so may any read of only
a tensor's shape or type (graph/dependence.py: CastLike's target type is no use of the values).

The frames (axes.py) check that this is attention: the Softmax normalises over the key positions,
the second product contracts exactly them and keeps the query positions, and both products share
the batch and heads. A Softmax without that skeleton is not attention and is never matched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_graphsurgeon as gs

from ..graph.dependence import meta_readers, value_readers
from ..graph.measure import shape_or_measured
from ..graph.view import PASSTHROUGH, GraphView
from ..site import MaskStep, QuantParams
from . import contraction, layout_ops, logit_ops
from .axes import Atoms, Frame, show
from .errors import NotAttention, OverWeights, Unsupported
from .normalised import over_weights, softmax_axes
from .returned import check_probabilities, logits_mode, returned_as


@dataclass
class Core:
    softmax: gs.Node
    bmm1: contraction.Contraction
    bmm2: contraction.Contraction
    steps: list[MaskStep]  # in graph order, from BMM1 to the Softmax (operand frames attached)
    probs_nodes: list[gs.Node]  # nodes between Softmax and BMM2
    atoms: Atoms
    query: str  # the atom of the query positions
    key: str  # the atom of the key positions
    batch: list[str]  # batch atoms (heads included), in the order of BMM1's output
    q_index: int  # which operand of BMM1 is Q
    p_index: int  # which operand of BMM2 the probabilities are
    q_frame: Frame  # of BMM1's Q operand
    k_frame: Frame  # of BMM1's K operand
    v_frame: Frame  # of BMM2's V operand
    out_frame: Frame  # of BMM2's output
    scores_frame: Frame  # of the Softmax input
    shape_reads: list[tuple[str, Frame]] = field(default_factory=list)  # shape or type reads of chain tensors
    logits_cast: int | None = None  # a float Cast on the logits (softmax computed in another precision)
    logits_quant: QuantParams | None = None  # a Q/DQ pair on the logits
    probs_quant: QuantParams | None = None  # a Q/DQ pair on the probabilities
    qk_output: tuple[str, Frame, int] | None = None  # a tensor the model returns, its frame, the op's mode for it
    notes: list[str] = field(default_factory=list)

    @property
    def q_operand(self) -> gs.Tensor:
        return self.bmm1.operands[self.q_index]

    @property
    def k_operand(self) -> gs.Tensor:
        return self.bmm1.operands[1 - self.q_index]

    @property
    def v_operand(self) -> gs.Tensor:
        return self.bmm2.operands[1 - self.p_index]


def find_core(view: GraphView, sm: gs.Node) -> Core:
    try:
        down, bmm2_node, probs_shapes, probs_masks, masked_rows, returned = _follow_probabilities(view, sm)
    except (NotAttention, Unsupported):
        _by_sizes(view, sm)  # a router's probabilities feed TopK: say why it is not attention at all
        raise
    up, bmm1_node, logit_shapes = _walk_logits(view, sm)
    if bmm1_node.op in contraction.LINEAR:
        _by_sizes(view, sm)
        raise NotAttention(f"the logits come from {bmm1_node.op} {bmm1_node.name} (a linear layer)")
    try:
        bmm1 = contraction.read(view, bmm1_node)
        atoms = Atoms()
        frame = _product_frame(view, bmm1, atoms, "the first product")
    except Unsupported:  # no frames to decide by (weights broadcast over the batch): decide by sizes
        _by_sizes(view, sm)
        raise
    shape_reads: list[tuple[str, Frame]] = []
    steps: list[MaskStep] = []
    cast = logits_quant = None
    shape_reads += [(s.outputs[0].name, frame) for s in logit_shapes.get(bmm1_node.outputs[0].name, [])]
    logits_out = [(bmm1_node.outputs[0].name, frame, 0)] if returned_as(view, bmm1_node.outputs[0]) else []
    for node, step in reversed(up):  # BMM1 -> Softmax
        if step is not None:
            steps.append(_with_frame(view, step, frame, atoms))
        elif node.op == "Cast" and view.is_float_cast(node) and not view.is_noop_cast(node):
            cast = cast if cast is not None else node.attrs["to"]
        elif node.op == "DequantizeLinear":
            logits_quant = logits_quant or quant_params(view, node)
        else:
            frame = layout_ops.forward(view, node, frame, atoms)
        shape_reads += [(s.outputs[0].name, frame) for s in logit_shapes.get(node.outputs[0].name, [])]
        if returned_as(view, node.outputs[0]):  # logits the model returns, after this many steps
            logits_out.append((node.outputs[0].name, frame, len(steps)))
    logit_ops.check(steps)
    for step in steps:
        if step.op == "head_scale":
            _per_head(view, step, atoms)
    scores = frame
    normalised = softmax_axes(view, sm, len(frame))
    over = [a for i in normalised for a in atoms.resolve((frame[i],))[0]]
    if len([a for a in over if atoms.known(a) != 1]) <= 1:  # size-1 atoms normalise nothing
        over = [a for a in over if atoms.known(a) != 1] or [a for a in over if a in ("m", "n")]
    if over not in (["m"], ["n"]):  # the free atoms of BMM1's first and second operand
        what = "the batch or heads" if over and all(a.startswith("x") for a in over) else "several axes"
        raise Unsupported(f"Softmax {sm.name} normalises over {what} ({show(tuple(frame[i] for i in normalised))}), "
                          f"not over the positions of one operand of {bmm1_node.name}")
    key = over[0]
    query = "n" if key == "m" else "m"
    _over_input(view, sm, bmm1, key, atoms)
    # the probabilities: their frame down to the second product
    probs_quant = None
    probs_output: tuple[str, Frame, int] | None = None
    kinds = []  # per node of `down`: "guard" (what the op does too: its fully-masked-row guard, a NaN guard), "mask"
    #             (a mask the op takes on its logits), "value" (changes the values otherwise), "" (layout, Cast, Identity)
    shape_reads += [(s.outputs[0].name, frame) for s in probs_shapes.get(sm.outputs[0].name, [])]
    for i, node in enumerate(down):
        if returned is not None and i == returned[0]:
            probs_output = (returned[1].name, frame, 3)
        kind = "value"
        if node.op == "DequantizeLinear":
            probs_quant = probs_quant or quant_params(view, node)
        elif id(node) in probs_masks:  # a mask re-applied to the probabilities: one more mask step
            step = probs_masks[id(node)]  # None: the renormalisation after it (frame unchanged)
            if step is not None and not _own_masked_rows(view, masked_rows.get(id(node)), steps, atoms, key):
                steps.append(_with_frame(view, step, frame, atoms))
                kind = "mask"
            elif step is not None:
                kind = "guard"
        elif node.op == "Slice" and not layout_ops.is_layout(view, node):
            _check_sink_slice(view, node, steps, len(frame))  # the sink's column dropped: the frame stays
        elif _is_nan_guard_node(view, node):
            kind = "guard"
        else:
            frame, kind = layout_ops.forward(view, node, frame, atoms), ""
        kinds.append(kind)
        shape_reads += [(s.outputs[0].name, frame) for s in probs_shapes.get(node.outputs[0].name, [])]
    if returned is not None:
        probs_output = probs_output or (returned[1].name, frame, 3)
        check_probabilities(returned, down, kinds, steps)
    qk_output = probs_output
    if qk_output is None and len(logits_out) == 1:  # else the logits stay computed beside the op for the output
        name, at, applied = logits_out[0]
        mode = logits_mode(steps, applied)
        qk_output = (name, at, mode) if mode is not None else None
    bmm2 = contraction.read(view, bmm2_node)
    probs = down[-1].outputs[0] if down else sm.outputs[0]
    p_index = 0 if bmm2.operands[0] is probs else 1
    if not contraction.activations(view)(bmm2.operands[1 - p_index]):
        raise NotAttention(f"{bmm2_node.op} {bmm2_node.name} weighs constants, not values of the input "
                           "(a softmax-weighted sum of weights)")
    v_frame, out_frame = _second_product(bmm2, p_index, frame, atoms, query, key)
    q_index = 0 if query == "m" else 1
    return Core(sm, bmm1, bmm2, steps, down, atoms, query, key, atoms_of_batch(bmm1), q_index, p_index,
                _operand_frame(bmm1, q_index), _operand_frame(bmm1, 1 - q_index), v_frame, out_frame, scores,
                shape_reads, cast, logits_quant, probs_quant, qk_output)


def _over_input(view: GraphView, sm: gs.Node, bmm1: contraction.Contraction, key: str, atoms: Atoms) -> None:
    """Attention normalises over positions of the input: the key axis must be a free axis of an activation
    operand of the first product. The other operand may be weights (a learned query). Over a weight's free
    axis (a classifier head's classes, a router's experts) it is not attention, whatever else it looks like."""
    k_index = 0 if key == "m" else 1
    if contraction.activations(view)(bmm1.operands[k_index]):
        return
    size = atoms.known(key)
    raise OverWeights(f"Softmax {sm.name} normalises over the {size if size is not None else 'fixed'} outputs of "
                      f"weights {bmm1.operands[k_index].name} in {bmm1.node.op} {bmm1.node.name} (a classifier "
                      "head or a router), not over positions of the input")


def _by_sizes(view: GraphView, sm: gs.Node) -> None:
    """Raise OverWeights when the product nearest the Softmax gives the normalised length from its weights
    (where frames cannot be read); nothing otherwise."""
    try:
        _, product, _ = _walk_logits(view, sm)
    except (NotAttention, Unsupported):
        return
    if over_weights(view, sm, product):
        raise OverWeights(f"Softmax {sm.name} normalises over the outputs of the weights of {product.op} "
                          f"{product.name} (a classifier head or a router), not over positions of the input") from None


# ---------------------------------------------------------------- frames of the products
def atoms_of_batch(c: contraction.Contraction) -> list[str]:
    return [f"x{i}" for i, _ in enumerate(c.batch)]


def _atom(c: contraction.Contraction, label: str) -> str:
    """BMM1's labels as atoms: batch x0, x1, ...; free m (first operand), n (second); contracted c."""
    if label in c.batch:
        return f"x{c.batch.index(label)}"
    if label in c.contracted:
        return "c"
    return "m" if label in c.labels[0] else "n"


def _product_frame(view: GraphView, c: contraction.Contraction, atoms: Atoms, what: str) -> Frame:
    node = c.node
    if len(c.contracted) != 1:
        raise Unsupported(f"{node.op} {node.name} ({what}) contracts {len(c.contracted)} axes, not one head dim")
    if len(c.free(0)) != 1 or len(c.free(1)) != 1:
        raise Unsupported(f"{node.op} {node.name} ({what}) does not leave one free axis per operand")
    if c.summed():
        raise Unsupported(f"{node.op} {node.name} ({what}) sums over an axis of one operand")
    for a in ("m", "n", "c", *atoms_of_batch(c)):
        atoms.new(a)
    frame = tuple((_atom(c, x),) for x in c.out)
    atoms.broadcast |= _broadcast_batch(view, c)
    for i in (0, 1):  # measured where inference left a dim unknown: the heads' count, for one
        atoms.learn(_operand_frame(c, i), shape_or_measured(view, c.operands[i]))
    atoms.learn(frame, shape_or_measured(view, node.outputs[0]))
    return frame


def _broadcast_batch(view: GraphView, c: contraction.Contraction) -> set[str]:
    """The batch atoms one operand holds at size 1 where the other's dim is not 1: the product broadcasts
    it (a learned probe [1, Q, D] against [B, D, S] keys), which does not make the batch 1."""
    shapes = [view.shape(t) for t in c.operands]
    dims = [dict(zip(lab, s)) if s is not None and len(s) == len(lab) else {} for lab, s in zip(c.labels, shapes)]
    return {_atom(c, x) for x in c.batch for i in (0, 1) if dims[i].get(x) == 1 and dims[1 - i].get(x, 1) != 1}


def _operand_frame(c: contraction.Contraction, i: int) -> Frame:
    return tuple((_atom(c, x),) for x in c.labels[i])


def _second_product(bmm2: contraction.Contraction, p: int, frame: Frame, atoms: Atoms, query: str, key: str):
    """V's frame and the output's, from the probabilities' frame and BMM2's labels."""
    node = bmm2.node
    if len(frame) != len(bmm2.labels[p]):
        raise Unsupported(f"{node.op} {node.name}: the probabilities reach it with rank {len(frame)}")
    frame = atoms.resolve(frame)
    of = dict(zip(bmm2.labels[p], frame))
    real = lambda g: [a for a in g if atoms.known(a) != 1]  # noqa: E731
    summed, p_free, v_free = bmm2.contracted, bmm2.free(p), bmm2.free(1 - p)
    if len(summed) != 1 or real(of[summed[0]]) != real((key,)):
        got = "*".join(a for s in summed for a in of[s]) or "nothing"
        raise Unsupported(f"{node.op} {node.name} contracts the probabilities over {got}, not the key positions")
    rows = real(of[p_free[0]]) if len(p_free) == 1 else []
    # heads folded into the query rows ([B, 1, N*T, ...] over one KV head: partition.py unfolds them for the
    # first product only): batch atoms before the query on its axis, which V does not hold
    folded = rows[:-1] if rows[-1:] == real((query,)) and all(a.startswith("x") for a in rows[:-1]) else None
    if folded is None:
        raise Unsupported(f"{node.op} {node.name} does not keep the query positions of the probabilities")
    if len(v_free) != 1 or bmm2.summed():
        raise Unsupported(f"{node.op} {node.name}: V does not have one head-dim axis")
    seen = sorted(a for lab in bmm2.batch for a in real(of[lab]))
    want = sorted(a for g in frame for a in real(g) if a not in (query, key, *folded))
    if seen != want:
        raise Unsupported(f"{node.op} {node.name} batches over {seen}, the probabilities over {want}")
    atoms.new("e")
    to = {lab: of[lab] for lab in bmm2.batch} | {summed[0]: (key,), p_free[0]: (*folded, query), v_free[0]: ("e",)}
    return tuple(to[x] for x in bmm2.labels[1 - p]), tuple(to[x] for x in bmm2.out)


def _with_frame(view: GraphView, step: MaskStep, frame: Frame, atoms: Atoms) -> MaskStep:
    """The step with its operand's frame: the chain's at that point, right-aligned to the operand's rank."""
    if step.operand is None or logit_ops.unit(step).layout:
        return step
    t = view.tensors.get(step.operand)
    rank = layout_ops.rank_of(view, t) if t is not None else None
    if rank is None:
        rank = len(frame)
    if rank > len(frame):
        raise Unsupported(f"{step.node}: its operand has rank {rank}, more than the logits' {len(frame)}")
    own = view.shape(t) if t is not None else None
    mine = frame[len(frame) - rank:]
    if own is not None:
        for g, d in zip(atoms.resolve(mine), own):
            if isinstance(d, int) and d > 1 and all(atoms.known(a) == 1 for a in g):
                raise Unsupported(f"{step.node}: its operand ({d}) broadcasts the logits up on an axis of size 1")
    return MaskStep(step.op, step.operand, step.value, step.node, frame=mine)


def _per_head(view: GraphView, step: MaskStep, atoms: Atoms) -> None:
    """A tensor scale of the logits may vary over batch and heads only (the fused op's Q takes it); over
    the positions it is a multiplicative mask."""
    shape = view.shape(view.tensors[step.operand])
    if step.frame is None or shape is None:  # nothing to tell per-head from per-position by
        raise Unsupported(f"{step.node} multiplies the logits by {step.operand}, whose shape is not known")
    for group, size in zip(atoms.resolve(step.frame), shape):
        if size != 1 and not all(a.startswith("x") for a in group):
            raise Unsupported(f"{step.node} multiplies the logits by a tensor that varies over "
                              f"{show((group,))}, not per head")


def quant_params(view: GraphView, dq: gs.Node) -> QuantParams | None:
    """(type, scale, zero point) of a DequantizeLinear fed by a QuantizeLinear, per tensor."""
    q = view.producer(dq.inputs[0])
    scale = view.scalar(dq.inputs[1]) if len(dq.inputs) > 1 else None
    zero = view.const(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2].name else None
    if q is None or q.op != "QuantizeLinear" or scale is None:
        return None
    dtype = str(zero.dtype) if zero is not None else "uint8"
    return QuantParams(dtype, float(scale), int(zero.reshape(-1)[0]) if zero is not None and zero.size == 1 else 0)


# ---------------------------------------------------------------- downstream
def _is_nan_guard(view: GraphView, where: gs.Node, t: gs.Tensor) -> bool:
    """Where(IsNaN(t), 0, t): torch's guard for fully masked rows."""
    if where.op != "Where" or len(where.inputs) != 3 or where.inputs[2] is not t:
        return False
    cond = view.producer(where.inputs[0])
    fill = view.scalar(where.inputs[1])
    return cond is not None and cond.op == "IsNaN" and cond.inputs[0] is t and fill == 0.0


def _is_nan_guard_node(view: GraphView, n: gs.Node) -> bool:
    return n.op == "Where" and len(n.inputs) == 3 and _is_nan_guard(view, n, n.inputs[2])


def _follow_probabilities(view: GraphView, sm: gs.Node):
    """Nodes from the Softmax to the product with V, the product, and Shape readers by tensor name."""
    t = sm.outputs[0]
    passed: list[gs.Node] = []
    shapes: dict[str, list[gs.Node]] = {}
    masks: dict[int, MaskStep | None] = {}  # id(node) -> its step, for nodes re-applying a mask (logit_ops/probs_mask)
    rows: dict[int, gs.Tensor] = {}  # id(node) -> the bias B, for those zeroing the rows where B is all -inf
    output_at = None  # (nodes passed, the tensor, how) where the probabilities are a graph output
    for _ in range(16):
        returned = returned_as(view, t)
        if returned is not None and output_at is not None:
            raise Unsupported(f"the probabilities are returned twice, as {output_at[1].name} and {t.name}: one "
                              "qk_matmul_output can give only one of them, so the site stays as written")
        if returned is not None:
            output_at = (len(passed), t, returned[0])
        consumers = [c for c in value_readers(t) if returned is None or c is not returned[1]]
        shapes[t.name] = meta_readers(t)
        guards = [c for c in consumers if c.op == "IsNaN"]
        main = [c for c in consumers if c.op != "IsNaN"]
        if not main and returned is not None:
            raise Unsupported(f"the probabilities {t.name} are a graph output{returned[0]} and reach no product with V")
        if len(main) != 1:
            ops = ", ".join(sorted({c.op for c in main})) or "nothing"
            raise NotAttention(f"the probabilities feed {len(main)} nodes ({ops})")
        c = main[0]
        for g in guards:  # an IsNaN is allowed only as the condition of the guard below
            if [x for x in g.outputs[0].outputs if x is not c] or not _is_nan_guard(view, c, t):
                raise NotAttention(f"the probabilities feed IsNaN {g.name} outside a NaN guard")
        if c.op == "Slice" and c.inputs[0] is t and not layout_ops.is_layout(view, c):  # a sink's column dropped?
            passed.append(c)  # find_core checks it against the logits' sink step
            t = c.outputs[0]
            continue
        again = None if _is_nan_guard(view, c, t) else logit_ops.read_probabilities(view, c, t)
        if again is not None:
            masks[id(c)] = again
            found = logit_ops.masked_rows(view, c, t)
            if found is not None:
                rows[id(c)] = found[0]
            passed.append(c)
            renormalised = None
            if all(id(n) in masks for n in passed):  # no layout op passed: the softmax axis is where it was
                renormalised = logit_ops.renormalisation(view, c, t, int(sm.attrs.get("axis", -1)),
                                                         view.rank(sm.outputs[0]))
            t = c.outputs[0]
            if renormalised is not None:  # P * m / ReduceSum(P * m): the same mask, frames unchanged
                masks.update({id(n): None for n in renormalised[0]})
                passed += renormalised[0]
                t = renormalised[1]
            continue
        if layout_ops.is_layout(view, c) or _is_nan_guard(view, c, t):
            if layout_ops.is_layout(view, c) and c.inputs[0] is not t:
                raise NotAttention(f"the probabilities are the shape operand of {c.op} {c.name}")
            passed.append(c)
            t = c.outputs[0]
            continue
        if c.op in contraction.PRODUCTS and len(c.inputs) == 2:
            return passed, c, shapes, masks, rows, output_at
        raise NotAttention(f"the probabilities feed {c.op} {c.name}, not a product with V")
    raise NotAttention("the probabilities pass through too many nodes")


def _own_masked_rows(view: GraphView, bias: gs.Tensor | None, steps: list[MaskStep], atoms: Atoms, key: str) -> bool:
    """Whether zeroing the rows where `bias` is -inf at every key (logit_ops.masked_rows) is what the fused op
    does itself: `bias` is added to the logits (so it is part of the op's mask) with its last axis over the
    keys, and an op's row masked everywhere gives 0. Otherwise the node stays one more mask step."""
    if bias is None:
        return False
    own = view.skip_passthrough_up(bias)
    for s in steps:
        operand = view.tensors.get(s.operand) if s.operand is not None else None
        if s.op == "add" and operand is not None and view.skip_passthrough_up(operand) is own and s.frame \
                and key in atoms.resolve(s.frame[-1:])[0]:
            return True
    return False


def _check_sink_slice(view: GraphView, node: gs.Node, steps: list[MaskStep], rank: int) -> None:
    """A Slice of the probabilities must drop exactly the column a sink step added (logit_ops/sink.py)."""
    sink = next((s for s in steps if s.op == "sink"), None)
    starts, ends = (view.ints(node.inputs[i]) if len(node.inputs) > i else None for i in (1, 2))
    axes = view.ints(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3].name else list(range(rank))
    steps_ok = len(node.inputs) < 5 or not node.inputs[4].name or view.ints(node.inputs[4]) == [1]
    last = axes is not None and len(axes) == 1 and axes[0] % rank == rank - 1
    drops = None
    if last and steps_ok and starts is not None and ends is not None:
        if starts == [0] and ends == [-1]:
            drops = 1.0  # the last column
        elif starts == [1] and ends[0] >= 2 ** 31 - 1:
            drops = 0.0  # the first column
    if sink is None or drops is None or drops != sink.value:
        raise Unsupported(f"Slice {node.name} takes part of the probabilities"
                          + ("" if sink is None else ", not exactly the sink's column"))


# ---------------------------------------------------------------- upstream
def _walk_logits(view: GraphView, sm: gs.Node):
    """From the Softmax input up to the first product: [(node, its logit step or None for a layout op)],
    nearest the Softmax first, the product, and Shape readers by tensor name."""
    t = sm.inputs[0]
    path: list[tuple[gs.Node, MaskStep | None]] = []
    shapes: dict[str, list[gs.Node]] = {}
    for _ in range(32):
        shapes[t.name] = meta_readers(t)
        n = view.producer(t)
        if n is None:
            raise NotAttention(f"the Softmax input {t.name} does not come from a product")
        if n.op in contraction.PRODUCTS:
            if not contraction.input_product(view, n):
                raise NotAttention(f"the logits come from {n.op} {n.name} of constants")
            return path, n, shapes
        if n.op in contraction.LINEAR:
            return path, n, shapes
        if layout_ops.is_layout(view, n):
            path.append((n, None))
            t = n.inputs[0]
            continue
        found = logit_ops.read(view, n)
        if found is None:
            raise NotAttention(f"the logits come from {n.op} {n.name}")
        step, t = found
        path.append((n, step))
    raise NotAttention("too many ops between the product and the Softmax")


__all__ = ["Core", "find_core", "softmax_axes", "quant_params", "PASSTHROUGH"]
