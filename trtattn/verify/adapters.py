"""How a candidate (a form model or an engine) takes the original's inputs and how its outputs line up
with the original's. The padded form takes them as they are; the packed form takes ragged rows end to
end; the kv-cache form takes preallocated caches and a write index.

The ragged forms read per-row lengths, so their checks run on rows that each keep real tokens and differ
in length (spread_masks): a row without a real token, or rows all of one length, would let a wrong
length pass."""

from __future__ import annotations

import numpy as np
import onnx

from ..contract import CU_SEQLENS, WRITE_INDEX, cu_seqlens, pack_padded
from ..graph.dim_names import dim_value
from ..graph.dims import DimsDoNotFit, fit_dims
from ..graph.feeds import make_feeds, mask_of_lengths, spread_lengths
from ..graph.roles import RoleKind, input_specs

ROW_TOKENS = 3  # new tokens per row a ragged check runs on at least: lengths 1..3 across the rows


class Adapter:
    form = "padded"

    def __init__(self, original: onnx.ModelProto, candidate_inputs: list[str]):
        self.original = original
        self.inputs = candidate_inputs

    def feeds(self, feeds: dict) -> dict:
        return {k: v for k, v in feeds.items() if k in self.inputs}

    def line_up(self, feeds: dict, ref: dict, out: dict) -> tuple[dict, dict]:
        return ref, out

    def original_feeds(self, dims, seed) -> dict:
        return make_feeds(self.original, dims=dims, seed=seed)

    def fit(self, dims) -> dict:
        """Dims the original runs on and its check takes (ragged forms: enough tokens per row)."""
        return fit_dims(self.original, dims)

    def row_lengths(self, feeds: dict) -> dict[str, list[int]]:
        """What the check's record says of the rows' lengths (none for the padded form)."""
        return {}


def token_masks(original: onnx.ModelProto) -> list[str]:
    """The 2-D padding masks, in input order (the first is the tokens' when there is one)."""
    return [s.name for s in input_specs(original) if s.kind is RoleKind.PADDING_MASK and len(s.shape) == 2]


def fit_row_tokens(original: onnx.ModelProto, dims) -> dict:
    """fit_dims, with the token ids' length raised to ROW_TOKENS when it is shorter (a decoder step's seq=1)
    and the model runs there: rows of 1..ROW_TOKENS new tokens."""
    dims = fit_dims(original, dims)
    ids = next((s for s in input_specs(original) if s.kind is RoleKind.TOKEN_IDS and len(s.shape) == 2), None)
    if ids is None or not isinstance(ids.shape[1], str) or dim_value(ids.shape[1], dims) >= ROW_TOKENS:
        return dims
    try:
        return fit_dims(original, {**dims, ids.shape[1]: ROW_TOKENS})
    except DimsDoNotFit:  # the model takes this one length only
        return dims


def spread_masks(original: onnx.ModelProto, feeds: dict, token_mask_start: int = 0) -> dict:
    """`feeds` with each 2-D padding mask's rows keeping lengths spread over 1..its width, all different
    (spread_lengths); the first (the tokens') from `token_mask_start` + 1 when it is right-padded, so
    that every row keeps at least one of the tokens after that start (a decoder step's new tokens)."""
    specs = {s.name: s for s in input_specs(original)}
    masks = token_masks(original)
    out = dict(feeds)
    for name in masks:
        batch, width = feeds[name].shape
        low = token_mask_start + 1 if name == masks[0] and not specs[name].left_padded else 1
        out[name] = mask_of_lengths(specs[name], width, spread_lengths(batch, min(low, width), width))
    return out


def mask_lengths(original: onnx.ModelProto, feeds: dict) -> dict[str, list[int]]:
    """Each 2-D padding mask's kept tokens per row, as the record shows them."""
    specs = {s.name: s for s in input_specs(original)}
    return {name: [int(n) for n in (feeds[name] == 0 if specs[name].true_at_padding
                                    else feeds[name] != 0).sum(axis=1)]
            for name in token_masks(original) if name in feeds}


