"""Zoo builders: real transformers model code, small configs, seeded random weights.

Each builder returns a `Built`: the module to export (a thin wrapper with tensor-only
inputs and outputs), example inputs, the dynamic axes of every input and the semantic role
of every input (so that verification can feed realistic data: token ids inside the
vocabulary, padding masks, positions, caches).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers as T

BATCH, SEQ, DEC_SEQ, PAST = 2, 7, 5, 6
VOCAB = 128


@dataclass
class Built:
    module: torch.nn.Module
    inputs: dict[str, torch.Tensor]  # in forward() order
    axes: dict[str, dict[int, str]]  # input -> {axis: dim name}; dim names may be sums ("past+seq")
    roles: dict[str, dict]  # input -> {"kind": ..., "vocab": ...}
    outputs: list[str]
    dims: dict[str, int] = field(default_factory=dict)  # example value of every dim name
    config: object = None


def _config(cls: Callable[..., T.PreTrainedConfig], **fields: Any) -> T.PreTrainedConfig:
    """Builds a config: transformers' config classes declare only their own fields, yet accept the
    base config's keywords (attn_implementation) and legacy fields at run time."""
    return cls(**fields)


def _ids(b, s, vocab=VOCAB):
    return torch.randint(3, vocab, (b, s))


def _padding_mask(b, s):
    m = torch.ones(b, s, dtype=torch.int64)
    m[-1, s - 2:] = 0  # the last row is padded at the end
    return m


class _Wrapper(torch.nn.Module):
    """Calls `fn(model, **inputs)`; gives the exporters a plain positional signature."""

    def __init__(self, model, fn, names):
        super().__init__()
        self.model = model
        self._fn = fn
        self._names = names

    def forward(self, *args):
        return self._fn(self.model, **dict(zip(self._names, args)))


def _wrap(model, fn, inputs):
    return _Wrapper(_randomize(model).eval(), fn, list(inputs))


@torch.no_grad()
def _randomize(model: torch.nn.Module) -> torch.nn.Module:
    """Seeded weights that make attention matter: transformers' init (std 0.02, zero biases and
    relative-position tables) gives near-uniform softmaxes that hide a wrong scale or mask."""
    for _, p in sorted(model.named_parameters()):
        if p.dim() >= 2:
            p.normal_(0.0, p[0].numel() ** -0.5)
        elif bool((p == 0).all()):
            p.normal_(0.0, 0.1)
    return model


TOKENS: dict[str, object] = {"kind": "token_ids", "vocab": VOCAB}
PADDING: dict[str, object] = {"kind": "padding_mask"}
FLOAT: dict[str, object] = {"kind": "float"}


# ---------------------------------------------------------------- encoder-decoder
def bart_config(impl: str):
    return _config(T.BartConfig, vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
                       encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                       decoder_ffn_dim=64, max_position_embeddings=64, attn_implementation=impl)


def bart(cfg) -> Built:
    return _encoder_decoder(T.BartModel(cfg), cfg)


def _encoder_decoder(model, cfg) -> Built:
    """BART / T5 style: encoder inputs with a padding mask, decoder inputs, both hidden states out."""
    inputs = {"input_ids": _ids(BATCH, SEQ), "attention_mask": _padding_mask(BATCH, SEQ),
              "decoder_input_ids": _ids(BATCH, DEC_SEQ)}

    def fn(m, input_ids, attention_mask, decoder_input_ids):
        out = m(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids, use_cache=False)
        return out.last_hidden_state, out.encoder_last_hidden_state

    return Built(_wrap(model, fn, inputs), inputs,
                 {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                  "decoder_input_ids": {0: "batch", 1: "dec_seq"}},
                 {"input_ids": TOKENS, "attention_mask": PADDING, "decoder_input_ids": TOKENS},
                 ["last_hidden_state", "encoder_last_hidden_state"],
                 {"batch": BATCH, "seq": SEQ, "dec_seq": DEC_SEQ}, cfg)


