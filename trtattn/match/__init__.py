"""Find every attention in an ONNX graph and describe it as an AttentionSite.

    result = match(model)            # onnx.ModelProto (or a gs.Graph)
    result.sites, result.skipped     # fusable sites; attention-like softmaxes that are not fused, with why
    graph, result, meanings = analyse(model, probe_feeds(model))   # + what each mask means

Each Softmax is tried as the anchor of an attention core (core.py): a product (MatMul or Einsum) of
two activations, logit ops, the Softmax, a product with V, followed through layout ops by what each
axis means (axes.py: frames of atoms; layout_ops.py: one rule per layout op; contraction.py: the products). The roles
around the core are resolved by one module each: heads.py (where the fused op reads Q, K and V, the
heads, GQA), cache.py (KV concat / static cross cache, self vs cross), rope.py (rotary embedding; rotation.py
reads one by what it computes, checked on ONNX Runtime against the RotaryEmbedding op),
logit_ops/ (scale, masks, biases, soft-cap: one unit per kind), probe.py (what the mask means: causal,
window, padding). Graphs that already contain a fused attention op are read by fused_ops.py; If
branches and Loop/Scan bodies by subgraphs.py. A Softmax that is attention-like (likeness.py) but
cannot be fused is listed in `skipped`, never ignored.
"""

from .errors import NotAttention, Unsupported
from .find import match
from .probe import MaskMeaning, analyse, probe_feeds

__all__ = ["match", "analyse", "probe_feeds", "MaskMeaning", "NotAttention", "Unsupported"]
