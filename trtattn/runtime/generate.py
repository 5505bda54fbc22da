"""Running requests: greedy decoding with a KV cache, and ragged batches packed end to end.

generate(step, prompts, n)                      decoder-only (Llama-style): `step` takes input_ids,
                                                position_ids and a cache (ConcatCache: attention_mask +
                                                past_key_values.*; StaticCache: packed tokens with
                                                cu_seqlens, cache_write_index and preallocated caches)
                                                and returns logits and presents. It prefills too,
                                                unless a `prefill` model is given.
generate_encoder_decoder(enc, init, step, x, prompts, n)
                                                Whisper-style: the encoder runs once; the first decoder
                                                step returns logits, self presents and the cross K/V;
                                                the decode steps read the self cache and the static
                                                cross K/V (session state, set once).
run_packed(session, requests)                   a packed-form model: ragged requests end to end,
                                                [1, T] tokens with cu_seqlens, outputs split back.

Prompts of different lengths are padded on the right (or the left: padding_side="left", as Hugging
Face generates) for a concat cache, and packed without padding for a static one; each row keeps its
own length in the cache, so rows never see each other's padding. Greedy = argmax of the logits at each
row's last real token.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np

from ..contract import CU_SEQLENS, cu_seqlens, pack_rows, unpack_rows
from ..errors import TrtattnError
from .cache import KVCache, make_cache, past_name, static_inputs


@dataclass
class Generation:
    tokens: list[list[int]]  # the generated tokens of each request (the prompt not included)
    logits: list[np.ndarray] = field(default_factory=list)  # per step, [B, V]: what each row's token was chosen from
    prompt_lengths: list[int] = field(default_factory=list)
    cache: str = ""  # concat | static
    steps: int = 0  # model runs after the prefill


def _right_pad(prompts, pad: int) -> tuple[np.ndarray, np.ndarray]:
    if not prompts:
        raise TrtattnError("no prompts to generate from")
    lengths = np.asarray([len(p) for p in prompts], np.int64)
    if (lengths < 1).any():
        raise TrtattnError("every prompt needs at least one token")
    ids = np.full((len(prompts), int(lengths.max())), pad, np.int64)
    for b, p in enumerate(prompts):
        ids[b, :len(p)] = np.asarray(p, np.int64)
    return ids, lengths


def _logits_name(session) -> str:
    if "logits" in session.output_names:
        return "logits"
    raise TrtattnError(f"{session.name}: no 'logits' output; generation needs a model with a language-model head "
                       "(trtattn.zoo.generation exports them)")


def _last(logits: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each row's logits at its last real token of right-padded rows: [B, V]."""
    return logits[np.arange(logits.shape[0]), lengths - 1]


def _decode(step, cache: KVCache, first: np.ndarray, max_new_tokens: int, eos: int | Collection[int] | None, record: bool,
            prompt_lengths) -> Generation:
    name = _logits_name(step)
    batch = first.shape[0]
    out = Generation([[] for _ in range(batch)], prompt_lengths=[int(n) for n in prompt_lengths], cache=cache.style)
    done = np.zeros(batch, bool)
    stops = {eos} if isinstance(eos, int) else set(eos or ())
    logits = first
    for t in range(max_new_tokens):
        if record:
            out.logits.append(np.array(logits, copy=True))
        token = logits.argmax(-1).astype(np.int64)
        for b in range(batch):
            if not done[b]:
                out.tokens[b].append(int(token[b]))
                done[b] = int(token[b]) in stops
        if done.all() or t == max_new_tokens - 1:
            break
        result = step.run(cache.step_feeds(token[:, None]), outputs=[name], carry=cache.carry())
        logits = cache.last(result[name])
        cache.advance(None, 1)
        out.steps += 1
    return out


def generate(step, prompts, max_new_tokens: int, *, prefill=None, eos_token_id: int | None = None,
             pad_token_id: int = 0, capacity: int | None = None, record_logits: bool = True,
             padding_side: str = "right", config: dict | None = None) -> Generation:
    """Greedy decoding of a batch of token prompts with a decoder-only step model (see module doc); `config`
    (the model's config.json) gives cache dims the step model leaves dynamic."""
    if max_new_tokens < 1:
        raise TrtattnError("max_new_tokens must be at least 1")
    ids, lengths = _right_pad(prompts, pad_token_id)
    cache = make_cache(step, len(prompts), capacity=capacity, padding_side=padding_side, config=config)
    name = _logits_name(step)
    seq = ids.shape[1]
    if prefill is None:
        result = step.run(cache.step_feeds(ids, lengths), outputs=[name], carry=cache.carry())
        first = cache.last(result[name], lengths)
        cache.advance(lengths, seq)
    else:
        mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int64)
        result = prefill.run({"input_ids": ids, "attention_mask": mask,
                              "position_ids": np.broadcast_to(np.arange(seq), ids.shape).copy()})
        presents = {past_name(o, step.input_names): v for o, v in result.items()}
        cache.load({k: v for k, v in presents.items() if k is not None}, lengths)
        first = _last(result[_logits_name(prefill)], lengths)
    return _decode(step, cache, first, max_new_tokens, eos_token_id, record_logits, lengths)


