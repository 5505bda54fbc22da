"""A mask re-applied to the probabilities after the softmax (issue 18, class 12): P * mask01 (Keras 3, flax
zero fully masked rows), Where(cond, P, 0) or Where(cond, 0, P) (DeBERTa's XSoftmax masked_fill).

Such a step zeroes the probabilities where the mask is 0 without renormalising. Where the logits are
already masked there (the usual case: the same mask applied before the softmax) nothing changes, except
that a row masked everywhere becomes 0. Both are what a boolean mask with a -inf fill computes in the
fused op (ONNX Runtime's Attention and IAttention give 0 for a fully masked row), so the step lowers as
one: allowed = mask != 0. Where the mask zeroes probabilities the logits did not mask, the fused op
renormalises and the verification against the original fails and says so: never a silent change.

flax (and hand-written code) renormalise the masked probabilities: P * m / ReduceSum(P * m) over the softmax
axis. With P = Softmax(x) that is exp(x) * m / sum(exp(x) * m) = Softmax(x + log m): for a 0/1 mask exactly the
boolean mask m != 0, whether or not the logits were masked before (`renormalisation` reads it). A row the mask
zeroes everywhere is 0/0 = NaN in the plain form and 0 under flax's guard (the sum replaced by 1 where it is
0, the result by 0); the fused op gives 0, as for any fully masked row.

tf2onnx writes where(mask, P, y) as Cast(mask) * P + y * Cast(Not(mask)): the first term is P * m, the second what
the select gives where the mask drops P. What it is, is evaluated (`zero_added`), not matched: 0 everywhere on the
model's feeds (y = 0, Keras' masked softmax) leaves P * m as it is; anything else is listed.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...graph.dependence import value_readers
from ...graph.measure import is_zero
from ...site import MaskStep
from ..errors import Unsupported
from .base import scalar
from .boolean import Where


class ProbsMul(Where):
    """P * m: allowed where m is not 0."""

    kind = "probs_mul"
    onnx_ops = ()  # read on the probabilities (read_probabilities below), not on the logits chain
    implicit_ok = False

    def condition(self, b, step):
        return b.emit("Cast", [b.operand(step, cast=False)], {"to": onnx.TensorProto.BOOL}, dtype=np.bool_)


class ProbsWhere(Where):
    """Where(cond, P, 0): allowed where cond."""

    kind = "probs_where"
    onnx_ops = ()
    implicit_ok = False


class ProbsWhereNot(Where):
    """Where(cond, 0, P): cond is True where the probability is zeroed."""

    kind = "probs_where_not"
    onnx_ops = ()
    implicit_ok = False

    def condition(self, b, step):
        return b.emit("Not", [b.operand(step, cast=False)], dtype=np.bool_)


def read_probabilities(view, node, probs) -> MaskStep | None:
    """The step for `node` reading the probabilities `probs` if it re-applies a mask, else None."""
    minus_inf = float("-inf")
    if node.op == "Mul" and len(node.inputs) == 2 and sum(i is probs for i in node.inputs) == 1:
        other = node.inputs[1] if node.inputs[0] is probs else node.inputs[0]
        if scalar(view, other) is None:
            return MaskStep(ProbsMul.kind, operand=other.name, value=minus_inf, node=node.name)
    if node.op == "Where" and len(node.inputs) == 3:
        cond, a, b = node.inputs
        if a is probs and b is not probs and scalar(view, b) == 0.0:
            return MaskStep(ProbsWhere.kind, operand=cond.name, value=minus_inf, node=node.name)
        if b is probs and a is not probs and scalar(view, a) == 0.0:
            return MaskStep(ProbsWhereNot.kind, operand=cond.name, value=minus_inf, node=node.name)
    return None


def masked_rows(view, node: gs.Node, probs: gs.Tensor) -> tuple[gs.Tensor, gs.Tensor] | None:
    """(the bias B, the condition) when `node` zeroes the rows of the probabilities `probs` where an additive
    bias B of the logits is -inf at every key: Where(ReduceMax(B, last axis) == -inf, 0, P), what the ONNX
    Attention op's function body writes after its softmax. That is the op's own fully-masked-row behaviour
    (a row masked everywhere gives 0), so when B is the mask the fused op takes, the node adds nothing to it
    (core.py checks that B is); None when `node` is not that."""
    if node.op != "Where" or len(node.inputs) != 3 or node.inputs[2] is not probs or scalar(view, node.inputs[1]) != 0.0:
        return None
    cond = node.inputs[0]
    test = view.producer(cond)
    if test is None:
        return None
    if test.op == "Equal" and len(test.inputs) == 2:
        fills = [scalar(view, x) for x in test.inputs]
        if float("-inf") not in fills:
            return None
        row_max = test.inputs[1 - fills.index(float("-inf"))]
    elif test.op == "IsInf" and int(test.attrs.get("detect_positive", 1)) == 0:
        row_max = test.inputs[0]
    else:
        return None
    reduce = view.producer(row_max)
    if reduce is None or reduce.op != "ReduceMax" or not reduce.inputs:
        return None
    axes, keep = _reduced(view, reduce)
    rank = view.rank(reduce.inputs[0])
    if not keep or axes is None or len(axes) != 1 or not (axes[0] == -1 or (rank is not None and axes[0] == rank - 1)):
        return None
    return reduce.inputs[0], cond


def renormalisation(view, step: gs.Node, probs: gs.Tensor, axis: int, rank: int | None
                    ) -> tuple[list[gs.Node], gs.Tensor] | None:
    """The nodes renormalising the probabilities `probs` masked by `step` (a node read_probabilities took)
    over the softmax `axis` (Div by their ReduceSum, optionally guarded against a zero sum), and the tensor
    they make; None when they are not renormalised. A sum that is not over the softmax axis alone, or a mask
    that does not broadcast into the probabilities, is not a renormalisation: it raises why.
    Also the Add of a tensor that is 0 everywhere (`zero_added`): it leaves the masked probabilities as they are."""
    masked = step.outputs[0]
    users = value_readers(masked)
    if len(users) == 1 and zero_added(view, users[0], masked):
        return [users[0]], users[0].outputs[0]
    sums = [c for c in users if c.op == "ReduceSum" and c.inputs[0] is masked]
    divs = [c for c in users if c.op == "Div" and c.inputs[0] is masked]
    if len(users) != 2 or len(sums) != 1 or len(divs) != 1:
        return None
    total, div = sums[0], divs[0]
    for m in (i for i in step.inputs[:2] if i is not probs):  # Mul's mask, Where's condition
        if not _broadcasts_into(view.shape(m), view.shape(probs)):
            raise Unsupported(f"{step.op} {step.name} masks the probabilities with {m.name} of shape "
                              f"{view.shape(m)}, which does not broadcast into theirs {view.shape(probs)}")
    nodes = [total]
    axes, keep = _reduced(view, total)
    same = axes is not None and len(axes) == 1 and (axes[0] == axis or (rank is not None and axes[0] % rank == axis % rank))
    if not same:
        raise Unsupported(f"the masked probabilities are divided by ReduceSum {total.name} over axes {axes}, not over "
                          f"the softmax's axis {axis} alone: not a renormalisation")
    s = total.outputs[0]
    if not keep:  # keepdims=0 and the axis put back by an Unsqueeze
        back = [c for c in view.consumers(s) if c.op == "Unsqueeze"]
        put = view.ints(back[0].inputs[1]) if back and len(back[0].inputs) > 1 else (
            list(back[0].attrs.get("axes", [])) if back else None)
        if len(back) != 1 or put is None or len(put) != 1 or not (
                put[0] == axis or (rank is not None and put[0] % rank == axis % rank)):
            raise Unsupported(f"ReduceSum {total.name} drops the softmax's axis (keepdims=0) and it is not put "
                              "back where it was: the sum does not broadcast along that axis")
        nodes.append(back[0])
        s = back[0].outputs[0]
    guard = _zero_sum_guard(view, s, div.inputs[1])
    if div.inputs[1] is not s and guard is None:
        return None
    nodes += ([guard, view.producer(div.inputs[1])] if guard is not None else []) + [div]
    out = div.outputs[0]
    after = value_readers(out)
    if guard is not None and len(after) == 1 and after[0].op == "Where" and after[0].inputs[0] is guard.outputs[0] \
            and after[0].inputs[1] is out and scalar(view, after[0].inputs[2]) == 0.0:
        nodes.append(after[0])  # the rows whose sum is 0 set to 0 again: what the fused op gives them
        out = after[0].outputs[0]
    return nodes, out


def zero_added(view, node: gs.Node, t: gs.Tensor) -> bool:
    """`node` adds to `t` a tensor evaluated to be 0 everywhere (graph/measure.is_zero), of a shape that does not
    broadcast `t` up: tf2onnx writes Keras' where(mask, P, 0) as Cast(mask) * P + 0 * Cast(Not(mask)), and the
    second term is what a select's other branch gives where the mask keeps P, and 0 where it drops it."""
    if node.op != "Add" or len(node.inputs) != 2 or sum(i is t for i in node.inputs) != 1:
        return False
    other = node.inputs[1] if node.inputs[0] is t else node.inputs[0]
    return _broadcasts_into(view.shape(other), view.shape(t)) and is_zero(view, other)


