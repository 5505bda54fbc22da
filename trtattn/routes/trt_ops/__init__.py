"""`trtattn fuse --ops trt`: the verified form `trtattn build` would lower (padded, packed or kv-cache), with
every planned layer written as TensorRT's own ONNX custom op instead of being lowered by the network API,
so that `trtexec --onnx` (or Triton's TensorRT backend) builds the same IAttention / KV-cache update layers:

    result = fuse_trt(model, name="llama", form="kv-cache")   # prepare, write, verify on CPU
    if result.ok:
        save(result.model, "llama.trt.onnx"); write_json(result.sidecar("llama.trt.onnx"), "llama.trt.json")

The plan (trt/plan.py) is the contract: its AttentionPlan records say what each op is (nodes.py writes
them). The written model is checked against the documented ops (trtattn_plugins.schema) and verified
against the original on ONNX Runtime through trtattn_plugins' CPU kernels of those ops, like every form.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import onnx
import onnx_graphsurgeon as gs

from trtattn_plugins import TrtOpError, schema

from ...errors import SitesRefused, TrtattnError
from ...graph.emit import export_like
from ...graph.feeds import make_feeds
from ...graph.precision import QUANTIZED
from ...graph.shapes import tensor_types
from ...report import Progress
from ...site import SiteStatus
from ...verify import Check, Verification, tolerance
from ..prepare import VERIFY_SEEDS, Prepared, forms, prepare
from .nodes import IO_FORM, OpWriter
from .sidecar import shape_strings, sidecar, trtexec_command

__all__ = ["TrtOpRow", "TrtOpsResult", "fuse_trt", "runnable", "shape_strings", "trtexec_command", "verify_trt_ops",
           "write_trt_ops"]


@dataclass(frozen=True)
class TrtOpRow:
    """One site as a TensorRT op: the table's row and the report's "sites" entry (JSON by to_json only)."""

    name: str  # the site
    op: str  # TRT_Attention, TRT_QuantizedAttention, or "-" when no op was written for it
    node: str  # the op node's name (the plan's layer)
    form: str  # its IO layout ("BNSH", or Q's and KV's when they differ)
    heads: str  # "q/kv"
    head_size: int | None
    q_scale: float
    causal_kind: str
    mask: str  # the mask's kind, or "-"
    lengths: str  # "q", "kv", "q/kv" or "-": which side reads per-row lengths
    dtype: str
    quantize: str  # the softmax's quantize-to type, or "-"
    reason: str | None  # why TensorRT's ops cannot express it (None: they can)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class TrtOpsResult:
    prepared: Prepared
    model: onnx.ModelProto  # the form with TensorRT's ops
    verification: Verification = field(default_factory=Verification.nothing)

    @property
    def ok(self) -> bool:
        return bool(self.verification.passed)

    def sidecar(self, onnx_path) -> dict:
        return sidecar(self.prepared.plan, self.model, onnx_path, source=self.prepared.source,
                       verification=self.verification)

    def rows(self) -> list[TrtOpRow]:
        """One row per site: the op it became and how."""
        ops = {n.name: n.op_type for n in self.model.graph.node if n.domain == schema.DOMAIN}
        rows = []
        for a in self.prepared.plan.attentions:
            form = IO_FORM[a.query_form] if a.query_form == a.kv_form else \
                f"{IO_FORM[a.query_form]} q / {IO_FORM[a.kv_form]} kv"
            lengths = "/".join(x for x in ("q" if a.q_lengths else "", "kv" if a.kv_lengths else "") if x) or "-"
            rows.append(TrtOpRow(name=a.site, op=ops.get(a.layer, "-"), node=a.layer, form=form,
                                 heads=f"{a.q_heads}/{a.kv_heads}", head_size=a.head_size, q_scale=a.q_scale,
                                 causal_kind=a.causal, mask=a.mask_kind if a.mask else "-", lengths=lengths,
                                 dtype=a.dtype, quantize=a.normalization_quantize_to_type or "-", reason=a.reason))
        return rows


def write_trt_ops(prepared: Prepared) -> onnx.ModelProto:
    """The form model with every planned layer as TensorRT's custom op (rotary embeddings stay the standard
    RotaryEmbedding). Raises naming the sites TensorRT's ops cannot express, or any departure of a written
    node from the documented ops."""
    plan, form_model = prepared.plan, prepared.form_model
    refused = [a for a in plan.attentions if a.reason is not None]
    if refused:
        raise SitesRefused(f"{len(refused)} site(s) cannot be written as TensorRT's attention ops (they would need a "
                           "TensorRT plugin): " + "; ".join(f"{a.site}: {a.reason}" for a in refused),
                           [(a.site, a.reason or "") for a in refused])
    graph = gs.import_onnx(form_model)
    writer = OpWriter(graph, tensor_types(form_model))
    for a in plan.native:
        writer.attention(a)
    capacity = plan.limits.max_cache if plan.limits else None
    for c in plan.cache_updates:
        writer.cache_update(c, capacity)
    model = export_like(graph, form_model)
    trt = [o for o in model.opset_import if o.domain == schema.DOMAIN]  # onnx-graphsurgeon may have added it
    if not trt:
        model.opset_import.append(onnx.helper.make_opsetid(schema.DOMAIN, 1))
    elif trt[0].version != 1:
        raise TrtattnError(f"the form model imports the '{schema.DOMAIN}' domain at version {trt[0].version}, not 1")
    left = sorted({n.op_type for n in model.graph.node if n.op_type in ("Attention", "TensorScatter")
                   and n.domain in ("", "ai.onnx")})
    if left:
        raise TrtattnError(f"the written model still has standard {', '.join(left)} ops the plan did not cover")
    problems = schema.check_model(model)
    if problems:
        raise TrtattnError("written TensorRT ops depart from the documented ones: " + "; ".join(problems[:5]))
    return model


def _symbolic_caches(written: onnx.ModelProto, form_model: onnx.ModelProto, caches: set[str]) -> onnx.ModelProto:
    """The written model with its caches' declared shapes as in the form (capacity symbolic), for ONNX
    Runtime, which the comparison feeds caches of past + new + a few free slots; the nodes are the same."""
    if not caches:
        return written
    copy = onnx.ModelProto()
    copy.CopyFrom(written)
    declared = {v.name: v for v in [*form_model.graph.input, *form_model.graph.output]}
    for v in [*copy.graph.input, *copy.graph.output]:
        if v.name in caches and v.name in declared:
            v.CopyFrom(declared[v.name])
    return copy


def runnable(result: TrtOpsResult) -> onnx.ModelProto:
    """The written model as ONNX Runtime (with trtattn_plugins) runs it on any cache length: the caches'
    declared capacity symbolic, as in the form (form_adapter(...) feeds it)."""
    caches = {c.cache for c in result.prepared.plan.cache_updates} | {c.output for c in result.prepared.plan.cache_updates}
    return _symbolic_caches(result.model, result.prepared.form_model, caches)


def verify_trt_ops(written: onnx.ModelProto, prepared: Prepared, *, dims=None) -> Verification:
    """The written model (its trt ops on trtattn_plugins' CPU kernels) against the model it came from on ONNX
    Runtime (the original; when quantized, the Q/DQ model the engine computes), as the form is verified (on the
    user's inputs when prepare had them), within the tolerance of the plan's precision; a kernel's refusal of its
    inputs is a failed verification naming the node."""
    reference, precision = prepared.source_model or prepared.model, prepared.plan.precision
    atol, rtol = tolerance(Check.ENGINE, precision)
    if precision in QUANTIZED:  # the bound prepare verifies the fused Q/DQ model within (rewrite/quantize/source.py)
        from ...rewrite.quantize.source import fuse_tolerance

        atol = max(atol, fuse_tolerance(reference, precision,
                                        [make_feeds(reference, dims=dims, seed=seed) for seed in VERIFY_SEEDS]))
    sites = [r.site for r in prepared.fused.reports if r.status == SiteStatus.FUSED]
    caches = {c.cache for c in prepared.plan.cache_updates} | {c.output for c in prepared.plan.cache_updates}
    model = _symbolic_caches(written, prepared.form_model, caches)
    emulated = precision == "bf16"  # ONNX Runtime has no bf16 MatMul, Add...: emulated in fp32, each bf16 tensor rounded
    if emulated:
        from ...rewrite.precision.emulate import EMULATION, bf16_emulated

        model = bf16_emulated(model)
    try:
        summary = forms.verify_form(prepared.plan.form, reference, model, sites, dims=dims, atol=atol, rtol=rtol,
                                    inputs=prepared.inputs)
        if emulated:
            summary.run_on = EMULATION
        return summary
    except TrtOpError as e:
        return Verification(passed=False, error=str(e))


def fuse_trt(model: onnx.ModelProto, *, name: str, form: str | None = None, precision: str | None = None, calib=None,
             dims=None, decomposable: bool = False, progress=None, source: str = "", inputs=None) -> TrtOpsResult:
    """prepare (routes/prepare: the verified form in `precision`, its plan), write its TensorRT ops, verify them."""
    progress = progress or Progress(enabled=False)
    prepared = prepare(model, name=name, form=form, precision=precision, calib=calib, dims=dims,
                       decomposable=decomposable, progress=progress, source=source, inputs=inputs)
    with progress.step("writing every site as TensorRT's TRT_Attention / TRT_KVCacheUpdate ops"):
        written = write_trt_ops(prepared)
    with progress.step("verifying the TensorRT ops against the original on ONNX Runtime (trtattn_plugins)"):
        verification = verify_trt_ops(written, prepared, dims=dims)
    return TrtOpsResult(prepared, written, verification)
