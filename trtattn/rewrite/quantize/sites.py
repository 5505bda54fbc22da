"""Where ModelOpt's Q/DQ landed around each attention, read from the quantized graph.

TensorRT fuses a quantized attention when Q/DQ pairs sit on both inputs of both attention MatMuls,
BMM1 (Q, K) and BMM2 (the Softmax output, V), and nothing between BMM1 and the Softmax is quantized;
the pair on the Softmax output is IAttention's normalization quantize scale. A site without that
pattern gets ModelOpt's reason (reasons.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...graph.precision import QUANTIZED
from ...graph.view import GraphView
from ...match.core import find_core
from ...match.errors import NotAttention, Unsupported
from ...site import AttentionSite
from .reasons import why_not

MODES = QUANTIZED
QDQ_DTYPES = {"fp8": "float8e4m3fn", "int8": "int8"}  # ModelOpt's names of the Q/DQ types

# Columns for trtattn.report.table(result.summary()["sites"], QUANT_COLUMNS).
QUANT_COLUMNS = [("name", "site"), ("placed", "Q/DQ"), ("qdq_dtype", "type"), ("q_scale", "q scale"),
                 ("k_scale", "k scale"), ("softmax_scale", "softmax scale"), ("v_scale", "v scale"),
                 ("reason", "why not")]

# Ops that may sit between a Q/DQ pair and the attention MatMul it feeds (ModelOpt's accumulation
# casts) and between the Softmax and the Q of its output.
_BETWEEN = {"Cast", "Identity"}
_LAYOUT = {"Cast", "Identity", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze"}
_ROLES = {"q": "Q", "k": "K", "softmax": "the Softmax output", "v": "V"}


@dataclass
class SiteQuant:
    """What quantization did to one attention.

    q_scale, k_scale: scales of the Q/DQ pairs on BMM1's inputs; softmax_scale: of the pair on the
    Softmax output (BMM2's first input: IAttention's normalization quantize scale); v_scale: of
    the pair on BMM2's second input; output_scale: a Q/DQ on the attention output, if ModelOpt put
    one there (it is optional for TensorRT). Scales are QuantizeLinear's: x_q = x / scale.
    """

    site: str
    placed: bool
    reason: str = ""
    q_scale: float | None = None
    k_scale: float | None = None
    softmax_scale: float | None = None
    v_scale: float | None = None
    output_scale: float | None = None
    qdq_dtype: str | None = None
    bmm1: str | None = None
    bmm2: str | None = None
    softmax: str | None = None

    def row(self) -> dict:
        return {"name": self.site, "placed": self.placed, "reason": self.reason, "q_scale": self.q_scale,
                "k_scale": self.k_scale, "softmax_scale": self.softmax_scale, "v_scale": self.v_scale,
                "output_scale": self.output_scale, "qdq_dtype": self.qdq_dtype, "bmm1": self.bmm1,
                "bmm2": self.bmm2, "softmax": self.softmax}


@dataclass
class CoreNodes:
    """The Softmax and the two MatMuls of a site by node name, or why it has none."""

    softmax: str | None
    bmm1: str | None
    bmm2: str | None
    why: str = ""
    logit_ops: tuple[str, ...] = ()  # nodes between BMM1 and the Softmax that change the logits


def find_cores(model: onnx.ModelProto, sites: list[AttentionSite]) -> list[CoreNodes]:
    """The core nodes of each site of `model` (whose nodes all have names)."""
    graph = gs.import_onnx(model)
    view = GraphView(graph, model, fold=False)
    by_name = {n.name: n for n in graph.nodes}
    out = []
    for s in sites:
        if s.source.is_op or not s.softmax:
            out.append(CoreNodes(None, None, None, f"a fused {s.source} op: ModelOpt places Q/DQ around "
                                                   "MatMul/Softmax attention only"))
            continue
        sm = by_name.get(s.softmax)
        if sm is None:
            out.append(CoreNodes(s.softmax, None, None, f"its Softmax {s.softmax} is not in the model"))
            continue
        try:
            core = find_core(view, sm)
        except (NotAttention, Unsupported) as e:
            out.append(CoreNodes(s.softmax, None, None, f"no MatMul/Softmax/MatMul core: {e}"))
            continue
        out.append(CoreNodes(sm.name, core.bmm1.node.name, core.bmm2.node.name,
                             logit_ops=tuple(st.node for st in core.steps if st.node)))
    return out


def inspect_sites(quantized: onnx.ModelProto, sites: list[AttentionSite], cores: list[CoreNodes], mode: str,
                  log: str = "", original: onnx.ModelProto | None = None) -> list[SiteQuant]:
    """Read the Q/DQ around each site's MatMuls in the quantized model; `log` (ModelOpt's debug log)
    and `original` (the model ModelOpt was given) say why a site has none."""
    graph = gs.import_onnx(quantized)
    nodes = {n.name: n for n in graph.nodes}
    types = _elem_types(quantized)
    return [_inspect(nodes, types, s, c, mode, log, original) for s, c in zip(sites, cores)]


def _inspect(nodes: dict, types: dict, site: AttentionSite, core: CoreNodes, mode: str, log: str,
             original) -> SiteQuant:
    rec = SiteQuant(site.name, False, bmm1=core.bmm1, bmm2=core.bmm2, softmax=core.softmax)
    if core.why:
        rec.reason = core.why
        return rec
    b1, b2 = nodes.get(core.bmm1), nodes.get(core.bmm2)
    if b1 is None or b2 is None:
        rec.reason = f"ModelOpt's preprocessing rewrote the attention MatMuls ({core.bmm1}, {core.bmm2} are gone)"
        return rec
    pairs = {"q": _qdq_pair(b1.inputs[0], types), "k": _qdq_pair(b1.inputs[1], types),
             "softmax": _qdq_pair(b2.inputs[0], types), "v": _qdq_pair(b2.inputs[1], types)}
    for role, pair in pairs.items():
        if pair is not None:
            setattr(rec, f"{role}_scale", pair.scale)
    out = _output_pair(b2.outputs[0])
    rec.output_scale = out.scale if out is not None else None
    dtypes = {p.dtype for p in pairs.values() if p is not None and p.dtype}
    rec.qdq_dtype = dtypes.pop() if len(dtypes) == 1 else (", ".join(sorted(dtypes)) or None)

    missing = [role for role, p in pairs.items() if p is None]
    if missing:
        where = ", ".join(_ROLES[m] for m in missing)
        rec.reason = f"no Q/DQ on {where}: " + why_not(core, log, original)
        return rec
    found = {role: p for role, p in pairs.items() if p is not None}  # every role, after the check above
    problems = []
    between = _qdq_between(b1, nodes.get(core.softmax))
    if between:
        problems.append(f"ModelOpt put Q/DQ between BMM1 and the Softmax ({', '.join(between)}), which TensorRT's "
                        "fused attention pattern does not allow")
    if core.softmax is None or not _reaches(found["softmax"].q.inputs[0], core.softmax):
        problems.append("the Q/DQ on BMM2's first input does not quantize the Softmax output")
    if any(p.scale is None or not np.isfinite(p.scale) or p.scale <= 0 for p in found.values()):
        problems.append("a Q/DQ scale is not one positive per-tensor value")
    if rec.qdq_dtype != QDQ_DTYPES[mode]:
        problems.append(f"the Q/DQ type is {rec.qdq_dtype}, not {QDQ_DTYPES[mode]}")
    rec.placed = not problems
    rec.reason = "; ".join(problems)
    return rec


# ---------------------------------------------------------------- reading the quantized graph
@dataclass
class _Pair:
    scale: float | None
    dtype: str | None
    q: gs.Node
    dq: gs.Node


def _producer(t) -> gs.Node | None:
    return t.inputs[0] if t is not None and t.inputs else None


def _scalar(t) -> float | None:
    if isinstance(t, gs.Constant):
        v = np.asarray(t.values)
    else:
        p = _producer(t)
        if p is None or p.op != "Constant" or "value" not in p.attrs:
            return None
        v = np.asarray(p.attrs["value"].values)
    if v.size != 1:
        return None  # per-channel: not an activation Q/DQ
    return float(np.asarray(v, dtype=np.float64).reshape(()))


def _elem_types(model: onnx.ModelProto) -> dict[str, str]:
    """ONNX's element type names ("int8", "float8e4m3fn", ...) of the typed tensors and constants of
    `model`, read from the proto: onnx-graphsurgeon types a float8 constant by its ONNX enum and
    the others by numpy dtype, and reading a float8 value would cast it."""
    out = {}
    for vi in list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            out[vi.name] = vi.type.tensor_type.elem_type
    for init in model.graph.initializer:
        out[init.name] = init.data_type
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = a.t.data_type
    return {k: onnx.helper.tensor_dtype_to_string(v).replace("TensorProto.", "").lower() for k, v in out.items()}


def _qdq_pair(t, types: dict[str, str]) -> _Pair | None:
    """The Q -> DQ pair feeding `t` (through accumulation casts), or None."""
    node = _producer(t)
    while node is not None and node.op in _BETWEEN:
        node = _producer(node.inputs[0])
    if node is None or node.op != "DequantizeLinear":
        return None
    q = _producer(node.inputs[0])
    if q is None or q.op != "QuantizeLinear":
        return None  # a weight (constant) DQ, not an activation pair
    scale = _scalar(node.inputs[1])
    zp = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] is not None else None
    dtype = types.get(zp.name) if zp is not None and zp.name else types.get(node.inputs[0].name)
    return _Pair(scale, dtype, q, node)


def _reaches(t, node_name: str, budget: int = 8) -> bool:
    """Does `t` come from the node `node_name` through layout/cast ops and torch's NaN guard
    (Where(IsNaN(p), 0, p), which SDPA exports put after the Softmax) only?"""
    for _ in range(budget):
        p = _producer(t)
        if p is None:
            return False
        if p.name == node_name:
            return True
        if p.op == "Where" and len(p.inputs) == 3:
            cond = _producer(p.inputs[0])
            if cond is None or cond.op != "IsNaN" or cond.inputs[0] is not p.inputs[2]:
                return False
            t = p.inputs[2]
            continue
        if p.op not in _LAYOUT:
            return False
        t = p.inputs[0]
    return False


def _qdq_between(bmm1: gs.Node, softmax: gs.Node | None, depth: int = 16) -> list[str]:
    """Q/DQ nodes on the paths from BMM1's output to the Softmax."""
    if softmax is None:
        return []

    def reach(start: gs.Node, step) -> dict[int, gs.Node]:
        seen, frontier = {}, [start]
        for _ in range(depth):
            nxt = []
            for n in frontier:
                for m in step(n):
                    if id(m) not in seen:
                        seen[id(m)] = m
                        nxt.append(m)
            frontier = nxt
        return seen

    down = reach(bmm1, lambda n: [c for t in n.outputs for c in t.outputs])
    up = reach(softmax, lambda n: [p for t in n.inputs if (p := _producer(t)) is not None])
    return sorted(down[k].name for k in down.keys() & up.keys()
                  if down[k].op in ("QuantizeLinear", "DequantizeLinear"))


def _output_pair(t, budget: int = 6) -> _Pair | None:
    """A Q -> DQ on the attention output, through layout ops with a single consumer each."""
    for _ in range(budget):
        consumers = list(t.outputs)
        if len(consumers) != 1:
            return None
        c = consumers[0]
        if c.op == "QuantizeLinear":
            dq = [n for n in c.outputs[0].outputs if n.op == "DequantizeLinear"]
            if not dq:
                return None
            return _Pair(_scalar(c.inputs[1]), None, c, dq[0])
        if c.op not in _LAYOUT:
            return None
        t = c.outputs[0]
    return None
