"""Forms of a fused model, each still standard ONNX and verified on ONNX Runtime before TensorRT
sees it. The network builder lowers their ops one to one (trt/plan.py, trt/lower.py).

padded    the fused model, with every rotate-half RoPE rewritten into the ONNX RotaryEmbedding op
          (cos/sin tables taken from the graph) so that it becomes an IRotaryEmbeddingLayer.
kv-cache  decoders whose K/V were concatenated with a past cache read a preallocated cache
          instead: TensorScatter (opset 24) writes the new K/V at each row's `cache_write_index`,
          Attention reads the whole cache with nonpad_kv_seqlen = write index + new tokens and
          is_causal (offset-aware: lower-right). The cache outputs alias the cache inputs. Each row
          keeps its own length, so there is no padding mask: the attention_mask input goes.
packed    encoders and cacheless decoders run on packed tokens [1, T] with `cu_seqlens` [B+1]
          instead of a padding mask; positions restart per sequence; attention sees a block-
          diagonal mask, which IAttention expresses as PACKED_NHD with cumulative lengths.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import onnx

from ...contract import CU_SEQLENS, cache_inputs
from ...errors import TrtattnError
from ...report import Progress
from ...verify import adapter_for, compare_models, compare_runners, onnx_runner
from .kv_cache import kv_cache_form
from .packed import packed_form
from .rope import rope_to_ops

FORMS = ("padded", "packed", "kv-cache")


@dataclass
class Derived:
    model: onnx.ModelProto
    sites: dict = field(default_factory=dict)  # Attention node -> AttentionSite
    packed_lengths: str | None = None
    causal: dict = field(default_factory=dict)  # Attention node -> alignment, where the form's op does not say
    verification: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def derive(form: str, original: onnx.ModelProto, fused, *, dims=None, progress=None) -> Derived:
    progress = progress or Progress(enabled=False)
    reports = [r for r in fused.reports if r.status == "fused"]
    sites = {r.attention_node: r.site for r in reports}
    with progress.step("rewriting RoPE into RotaryEmbedding ops"):
        model, ropes = rope_to_ops(fused.model, [r.site for r in reports])
    derived = Derived(model, sites, notes=[f"{ropes} RoPE rotations as RotaryEmbedding ops"] if ropes else [])
    if form == "kv-cache":
        with progress.step("deriving the KV-cache form (TensorScatter + Attention with cache lengths)"):
            derived.model = kv_cache_form(derived.model, reports)
    elif form == "packed":
        with progress.step("deriving the packed form (cu_seqlens, restarting positions)"):
            derived.model, derived.causal = packed_form(derived.model, reports)
            derived.packed_lengths = CU_SEQLENS
    if form == "padded" and not ropes:  # the fused model itself, verified by fuse already
        derived.verification = fused.verification
        return derived
    with progress.step(f"verifying the {form} form against the original on ONNX Runtime"):
        derived.verification = verify_form(form, original, derived.model, [r.site for r in reports], dims=dims)
    if not derived.verification["passed"]:
        raise TrtattnError(f"the {form} form does not match the original model on ONNX Runtime "
                           f"(max abs error {derived.verification.get('max_abs_err')}); not building it")
    return derived


def verify_form(form: str, original: onnx.ModelProto, derived: onnx.ModelProto, sites, *, dims=None) -> dict:
    """The form model against the original, both on ONNX Runtime through Polygraphy."""
    if form == "padded":
        return compare_models(original, derived, sites, dims=dims).summary()
    adapter = adapter_for(original, [i.name for i in derived.graph.input], cache_inputs(derived))
    with contextlib.ExitStack() as stack:
        runners = [onnx_runner(stack, original, name="original"), onnx_runner(stack, derived, name=form)]
        return compare_runners(*runners, adapter, dims=dims).summary()
