"""What a form tells the build planner (trt/plan.py) where its standard ONNX ops alone do not say it.

A form is standard ONNX that ONNX Runtime verifies. Some of what TensorRT should do has no unambiguous
ONNX spelling: a packed query over a padded cache, a causal kind plus per-row key/value lengths (ONNX
`is_causal` is bottom-right since 2026, TensorRT's parser reads it as upper-left). There the form writes
the exact meaning as ONNX (a Gather to padded rows, a boolean mask built from the lengths, a ScatterND
into the cache) and records here what the TensorRT layer is: its boundary tensors, the ONNX nodes it
replaces (`region`) and its settings. The planner builds each layer from the record; the mask the form
wrote is then not read, and TensorRT's parser never sees the nodes that built it.
"""

from __future__ import annotations

from dataclasses import dataclass

CAUSAL_KINDS = ("none", "upper_left", "lower_right")
IO_FORMS = ("padded", "packed")


@dataclass(frozen=True)
class AttentionLowering:
    node: str  # the ONNX Attention node
    region: tuple[str, ...]  # the ONNX nodes the IAttention replaces (the Attention node among them)
    causal: str = "none"  # what the mask the form wrote says, together with the lengths
    query: str | None = None  # the IAttention's query, where it is not the node's input 0 (packed tokens)
    output: str | None = None  # the tensor the IAttention produces, where it is not the node's output
    q_lengths: str | None = None  # cumulative [B+1] (packed query)
    kv_lengths: str | None = None  # per row [B] (padded key/value) or cumulative [B+1] (packed)
    query_form: str = "padded"
    kv_form: str = "padded"
    mask: str | None = None  # a mask IAttention reads with the lengths (else the form's mask only spells them out)

    def __post_init__(self):
        if self.causal not in CAUSAL_KINDS or self.query_form not in IO_FORMS or self.kv_form not in IO_FORMS:
            raise ValueError(f"{self.node}: causal {self.causal!r}, forms {self.query_form!r}/{self.kv_form!r}")
        if self.query_form == "packed" and not self.q_lengths:
            raise ValueError(f"{self.node}: a packed query needs its cumulative lengths")


@dataclass(frozen=True)
class CacheLowering:
    node: str  # names the layer: the node that writes the cache (a ScatterND)
    region: tuple[str, ...]
    cache: str  # the graph input holding the cache [B, N, capacity, H]; the output aliases it
    update: str  # the new K or V: [B, N, S, H], or packed tokens [1, N, T, H]
    write_indices: str  # [B]: where each row's update starts
    output: str
    update_form: str = "padded"
    update_lengths: str | None = None  # cumulative [B+1] (packed update)
