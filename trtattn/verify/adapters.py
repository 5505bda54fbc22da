"""How a candidate (a form model or an engine) takes the original's inputs and how its outputs line up
with the original's. The padded form takes them as they are; the packed form takes ragged rows end to
end; the kv-cache form takes preallocated caches and a write index."""

from __future__ import annotations

import numpy as np
import onnx

from ..contract import CU_SEQLENS, WRITE_INDEX, cu_seqlens, pack_padded
from ..graph.feeds import make_feeds
from ..graph.roles import input_specs


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


class PackedAdapter(Adapter):
    """Ragged rows end to end: the original's padded outputs are packed the same way."""

    form = "packed"

    def lengths(self, feeds: dict) -> list[int]:
        masks = [s.name for s in input_specs(self.original) if s.role.get("kind") == "padding_mask"]
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
        return make_feeds(self.original, dims=dims, seed=seed, padding=True)


class CacheAdapter(Adapter):
    """Past K/V placed at the start of preallocated caches, every row at the same write index; the
    candidate's caches are compared over the positions the original's presents cover, and the free
    positions after them must stay untouched (zero)."""

    form = "kv-cache"
    slack = 3

    def __init__(self, original, candidate_inputs, caches: list[str]):
        super().__init__(original, candidate_inputs)
        self.caches = caches

    def original_feeds(self, dims, seed):
        return make_feeds(self.original, dims=dims, seed=seed, padding=False)

    def feeds(self, feeds):
        out = {k: v for k, v in feeds.items() if k in self.inputs and k not in self.caches}
        past = feeds[self.caches[0]].shape[2]
        new = next((v.shape[1] for k, v in feeds.items() if k == "input_ids"), 1)
        capacity = past + new + self.slack
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
            if got.ndim == 4 and got.shape != v.shape and got.shape[:2] == v.shape[:2]:
                filled = v.shape[2]
                ref2[name] = v
                out2[name] = got[:, :, :filled]
                ref2[name + "[free]"] = np.zeros_like(got[:, :, filled:])
                out2[name + "[free]"] = got[:, :, filled:]
            else:
                ref2[name], out2[name] = v, got
        return ref2, out2


def adapter_for(original: onnx.ModelProto, candidate_inputs: list[str], cache_inputs: list[str] | None = None) -> Adapter:
    if CU_SEQLENS in candidate_inputs:
        return PackedAdapter(original, candidate_inputs)
    if WRITE_INDEX in candidate_inputs:
        return CacheAdapter(original, candidate_inputs, cache_inputs or [])
    return Adapter(original, candidate_inputs)