class PackedAdapter(Adapter):
    """Ragged rows end to end: the original's padded outputs are packed the same way."""

    form = "packed"

    def lengths(self, feeds: dict) -> list[int]:
        masks = [s.name for s in input_specs(self.original) if s.kind is RoleKind.PADDING_MASK]
        batch, seq = next(v.shape for v in feeds.values() if v.ndim == 2)
        return [int(feeds[masks[0]][b].sum()) for b in range(batch)] if masks else [seq] * batch

    def feeds(self, feeds: dict) -> dict:
        lengths = self.lengths(feeds)
        out = {k: (pack_padded(v, lengths) if v.ndim == 2 else v) for k, v in feeds.items() if k in self.inputs}
        out[CU_SEQLENS] = cu_seqlens(lengths)
        return out

    def line_up(self, feeds, ref, out):
        lengths = self.lengths(feeds)
        batch, seq = len(lengths), max(lengths)
        packed = {name: pack_padded(v, lengths) for name, v in ref.items()
                  if v.ndim >= 2 and v.shape[0] == batch and v.shape[1] >= seq}
        return packed, {k: v for k, v in out.items() if k in packed}

    def original_feeds(self, dims, seed):
        return spread_masks(self.original, make_feeds(self.original, dims=dims, seed=seed, padding=False))

    def fit(self, dims) -> dict:
        return fit_row_tokens(self.original, dims)

    def row_lengths(self, feeds):
        return mask_lengths(self.original, feeds) or {"tokens": [int(n) for n in self.lengths(feeds)]}


class CacheAdapter(Adapter):
    """Past K/V placed at the start of preallocated caches, every row at the same write index; the
    candidate's caches are compared over the positions the original's presents cover, and the free
    positions after them must stay untouched (zero)."""

    form = "kv-cache"
    slack = 3

    def __init__(self, original, candidate_inputs, caches: list[str], capacity: int | None = None):
        super().__init__(original, candidate_inputs)
        self.caches = caches
        self.capacity = capacity  # an engine's static capacity; None: past + new + slack

    def original_feeds(self, dims, seed):
        return make_feeds(self.original, dims=dims, seed=seed, padding=False)

    def feeds(self, feeds):
        out = {k: v for k, v in feeds.items() if k in self.inputs and k not in self.caches}
        past = feeds[self.caches[0]].shape[2]
        new = next((v.shape[1] for k, v in feeds.items() if k == "input_ids"), None) or _longest_update(feeds, self.caches)
        capacity = self.capacity or past + new + self.slack
        for name in self.caches:
            v = feeds[name]
            buf = np.zeros(v.shape[:2] + (capacity,) + v.shape[3:], v.dtype)
            buf[:, :, :past] = v
            out[name] = buf
        out[WRITE_INDEX] = np.full((feeds[self.caches[0]].shape[0],), past, np.int64)
        return out

    def line_up(self, feeds, ref, out):
        ref2, out2 = {}, {}
        for name, v in ref.items():
            got = out.get(name)
            if got is None:
                continue
            if got.ndim == 4 and got.shape[:3] == v.shape[:3] and got.shape[3] > v.shape[3]:
                # logits over the cache's capacity (an Attention op's qk_matmul_output, routes/prepare/qk_beside.py):
                # the original's keys are the first ones; the free columns are no keys of it
                ref2[name], out2[name] = v, got[..., :v.shape[3]]
            elif got.ndim == 4 and got.shape != v.shape and got.shape[:2] == v.shape[:2]:
                filled = v.shape[2]
                ref2[name] = v
                out2[name] = got[:, :, :filled]
                ref2[name + "[free]"] = np.zeros_like(got[:, :, filled:])
                out2[name + "[free]"] = got[:, :, filled:]
            else:
                ref2[name], out2[name] = v, got
        return ref2, out2


def _longest_update(feeds: dict, caches: list[str]) -> int:
    """Without token ids, the most new K/V tokens any float input can carry: its sequence axis (axis 2 of a
    4-D [B, N, S, H], axis 1 of a 3-D [B, S, N*H]); at least 1."""
    seqs = [v.shape[2] if v.ndim == 4 else v.shape[1] for k, v in feeds.items()
            if k not in caches and np.issubdtype(v.dtype, np.floating) and v.ndim in (3, 4)]
    return max(seqs, default=1)


def adapter_for(original: onnx.ModelProto, candidate_inputs: list[str], cache_inputs: list[str] | None = None,
                capacity: int | None = None) -> Adapter:
    if CU_SEQLENS in candidate_inputs:
        return PackedAdapter(original, candidate_inputs)
    if WRITE_INDEX in candidate_inputs:
        return CacheAdapter(original, candidate_inputs, cache_inputs or [], capacity)
    return Adapter(original, candidate_inputs)
