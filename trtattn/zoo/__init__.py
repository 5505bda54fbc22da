"""Model zoo: real transformers model code exported to ONNX by torch, no downloads.

Every entry is a model family with an attention implementation ("eager": the modelling code's
own MatMul/Softmax; "-sdpa": torch's scaled_dot_product_attention) and knows how many attention
sites it has from its config. Exporters: "torchscript" (torch.onnx.export(dynamo=False)) and
"dynamo" (torch.onnx.export(dynamo=True)). Where an exporter cannot export an entry the zoo
records why, and tests/test_zoo.py checks the record is still true.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

EXPORTERS = ("torchscript", "dynamo")
DEFAULT_MODEL = "bart"


@dataclass(frozen=True)
class ZooEntry:
    name: str
    family: str
    impl: str  # transformers attn_implementation: "eager" or "sdpa"
    description: str
    builder: str  # function name in trtattn.zoo.models (and <builder>_config)
    count_sites: Callable[[object], int]
    unsupported: dict = field(default_factory=dict)  # exporter -> why it cannot export

    @property
    def exporters(self) -> list[str]:
        return [e for e in EXPORTERS if e not in self.unsupported]

    def config(self):
        from . import models

        return getattr(models, f"{self.builder}_config")(self.impl)

    @property
    def expected_sites(self) -> int:
        return self.count_sites(self.config())

    def build(self):
        """The model with seeded random weights, its example inputs and their roles."""
        import torch

        from . import models

        torch.manual_seed(0)
        return getattr(models, self.builder)(self.config())


def _enc_dec(c):
    return c.encoder_layers + 2 * c.decoder_layers


# name, builder, description, attention sites from the config
_FAMILIES = [
    ("bart", "bart", "BART: encoder self, decoder causal self, cross attention", _enc_dec),
    ("whisper", "whisper", "Whisper: encoder self, decoder causal self, cross attention", _enc_dec),
    ("whisper-decoder-cache", "whisper_decoder_cache",
     "Whisper decoder step: self K/V concatenated with the past, cross K/V from the encoder cache",
     lambda c: 2 * c.decoder_layers),
    ("t5", "t5", "T5: relative position bias, unscaled logits; encoder, decoder causal, cross",
     lambda c: c.num_layers + 2 * c.num_decoder_layers),
    ("swin", "swin", "Swin: window attention, relative position bias, shifted-window mask", lambda c: sum(c.depths)),
    ("vit", "vit", "ViT: unmasked encoder self attention", lambda c: c.num_hidden_layers),
    ("bert", "bert", "BERT: encoder self attention with a padding mask", lambda c: c.num_hidden_layers),
    ("gpt2", "gpt2", "GPT-2: fused QKV projection split in three, causal + padding mask", lambda c: c.n_layer),
    ("llama", "llama", "Llama: GQA (4 query / 2 kv heads), RoPE, causal + padding mask", lambda c: c.num_hidden_layers),
    ("llama-cache", "llama_cache", "Llama with past_key_values: K/V concatenated with the cache, left padding",
     lambda c: c.num_hidden_layers),
    ("gemma3", "gemma3", "Gemma 3: GQA, head size 256, a sliding-window and a global layer",
     lambda c: c.num_hidden_layers),
]

# Exporter failures, recorded with the reason (tests/test_zoo.py re-checks each one).
UNSUPPORTED: dict[str, dict[str, str]] = {
    "t5-sdpa": {"dynamo": "torch.export cannot view T5's transposed SDPA output as [B, S, D] with a "
                          "dynamic sequence length (ValueError: Cannot view a tensor ...)"},
    "swin-sdpa": {"dynamo": "torch.export cannot view Swin's transposed SDPA output as [B*W, N, D] with a "
                            "dynamic batch (ValueError: Cannot view a tensor ...)"},
}


def _entries() -> dict[str, ZooEntry]:
    out = {}
    for family, builder, desc, count in _FAMILIES:
        for impl in ("eager", "sdpa"):
            name = family if impl == "eager" else f"{family}-sdpa"
            out[name] = ZooEntry(name, family, impl, desc if impl == "eager" else f"{desc} (torch SDPA)",
                                 builder, count, dict(UNSUPPORTED.get(name, {})))
    return out


ZOO: dict[str, ZooEntry] = _entries()


def get(name: str) -> ZooEntry:
    from ..errors import TrtattnError

    if name not in ZOO:
        raise TrtattnError(f"unknown zoo model '{name}'; known: {', '.join(ZOO)}")
    return ZOO[name]


def listing() -> list[dict]:
    return [{"name": e.name, "exporters": e.exporters, "expected_sites": e.expected_sites,
             "description": e.description, "unsupported": e.unsupported} for e in ZOO.values()]


def listing_json() -> str:
    return json.dumps(listing(), indent=2)


def export(name: str, exporter: str, path, *, opset: int | None = None, force: bool = False):
    """Export zoo entry `name` with `exporter` to `path` (see trtattn.zoo.export)."""
    from .torch_export import export_entry

    return export_entry(get(name), exporter, path, opset=opset, force=force)