def whisper_config(impl: str):
    return _config(T.WhisperConfig, vocab_size=VOCAB, num_mel_bins=16, d_model=64, encoder_layers=2, decoder_layers=2,
                   encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                   decoder_ffn_dim=64, max_source_positions=16, max_target_positions=64,
                   pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=0,
                   attn_implementation=impl)


def whisper(cfg) -> Built:
    model = T.WhisperModel(cfg)
    frames = 2 * cfg.max_source_positions
    inputs = {"input_features": torch.randn(BATCH, cfg.num_mel_bins, frames),
              "decoder_input_ids": _ids(BATCH, DEC_SEQ),
              "decoder_attention_mask": torch.ones(BATCH, DEC_SEQ, dtype=torch.int64)}

    def fn(m, input_features, decoder_input_ids, decoder_attention_mask):
        out = m(input_features=input_features, decoder_input_ids=decoder_input_ids,
                decoder_attention_mask=decoder_attention_mask, use_cache=False)
        return out.last_hidden_state, out.encoder_last_hidden_state

    return Built(_wrap(model, fn, inputs), inputs,
                 {"input_features": {0: "batch"}, "decoder_input_ids": {0: "batch", 1: "dec_seq"},
                  "decoder_attention_mask": {0: "batch", 1: "dec_seq"}},
                 {"input_features": FLOAT, "decoder_input_ids": TOKENS, "decoder_attention_mask": {"kind": "ones_mask"}},
                 ["last_hidden_state", "encoder_last_hidden_state"],
                 {"batch": BATCH, "dec_seq": DEC_SEQ}, cfg)


whisper_decoder_cache_config = whisper_config


def whisper_decoder_cache(cfg) -> Built:
    """One decode step of the Whisper decoder: self-attention K/V concatenated with the past,
    cross-attention K/V read from the (static) encoder cache."""
    decoder = T.WhisperModel(cfg).get_decoder()
    n, h = cfg.decoder_attention_heads, cfg.d_model // cfg.decoder_attention_heads
    enc = cfg.max_source_positions
    # exported with 3 new tokens: torch.export specialises a dim whose example size is 1
    inputs = {"input_ids": _ids(BATCH, 3), "position_ids": (torch.arange(3) + PAST).unsqueeze(0).expand(BATCH, 3).contiguous(),
              "encoder_hidden_states": torch.randn(BATCH, enc, cfg.d_model)}
    for i in range(cfg.decoder_layers):
        inputs[f"past_key_values.{i}.decoder.key"] = torch.randn(BATCH, n, PAST, h)
        inputs[f"past_key_values.{i}.decoder.value"] = torch.randn(BATCH, n, PAST, h)
        inputs[f"past_key_values.{i}.encoder.key"] = torch.randn(BATCH, n, enc, h)
        inputs[f"past_key_values.{i}.encoder.value"] = torch.randn(BATCH, n, enc, h)
    layers = cfg.decoder_layers

    def fn(m, input_ids, position_ids, encoder_hidden_states, **past):
        data = [(past[f"past_key_values.{i}.decoder.key"], past[f"past_key_values.{i}.decoder.value"],
                 past[f"past_key_values.{i}.encoder.key"], past[f"past_key_values.{i}.encoder.value"])
                for i in range(layers)]
        cache = T.EncoderDecoderCache(data)
        # positions are an input (as optimum exports decoders): a preallocated cache's length is its capacity
        out = m(input_ids=input_ids, encoder_hidden_states=encoder_hidden_states, past_key_values=cache,
                position_ids=position_ids, use_cache=True)
        presents = []
        for i in range(layers):
            layer = out.past_key_values.self_attention_cache.layers[i]
            presents += [layer.keys, layer.values]
        return (out.last_hidden_state, *presents)

    axes = {"input_ids": {0: "batch", 1: "seq"}, "position_ids": {0: "batch", 1: "seq"}, "encoder_hidden_states": {0: "batch"}}
    roles: dict[str, dict] = {"input_ids": TOKENS, "position_ids": {"kind": "position_ids", "offset": "past"},
                              "encoder_hidden_states": FLOAT}
    outputs = ["last_hidden_state"] + whisper_cache_io(layers, axes, roles)
    return Built(_wrap(decoder, fn, inputs), inputs, axes, roles, outputs,
                 {"batch": BATCH, "seq": 1, "past": PAST}, cfg)