def generate_encoder_decoder(encoder, decoder_init, decoder_step, features: np.ndarray, prompts, max_new_tokens: int, *,
                             eos_token_id: int | None = None, pad_token_id: int = 0, capacity: int | None = None,
                             record_logits: bool = True) -> Generation:
    """Greedy decoding for a Whisper-style encoder-decoder (see module doc)."""
    if max_new_tokens < 1:
        raise TrtattnError("max_new_tokens must be at least 1")
    ids, lengths = _right_pad(prompts, pad_token_id)
    if features.shape[0] != len(prompts):
        raise TrtattnError(f"{features.shape[0]} encoder inputs for {len(prompts)} prompts")
    enc_in = encoder.input_names[0]
    states = encoder.run({enc_in: features})
    states = states.get("encoder_hidden_states", next(iter(states.values())))
    seq = ids.shape[1]
    init = decoder_init.run({"input_ids": ids, "attention_mask": (np.arange(seq)[None] < lengths[:, None]).astype(np.int64),
                             "position_ids": np.broadcast_to(np.arange(seq), ids.shape).copy(),
                             "encoder_hidden_states": states})
    by_input = {past_name(o, decoder_step.input_names): v for o, v in init.items()}
    first = _last(init[_logits_name(decoder_init)], lengths)
    return continue_decoding(decoder_step, {k: v for k, v in by_input.items() if k is not None}, first, lengths,
                             max_new_tokens, eos_token_id=eos_token_id, capacity=capacity, record_logits=record_logits,
                             source=decoder_init.name)


def continue_decoding(step, presents: dict[str, np.ndarray], first_logits: np.ndarray, lengths, max_new_tokens: int, *,
                      eos_token_id: int | Collection[int] | None = None, capacity: int | None = None,
                      record_logits: bool = True, source: str = "the first step",
                      fixed: dict[str, np.ndarray] | None = None) -> Generation:
    """Greedy decoding on `step` after a first step run elsewhere (an encoder-decoder's first decoder part):
    its presents ({step's past input: [B, N, S, H]}) seed the cache (`lengths` valid tokens per row), the
    ones with no present output on `step` (cross-attention K/V) are set once as its state, and the first
    token comes from `first_logits` [B, V]. eos_token_id: one id or several (any of them ends a row). `fixed`:
    inputs the same at every step (the encoder's padding mask), set once where `step` takes them."""
    lengths = np.asarray(lengths, np.int64).reshape(-1)
    cache = make_cache(step, len(lengths), capacity=capacity)
    cache.load({p: presents[p] for p, _ in cache.pairs if p in presents}, lengths)
    for name in static_inputs(step, cache.pairs):  # cross-attention K/V: set once, read every step
        if name not in presents:
            raise TrtattnError(f"{source} gives no value for {step.name}'s {name}")
        step.set_state(name, presents[name])
    for name, value in (fixed or {}).items():
        if name in step.input_names:
            step.set_state(name, value)
    return _decode(step, cache, first_logits, max_new_tokens, eos_token_id, record_logits, lengths)


# ---------------------------------------------------------------- packed ragged batches
def token_inputs(session) -> list[str]:
    """A packed-form model's per-token inputs: [1, total_tokens]."""
    return [i.name for i in session.inputs if len(i.shape) == 2 and i.shape[0] == 1]


def pack_requests(session, requests: list[dict]) -> tuple[dict, np.ndarray]:
    """Requests ({input: [S_i] or [1, S_i]}) end to end: [1, T] feeds and cu_seqlens [B+1] (int32).
    Positions restart per request where the model takes position_ids and a request gives none."""
    if CU_SEQLENS not in session.input_names:
        raise TrtattnError(f"{session.name}: not a packed-form model (no {CU_SEQLENS} input); build it with "
                           "form='packed'")
    if not requests:
        raise TrtattnError("no requests to pack")
    names = token_inputs(session)
    lengths = []
    for r in requests:
        sizes = {np.asarray(v).shape[-1] for k, v in r.items() if k in names}
        if len(sizes) != 1:
            raise TrtattnError(f"a request's token inputs must have one length, got {sorted(sizes)}")
        lengths.append(sizes.pop())
    feeds = {}
    for name in names:
        parts = []
        for r, n in zip(requests, lengths):
            if name in r:
                parts.append(np.asarray(r[name]).reshape(-1))
            elif "position" in name:
                parts.append(np.arange(n, dtype=np.int64))
            else:
                raise TrtattnError(f"request has no {name}")
        feeds[name] = pack_rows(parts)
    extra = {k: v for k, v in requests[0].items() if k not in names and k in session.input_names}
    feeds.update(extra)
    cu = cu_seqlens(lengths)
    feeds[CU_SEQLENS] = cu
    return feeds, cu


def unpack(outputs: dict[str, np.ndarray], cu: np.ndarray) -> list[dict[str, np.ndarray]]:
    """Packed outputs [1, T, ...] back into one [S_i, ...] per request; other outputs are shared."""
    total = int(cu[-1])
    rows: list[dict[str, np.ndarray]] = [{} for _ in range(len(cu) - 1)]
    for name, value in outputs.items():
        per_token = value.ndim >= 2 and value.shape[0] == 1 and value.shape[1] == total
        for row, part in zip(rows, unpack_rows(value, cu) if per_token else [value] * len(rows)):
            row[name] = part
    return rows


def run_packed(session, requests: list[dict], **run_options) -> list[dict[str, np.ndarray]]:
    """Run ragged requests as one packed batch; one output dict per request ([S_i, ...])."""
    feeds, cu = pack_requests(session, requests)
    return unpack(session.run(feeds, **run_options), cu)
