"""The build plan: what the network builder will lower, computed without TensorRT.

The input is a *form* model (routes/prepare): every attention as a standard ONNX op (Attention, and
RotaryEmbedding where the form has them), already verified on ONNX Runtime, plus the form's records of
what ONNX alone does not say (routes/prepare/lowering.py: a packed query, lengths, the cache updates). Each
becomes one planned TensorRT layer; everything else is parsed by TensorRT's OnnxParser. `trtattn build`
prints the plan, writes it with --plan-json, and stores it in the engine's sidecar.

AttentionPlan is also the contract with the trtexec route (routes/trt_ops writes TensorRT's
TRT_Attention custom ops from it). Its fields:

site, node, layer, query, key, value, output, q_scale, causal ("none"|"upper_left"|"lower_right"),
mask, mask_kind ("none"|"boolean"|"additive"), query_form and kv_form ("padded"|"packed", independent:
a packed query over a padded cache), q_lengths (cumulative [B+1]), kv_lengths (per-row [B] when padded,
cumulative [B+1] when packed), q_heads, kv_heads, head_size, rank, dtype (what the IAttention computes
in: "fp32"|"fp16"|"bf16"|"fp8"|"int8"), normalization_quantize_to_type (None|"fp8"|"int8"),
normalization_quantize_scale (float or None), decomposable, reason (why a site is not native, or None),
region (the ONNX nodes the layer replaces).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx

from ..errors import SitesRefused, TrtattnError
from ..graph.precision import elem_precision
from ..graph.rotary import RotaryAttrs, rotary_inputs
from ..graph.shapes import STANDARD_DOMAINS as STANDARD
from ..graph.shapes import dims_of, proven_output_dims, tensor_types
from ..site import attribute_softcap
from ..site_names import engine_layer, layer_metadata
from .profiles import PlanLimits


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
    query_form: str = "padded"  # padded | packed
    kv_form: str = "padded"
    q_lengths: str | None = None  # cumulative [B+1] (packed query)
    kv_lengths: str | None = None  # per row [B] (padded key/value) or cumulative [B+1] (packed)
    q_heads: int | None = None
    kv_heads: int | None = None
    head_size: int | None = None
    rank: int = 4
    dtype: str = "fp32"  # what the IAttention computes in: its query's dtype in the form
    normalization_quantize_to_type: str | None = None  # fp8 | int8: the softmax output's Q/DQ
    normalization_quantize_scale: float | None = None
    decomposable: bool = False
    reason: str | None = None  # why the site is not an IAttention (then nothing is lowered for it)
    region: tuple[str, ...] = ()  # the ONNX nodes the layer replaces

    def metadata(self) -> str:
        return layer_metadata(self.site, self.node)

    def reads(self) -> list[str]:
        return [t for t in (self.query, self.key, self.value, self.mask, self.q_lengths, self.kv_lengths) if t]

    def row(self) -> dict:
        """The site in the plan JSON (`build --plan-json`)."""
        return {"name": self.site, "dtype": self.dtype, "causal_kind": self.causal,
                "mask": None if self.mask_kind == "none" else self.mask_kind, "kv_lengths": self.kv_lengths,
                "normalization_quantize_to_type": self.normalization_quantize_to_type, "reason": self.reason}


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
    num_heads: int = 0  # > 0: the input is [B, S, num_heads * H], split into [B, N, S, H] around the layer

    @property
    def region(self) -> tuple[str, ...]:
        return (self.node,)

    def reads(self) -> list[str]:
        return [t for t in (self.input, self.cos, self.sin, self.position_ids) if t]


@dataclass
class CacheUpdatePlan:
    node: str
    cache: str  # the engine input holding the cache; the output aliases it
    update: str  # [B, N, S, H] or packed tokens [1, N, T, H]
    write_indices: str | None
    output: str
    update_form: str = "padded"  # padded | packed
    update_lengths: str | None = None  # cumulative [B+1] (packed update)
    region: tuple[str, ...] = ()

    def reads(self) -> list[str]:
        return [t for t in (self.cache, self.update, self.write_indices, self.update_lengths) if t]


@dataclass
class CollectivePlan:
    """A tensor-parallel collective of a rank's form (a `trtattn.dist` node, routes/parallel): TensorRT's
    IDistCollectiveLayer (NCCL) over `ranks` devices."""

    node: str
    input: str
    output: str
    kind: str  # "ALL_REDUCE" | "ALL_GATHER"
    ranks: int
    axis: int = 0  # ALL_GATHER: the axis the ranks' slices are concatenated along

    @property
    def region(self) -> tuple[str, ...]:
        return (self.node,)

    def reads(self) -> list[str]:
        return [self.input]


LoweredPlan = AttentionPlan | RopePlan | CacheUpdatePlan | CollectivePlan  # an op TensorRT gets as its own layer


@dataclass(frozen=True)
class TensorIO:
    """An engine input or output of the I/O contract: its name, numpy dtype name and dims (ints, dim names)."""

    name: str
    dtype: str
    shape: list

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass
class BuildPlan:
    name: str
    form: str
    precision: str
    attentions: list[AttentionPlan] = field(default_factory=list)  # every site; lowered where reason is None
    ropes: list[RopePlan] = field(default_factory=list)
    cache_updates: list[CacheUpdatePlan] = field(default_factory=list)
    collectives: list[CollectivePlan] = field(default_factory=list)  # tensor parallel: one rank's
    order: list[str] = field(default_factory=list)  # lowered ONNX nodes, in graph order
    inputs: list[TensorIO] = field(default_factory=list)  # the engine's I/O contract
    outputs: list[TensorIO] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)  # output -> input whose buffer it updates in place
    profiles: list[dict] = field(default_factory=list)  # [{input: {"min", "opt", "max"}}], one per profile
    limits: PlanLimits | None = None  # what the default profiles run to (None: not planned yet)
    precision_table: dict[str, float] = field(default_factory=dict)  # share of matmul work per dtype
    right_padded: list[str] = field(default_factory=list)  # padding masks read as per-row lengths
    notes: list[str] = field(default_factory=list)
    # ONNX Runtime's ops lowered to standard ONNX before the form was made (rewrite/lower): op -> how many
    contrib_lowered: dict[str, int] = field(default_factory=dict)
    mark_sites: bool = False  # also output each attention's result (per-site verification)

    @property
    def native(self) -> list[AttentionPlan]:
        """The sites that become an IAttention."""
        return [a for a in self.attentions if a.reason is None]

    def lowered(self) -> dict[str, LoweredPlan]:
        plans: list[LoweredPlan] = [*self.native, *self.ropes, *self.cache_updates, *self.collectives]
        return {p.node: p for p in plans}

    def to_json(self) -> dict:
        return {**asdict(self), "limits": self.limits_json()}

    def inputs_json(self) -> list[dict]:
        """The plan's and pipeline.json's "inputs" (issue 12's key order: name, shape, dtype)."""
        return [{"name": i.name, "shape": i.shape, "dtype": i.dtype} for i in self.inputs]

    def io_json(self) -> dict:
        """The sidecar's "io": the contract's inputs and outputs, the in-place aliases, the masks read as lengths."""
        return {"inputs": [i.to_json() for i in self.inputs], "outputs": [o.to_json() for o in self.outputs],
                "aliases": self.aliases, "right_padded": self.right_padded}

    def limits_json(self) -> dict:
        return self.limits.to_json() if self.limits else {}

    def plan_json(self) -> dict:
        """`build --plan-json`: exactly the keys issue 12 lists."""
        return {"form": self.form, "precision": self.precision,
                "inputs": self.inputs_json(),
                "profiles": self.profiles, "sites": [a.row() for a in self.attentions],
                "precision_table": self.precision_table}


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _rope(node: onnx.NodeProto, types) -> RopePlan | str:
    """A RotaryEmbedding as IRotaryEmbeddingLayer, or why it is left to TensorRT's ONNX parser. The layer takes
    [B, N, S, H] (a 3-D input it reads as packed [T, N, H]), so the op's 3-D input ([B, S, N*H] with num_heads)
    is split into heads around it; an input of unknown rank cannot be told from packed tokens."""
    attrs = _attrs(node)
    shape = types.get(node.input[0], (None, None))[1]
    rank = len(shape) if shape is not None else None
    heads = int(attrs.get("num_heads", 0))
    if rank not in (3, 4) or (rank == 3 and not heads):
        return (f"RotaryEmbedding {node.name} is left to TensorRT's ONNX parser: its input's rank is "
                + (f"{rank}" if rank is not None else "unknown") + (" without num_heads" if rank == 3 else ""))
    x, cos, sin, positions = rotary_inputs(node.domain, list(node.input))
    rope = RotaryAttrs.of(attrs)
    return RopePlan(node.name, x, cos, sin, node.output[0], positions, rope.interleaved, rope.rotary_embedding_dim,
                    heads if rank == 3 else 0)


def _opt(node: onnx.NodeProto, i: int) -> str | None:
    return node.input[i] if len(node.input) > i and node.input[i] else None


def make_plan(form_model: onnx.ModelProto, *, name: str, form: str, precision: str, sites: dict,
              lowerings: dict | None = None, cache_lowerings=(), decomposable: bool = False,
              quantized: dict | None = None, implicit=(), implicit_reason: str = "") -> BuildPlan:
    """Plan every standard attention-related op of `form_model`.

    sites: ONNX Attention node -> its AttentionSite (names the layer, gives heads and head size);
    lowerings: Attention node -> its forms.lowering.AttentionLowering, where the form says more than the
    op; cache_lowerings: the form's forms.lowering.CacheLowering records; quantized: Attention node ->
    (normalization_quantize_to_type, scale) from the site's softmax Q/DQ; implicit: (AttentionSite, node) of
    the sites the form left to TensorRT's own fusion, planned with `implicit_reason` and not lowered.
    """
    types = tensor_types(form_model)
    plan = BuildPlan(name=name, form=form, precision=precision)
    lowerings, quantized = lowerings or {}, quantized or {}
    by_scatter = {c.node: c for c in cache_lowerings}
    for node in form_model.graph.node:
        if node.domain not in STANDARD:
            continue
        if node.op_type == "Attention":
            a = _attention(node, types, sites, lowerings.get(node.name), decomposable)
            if node.name in quantized:
                a.normalization_quantize_to_type, a.normalization_quantize_scale = quantized[node.name]
                a.dtype = a.normalization_quantize_to_type
            plan.attentions.append(a)
            if a.reason is not None:
                continue
        elif node.op_type == "RotaryEmbedding":
            rope = _rope(node, types)
            if isinstance(rope, str):
                plan.notes.append(rope)
                continue
            plan.ropes.append(rope)
        elif node.op_type == "TensorScatter":
            plan.cache_updates.append(_tensor_scatter(node, types))
        elif node.name in by_scatter:
            c = by_scatter[node.name]
            plan.cache_updates.append(CacheUpdatePlan(c.node, c.cache, c.update, c.write_indices, c.output,
                                                      c.update_form, c.update_lengths, tuple(c.region)))
        else:
            continue
        plan.order.append(node.name)
    for site, node in implicit:  # written out for TensorRT's own fusion (routes/prepare/implicit.py): planned, not lowered
        plan.attentions.append(AttentionPlan(
            site=site.name, node=node, layer=engine_layer(site.name), query=site.query, key=site.key,
            value=site.value, output=site.output, q_scale=float(site.softmax_scale), mask_kind=site.mask.value,
            q_heads=site.q_heads, kv_heads=site.kv_heads, head_size=site.head_size,
            rank=site.rank, dtype=elem_precision(types.get(site.query, (onnx.TensorProto.UNDEFINED, None))[0]),
            decomposable=decomposable, reason=implicit_reason, region=()))
    missing = set(by_scatter) - {c.node for c in plan.cache_updates}
    if missing:
        raise TrtattnError(f"the form's cache updates {sorted(missing)} are not in its graph")
    return plan


def _tensor_scatter(node, types) -> CacheUpdatePlan:
    a = _attrs(node)
    mode = a.get("mode", "linear")
    if (mode.decode() if isinstance(mode, bytes) else mode) != "linear":
        raise TrtattnError(f"TensorScatter {node.name}: only the linear cache mode maps to IKVCacheUpdateLayer")
    shape = types.get(node.input[0], (None, None))[1] or [None] * 4
    if int(a.get("axis", -2)) % len(shape) != len(shape) - 2:
        raise TrtattnError(f"TensorScatter {node.name}: the cache's sequence axis must be the second last")
    return CacheUpdatePlan(node.name, node.input[0], node.input[1], _opt(node, 2), node.output[0], region=(node.name,))


def _static(shape, i):
    try:
        d = shape[i]
    except (IndexError, TypeError):
        return None
    return d if isinstance(d, int) and d > 0 else None


def _attention(node, types, sites, lowering, decomposable) -> AttentionPlan:
    a = _attrs(node)
    q, k, v = node.input[:3]
    mask, past_key, nonpad = _opt(node, 3), _opt(node, 4), _opt(node, 6)
    record = sites.get(node.name)
    site = record.name if record is not None else node.name
    if len(node.output) > 3 and node.output[3]:  # the form computes a returned QK beside the op (qk_beside.py)
        mode = a.get("qk_matmul_output_mode", 0)
        raise SitesRefused(f"site {site} also returns {node.output[3]} (the Attention op's qk_matmul_output, mode "
                           f"{mode}): IAttention outputs only Y",
                           [(site, f"the model also returns {node.output[3]} (qk_matmul_output mode {mode}), which "
                                   "IAttention cannot output")])
    if past_key:
        raise TrtattnError(f"Attention {node.name} concatenates a past cache inside the op; "
                           "build the kv-cache form (--form kv-cache) instead")
    q_type, q_shape = types.get(q, (None, None))
    q_shape, k_shape = q_shape or [], types.get(k, (None, None))[1] or []
    rank = len(q_shape) or 4
    if rank == 4:
        q_heads, kv_heads, head = _static(q_shape, 1), _static(k_shape, 1), _static(q_shape, -1)
    else:  # [B, S, N*H] with the head counts as attributes
        q_heads, kv_heads = a.get("q_num_heads"), a.get("kv_num_heads")
        hidden = _static(q_shape, -1)
        head = hidden // q_heads if hidden and q_heads else None
    if record is not None:  # the matcher's record knows the heads even where shape inference does not
        q_heads, kv_heads, head = record.q_heads or q_heads, record.kv_heads or kv_heads, record.head_size or head
    scale = a.get("scale")
    if scale is None:
        if head is None:
            raise TrtattnError(f"Attention {node.name}: the head size is unknown, so is its default scale")
        scale = 1.0 / math.sqrt(head)
    plan = AttentionPlan(site=site, node=node.name, layer=engine_layer(site), query=q, key=k, value=v,
                         output=node.output[0], q_scale=float(scale), q_heads=q_heads, kv_heads=kv_heads, head_size=head,
                         rank=rank, dtype=elem_precision(q_type), decomposable=decomposable,
                         region=(node.name,))
    if attribute_softcap(a):
        raise TrtattnError(f"Attention {node.name} soft-caps its logits, which IAttention cannot do; the padded form "
                           "writes such sites in TensorRT's implicit form")
    if lowering is not None:  # the form's record: lengths, forms, causal kind; its mask says the same
        plan.query, plan.output = lowering.query or q, lowering.output or node.output[0]
        plan.causal, plan.q_lengths, plan.kv_lengths = lowering.causal, lowering.q_lengths, lowering.kv_lengths
        plan.query_form, plan.kv_form, plan.region = lowering.query_form, lowering.kv_form, tuple(lowering.region)
        if lowering.mask:
            plan.mask, plan.mask_kind = lowering.mask, _mask_kind(types, lowering.mask)
        return plan
    if nonpad:
        raise TrtattnError(f"Attention {node.name} reads nonpad_kv_seqlen without a form record saying how its "
                           "causal mask aligns (ONNX's is_causal is bottom-right, TensorRT's parser reads upper-left)")
    if any(a.get(w, -1) >= 0 for w in ("left_window_size", "right_window_size")):
        raise TrtattnError(f"Attention {node.name} has a sliding window, which IAttention has not; the padded form "
                           "writes it as a mask")
    if a.get("is_causal", 0):  # without a cache or lengths ONNX's causal offset is 0: upper-left
        if mask:
            raise TrtattnError(f"Attention {node.name} has a mask and is_causal: IAttention takes one or the other")
        plan.causal = "upper_left"
    if mask:
        plan.mask, plan.mask_kind = mask, _mask_kind(types, mask)
    return plan


def _mask_kind(types, mask: str) -> str:
    return "boolean" if types.get(mask, (None, None))[0] == onnx.TensorProto.BOOL else "additive"


def describe_io(types: dict, name: str) -> TensorIO:
    elem, shape = types.get(name, (onnx.TensorProto.FLOAT, None))
    return TensorIO(name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).name,
                    [d if isinstance(d, int) else (d or f"{name}_dim{i}") for i, d in enumerate(shape or [])])


