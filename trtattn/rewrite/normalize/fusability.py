"""fusability: can TensorRT fuse this attention, and if not, why.

Two questions per site, against TensorRT's documented limits (shared/reference:
tensorrt-fused-attention.txt, tensorrt-attention-api-facts.md):
- implicit: will TensorRT's own pattern fusion (trtexec --onnx on this graph) take it?
  Needs a fused-kernel precision, a supported head size, the scale on Q/K before the first
  MatMul, exactly one masking op (Where/Add/Sub) between that MatMul and the Softmax, and
  nothing but Q/DQ between the Softmax and the second MatMul.
- iattention: can trtattn's builder express it as one IAttention (add_attention_v2)?
The published limits are the older conservative ones (head size 16..256 and a multiple of 8 for
FP16/BF16; INT8 head sizes 16/32/64 with sequences up to 512): newer TensorRT may accept more, in
which case the engine's layer info (trtattn inspect) is the final word.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...graph.precision import FUSED_PRECISIONS
from ...match import logit_ops
from ...site import AttentionSite, MaskKind, ScalePlacement
from .canonical import needed as needs_reemit
from .probabilities import not_documented

INT8_HEAD_SIZES = (16, 32, 64)
INT8_MAX_SEQ = 512


@dataclass
class Verdict:
    implicit: bool
    iattention: bool
    implicit_why: list[str] = field(default_factory=list)
    iattention_why: list[str] = field(default_factory=list)
    causal_skip: bool = False  # TensorRT can skip the masked half (mask written as Range comparisons)

    def row(self) -> dict:
        """normalize's report columns for the verdict on the normalised graph (AFTER_KEYS, in order)."""
        return {"implicit": self.implicit, "implicit_why": "; ".join(self.implicit_why) or "-",
                "iattention": self.iattention, "iattention_why": "; ".join(self.iattention_why) or "-",
                "causal_skip": self.causal_skip}


AFTER_KEYS = ("implicit", "implicit_why", "iattention", "iattention_why", "causal_skip")  # Verdict.row()'s keys


def _kernel_limits(site: AttentionSite, precision: str, max_seq: int | None) -> list[str]:
    why = []
    if precision not in FUSED_PRECISIONS:
        why.append(f"{precision}: no fused attention kernel (build with fp16/bf16, or allow a decomposed fallback)")
        return why
    h = site.head_size
    if h is None:
        why.append("head size unknown")
    elif precision == "int8":
        if h not in INT8_HEAD_SIZES:
            why.append(f"int8 fused attention takes head sizes {INT8_HEAD_SIZES}, not {h}")
        if max_seq is not None and max_seq > INT8_MAX_SEQ:
            why.append(f"int8 fused attention takes sequences up to {INT8_MAX_SEQ}, not {max_seq}")
        elif max_seq is None:
            why.append(f"int8 fused attention needs sequences up to {INT8_MAX_SEQ} (set the profile's max)")
    elif not (16 <= h <= 256 and h % 8 == 0):
        why.append(f"head size {h} is outside 16..256 or not a multiple of 8")
    if site.v_head_size is not None and h is not None and site.v_head_size != h:
        why.append(f"value head size {site.v_head_size} differs from the query/key head size {h}")
    return why


def verdict(site: AttentionSite, *, precision: str = "fp16", meaning=None, max_seq: int | None = None,
            mask_ops: set[str] | None = None, probs_ops: list[str] | None = None) -> Verdict:
    """probs_ops: the op types between the site's Softmax and its second MatMul (probabilities.between)."""
    limits = _kernel_limits(site, precision, max_seq)
    softcap = site.softcap is not None

    iatt = list(limits)
    if site.source.is_contrib:
        iatt.append(f"{site.source} must first be converted to the standard Attention op")
    if softcap:
        iatt.append("IAttention has no logit soft-capping")
    if site.qk_output is not None:
        iatt.append(f"the model also returns {site.qk_output} (qk_matmul_output mode {site.qk_mode}); IAttention "
                    "outputs only Y")
    if site.q_heads and site.kv_heads and site.q_heads % site.kv_heads:
        iatt.append(f"{site.q_heads} query heads are not a multiple of {site.kv_heads} kv heads")

    implicit = list(limits)
    if site.source.is_op:
        implicit.append(f"already a fused op ({site.source}); TensorRT's parser maps ONNX Attention to IAttention")
    else:
        if site.scale_placement in (ScalePlacement.AFTER_BMM1, ScalePlacement.MIXED):
            implicit.append("the scale is applied after the first MatMul (TensorRT wants it on Q or K)")
        ops = [s.op for s in site.mask_steps if not logit_ops.unit(s).scales]
        late_scales = [s for s in site.mask_steps if logit_ops.unit(s).scales]
        if late_scales and site.scale_placement not in (ScalePlacement.AFTER_BMM1, ScalePlacement.MIXED):
            implicit.append("a Mul/Div sits between the first MatMul and the Softmax")
        if len(ops) > 1:
            implicit.append(f"{len(ops)} ops between the first MatMul and the Softmax ({', '.join(ops)}); one Where/Add allowed")
        if logit_ops.has_layout_change(site.mask_steps) or needs_reemit(site):
            implicit.append("the logits are reshaped between the first MatMul and the Softmax (or the products are "
                            "not MatMuls on [batch, heads, seq, dim])")
        if softcap:
            implicit.append("logit soft-capping between the MatMul and the Softmax")
        extra = not_documented(probs_ops)
        if extra:
            implicit.append(f"{', '.join(extra)} between the Softmax and the second MatMul (TensorRT's pattern "
                            "allows only Q/DQ there)")
    causal_skip = bool(meaning is not None and getattr(meaning, "pattern", "") in ("causal", "window")
                       and not meaning.padding and not meaning.bias and site.mask != MaskKind.ADDITIVE
                       and (mask_ops is None or {"Range"} <= mask_ops))
    return Verdict(not implicit, not iatt, implicit, iatt, causal_skip)
