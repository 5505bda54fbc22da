"""What a Softmax normalises over: its axes, their size, and whether a weight gives that size.

Attention normalises over positions of the input (a symbolic length, or the length of an input's axis);
a classifier head or a router normalises over a weight's axis (its classes, its experts). core.py decides
this exactly by frames; these sizes decide it where frames cannot be read (a MatMul broadcasting its
weights, a Softmax that is listed or ignored by likeness.py).
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from .contraction import activations, read
from .errors import Unsupported


def softmax_axes(view, sm: gs.Node, rank: int) -> list[int]:
    """The axes a Softmax normalises over (opset < 13: every axis from `axis` on)."""
    axis = sm.attrs.get("axis", -1 if view.opset >= 13 else 1)
    if not -rank <= axis < rank:
        raise Unsupported(f"Softmax {sm.name}: axis {axis} out of range for rank {rank}")
    axis %= rank
    return list(range(axis, rank)) if view.opset < 13 else [axis]


def softmax_size(view, sm: gs.Node):
    """The size the Softmax normalises over: an int, a symbolic name (it comes from the input), or None."""
    shape = view.shape(sm.inputs[0])
    if shape is None:
        return None
    try:
        dims = [shape[i] for i in softmax_axes(view, sm, len(shape))]
    except Unsupported:
        return None
    if any(not isinstance(d, int) for d in dims):
        return next((d for d in dims if isinstance(d, str)), None)
    size = 1
    for d in dims:
        size *= d
    return size


def weight_sizes(view, n: gs.Node) -> set:
    """Sizes of the free (output) axes of the weights operand of a product (empty: no weights operand)."""
    act = activations(view)
    if n.op == "Gemm" and len(n.inputs) >= 2:
        shape = view.shape(n.inputs[1])
        if act(n.inputs[1]) or not shape or len(shape) != 2:
            return set()
        return {shape[0] if n.attrs.get("transB", 0) else shape[1]}
    if n.op == "MatMul" and len(n.inputs) == 2:  # a weight broadcast over the batch too
        sizes = set()
        for i, axis in ((0, -2), (1, -1)):
            shape = view.shape(n.inputs[i])
            if not act(n.inputs[i]) and shape and len(shape) >= 2:
                sizes.add(shape[axis])
        return sizes
    try:
        c = read(view, n)
    except Unsupported:
        return set()
    sizes = set()
    for i in (0, 1):
        shape = view.shape(c.operands[i])
        if not act(c.operands[i]) and shape is not None and len(shape) == len(c.labels[i]):
            sizes |= {shape[c.labels[i].index(x)] for x in c.free(i)}
    return sizes


def over_weights(view, sm: gs.Node, product: gs.Node) -> bool:
    """Does the Softmax normalise over a length that the weights of `product` give (by sizes)?"""
    size = softmax_size(view, sm)
    return isinstance(size, int) and size in weight_sizes(view, product)
