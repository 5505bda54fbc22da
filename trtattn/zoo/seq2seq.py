"""Text encoder-decoders (BART, T5) with their language-model heads, cut into the parts Optimum exports
for generation (trtattn.zoo.generation registers them; real transformers code, the zoo's small configs,
seeded random weights shared by the three parts, no downloads).

{family}-encoder        input_ids, attention_mask [B, enc_seq] -> last_hidden_state [B, enc_seq, D]
{family}-decoder-init   the first decoder step: input_ids, attention_mask, position_ids [B, seq],
                        encoder_hidden_states, encoder_attention_mask [B, enc_seq] -> logits,
                        present.{i}.decoder.key/value (self) and present.{i}.encoder.key/value (cross K/V)
{family}-decoder-step   a step on a cache: input_ids, attention_mask [B, past+seq], position_ids,
                        encoder_attention_mask, past_key_values.{i}.decoder.* (self, grows) and
                        .encoder.* (cross, static) -> logits, present.{i}.decoder.key/value

Optimum's decoders take no position_ids: BART reads its positions from the cache's length. Here they
are inputs (as for the zoo's Whisper parts), so a decoder step can become the kv-cache form, where a
cache's length is its capacity. T5 has no positions: its relative position bias is derived from the
cache's length, as in Optimum's export.
"""

from __future__ import annotations

import torch
import transformers as T

BATCH, SEQ, ENC_SEQ, PAST = 2, 5, 7, 6
SEED = 0
FAMILIES = ("bart", "t5")


def config(family: str):
    from . import models

    cfg = models.bart_config("eager") if family == "bart" else models.t5_config("eager")
    cfg.decoder_start_token_id, cfg.eos_token_id, cfg.pad_token_id = 2, 2, 0
    return cfg


def _model(cfg):
    from .models import _randomize

    cls = T.BartForConditionalGeneration if cfg.model_type == "bart" else T.T5ForConditionalGeneration
    torch.manual_seed(SEED)
    model = _randomize(cls(cfg)).eval()
    if cfg.model_type == "bart":
        decoder = _decoder(model)
        decoder.embed_positions = _GivenPositions(decoder.embed_positions)
    return model


class _GivenPositions(torch.nn.Module):
    """BART's learned positions at the position_ids the wrapper was given (not at the cache's length)."""

    def __init__(self, table):
        super().__init__()
        self.table = table
        self.position_ids: torch.Tensor | None = None

    def forward(self, input_ids, past_key_values_length=0, position_ids=None):
        return torch.nn.functional.embedding(self.position_ids + self.table.offset, self.table.weight)  # [B, S, D]


def _wrapper(model, fn, inputs):
    from .models import _Wrapper

    return _Wrapper(model, fn, list(inputs))


def _decoder(m):
    return m.model.decoder if m.config.model_type == "bart" else m.decoder


def _logits(m, hidden):
    if m.config.model_type == "t5" and m.config.tie_word_embeddings:
        hidden = hidden * m.config.d_model ** -0.5  # as T5ForConditionalGeneration scales before its head
    logits = m.lm_head(hidden)
    return logits + m.final_logits_bias if hasattr(m, "final_logits_bias") else logits


def _run_decoder(m, input_ids, attention_mask, position_ids, states, encoder_attention_mask, cache):
    decoder = _decoder(m)
    if m.config.model_type == "bart":
        decoder.embed_positions.position_ids = position_ids
    out = decoder(input_ids=input_ids, attention_mask=attention_mask, encoder_hidden_states=states,
                  encoder_attention_mask=encoder_attention_mask, past_key_values=cache, use_cache=True)
    return _logits(m, out.last_hidden_state), out.past_key_values


def _inputs(cfg, past: bool):
    from .models import _ids, _padding_mask

    torch.manual_seed(SEED + 1)
    heads = cfg.decoder_attention_heads if cfg.model_type == "bart" else cfg.num_heads
    size = cfg.d_model // heads if cfg.model_type == "bart" else cfg.d_kv
    seq, offset = (3, PAST) if past else (SEQ, 0)
    mask = torch.ones(BATCH, offset + seq, dtype=torch.int64)
    inputs = {"input_ids": _ids(BATCH, seq), "attention_mask": mask,
              "position_ids": (torch.arange(seq) + offset).unsqueeze(0).expand(BATCH, seq).contiguous()}
    if not past:
        inputs["encoder_hidden_states"] = torch.randn(BATCH, ENC_SEQ, cfg.d_model)
    inputs["encoder_attention_mask"] = _padding_mask(BATCH, ENC_SEQ)
    if past:
        for i in range(cfg.decoder_layers if cfg.model_type == "bart" else cfg.num_decoder_layers):
            for part, length in (("decoder", PAST), ("encoder", ENC_SEQ)):
                inputs[f"past_key_values.{i}.{part}.key"] = torch.randn(BATCH, heads, length, size)
                inputs[f"past_key_values.{i}.{part}.value"] = torch.randn(BATCH, heads, length, size)
    return inputs