def _broadcasts_into(small: list | None, big: list | None) -> bool:
    """Is a tensor of shape `small` broadcast to `big` without making it larger (unknown dims: yes)?"""
    if small is None or big is None:
        return True
    if len(small) > len(big):
        return False
    return all(not (isinstance(a, int) and a > 1) or a == b or not isinstance(b, int)
               for a, b in zip(reversed(small), reversed(big)))


def _reduced(view, n: gs.Node) -> tuple[list[int] | None, int]:
    keep = int(n.attrs.get("keepdims", 1))
    if len(n.inputs) > 1 and n.inputs[1].name:
        return view.ints(n.inputs[1]), keep
    axes = n.attrs.get("axes")
    return ([int(a) for a in axes] if axes is not None else None), keep


def _zero_sum_guard(view, s: gs.Tensor, denominator: gs.Tensor) -> gs.Node | None:
    """The comparison s > 0 in denominator = Where(s > 0, s, c) with c a nonzero constant (flax's guard)."""
    where = view.producer(denominator)
    if where is None or where.op != "Where" or where.inputs[1] is not s:
        return None
    cond = view.producer(where.inputs[0])
    fill = scalar(view, where.inputs[2])
    if cond is None or cond.op != "Greater" or cond.inputs[0] is not s or scalar(view, cond.inputs[1]) != 0.0 \
            or not fill:
        return None
    return cond
