"""Attention written in pieces, proved one attention by algebra before the core is matched (issue 32).

A partitioned key axis (Gemma3's prefill over a cache split from the new slice): the logits are
Concat_a(Q.K_1, ..., Q.K_n) along an axis a, the probabilities P are sliced back along an axis b into blocks
P_1..P_n, each multiplied by its V_i, and the products summed. Two identities make it one chain:

    Concat_a(Q.K_i) = Q.Concat(K_i)      when a is the free axis of every K_i in the same product (same Q)
    sum_i P_i.V_i   = P.Concat(V_i)      when b is the axis the products contract, the slices cover it exactly
                                         once and in order, and V_i's contracted axis is as long as its slice

Both are proved here from the products' labels (contraction.py) and the slices' bounds evaluated numerically
(graph/measure.value), never from a pattern of the blocks' shapes. The graph is then rewritten in place to the one
chain (Q.Concat(K_i) -> the same logit ops -> Softmax -> P.Concat(V_i)), which the core matcher (core.py) reads
like any attention: its frames prove the softmax normalises over the keys that P.V contracts, and the scale and
mask are the chain's own, the same for every block by construction. The concatenations are pulled above layout
ops the blocks share (a Transpose of each block is a Transpose of their Concat), so that a cache input and the
new slice meet in one Concat(past, new), the past/present form cache.py reads. The record (site.KeyPartition)
lists the nodes made, which the rewrite writes again in a graph read afresh (`emit`).

Probabilities shared by several value products (differential attention, whose two identical softmaxes
exporters merge into one): each product gets its own Softmax of the same logits, so each is one attention.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from ..graph.dependence import value_readers
from ..graph.measure import value
from ..graph.view import GraphView
from ..site import KeyPartition, MadeNode
from . import contraction
from .errors import Unsupported

_BIG = 2 ** 31 - 1  # a Slice end at least this far: to the end of the axis


def join_pieces(view: GraphView) -> tuple[dict[str, KeyPartition], dict[str, str], dict[str, str], dict[str, str]]:
    """Rewrite `view`'s graph in place (module doc). Returns the key partitions by Softmax name, the Softmaxes
    made for shared probabilities (made -> the original), the Softmaxes whose pieces could not be proved ->
    why (the matcher lists them with it), and the products whose query rows were unfolded into heads."""
    partitions: dict[str, KeyPartition] = {}
    shared: dict[str, str] = {}
    refused: dict[str, str] = {}
    unfolded: dict[str, str] = {}
    for sm in [n for n in view.graph.nodes if n.op == "Softmax"]:
        readers = value_readers(sm.outputs[0])
        if len(readers) < 2 or sm.outputs[0].name in view.outputs:
            continue
        try:
            if all(r.op == "Slice" and r.inputs[0] is sm.outputs[0] for r in readers):
                partitions[sm.name] = _join_blocks(view, sm, readers)
            elif all(r.op in contraction.PRODUCTS and len(r.inputs) == 2 for r in readers):
                shared.update({made: sm.name for made in _one_softmax_each(view, sm, readers)})
        except Unsupported as e:
            refused[sm.name] = str(e)
    for product in [n for n in view.graph.nodes if n.op == "MatMul"]:
        if _unfold_query_rows(view, product):
            unfolded[product.name] = "heads unfolded from the query rows"
    return partitions, shared, refused, unfolded


# ---------------------------------------------------------------- heads folded into the query rows
def _unfold_query_rows(view: GraphView, product: gs.Node) -> bool:
    """MatMul(Reshape(X [B, N, T, H] -> [B, 1, N*T, H]), K [B', 1, H, L]) = Reshape(MatMul(X, K) -> [B, 1, N*T, L]):
    every row meets the same K (its axis 1 is 1), so the heads folded into the rows (one KV head for N query
    heads, Gemma3's prefill) unfold before the product and fold after it, exactly. The product then reads the
    heads as heads; the output keeps its name."""
    fold, k = view.producer(product.inputs[0]), product.inputs[1]
    if fold is None or fold.op != "Reshape" or len(product.outputs[0].outputs) == 0:
        return False
    x, folded = fold.inputs[0], fold.outputs[0]
    xs, fs, ks = view.shape(x), view.shape(folded), view.shape(k)
    if xs is None or fs is None or ks is None or len(xs) != 4 or len(fs) != 4 or len(ks) != 4:
        return False
    n, t, h = xs[1:]
    if not all(isinstance(d, int) for d in (n, t, h, fs[2], fs[3])) or fs[1] != 1 or ks[1] != 1 \
            or fs[2] != n * t or fs[3] != h or n == 1:
        return False
    out = product.outputs[0]
    rows = gs.Variable(f"{out.name}/heads", dtype=out.dtype)
    target = gs.Constant(f"{out.name}/fold_shape", np.array([0, 1, -1, 0], dtype=np.int64))
    heads = gs.Variable(f"{out.name}/key_heads", dtype=k.dtype, shape=[ks[0], n, ks[2], ks[3]])
    repeat = gs.Constant(f"{out.name}/key_repeat", np.array([1, n, 1, 1], dtype=np.int64))
    view.graph.nodes.append(gs.Node("Expand", f"{product.name}/key_heads", inputs=[k, repeat], outputs=[heads]))
    product.outputs = [rows]
    product.inputs[0], product.inputs[1] = x, heads  # the one KV head met by every query head, as a GQA repeat
    view.graph.nodes.append(gs.Node("Reshape", f"{product.name}/fold", inputs=[rows, target], outputs=[out]))
    for made in (rows, target, heads, repeat):
        view.tensors[made.name] = made
    return True


# ---------------------------------------------------------------- shared probabilities
def _one_softmax_each(view: GraphView, sm: gs.Node, products: list[gs.Node]) -> list[str]:
    """Every product after the first reads its own copy of the Softmax: the same values, one attention each."""
    made = []
    for i, product in enumerate(products[1:], start=1):
        out = gs.Variable(f"{sm.outputs[0].name}/value_{i}", dtype=sm.outputs[0].dtype, shape=sm.outputs[0].shape)
        copy = gs.Node("Softmax", f"{sm.name}_v{i}", dict(sm.attrs), inputs=[sm.inputs[0]], outputs=[out])
        product.inputs[[j for j, t in enumerate(product.inputs) if t is sm.outputs[0]][0]] = out
        view.graph.nodes.append(copy)
        view.tensors[out.name] = out
        made.append(copy.name)
    return made


# ---------------------------------------------------------------- a partitioned key axis
def _join_blocks(view: GraphView, sm: gs.Node, slices: list[gs.Node]) -> KeyPartition:
    p = sm.outputs[0]
    bounds, slices = _slice_bounds(view, sm, slices)
    values = [_only_product(view, s.outputs[0], f"the probabilities' block {s.name}") for s in slices]
    pv = [contraction.read(view, n) for n in values]
    p_index = _same_structure(pv, [s.outputs[0] for s in slices], "the value products")
    axis = bounds[0][2]
    label = pv[0].labels[p_index][axis]
    if label not in pv[0].contracted:
        raise Unsupported(f"the probabilities are sliced on an axis {values[0].name} does not contract")
    v_axis = pv[0].labels[1 - p_index].index(label)
    for (start, end, _), c in zip(bounds, pv):
        v_len = view.dim(c.operands[1 - p_index], v_axis)
        if end is not None and v_len is not None and v_len != end - start:
            raise Unsupported(f"{c.node.name} multiplies a block of {end - start} keys by {v_len} values")
    adds, total = _summed(view, [n.outputs[0] for n in values])
    concat = _logits_concat(view, sm)
    qk = [contraction.read(view, _only_product(view, t, f"the logits' block {t.name}", concat)) for t in concat.inputs]
    k_index = 1 - _same_structure(qk, None, "the logit products")
    rank = len(qk[0].out)
    k_label = qk[0].out[int(concat.attrs.get("axis", 0)) % rank]
    if k_label not in qk[0].free(k_index):
        raise Unsupported(f"Concat {concat.name} joins the logits on an axis that is not the keys' free axis")
    tag = f"{sm.name}/keys"
    keys = [c.operands[k_index] for c in qk]
    vals = [c.operands[1 - p_index] for c in pv]
    made_k, k_all = _joined(view, keys, qk[0].labels[k_index].index(k_label), f"{tag}/key")
    made_v, v_all = _joined(view, vals, v_axis, f"{tag}/value")
    _replace(view, [concat, *[c.node for c in qk]], qk[0].node, k_index, k_all, concat.outputs[0])
    _replace(view, [*slices, *values, *adds], pv[0].node, 1 - p_index, v_all, total, p_index, p)
    return KeyPartition(sm.name, tuple(t.name for t in keys), tuple(t.name for t in vals),
                        tuple((s, e) for s, e, _ in bounds), made_k[0].output, made_v[0].output,
                        tuple(made_k + made_v))


def _slice_bounds(view: GraphView, sm: gs.Node, slices: list[gs.Node]):
    """[(start, end or None, axis)] in key order and the slices in that order, proved to cover the sliced axis
    exactly once, in order, with step 1."""
    p = sm.outputs[0]
    rank = view.rank(p)
    if rank is None:
        raise Unsupported(f"the rank of the probabilities {p.name} is unknown")
    found = []
    for s in slices:
        ins = [value(view, t) if t.name else None for t in s.inputs[1:]] + [None] * 4
        starts, ends, axes, steps = ins[:4]
        if starts is None or ends is None or (len(s.inputs) > 3 and s.inputs[3].name and axes is None):
            raise Unsupported(f"Slice {s.name} of the probabilities has bounds no evaluation gives")
        axes = axes if axes is not None else np.arange(np.size(starts))
        if np.size(starts) != 1 or np.size(axes) != 1 or (steps is not None and int(np.reshape(steps, -1)[0]) != 1):
            raise Unsupported(f"Slice {s.name} of the probabilities is not one run of one axis")
        axis = int(np.reshape(axes, -1)[0]) % rank
        found.append((_bound(view, p, axis, int(np.reshape(starts, -1)[0]), s),
                      _bound(view, p, axis, int(np.reshape(ends, -1)[0]), s), axis, s))
    if len({f[2] for f in found}) != 1:
        raise Unsupported(f"the probabilities of {sm.name} are sliced on different axes")
    found.sort(key=lambda f: f[0] if f[0] is not None else -1)
    at: int | None = 0
    for start, end, _, s in found:
        if start is None or start != at or (end is not None and end <= start):
            raise Unsupported(f"the slices of the probabilities of {sm.name} do not cover their axis once and in "
                              f"order (Slice {s.name} starts at {start}, the blocks before end at {at})")
        at = end
    length = view.dim(p, found[0][2])
    if at is not None and (length is None or at != length):
        raise Unsupported(f"the slices of the probabilities of {sm.name} stop at {at}, not at the end of the axis")
    return [(st, None if en is None or en == length else en, ax) for st, en, ax, _ in found], [f[3] for f in found]


def _bound(view: GraphView, p: gs.Tensor, axis: int, x: int, s: gs.Node) -> int | None:
    """A Slice bound as an index of the axis (None: its end); negative or clamped ones need the axis' length."""
    length = view.dim(p, axis)
    if x >= _BIG and length is None:
        return None
    if length is None and x < 0:
        raise Unsupported(f"Slice {s.name} counts from the end of an axis whose length is unknown")
    if length is None:
        return x
    x = x + length if x < 0 else x
    return min(max(x, 0), length)


def _only_product(view: GraphView, t: gs.Tensor, what: str, reader: gs.Node | None = None) -> gs.Node:
    """The product `t` is read by (reader None) or made by (the only reader being `reader`), alone."""
    if t.name in view.outputs or len(t.outputs) != 1:
        raise Unsupported(f"{what} is read elsewhere too, so it stays as written")
    node = t.outputs[0] if reader is None else view.producer(t)
    if node is None or node.op not in contraction.PRODUCTS or len(node.inputs) != 2:
        raise Unsupported(f"{what} is {'read by' if reader is None else 'made by'} "
                          f"{node.op if node is not None else 'no node'}, not a product")
    if reader is not None and len(node.outputs[0].outputs) != 1:
        raise Unsupported(f"{what} is read elsewhere too, so it stays as written")
    return node


def _same_structure(products: list[contraction.Contraction], shared: list[gs.Tensor] | None, what: str) -> int:
    """The operand index the products share: one tensor (shared None) or each its own block of the
    probabilities; every product the same contraction, so their outputs line up axis for axis."""
    first = products[0]
    for c in products[1:]:
        if (c.labels, c.out, c.node.op, dict(c.node.attrs)) != (first.labels, first.out, first.node.op,
                                                                dict(first.node.attrs)):
            raise Unsupported(f"{what} {first.node.name} and {c.node.name} are not the same contraction")
    if shared is not None:
        index = [i for i in (0, 1) if first.operands[i] is shared[0]]
        if not index or any(c.operands[index[0]] is not t for c, t in zip(products, shared)):
            raise Unsupported(f"{what} do not read their blocks as the same operand")
        return index[0]
    index = [i for i in (0, 1) if all(c.operands[i] is first.operands[i] for c in products)]
    if len(index) != 1:
        raise Unsupported(f"{what} {', '.join(c.node.name for c in products)} do not share one query")
    return index[0]


def _summed(view: GraphView, outs: list[gs.Tensor]) -> tuple[list[gs.Node], gs.Tensor]:
    """The Add (or Sum) nodes that add exactly these tensors, and their total."""
    pending = {t.name: t for t in outs}
    nodes: list[gs.Node] = []
    while len(pending) > 1:
        for t in list(pending.values()):
            readers = t.outputs
            n = readers[0] if len(readers) == 1 and t.name not in view.outputs else None
            if n is None or n.op not in ("Add", "Sum"):
                raise Unsupported(f"the products with the value blocks are not summed ({t.name} goes on alone)")
            if all(i.name in pending for i in n.inputs) and len({i.name for i in n.inputs}) == len(n.inputs):
                for i in n.inputs:
                    pending.pop(i.name)
                pending[n.outputs[0].name] = n.outputs[0]
                nodes.append(n)
                break
        else:
            raise Unsupported("the products with the value blocks are added to something else")
    shapes = [view.shape(t) for t in outs]
    if any(s is None or s != shapes[0] for s in shapes):
        raise Unsupported("the products with the value blocks do not have one shape, known (a sum may broadcast)")
    return nodes, next(iter(pending.values()))


def _logits_concat(view: GraphView, sm: gs.Node) -> gs.Node:
    """The nearest Concat above the Softmax whose inputs are all products: the logits' blocks. What lies between
    needs no reading here (Concat(Q.K_i) = Q.Concat(K_i) whatever follows); the core matcher reads it after."""
    seen: set[str] = set()
    frontier = [sm.inputs[0]]
    for _ in range(24):
        ahead = []
        for t in frontier:
            n = view.producer(t)
            if n is None or t.name in seen or n.op in contraction.PRODUCTS:
                continue
            seen.add(t.name)
            if n.op == "Concat" and all((m := view.producer(i)) is not None and m.op in contraction.PRODUCTS
                                        for i in n.inputs):
                return n
            ahead += [i for i in n.inputs if isinstance(i, gs.Variable) and view.const(i) is None]
        frontier = ahead
    raise Unsupported(f"the probabilities of {sm.name} are sliced into blocks, but its logits are not concatenated "
                      "from products with key blocks")


def _joined(view: GraphView, blocks: list[gs.Tensor], axis: int, name: str) -> tuple[list[MadeNode], gs.Tensor]:
    """Concat(blocks) along `axis`, pulled above the Transposes the blocks share, made in the graph."""
    perms: list[list[int]] = []
    while True:
        producers = [view.producer(b) for b in blocks]
        perm = [list(n.attrs.get("perm", [])) if n is not None and n.op == "Transpose" else [] for n in producers]
        if not perm[0] or any(q != perm[0] for q in perm):
            break
        perms.append(perm[0])
        axis = perm[0][axis]
        blocks = [n.inputs[0] for n in producers if n is not None]
    made = [MadeNode("Concat", tuple(b.name for b in blocks), f"{name}/concat", (("axis", axis),))]
    for i, order in enumerate(reversed(perms)):
        made.append(MadeNode("Transpose", (made[-1].output,), f"{name}/transpose_{i}", (("perm", tuple(order)),)))
    out = emit(view.graph, view.tensors, made, shapes=view.shape, dtype=view.dtype(blocks[0]))
    return made, out


def emit(graph: gs.Graph, tensors: dict, made, shapes=None, dtype=None) -> gs.Tensor:
    """Write the nodes `made` lists (those whose outputs `tensors` lacks) in `graph`; the last one's output."""
    for m in made:
        if m.output in tensors:
            continue
        ins = [tensors[i] for i in m.inputs]
        out = gs.Variable(m.output, dtype=dtype if dtype is not None else ins[0].dtype,
                          shape=_shape_of(m, [shapes(i) if shapes else i.shape for i in ins]))
        attrs = {k: list(v) if isinstance(v, tuple) else v for k, v in m.attrs}
        graph.nodes.append(gs.Node(m.op, m.output, attrs, inputs=ins, outputs=[out]))
        tensors[m.output] = out
    return tensors[made[-1].output]


def _shape_of(m: MadeNode, shapes: list) -> list | None:
    attrs = dict(m.attrs)
    if any(s is None for s in shapes):
        return None
    perm, axis = attrs.get("perm", ()), attrs.get("axis", 0)
    if m.op == "Transpose" and isinstance(perm, tuple):
        return [shapes[0][i] for i in perm]
    axis = int(axis) % len(shapes[0]) if isinstance(axis, int) else 0
    sizes = [s[axis] for s in shapes]
    out = list(shapes[0])
    out[axis] = sum(sizes) if all(isinstance(d, int) for d in sizes) else None
    return out


def _replace(view: GraphView, old: list[gs.Node], like: gs.Node, index: int, operand: gs.Tensor, out: gs.Tensor,
             keep: int | None = None, kept: gs.Tensor | None = None) -> None:
    """The nodes `old` go; one product like `like`, with `operand` at `index` (and `kept` at `keep`), makes `out`."""
    ins = list(like.inputs)
    for node in old:
        node.inputs.clear()
        node.outputs.clear()
    view.graph.nodes = [n for n in view.graph.nodes if all(n is not o for o in old)]
    ins[index] = operand
    if keep is not None and kept is not None:
        ins[keep] = kept
    view.graph.nodes.append(gs.Node(like.op, f"{like.name}/joined", dict(like.attrs), inputs=ins, outputs=[out]))


__all__ = ["join_pieces", "emit"]