def _roles(inputs):
    from .models import FLOAT, PADDING, TOKENS

    roles = {"input_ids": TOKENS, "attention_mask": PADDING, "position_ids": {"kind": "position_ids"},
             "encoder_hidden_states": FLOAT, "encoder_attention_mask": PADDING}
    if "past_key_values.0.decoder.key" in inputs:
        roles["position_ids"] = {"kind": "position_ids", "offset": "past"}
    return {k: roles.get(k, {"kind": "cache"}) for k in inputs}


def encoder(cfg):
    from .models import PADDING, TOKENS, Built, _ids, _padding_mask

    model = _model(cfg)
    torch.manual_seed(SEED + 1)
    inputs = {"input_ids": _ids(BATCH, ENC_SEQ), "attention_mask": _padding_mask(BATCH, ENC_SEQ)}

    def fn(m, input_ids, attention_mask):
        return m.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    axes = {"input_ids": {0: "batch", 1: "enc_seq"}, "attention_mask": {0: "batch", 1: "enc_seq"}}
    return Built(_wrapper(model, fn, inputs), inputs, axes, {"input_ids": TOKENS, "attention_mask": PADDING},
                 ["last_hidden_state"], {"batch": BATCH, "enc_seq": ENC_SEQ}, cfg)


def decoder_init(cfg):
    from .models import Built

    model = _model(cfg)
    inputs = _inputs(cfg, past=False)
    layers = len(_decoder(model).layers if cfg.model_type == "bart" else _decoder(model).block)

    def fn(m, input_ids, attention_mask, position_ids, encoder_hidden_states, encoder_attention_mask):
        logits, cache = _run_decoder(m, input_ids, attention_mask, position_ids, encoder_hidden_states,
                                     encoder_attention_mask, None)
        selves, crosses = [], []
        for i in range(layers):
            selves += [cache.self_attention_cache.layers[i].keys, cache.self_attention_cache.layers[i].values]
            crosses += [cache.cross_attention_cache.layers[i].keys, cache.cross_attention_cache.layers[i].values]
        return (logits, *selves, *crosses)

    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
            "position_ids": {0: "batch", 1: "seq"}, "encoder_hidden_states": {0: "batch", 1: "enc_seq"},
            "encoder_attention_mask": {0: "batch", 1: "enc_seq"}}
    outputs = ["logits"] + [f"present.{i}.decoder.{p}" for i in range(layers) for p in ("key", "value")] \
        + [f"present.{i}.encoder.{p}" for i in range(layers) for p in ("key", "value")]
    return Built(_wrapper(model, fn, inputs), inputs, axes, _roles(inputs), outputs,
                 {"batch": BATCH, "seq": SEQ, "enc_seq": ENC_SEQ}, cfg)


def decoder_step(cfg):
    from .models import Built

    model = _model(cfg)
    inputs = _inputs(cfg, past=True)
    layers = sum(1 for k in inputs if k.endswith(".decoder.key"))

    def fn(m, input_ids, attention_mask, position_ids, encoder_attention_mask, **past):
        cache = T.EncoderDecoderCache([(past[f"past_key_values.{i}.decoder.key"], past[f"past_key_values.{i}.decoder.value"],
                                        past[f"past_key_values.{i}.encoder.key"], past[f"past_key_values.{i}.encoder.value"])
                                       for i in range(layers)])
        # the cross K/V come from the cache; the encoder states only switch cross-attention on
        enc = past["past_key_values.0.encoder.key"]
        states = enc.new_zeros(enc.shape[0], enc.shape[2], m.config.d_model)
        logits, out = _run_decoder(m, input_ids, attention_mask, position_ids, states, encoder_attention_mask, cache)
        presents = []
        for i in range(layers):
            presents += [out.self_attention_cache.layers[i].keys, out.self_attention_cache.layers[i].values]
        return (logits, *presents)

    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "past+seq"},
            "position_ids": {0: "batch", 1: "seq"}, "encoder_attention_mask": {0: "batch", 1: "enc_seq"}}
    for i in range(layers):
        for part in ("key", "value"):
            axes[f"past_key_values.{i}.decoder.{part}"] = {0: "batch", 2: "past"}
            axes[f"past_key_values.{i}.encoder.{part}"] = {0: "batch", 2: "enc_seq"}
    outputs = ["logits"] + [f"present.{i}.decoder.{p}" for i in range(layers) for p in ("key", "value")]
    return Built(_wrapper(model, fn, inputs), inputs, axes, _roles(inputs), outputs,
                 {"batch": BATCH, "seq": 1, "past": PAST, "enc_seq": ENC_SEQ}, cfg)