def io_contract(form_model: onnx.ModelProto, cut_model: onnx.ModelProto, cut_inputs: list[str], plan: BuildPlan,
                original: onnx.ModelProto | None = None) -> None:
    """The engine's inputs (the cut model's, minus placeholders: static cache capacities included),
    outputs (the form model's) and aliases. Dynamic dims keep their names; an output's dim the exporter named
    after an op is named after the inputs' dim `original` (the model the form was verified against, same
    outputs) provably runs it at (named_outputs)."""
    plan.inputs = [describe_io(tensor_types(cut_model), n) for n in cut_inputs]
    types = tensor_types(form_model)
    plan.outputs = [describe_io(types, o.name) for o in form_model.graph.output]
    if original is not None:
        named_outputs(plan, form_model, original)
    if plan.mark_sites:
        plan.outputs += [describe_io(types, a.output) for a in plan.native]
    outputs = {o.name for o in plan.outputs}
    plan.aliases = {cu.output: cu.cache for cu in plan.cache_updates if cu.output in outputs}


def named_outputs(plan: BuildPlan, form_model: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """Each output dim that is not one of the engine inputs' dims named after the inputs' dim the original's
    symbolic shapes prove it equal to (graph/shapes.proven_output_dims); a dim nothing proves keeps its name.
    Only for outputs the form passes on as the original declares them: a cache the form updates in place
    (its capacity, not the original's past + seq) is not the original's output."""
    names = {d for i in plan.inputs for d in i.shape if isinstance(d, str)}
    caches = {cu.output for cu in plan.cache_updates}
    declared = {o.name: dims_of(o) for o in original.graph.output}
    kept = {o.name for o in form_model.graph.output if o.name not in caches and dims_of(o) == declared.get(o.name)}
    proven = proven_output_dims(original, names)
    for k, o in enumerate(plan.outputs):
        dims = proven.get(o.name)
        if o.name in kept and dims is not None and len(dims) == len(o.shape):
            plan.outputs[k] = dataclasses.replace(o, shape=[p if isinstance(d, str) and d not in names and p is not None
                                                            else d for d, p in zip(o.shape, dims)])
