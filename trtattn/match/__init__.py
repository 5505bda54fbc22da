"""Find every attention in an ONNX graph and describe it as an AttentionSite.

    result = match(model)            # onnx.ModelProto (or a gs.Graph)
    result.sites, result.skipped     # fusable sites; attention-like softmaxes that are not
    graph, result, meanings = analyse(model, probe_feeds(model))   # + what each mask means

Each Softmax is tried as the anchor of a scaled-dot-product core (core.py); the roles around the core
are resolved by one module each: heads.py (layouts, head split, GQA repeat), cache.py (KV concat /
static cross cache, self vs cross), rope.py (rotary embedding), logit_ops/ (scale, masks, biases: one
unit per kind), probe.py (what the mask means: causal, window, padding). Graphs that already contain
a fused attention op are read by fused_ops.py.
"""

from .errors import NotAttention, Unsupported
from .find import match
from .probe import MaskMeaning, analyse, probe_feeds

__all__ = ["match", "analyse", "probe_feeds", "MaskMeaning", "NotAttention", "Unsupported"]
