"""Model zoo: real transformers model code exported to ONNX by torch, no downloads.

Every entry is a model family with an attention implementation ("eager": the modelling code's
own MatMul/Softmax; "-sdpa": torch's scaled_dot_product_attention) and knows how many attention
sites it has from its config. Exporters: "torchscript" (torch.onnx.export(dynamo=False)) and
"dynamo" (torch.onnx.export(dynamo=True)). Where an exporter cannot export an entry the zoo
records why, and tests/zoo/test_zoo.py checks the record is still true.

Besides the families the matcher takes today (models.py), three groups exercise the classes of
attention it misses (issue 10; `CLASSES`, each entry's `classes`): more transformers families
(families.py), plain-PyTorch attention code (plain.py) and entries derived from a zoo export by a
tool (derived.py: an older opset, int8 Q/DQ, a merged If decoder, external data, foreign dims).
README.md in this folder lists them with what trtattn does with each today.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

EXPORTERS = ("torchscript", "dynamo")
DEFAULT_MODEL = "bart"

# The classes of attention trtattn missed (issue 10) that zoo entries exercise.
CLASSES = {
    "layout3d": "heads merged into a 3-D batch ([B*N, S, S]) around the softmax",
    "baddbmm": "logits written alpha * Q.K^T + beta * bias (torch.baddbmm)",
    "flatten_softmax": "an opset <= 12 export: raised to opset 13+, its Softmax is wrapped in Flatten/Reshape",
    "shape_consumer": "the probabilities (or logits) also feed a Shape node",
    "softcap": "logit soft-capping: cap * tanh(logits / cap)",
    "bias_in_graph": "a position bias computed in the graph (ALiBi slopes x positions, relative terms)",
    "dims": "the default verification dims do not fit the model; a user passes --dims (user_shapes)",
    "einsum": "both products written as Einsum",
    "qdq": "static int8 QuantizeLinear/DequantizeLinear from ONNX Runtime's quantization tools",
    "single_query": "one query position (a recurrent decoder step), boolean mask True at padding",
    "control_flow": "attention inside If branches or a Loop body",
    "external_data": "weights saved as external data next to the model (with attention and without)",
}


@dataclass(frozen=True)
class ZooEntry:
    name: str
    family: str
    impl: str  # transformers attn_implementation: "eager" or "sdpa"
    description: str
    builder: str  # function name in trtattn.zoo.<module> (and <builder>_config)
    count_sites: Callable[[object], int]
    unsupported: dict = field(default_factory=dict)  # exporter -> why it cannot export
    module: str = "models"  # models, families, plain: torch exports; derived: made from `base`'s export
    classes: tuple[str, ...] = ()  # the issue-10 classes it exercises (keys of CLASSES)
    base: str | None = None  # derived entries: the zoo entry whose export they start from
    user_shapes: dict = field(default_factory=dict)  # "dims" entries: input -> the shape a user runs it on

    @property
    def exporters(self) -> list[str]:
        return [e for e in EXPORTERS if e not in self.unsupported]

    def classes_for(self, exporter: str) -> tuple[str, ...]:
        only = ONLY_WITH.get(self.name, {})
        return tuple(c for c in self.classes if only.get(c, exporter) == exporter)

    @property
    def derived(self) -> bool:
        return self.base is not None

    def config(self):
        if self.base is not None:
            return get(self.base).config()
        module = importlib.import_module(f"{__name__}.{self.module}")
        return getattr(module, f"{self.builder}_config")(self.impl)

    @property
    def expected_sites(self) -> int:
        return self.count_sites(self.config())

    def build(self):
        """The model with seeded random weights, its example inputs and their roles."""
        import torch

        if self.derived:
            raise TypeError(f"{self.name} is derived from {self.base}'s export: use zoo.export")
        module = importlib.import_module(f"{__name__}.{self.module}")
        torch.manual_seed(0)
        return getattr(module, self.builder)(self.config())


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

# Exporter failures, recorded with the reason (tests/zoo/test_zoo.py re-checks each one).
UNSUPPORTED: dict[str, dict[str, str]] = {
    "t5-sdpa": {"dynamo": "torch.export cannot view T5's transposed SDPA output as [B, S, D] with a "
                          "dynamic sequence length (ValueError: Cannot view a tensor ...)"},
    "swin-sdpa": {"dynamo": "torch.export cannot view Swin's transposed SDPA output as [B*W, N, D] with a "
                            "dynamic batch (ValueError: Cannot view a tensor ...)"},
    "xlnet": {"dynamo": "torch.export cannot trace XLNet's relative position encoding "
                        "(RuntimeError: Cannot find a compatible OpOverload for aten.sub ...)"},
    "fsmt": {"dynamo": "torch.export cannot branch on FSMT's data-dependent `if not padding_mask.any()` "
                       "(GuardOnDataDependentSymNode)"},
    "led": {"dynamo": "torch.export cannot guard on LED's data-dependent padding to the attention window "
                      "(GuardOnDataDependentSymNode)"},
    "chunked-loop": {"dynamo": "the dynamo exporter does not take a scripted module (ValueError: Exporting a "
                               "ScriptModule is not supported), and tracing would unroll the loop"},
    "bert-opset12": {"dynamo": "the dynamo exporter writes opset 18 when asked for 12 (LayerNormalization has "
                               "no earlier version)"},
}

# Classes an entry shows with one exporter only: entry -> {class: exporter}.
ONLY_WITH = {
    "deberta-v2": {"shape_consumer": "torchscript"},  # dynamo computes the sizes from the inputs
}


def _layers(c):
    return c.num_hidden_layers


# Entries for the classes of issue 10: name, module, builder, attention implementations,
# description, attention sites from the config, classes, and for "dims" entries the input shapes a
# user runs them on. A derived entry's module is "derived:<base entry>".
_MISSED = [
    ("gemma2", "families", "gemma2", ("eager",),
     "Gemma 2: attention logit soft-capping (tanh), GQA, a sliding-window and a global layer",
     _layers, ("softcap",), None),
    ("bloom", "families", "bloom", ("eager",),
     "BLOOM: ALiBi from the padding mask's cumsum, baddbmm logits on heads merged to [B*N, S, S]",
     lambda c: c.n_layer, ("layout3d", "baddbmm", "bias_in_graph"), None),
    ("deberta-v2", "families", "deberta_v2", ("eager",),
     "DeBERTa-v2: c2p/p2c relative terms gathered from log buckets, bmm on [B*N, S, S], Shape of the probabilities",
     _layers, ("layout3d", "shape_consumer", "bias_in_graph"), None),
    ("xlnet", "families", "xlnet", ("eager",),
     "XLNet: einsum products in [S, B, N, H] layout, relative position terms, two-stream masks",
     lambda c: c.n_layer, ("einsum", "bias_in_graph"), None),
    ("fsmt", "families", "fsmt", ("eager",),
     "FSMT (fairseq translation): bmm attention on [B*N, S, H] in encoder, decoder and cross attention",
     lambda c: c.encoder_layers + 2 * c.decoder_layers, ("layout3d",), None),
    ("wav2vec2", "families", "wav2vec2", ("eager", "sdpa"),
     "Wav2Vec2: raw audio through seven strided convolutions, then an encoder; optimum's dim names",
     _layers, ("dims",), {"input_values": [2, 16000]}),  # one second at 16 kHz
    ("led", "families", "led", ("eager",),
     "LED: the encoder pads the input to its attention window in Python, so TorchScript bakes the example's "
     "padding into Reshapes; Longformer sliding-window encoder, bmm decoder and cross attention",
     lambda c: c.encoder_layers + 2 * c.decoder_layers, ("dims", "layout3d"),
     {"input_ids": [2, 7], "attention_mask": [2, 7], "decoder_input_ids": [2, 5]}),
    ("unet-einsum", "plain", "unet_einsum", ("eager",),
     "Stable-diffusion (LDM) transformer block: self and cross attention, heads folded into the batch, einsum",
     lambda c: 2 * c.blocks, ("einsum", "layout3d"), None),
    ("unet-baddbmm", "plain", "unet_baddbmm", ("eager",),
     "diffusers AttnProcessor block: baddbmm(empty, q, k^T, beta=0, alpha=scale) and bmm, heads folded into the batch",
     lambda c: 2 * c.blocks, ("baddbmm", "layout3d"), None),
    ("luong-gru", "plain", "luong_gru", ("eager",),
     "GRU decoder step with Luong (general) attention: one query, no scale, masked_fill on a True-at-padding mask",
     lambda c: 1, ("single_query",), None),
    ("chunked-loop", "plain", "chunked_loop", ("eager",),
     "Streaming encoder run chunk by chunk in a scripted loop: its attentions in an ONNX Loop body",
     lambda c: c.layers, ("control_flow",), None),
    ("bert-opset12", "derived:bert", "opset12", ("eager",),
     "BERT exported at opset 12: Softmax with opset-12 semantics (Flatten/Reshape once raised)",
     _layers, ("flatten_softmax",), None),
    ("bert-int8", "derived:bert", "int8_qdq", ("eager",),
     "BERT after ONNX Runtime's quantize_static (QDQ, int8, calibrated on zoo inputs)",
     _layers, ("qdq",), None),
    ("llama-merged", "derived:llama-cache", "merged_decoder", ("eager",),
     "Llama as optimum merges decoders: If(use_cache_branch) over the with-cache and without-cache graphs",
     lambda c: 2 * c.num_hidden_layers, ("control_flow",), None),
    ("resnet-external", "families", "resnet", ("eager",),
     "ResNet, no attention, saved with external data: nothing to fuse, the output must still be complete",
     lambda c: 0, ("external_data",), None),
    ("bert-external", "derived:bert", "external_data", ("eager",),
     "BERT saved with its weights as external data (model.onnx + model.onnx.data)",
     _layers, ("external_data",), None),
    ("bert-foreign-dims", "derived:bert", "foreign_dims", ("eager",),
     "BERT with input dims as other exporters write them: -1, '?' and an independent name per input",
     _layers, ("dims",), {"input_ids": [2, 7], "attention_mask": [2, 7]}),
]


def _entries() -> dict[str, ZooEntry]:
    out = {}
    for family, builder, desc, count in _FAMILIES:
        for impl in ("eager", "sdpa"):
            name = family if impl == "eager" else f"{family}-sdpa"
            out[name] = ZooEntry(name, family, impl, desc if impl == "eager" else f"{desc} (torch SDPA)",
                                 builder, count, dict(UNSUPPORTED.get(name, {})))
    for family, module, builder, impls, desc, count, classes, shapes in _MISSED:
        base = module.split(":", 1)[1] if module.startswith("derived:") else None
        for impl in impls:
            name = family if impl == "eager" else f"{family}-sdpa"
            out[name] = ZooEntry(name, family, impl, desc if impl == "eager" else f"{desc} (torch SDPA)",
                                 builder, count, dict(UNSUPPORTED.get(name, {})), module.split(":")[0],
                                 classes, base, dict(shapes or {}))
    return out


ZOO: dict[str, ZooEntry] = _entries()


def get(name: str) -> ZooEntry:
    from ..errors import TrtattnError

    if name not in ZOO:
        raise TrtattnError(f"unknown zoo model '{name}'; known: {', '.join(ZOO)}")
    return ZOO[name]


def listing() -> list[dict]:
    return [{"name": e.name, "exporters": e.exporters, "expected_sites": e.expected_sites,
             "description": e.description + (f" [{', '.join(e.classes)}]" if e.classes else ""),
             "unsupported": e.unsupported, "classes": list(e.classes)} for e in ZOO.values()]


def listing_json() -> str:
    return json.dumps(listing(), indent=2)


def exported(path, make: Callable[[Path], object]) -> Path:
    """`path` once it exists, made by make(path) if it does not: in one process while any other asking for it
    waits on a lock file beside it, so parallel test workers sharing a folder of exports make each once
    (the exports write atomically: a path that exists is complete)."""
    path = Path(path)
    if not path.exists():
        from filelock import FileLock

        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{path}.lock"):
            if not path.exists():
                make(path)
    return path


def export(name: str, exporter: str, path, *, opset: int | None = None, force: bool = False):
    """Export zoo entry `name` with `exporter` to `path` (see trtattn.zoo.export)."""
    entry = get(name)
    if entry.base is not None:
        from .derived import export_derived

        return export_derived(entry, get(entry.base), exporter, path, force=force)
    from .torch_export import export_entry

    return export_entry(entry, exporter, path, opset=opset, force=force)