def whisper_cache_io(layers: int, axes: dict, roles: dict) -> list[str]:
    """A Whisper decoder step's caches: self-attention past (grows: dim "past") and cross-attention
    K/V (static), as inputs; returns the present outputs (self-attention only)."""
    presents = []
    for i in range(layers):
        for part in ("decoder.key", "decoder.value"):
            axes[f"past_key_values.{i}.{part}"] = {0: "batch", 2: "past"}
            roles[f"past_key_values.{i}.{part}"] = {"kind": "cache"}
            presents.append(f"present.{i}.{part}")
        for part in ("encoder.key", "encoder.value"):
            axes[f"past_key_values.{i}.{part}"] = {0: "batch"}
            roles[f"past_key_values.{i}.{part}"] = {"kind": "cache"}
    return presents


def t5_config(impl: str):
    return _config(T.T5Config, vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2,
                     num_heads=4, relative_attention_num_buckets=16, attn_implementation=impl)


def t5(cfg) -> Built:
    return _encoder_decoder(T.T5Model(cfg), cfg)


# ---------------------------------------------------------------- encoders
def _image_model(model, cfg, size):
    inputs = {"pixel_values": torch.randn(BATCH, 3, size, size)}

    def fn(m, pixel_values):
        return m(pixel_values=pixel_values).last_hidden_state

    return Built(_wrap(model, fn, inputs), inputs, {"pixel_values": {0: "batch"}}, {"pixel_values": FLOAT},
                 ["last_hidden_state"], {"batch": BATCH}, cfg)


def swin_config(impl: str):
    # 64x64 image, patch 4 -> 16x16 tokens in stage 1 and 8x8 in stage 2: windows of 4x4 with
    # shifted windows (and their mask) in every second block of both stages.
    return _config(T.SwinConfig, image_size=64, patch_size=4, embed_dim=32, depths=[2, 2], num_heads=[2, 4],
                   window_size=4, attn_implementation=impl)


def swin(cfg) -> Built:
    return _image_model(T.SwinModel(cfg, add_pooling_layer=False), cfg, 64)


def vit_config(impl: str):
    return _config(T.ViTConfig, image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=64, attn_implementation=impl)


def vit(cfg) -> Built:
    return _image_model(T.ViTModel(cfg, add_pooling_layer=False), cfg, 32)


def bert_config(impl: str):
    return _config(T.BertConfig, vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=64, max_position_embeddings=64, attn_implementation=impl)


def bert(cfg) -> Built:
    return _encoder(T.BertModel(cfg, add_pooling_layer=False), cfg)


def _encoder(model, cfg, **kwargs) -> Built:
    """A text encoder: token ids and a padding mask in, the last hidden states out (`kwargs`: extra
    arguments of the model's forward)."""
    inputs = {"input_ids": _ids(BATCH, SEQ), "attention_mask": _padding_mask(BATCH, SEQ)}

    def fn(m, input_ids, attention_mask):
        return m(input_ids=input_ids, attention_mask=attention_mask, **kwargs).last_hidden_state

    return Built(_wrap(model, fn, inputs), inputs,
                 {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
                 {"input_ids": TOKENS, "attention_mask": PADDING}, ["last_hidden_state"],
                 {"batch": BATCH, "seq": SEQ}, cfg)


# ---------------------------------------------------------------- decoders
def _decoder(model, cfg, positions: bool = False) -> Built:
    """A decoder-only model without cache. With `positions`, position_ids is an input (as optimum
    exports Llama-style models): torch's dynamo exporter then builds RoPE tables per batch row,
    which ONNX Runtime's RotaryEmbedding requires."""
    inputs = {"input_ids": _ids(BATCH, SEQ), "attention_mask": _padding_mask(BATCH, SEQ)}
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    roles: dict[str, dict] = {"input_ids": TOKENS, "attention_mask": PADDING}
    if positions:
        inputs["position_ids"] = torch.arange(SEQ).unsqueeze(0).expand(BATCH, SEQ).contiguous()
        axes["position_ids"] = {0: "batch", 1: "seq"}
        roles["position_ids"] = {"kind": "position_ids"}

    def fn(m, input_ids, attention_mask, position_ids=None):
        return m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                 use_cache=False).last_hidden_state

    return Built(_wrap(model, fn, inputs), inputs, axes, roles, ["last_hidden_state"],
                 {"batch": BATCH, "seq": SEQ}, cfg)


