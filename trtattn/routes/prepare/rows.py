"""How the kv-cache form takes the original decoder step's inputs and how its outputs line up: the
original's rows (left- or right-padded over past + new tokens, per its attention_mask) become packed new
tokens, caches holding each row's valid past from slot 0, write indices and cu_seqlens; the original's
per-token outputs are packed the same way and its presents compacted to each row's valid tokens.

(An adapter in verify/adapters.py's sense; it lives with the form it serves until verify/ dispatches to it.)
"""

from __future__ import annotations

import numpy as np
import onnx

from ...contract import CU_SEQLENS, WRITE_INDEX, cu_seqlens, pack_rows
from ...graph.feeds import make_feeds
from ...graph.roles import RoleKind, input_specs
from ...verify.adapters import Adapter, fit_row_tokens, mask_lengths, spread_masks, token_masks


class PackedCacheAdapter(Adapter):
    form = "kv-cache"
    slack = 3  # free cache slots after the last token: they must stay untouched

    def __init__(self, original: onnx.ModelProto, candidate_inputs: list[str], caches: list[str],
                 capacity: int | None = None):
        super().__init__(original, candidate_inputs)
        self.caches = caches
        self.capacity = capacity  # an engine's static capacity; None: past + new + slack
        self.roles = {s.name: s.kind for s in input_specs(original)}

    def original_feeds(self, dims, seed):
        """Rows that each keep 1..seq new tokens (a right-padded mask) or 1..past + seq tokens (left),
        other padding masks (an encoder's) 1..their width: every row is checked, at its own length."""
        feeds = make_feeds(self.original, dims=dims, seed=seed, padding=False)
        return spread_masks(self.original, feeds, token_mask_start=feeds[self.caches[0]].shape[2])

    def fit(self, dims) -> dict:
        return fit_row_tokens(self.original, dims)

    def row_lengths(self, feeds):
        valid, past, _ = self._rows(feeds)
        return {"past": [int(n) for n in valid[:, :past].sum(axis=1)],
                "new": [int(n) for n in valid[:, past:].sum(axis=1)], **mask_lengths(self.original, feeds)}

    def _rows(self, feeds: dict) -> tuple[np.ndarray, int, int]:
        """(valid [B, past + seq] booleans, past, seq) of the original's feeds."""
        ids = next(v for k, v in feeds.items() if self.roles.get(k) is RoleKind.TOKEN_IDS)
        batch, seq = ids.shape
        past = feeds[self.caches[0]].shape[2]
        masks = [feeds[name] for name in token_masks(self.original)[:1] if name in feeds]
        valid = np.ones((batch, past + seq), bool)
        if masks:
            m = masks[0].astype(bool)
            valid[:, past + seq - m.shape[1]:] = m  # a mask over the new tokens only leaves the past valid
        return valid, past, seq

    def feeds(self, feeds):
        valid, past, seq = self._rows(feeds)
        new, old = valid[:, past:], valid[:, :past]
        out = {}
        for name, v in feeds.items():
            if name not in self.inputs or name in self.caches:
                continue
            if self.roles.get(name) in (RoleKind.TOKEN_IDS, RoleKind.POSITION_IDS) and v.ndim == 2:
                out[name] = pack_rows(v[b][new[b]] for b in range(len(v)))
            else:
                out[name] = v
        capacity = self.capacity or past + seq + self.slack
        for name in self.caches:
            v = feeds[name]
            buf = np.zeros(v.shape[:2] + (capacity,) + v.shape[3:], v.dtype)
            for b in range(len(v)):
                buf[b, :, :int(old[b].sum())] = v[b][:, old[b]]
            out[name] = buf
        out[WRITE_INDEX] = old.sum(axis=1).astype(np.int64)
        out[CU_SEQLENS] = cu_seqlens(new.sum(axis=1))
        return out

    def line_up(self, feeds, ref, out):
        valid, past, seq = self._rows(feeds)
        new = valid[:, past:]
        batch = len(valid)
        ref2, out2 = {}, {}
        for name, v in ref.items():
            got = out.get(name)
            if got is None:
                continue
            if got.ndim == 4 and v.ndim == 4 and got.shape[0] == batch and v.shape[2] == past + seq:  # a cache
                n = valid.sum(axis=1)
                ref2[name] = np.concatenate([v[b][:, valid[b]] for b in range(batch)], axis=1)
                out2[name] = np.concatenate([got[b][:, :n[b]] for b in range(batch)], axis=1)
                free = np.concatenate([got[b][:, n[b]:] for b in range(batch)], axis=1)
                ref2[name + "[free]"], out2[name + "[free]"] = np.zeros_like(free), free
            elif v.ndim >= 2 and v.shape[:2] == (batch, seq):  # per token
                ref2[name], out2[name] = pack_rows(v[b][new[b]] for b in range(batch)), got
            else:
                ref2[name], out2[name] = v, got
        contiguous = np.ascontiguousarray  # Polygraphy's comparator views arrays
        return {k: contiguous(v) for k, v in ref2.items()}, {k: contiguous(v) for k, v in out2.items()}
