"""Tensors of an attention the model also returns (a graph output), and which of them the ONNX Attention op gives
itself as its fourth output, qk_matmul_output, by where they stand on the site's chain (core.py walks it):

    mode 0  the scaled Q.K^T: every scale applied, nothing else (a site without a soft-cap)
    mode 1  after the soft-cap: every scale and the soft-cap applied, no mask
    mode 2  the logits the softmax normalises: every step applied
    mode 3  the probabilities after the op's own fully-masked-row guard, before anything else changes them

onnx's reference and ONNX Runtime 1.32 agree on each of these. They differ on mode 0 of a soft-capped op (the
reference returns the capped logits, ONNX Runtime and the spec's text the raw ones), so the logits before a
soft-cap stay computed beside the op, as any other returned tensor of the chain does. ONNX Runtime fills an
is_causal or boolean mask with the lowest float where the reference has -inf: fuse gives a mode-2 op its mask as a
-inf bias. Should the op's own output still not verify, fuse computes the logits beside it again.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ..graph.dependence import value_readers
from ..graph.view import PASSTHROUGH, GraphView
from ..site import MaskStep
from . import logit_ops
from .errors import Unsupported


def returned_as(view: GraphView, t: gs.Tensor) -> tuple[str, gs.Node | None] | None:
    """('', None) when `t` is a graph output, (" (as 'name')", the reader) when it reaches one through Identity /
    no-op Casts from that reader that nothing else reads (the walk meets one read on as the tensor itself); else
    None."""
    if t.name in view.outputs:
        return "", None
    for c in value_readers(t):
        x = c
        while x.op in PASSTHROUGH or view.is_noop_cast(x):
            out = x.outputs[0]
            readers = value_readers(out)
            if out.name in view.outputs:
                if readers:
                    break
                return f" (as '{out.name}')", c
            if len(readers) != 1:
                break
            x = readers[0]
    return None


def logits_mode(steps: list[MaskStep], applied: int) -> int | None:
    """The op's qk_matmul_output_mode giving the logits after the first `applied` of the site's `steps` (in graph
    order), or None when no mode gives them."""
    kinds = [_kind(s) for s in steps]
    if "other" in kinds:  # the op's output would not be these logits
        return None
    before, after = kinds[:applied], kinds[applied:]
    if "softcap" not in kinds and set(before) <= {"scale"} and "scale" not in after:
        return 0
    if "softcap" in before and set(before) <= {"scale", "softcap"} and set(after) <= {"mask"}:
        return 1
    return 2 if not after else None


def _kind(step: MaskStep) -> str:
    """'scale', 'softcap', 'mask' (one the op adds to the logits as they are: a bias, or a fill of -inf), 'other'."""
    if step.op == "softcap":
        return "softcap"
    if logit_ops.unit(step).scales or step.op == "head_scale":
        return "scale"
    if step.op in ("add", "sub") or (step.op in ("where", "where_not") and step.value == float("-inf")):
        return "mask"
    return "other"  # a finite fill (the logits replaced, not added to), a product mask, a sink's column, a reshape


def check_probabilities(returned: tuple, down: list[gs.Node], kinds: list[str], steps: list[MaskStep]) -> None:
    """The probabilities the model returns must be what the op's qk_matmul_output gives in mode 3: after the softmax
    and the guards the op applies too, before anything else changes their values; else the site stays as written.
    `returned`: (nodes of `down` before them, the tensor, how it is returned); `kinds`: per node of `down`."""
    at, t, where = returned
    what = f"the probabilities {t.name} are a graph output{where} (the model returns its attention weights)"
    if any(s.op == "sink" for s in steps):
        raise Unsupported(f"{what}, over the keys without the sink's column the op adds: its qk_matmul_output "
                          "cannot give them, so the site stays as written")
    changed = [n for i, (n, k) in enumerate(zip(down, kinds)) if k == "mask" or (k == "value" and i < at)]
    guards = [n for n, k in zip(down[at:], kinds[at:]) if k == "guard"]
    if changed or guards:
        node = (changed or guards)[0]
        how = "changes them unlike" if changed else "comes after them, unlike in"
        raise Unsupported(f"{what}: {node.op} {node.name} {how} the Attention op's qk_matmul_output (mode 3: the "
                          "softmax of the masked logits after its fully-masked-row guard), so the site stays as written")
