"""Generation test models: the zoo's Llama and Whisper with their language-model heads, cut into
the steps a decoding loop runs (real transformers code, small configs, seeded random weights, no
downloads). The zoo's own entries output hidden states; these output logits, so greedy decoding
can be checked token for token (trtattn/runtime/generate.py).

llama-lm                 LlamaForCausalLM, one step on top of a cache: input_ids, attention_mask
                         [B, past+seq], position_ids, past_key_values.{i}.key/value [B, Nkv, past, H]
                         -> logits [B, seq, V], present.{i}.key/value [B, Nkv, past+seq, H].
                         The same model prefills (past length 0) and decodes (seq 1).
whisper-encoder          input_features [B, mels, frames] -> encoder_hidden_states [B, frames/2, D]
whisper-decoder-init     the first decoder step: input_ids, attention_mask, position_ids,
                         encoder_hidden_states -> logits, present.{i}.decoder.key/value (self) and
                         present.{i}.encoder.key/value (the cross K/V, computed once)
whisper-decoder-step     a decoder step with a cache: input_ids, attention_mask [B, past+seq],
                         position_ids, past_key_values.{i}.decoder.* (self) and .encoder.* (cross,
                         static) -> logits, present.{i}.decoder.key/value

Positions are inputs everywhere (as optimum exports decoders): in the kv-cache form a cache's
length is its capacity, not the number of tokens in it. The three Whisper parts share one set of
weights (same seed, same construction). Export with `export(name, exporter, path)` or all parts of
a family at once with `export_family("llama" | "whisper" | "bart" | "t5", out_dir)` (BART and T5:
zoo/seq2seq.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TrtattnError

BATCH, SEQ, PAST = 2, 5, 6
SEED = 0


@dataclass(frozen=True)
class GenerationEntry:
    """Quacks like a zoo.ZooEntry for zoo.torch_export.export_entry."""

    name: str
    family: str
    description: str
    builder: str
    sites: int
    unsupported: dict = field(default_factory=dict)

    @property
    def expected_sites(self) -> int:
        return self.sites

    @property
    def exporters(self) -> list[str]:
        return [e for e in ("torchscript", "dynamo") if e not in self.unsupported]

    def config(self):
        if self.family in SEQ2SEQ:
            from . import seq2seq

            return seq2seq.config(self.family)
        return (llama_config() if self.family == "llama" else whisper_config())

    def build(self):
        if self.family in SEQ2SEQ:
            from . import seq2seq

            return getattr(seq2seq, self.builder)(self.config())
        return globals()[self.builder](self.config())


ENTRIES: dict[str, GenerationEntry] = {e.name: e for e in [
    GenerationEntry("llama-lm", "llama", "LlamaForCausalLM step: logits + present K/V (GQA, RoPE)", "llama_lm", 2),
    GenerationEntry("whisper-encoder", "whisper", "Whisper encoder", "whisper_encoder", 2),
    GenerationEntry("whisper-decoder-init", "whisper", "Whisper first decoder step: logits, self presents, cross K/V",
                    "whisper_decoder_init", 4),
    GenerationEntry("whisper-decoder-step", "whisper", "Whisper decoder step on a self cache and static cross K/V",
                    "whisper_decoder_step", 4),
]}
SEQ2SEQ = ("bart", "t5")  # text encoder-decoders: zoo/seq2seq.py
for _family in SEQ2SEQ:
    for _part, _sites in (("encoder", 2), ("decoder-init", 4), ("decoder-step", 4)):
        ENTRIES[f"{_family}-{_part}"] = GenerationEntry(f"{_family}-{_part}", _family,
                                                        f"{_family} {_part.replace('-', ' ')}, as Optimum cuts it",
                                                        _part.replace("-", "_"), _sites)
FAMILIES = {"llama": ["llama-lm"], "whisper": ["whisper-encoder", "whisper-decoder-init", "whisper-decoder-step"],
            **{f: [f"{f}-encoder", f"{f}-decoder-init", f"{f}-decoder-step"] for f in SEQ2SEQ}}


def get(name: str) -> GenerationEntry:
    if name not in ENTRIES:
        raise TrtattnError(f"unknown generation model '{name}'; known: {', '.join(ENTRIES)}")
    return ENTRIES[name]


def export(name: str, exporter: str, path, *, opset: int | None = None, force: bool = False) -> Path:
    """Export one generation model (TorchScript: torch.onnx.export(dynamo=False); or dynamo)."""
    from .torch_export import export_entry

    return export_entry(get(name), exporter, path, opset=opset, force=force)


def export_family(family: str, out_dir, *, exporter: str = "torchscript", force: bool = False) -> dict[str, Path]:
    """Every part of a family into out_dir/NAME.EXPORTER.onnx (existing files are kept unless force)."""
    if family not in FAMILIES:
        raise TrtattnError(f"unknown generation family '{family}'; known: {', '.join(FAMILIES)}")
    from . import exported

    def make(name: str) -> Callable[[Path], Path]:
        return lambda path: export(name, exporter, path, force=True)

    out = {}
    for name in FAMILIES[family]:
        path = Path(out_dir) / f"{name}.{exporter}.onnx"
        if force:
            export(name, exporter, path, force=True)
        out[name] = exported(path, make(name))
    return out


# ---------------------------------------------------------------- configs and models
def llama_config(impl: str = "eager"):
    from .models import llama_config as zoo_llama

    return zoo_llama(impl)


def whisper_config(impl: str = "eager"):
    from .models import whisper_config as zoo_whisper

    return zoo_whisper(impl)


def _seeded(cls, cfg):
    """The same random weights every time (the Whisper parts must share them)."""
    import torch

    from .models import _randomize

    torch.manual_seed(SEED)
    return _randomize(cls(cfg)).eval()


def _wrapper(model, fn, inputs):
    from .models import _Wrapper

    return _Wrapper(model, fn, list(inputs))


def _ids(b, s):
    import torch

    from .models import VOCAB

    return torch.randint(3, VOCAB, (b, s))


def _tokens():
    from .models import TOKENS

    return TOKENS


def _positions(b, s, offset=0):
    import torch

    return (torch.arange(s) + offset).unsqueeze(0).expand(b, s).contiguous()


def _left_padded_mask(b, total):
    import torch

    m = torch.ones(b, total, dtype=torch.int64)
    m[-1, :2] = 0  # a padded row (in the past), as a ragged batch has
    return m


def llama_lm(cfg):
    import torch
    import transformers as T

    from .models import _with_past

    model = _seeded(T.LlamaForCausalLM, cfg)
    torch.manual_seed(SEED + 1)
    return _with_past(model, cfg, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads,
                      output="logits", wrap=_wrapper)


def _whisper(cfg):
    import transformers as T

    return _seeded(T.WhisperForConditionalGeneration, cfg)


def whisper_encoder(cfg):
    import torch

    from .models import FLOAT, Built

    model = _whisper(cfg)
    torch.manual_seed(SEED + 1)
    inputs = {"input_features": torch.randn(BATCH, cfg.num_mel_bins, 2 * cfg.max_source_positions)}

    def fn(m, input_features):
        return m.model.encoder(input_features=input_features).last_hidden_state

    return Built(_wrapper(model, fn, inputs), inputs, {"input_features": {0: "batch"}}, {"input_features": FLOAT},
                 ["encoder_hidden_states"], {"batch": BATCH}, cfg)


def _decoder_io(cfg, past: bool):
    import torch

    layers = cfg.decoder_layers
    n, h, enc = cfg.decoder_attention_heads, cfg.d_model // cfg.decoder_attention_heads, cfg.max_source_positions
    torch.manual_seed(SEED + 1)
    seq = SEQ if not past else 3  # torch.export specialises a dim whose example size is 1
    offset = PAST if past else 0
    inputs = {"input_ids": _ids(BATCH, seq),
              "attention_mask": _left_padded_mask(BATCH, offset + seq) if past else _right_padded_mask(BATCH, seq),
              "position_ids": _positions(BATCH, seq, offset)}
    if not past:
        inputs["encoder_hidden_states"] = torch.randn(BATCH, enc, cfg.d_model)
    else:
        for i in range(layers):
            inputs[f"past_key_values.{i}.decoder.key"] = torch.randn(BATCH, n, PAST, h)
            inputs[f"past_key_values.{i}.decoder.value"] = torch.randn(BATCH, n, PAST, h)
            inputs[f"past_key_values.{i}.encoder.key"] = torch.randn(BATCH, n, enc, h)
            inputs[f"past_key_values.{i}.encoder.value"] = torch.randn(BATCH, n, enc, h)
    return inputs, layers


def _right_padded_mask(b, s):
    import torch

    m = torch.ones(b, s, dtype=torch.int64)
    m[-1, s - 2:] = 0
    return m


def whisper_decoder_init(cfg):
    from .models import FLOAT, Built

    model = _whisper(cfg)
    inputs, layers = _decoder_io(cfg, past=False)

    def fn(m, input_ids, attention_mask, position_ids, encoder_hidden_states):
        out = m.model.decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              encoder_hidden_states=encoder_hidden_states, use_cache=True)
        cache = out.past_key_values
        selves, crosses = [], []
        for i in range(layers):
            selves += [cache.self_attention_cache.layers[i].keys, cache.self_attention_cache.layers[i].values]
            crosses += [cache.cross_attention_cache.layers[i].keys, cache.cross_attention_cache.layers[i].values]
        return (m.proj_out(out.last_hidden_state), *selves, *crosses)

    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
            "position_ids": {0: "batch", 1: "seq"}, "encoder_hidden_states": {0: "batch"}}
    roles = {"input_ids": _tokens(), "attention_mask": {"kind": "padding_mask"}, "position_ids": {"kind": "position_ids"},
             "encoder_hidden_states": FLOAT}
    outputs = ["logits"] + [f"present.{i}.decoder.{p}" for i in range(layers) for p in ("key", "value")] \
        + [f"present.{i}.encoder.{p}" for i in range(layers) for p in ("key", "value")]
    return Built(_wrapper(model, fn, inputs), inputs, axes, roles, outputs, {"batch": BATCH, "seq": SEQ}, cfg)


def whisper_decoder_step(cfg):
    import transformers as T

    from .models import Built, whisper_cache_io

    model = _whisper(cfg)
    inputs, layers = _decoder_io(cfg, past=True)

    def fn(m, input_ids, attention_mask, position_ids, **past):
        data = [(past[f"past_key_values.{i}.decoder.key"], past[f"past_key_values.{i}.decoder.value"],
                 past[f"past_key_values.{i}.encoder.key"], past[f"past_key_values.{i}.encoder.value"])
                for i in range(layers)]
        cache = T.EncoderDecoderCache(data)
        # the cross K/V come from the cache; the encoder states only switch cross-attention on (their
        # values are never read, so the exported graph has no such input)
        enc = past["past_key_values.0.encoder.key"]
        states = enc.new_zeros(enc.shape[0], enc.shape[2], cfg.d_model)
        out = m.model.decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              encoder_hidden_states=states, past_key_values=cache, use_cache=True)
        presents = []
        for i in range(layers):
            layer = out.past_key_values.self_attention_cache.layers[i]
            presents += [layer.keys, layer.values]
        return (m.proj_out(out.last_hidden_state), *presents)

    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "past+seq"},
            "position_ids": {0: "batch", 1: "seq"}}
    roles = {"input_ids": _tokens(), "attention_mask": {"kind": "padding_mask", "side": "left"},
             "position_ids": {"kind": "position_ids", "offset": "past"}}
    outputs = ["logits"] + whisper_cache_io(layers, axes, roles)
    return Built(_wrapper(model, fn, inputs), inputs, axes, roles, outputs,
                 {"batch": BATCH, "seq": 1, "past": PAST}, cfg)