def gpt2_config(impl: str):
    # <|endoftext|> is the last token, as in GPT-2's vocabulary (its default id 50256 is outside this one)
    return _config(T.GPT2Config, vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                   bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1, attn_implementation=impl)


def gpt2(cfg) -> Built:
    return _decoder(T.GPT2Model(cfg), cfg)


gpt2_cache_config = gpt2_config


def gpt2_cache(cfg) -> Built:
    """GPT-2 with past_key_values inputs and present outputs (use_cache=True), as a cached decoder step."""
    return _with_past(T.GPT2Model(cfg), cfg, cfg.n_head, cfg.n_embd // cfg.n_head)


def llama_config(impl: str):
    return _config(T.LlamaConfig, vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                   attn_implementation=impl)


def llama(cfg) -> Built:
    return _decoder(T.LlamaModel(cfg), cfg, positions=True)


def gemma3_config(impl: str):
    return _config(T.Gemma3TextConfig, vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=256, max_position_embeddings=64,
                             sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                             attn_implementation=impl)


def gemma3(cfg) -> Built:
    return _decoder(T.Gemma3TextModel(cfg), cfg, positions=True)


def _with_past(model, cfg, n_kv, head, *, output: str = "last_hidden_state", wrap=None) -> Built:
    """A decoder-only model with past_key_values inputs and present outputs (one step of prefill
    or decode on top of a cache). `output`: the model output returned first (logits for a causal
    LM); `wrap`: how the module is wrapped (default: with the zoo's re-drawn weights)."""
    layers = cfg.num_hidden_layers
    inputs = {"input_ids": _ids(BATCH, SEQ), "attention_mask": _padding_mask(BATCH, PAST + SEQ)}
    for i in range(layers):
        inputs[f"past_key_values.{i}.key"] = torch.randn(BATCH, n_kv, PAST, head)
        inputs[f"past_key_values.{i}.value"] = torch.randn(BATCH, n_kv, PAST, head)
    inputs["attention_mask"][-1, :] = 1
    inputs["attention_mask"][-1, :2] = 0  # left padding, as in batched generation
    inputs["position_ids"] = (torch.arange(SEQ) + PAST).unsqueeze(0).expand(BATCH, SEQ).contiguous()
    inputs = {k: inputs[k] for k in ["input_ids", "attention_mask", "position_ids"] + [k for k in inputs if k.startswith("past")]}

    def fn(m, input_ids, attention_mask, position_ids, **past):
        cache = T.DynamicCache([(past[f"past_key_values.{i}.key"], past[f"past_key_values.{i}.value"])
                                for i in range(layers)], config=m.config)
        out = m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                past_key_values=cache, use_cache=True)
        presents = []
        for layer in out.past_key_values.layers:
            presents += [layer.keys, layer.values]
        return (getattr(out, output), *presents)

    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "past+seq"},
            "position_ids": {0: "batch", 1: "seq"}}
    roles: dict[str, dict] = {"input_ids": TOKENS, "attention_mask": {"kind": "padding_mask", "side": "left"},
                              "position_ids": {"kind": "position_ids", "offset": "past"}}
    outputs = [output]
    for i in range(layers):
        for part in ("key", "value"):
            axes[f"past_key_values.{i}.{part}"] = {0: "batch", 2: "past"}
            roles[f"past_key_values.{i}.{part}"] = {"kind": "cache"}
            outputs.append(f"present.{i}.{part}")
    return Built((wrap or _wrap)(model, fn, inputs), inputs, axes, roles, outputs,
                 {"batch": BATCH, "seq": SEQ, "past": PAST}, cfg)


llama_cache_config = llama_config


def llama_cache(cfg) -> Built:
    return _with_past(T.LlamaModel(cfg), cfg, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads)

