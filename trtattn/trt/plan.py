"""The build plan: what the network builder will lower, computed without TensorRT.

The input is a *form* model: every attention as a standard ONNX op (Attention, and
RotaryEmbedding / TensorScatter where the form has them; see trtattn/forms.py), already verified
on ONNX Runtime. Each of those ops becomes one planned TensorRT layer; everything else is parsed
by TensorRT's OnnxParser. `trtattn build` prints the plan when TensorRT is missing and stores it
in the engine's sidecar.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx

from ..errors import TrtattnError
from ..graph.shapes import STANDARD_DOMAINS as STANDARD
from ..graph.shapes import tensor_types


@dataclass
class AttentionPlan:
    site: str
    node: str  # the ONNX Attention node it replaces
    layer: str  # the IAttention's name, which layer info shows
    query: str
    key: str
    value: str
    output: str
    q_scale: float  # multiplied onto Q before the attention (IAttention has no scale)
    causal: str = "none"  # none | upper_left | lower_right
    mask: str | None = None
    mask_kind: str = "none"  # none | boolean | additive
    form: str = "padded"  # padded | packed (query and key/value alike)
    q_lengths: str | None = None  # cumulative [B+1] (packed)
    kv_lengths: str | None = None  # per row [B] (padded) or cumulative [B+1] (packed)
    q_heads: int | None = None
    kv_heads: int | None = None
    head_size: int | None = None
    rank: int = 4
    precision: str = "fp32"  # the dtype the attention computes in (casts around it otherwise)
    decomposable: bool = False

    def metadata(self) -> str:
        return f"trtattn site={self.site} onnx={self.node}"


@dataclass
class RopePlan:
    node: str
    input: str
    cos: str
    sin: str
    output: str
    position_ids: str | None = None
    interleaved: bool = False
    rotary_dim: int = 0  # 0: the whole head


@dataclass
class CacheUpdatePlan:
    node: str
    cache: str  # the engine input holding the cache; the output aliases it
    update: str
    write_indices: str | None
    output: str


@dataclass
class BuildPlan:
    name: str
    form: str
    precision: str
    attentions: list[AttentionPlan] = field(default_factory=list)
    ropes: list[RopePlan] = field(default_factory=list)
    cache_updates: list[CacheUpdatePlan] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # lowered ONNX nodes, in graph order
    inputs: list[dict] = field(default_factory=list)  # the engine's I/O contract
    outputs: list[dict] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)  # output -> input whose buffer it updates in place
    profiles: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    mark_sites: bool = False  # also output each attention's result (per-site verification)

    def lowered(self) -> dict:
        return {p.node: p for p in [*self.attentions, *self.ropes, *self.cache_updates]}

    def to_json(self) -> dict:
        return asdict(self)


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _opt(node: onnx.NodeProto, i: int) -> str | None:
    return node.input[i] if len(node.input) > i and node.input[i] else None


def make_plan(form_model: onnx.ModelProto, *, name: str, form: str, precision: str, sites: dict,
              causal: dict[str, str] | None = None, packed_lengths: str | None = None,
              decomposable: bool = False) -> BuildPlan:
    """Plan every standard attention-related op of `form_model`.

    sites: ONNX Attention node -> its AttentionSite (names the layer, gives heads and head size);
    causal: node -> alignment for is_causal; packed_lengths: the cumulative-lengths input when the
    attentions run on packed tokens.
    """
    types = tensor_types(form_model)
    plan = BuildPlan(name=name, form=form, precision=precision)
    for node in form_model.graph.node:
        if node.domain not in STANDARD:
            continue
        if node.op_type == "Attention":
            plan.attentions.append(_attention(node, types, sites, causal or {}, packed_lengths, precision,
                                              decomposable))
        elif node.op_type == "RotaryEmbedding":
            a = _attrs(node)
            plan.ropes.append(RopePlan(node.name, node.input[0], node.input[1], node.input[2], node.output[0],
                                       _opt(node, 3), bool(a.get("interleaved", 0)),
                                       int(a.get("rotary_embedding_dim", 0))))
        elif node.op_type == "TensorScatter":
            a = _attrs(node)
            mode = a.get("mode", "linear")
            if (mode.decode() if isinstance(mode, bytes) else mode) != "linear":
                raise TrtattnError(f"TensorScatter {node.name}: only the linear cache mode maps to IKVCacheUpdateLayer")
            shape = types.get(node.input[0], (None, None))[1] or [None] * 4
            if int(a.get("axis", -2)) % len(shape) != len(shape) - 2:
                raise TrtattnError(f"TensorScatter {node.name}: the cache's sequence axis must be the second last")
            plan.cache_updates.append(CacheUpdatePlan(node.name, node.input[0], node.input[1], _opt(node, 2),
                                                      node.output[0]))
        else:
            continue
        plan.order.append(node.name)
    return plan


def _attention(node, types, sites, causal, packed_lengths, precision, decomposable) -> AttentionPlan:
    a = _attrs(node)
    q, k, v = node.input[:3]
    mask, past_key, nonpad = _opt(node, 3), _opt(node, 4), _opt(node, 6)
    if past_key:
        raise TrtattnError(f"Attention {node.name} concatenates a past cache inside the op; "
                           "build the kv-cache form (--form kv-cache) instead")
    if a.get("softcap"):
        raise TrtattnError(f"Attention {node.name} soft-caps its logits, which IAttention cannot do")
    q_shape = types.get(q, (None, None))[1] or []
    k_shape = types.get(k, (None, None))[1] or []
    rank = len(q_shape) or 4

    def static(shape, i):
        try:
            d = shape[i]
        except IndexError:
            return None
        return d if isinstance(d, int) and d > 0 else None

    if rank == 4:
        q_heads, kv_heads, head = static(q_shape, 1), static(k_shape, 1), static(q_shape, -1)
    else:  # [B, S, N*H] with the head counts as attributes
        q_heads, kv_heads = a.get("q_num_heads"), a.get("kv_num_heads")
        hidden = static(q_shape, -1)
        head = hidden // q_heads if hidden and q_heads else None
    scale = a.get("scale")
    if scale is None:
        if head is None:
            raise TrtattnError(f"Attention {node.name}: the head size is unknown, so is its default scale")
        scale = 1.0 / math.sqrt(head)
    alignment = "none"
    if a.get("is_causal", 0):  # bottom-right (offset-aware) in ONNX: upper-left unless a cache length says otherwise
        alignment = causal.get(node.name, "lower_right" if nonpad else "upper_left")
    mask_kind = "none"
    if mask:
        elem = types.get(mask, (None, None))[0]
        mask_kind = "boolean" if elem == onnx.TensorProto.BOOL else "additive"
        if alignment != "none":
            raise TrtattnError(f"Attention {node.name} has a mask and is_causal: IAttention takes one or the other")
    record = sites.get(node.name)
    if record is not None:  # the matcher's record knows the heads even where shape inference does not
        q_heads, kv_heads, head = record.q_heads or q_heads, record.kv_heads or kv_heads, record.head_size or head
    site = record.name if record is not None else node.name
    plan = AttentionPlan(site=site, node=node.name, layer=f"trtattn/attn/{site}", query=q, key=k, value=v,
                         output=node.output[0], q_scale=float(scale), causal=alignment, mask=mask, mask_kind=mask_kind,
                         kv_lengths=nonpad, q_heads=q_heads, kv_heads=kv_heads, head_size=head, rank=rank,
                         precision=precision, decomposable=decomposable)
    if packed_lengths:
        # the packed form's mask is block-diagonal by sequence (and causal within it): the lengths and
        # the causal flag say the same to IAttention
        plan.form, plan.q_lengths, plan.kv_lengths = "packed", packed_lengths, packed_lengths
        plan.mask, plan.mask_kind = None, "none"
        plan.causal = causal.get(node.name, "none")
    return plan


def io_contract(form_model: onnx.ModelProto, cut_inputs: list[str], plan: BuildPlan) -> None:
    """The engine's inputs (the cut model's, minus placeholders), outputs (the form model's) and aliases."""
    types = tensor_types(form_model)

    def describe(name):
        elem, shape = types.get(name, (onnx.TensorProto.FLOAT, None))
        return {"name": name, "dtype": np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).name,
                "shape": [d if isinstance(d, int) else (d or -1) for d in (shape or [])]}

    plan.inputs = [describe(n) for n in cut_inputs]
    plan.outputs = [describe(o.name) for o in form_model.graph.output]
    if plan.mark_sites:
        plan.outputs += [describe(a.output) for a in plan.attentions]
    plan.aliases = {cu.output: cu.cache for cu in plan.cache_updates if cu.output in {o["name"] for o in plan.outputs}}
