"""KV-cache managers: what a decoding loop feeds a model about its cache, per row.

ConcatCache  models whose past grows each step (the original and the fused ONNX models, engines
             built from them): past inputs [B, N, P, H], present outputs [B, N, P+S, H]. The
             presents are carried into the next step's past (on TensorRT the device buffers swap).
             Ragged rows share one slot axis: each row's `valid` slots say which positions hold
             its tokens, and the step's attention_mask [B, P+S] is exactly that. Prompts are padded
             on the right, or on the left (`padding_side="left"`, as Hugging Face generates).
StaticCache  the kv-cache form (and its engine): preallocated [B, N, capacity, H] buffers kept as
             session state; the step's tokens go end to end ([1, T] with cu_seqlens), each row's
             `cache_write_index` is its length, its positions continue from there; the present
             outputs alias the cache inputs (ONNX Runtime: the returned buffer replaces the state;
             TensorRT: the same device buffer is bound to both, nothing moves). No row ever carries
             padding: a ragged prefill is as exact as each request alone. The kv-cache form of an
             Attention op's own cache (no cu_seqlens) takes right-padded [B, S] steps: a row's padding
             is written after its tokens, seen by none of them (causal), and overwritten next step.

Both keep `lengths` [B] (valid tokens per row). `step_feeds(ids, new)` gives a step's feeds from
right-padded ids [B, S] of which `new[b]` per row are real; `last(logits, new)` each row's logits
at its last real token.
"""

from __future__ import annotations

import numpy as np

from ..contract import CU_SEQLENS, WRITE_INDEX, cu_seqlens, pack_rows
from ..errors import TrtattnError

PAST_PREFIXES = ("past_key_values.", "past_key_values_", "past.", "past_")
PRESENT_PREFIXES = ("present.", "present_", "present_key_values.")
DEFAULT_CAPACITY = 256


def past_name(present: str, inputs) -> str | None:
    """The past input a present output feeds (present.0.key -> past_key_values.0.key)."""
    for pre in PRESENT_PREFIXES:
        if present.startswith(pre):
            rest = present[len(pre):]
            for past in PAST_PREFIXES:
                if past + rest in inputs:
                    return past + rest
    return None


def concat_pairs(session) -> list[tuple[str, str]]:
    """(past input, present output) pairs by name."""
    inputs = set(session.input_names)
    pairs = []
    for out in session.output_names:
        past = past_name(out, inputs)
        if past is not None:
            pairs.append((past, out))
    return pairs


def static_inputs(session, pairs) -> list[str]:
    """Cache-like inputs with no present output: static cross-attention K/V."""
    paired = {p for p, _ in pairs}
    return [n for n in session.input_names if n not in paired and n.startswith(PAST_PREFIXES)]


def cache_dims(session, name: str, config: dict | None = None) -> tuple[int, int]:
    """A cache input's heads and head size, [batch, heads, seq, head size]: its static dims, else the model's
    config (config.json, or genai_config.json: runtime/pipeline.py), whose builder may leave them dynamic."""
    shape = list(session.input(name).shape)
    if len(shape) != 4:
        raise TrtattnError(f"{session.name}: cache input {name} has rank {len(shape)}; expected [batch, heads, "
                           "past, head size]")
    config = config or {}
    heads, size = shape[1], shape[3]
    if not isinstance(heads, int) or heads <= 0:
        heads = config.get("num_key_value_heads") or config.get("num_attention_heads") or config.get("num_heads") \
            or config.get("decoder_attention_heads")
    if not isinstance(size, int) or size <= 0:
        hidden = config.get("hidden_size") or config.get("d_model")
        size = config.get("head_dim") or config.get("d_kv") or (hidden // heads if hidden and heads else None)
    if not heads or not size:
        raise TrtattnError(f"{session.name}: cannot tell the heads and head size of {name} (dynamic dims "
                           f"{shape}, and neither config.json nor genai_config.json says)")
    return int(heads), int(size)


def _capacity(session, name: str, requested: int | None) -> int:
    """A cache's capacity: fixed by the model (an engine's static cache input, or its sidecar's I/O), else
    the one requested, else DEFAULT_CAPACITY."""
    shape = session.input(name).shape
    declared = [io["shape"][2] for io in ((session.sidecar or {}).get("io") or {}).get("inputs", [])
                if io.get("name") == name and len(io.get("shape") or []) == 4]
    fixed = shape[2] if isinstance(shape[2], int) and shape[2] > 0 else next(
        (d for d in declared if isinstance(d, int) and d > 0), None)
    if fixed:
        if requested and requested != fixed:
            raise TrtattnError(f"{session.name}: {name} has a fixed capacity of {fixed}, not {requested}")
        return int(fixed)
    return int(requested or DEFAULT_CAPACITY)


class KVCache:
    style = "?"

    def __init__(self, session, pairs: list[tuple[str, str]], batch: int):
        if not pairs:
            raise TrtattnError(f"{session.name}: no KV-cache inputs (past_key_values.* with present.* outputs, or "
                               "the kv-cache form's cache inputs)")
        self.session = session
        self.pairs = pairs
        self.batch = int(batch)
        self.lengths = np.zeros(self.batch, np.int64)

    def positions(self, seq: int) -> np.ndarray:
        """Positions of the next `seq` tokens of every row: [B, seq]."""
        return self.lengths[:, None] + np.arange(seq, dtype=np.int64)[None]

    def step_feeds(self, ids: np.ndarray, new_lengths=None) -> dict[str, np.ndarray]:
        """The feeds of a step of right-padded token ids [B, S], `new_lengths` real per row (all S)."""
        raise NotImplementedError

    def last(self, logits: np.ndarray, new_lengths=None) -> np.ndarray:
        """Each row's logits at its last real token of the step just run: [B, V]."""
        raise NotImplementedError

    def carry(self) -> dict[str, str]:
        return {}

    def advance(self, new_lengths, seq: int | None = None) -> None:
        """After a step of `seq` tokens of which `new_lengths` per row are real (the rest padding)."""
        self.lengths = self.lengths + self._new(new_lengths, seq)

    def load(self, presents: dict[str, np.ndarray], lengths) -> None:
        """Seed the cache from a prefill model's presents ({past input name: [B, N, S, H]}) holding
        `lengths` valid tokens per row."""
        raise NotImplementedError

    def read(self, past: str, row: int) -> np.ndarray:
        """The valid K (or V) of one row: [N, length, H] (a host copy; for checks, not for decoding)."""
        raise NotImplementedError

    def _new(self, new_lengths, seq) -> np.ndarray:
        if new_lengths is None:
            if seq is None:
                raise TrtattnError("advance needs the number of new tokens per row")
            return np.full(self.batch, seq, np.int64)
        new = np.asarray(new_lengths, np.int64).reshape(-1)
        if new.shape != (self.batch,):
            raise TrtattnError(f"new lengths for {new.shape[0]} rows, the cache has {self.batch}")
        return new


class ConcatCache(KVCache):
    """Past inputs grow by the step's tokens; padding slots are masked out per row."""

    style = "concat"

    def __init__(self, session, batch: int, pairs: list[tuple[str, str]] | None = None, padding_side: str = "right",
                 config: dict | None = None):
        super().__init__(session, pairs if pairs is not None else concat_pairs(session), batch)
        if padding_side not in ("right", "left"):
            raise TrtattnError(f"padding_side is 'right' or 'left', not {padding_side!r}")
        self.padding_side = padding_side
        self.valid = np.zeros((self.batch, 0), bool)
        for past, _ in self.pairs:
            n, h = cache_dims(session, past, config)
            session.zeros_state(past, (self.batch, n, 0, h))

    @property
    def slots(self) -> int:
        return self.valid.shape[1]

    def _fresh(self, new: np.ndarray, seq: int) -> np.ndarray:
        """[B, seq]: which of the step's slots hold real tokens."""
        if self.padding_side == "left":
            return np.arange(seq)[None] >= seq - new[:, None]
        return np.arange(seq)[None] < new[:, None]

    def step_feeds(self, ids, new_lengths=None):
        ids = np.asarray(ids, np.int64)
        seq = ids.shape[1]
        new = self._new(new_lengths, seq)
        if (new > seq).any():
            raise TrtattnError(f"a row has more new tokens than the step's {seq}")
        fresh = self._fresh(new, seq)
        if self.padding_side == "left":  # each row's real tokens move to the end of the step
            ids = np.stack([np.roll(row, seq - n) for row, n in zip(ids, new)])
            positions = self.lengths[:, None] + np.maximum(np.cumsum(fresh, axis=1) - 1, 0)
        else:
            positions = self.positions(seq)
        mask = np.concatenate([self.valid, fresh], axis=1).astype(np.int64)
        return {"input_ids": ids, "attention_mask": mask, "position_ids": positions}

    def last(self, logits, new_lengths=None):
        new = self._new(new_lengths, logits.shape[1])
        index = np.full_like(new, logits.shape[1] - 1) if self.padding_side == "left" else new - 1
        return logits[np.arange(logits.shape[0]), index]

    def carry(self):
        return {present: past for past, present in self.pairs}

    def advance(self, new_lengths, seq: int | None = None):
        new = self._new(new_lengths, seq)
        seq = seq if seq is not None else int(new.max(initial=0))
        self.valid = np.concatenate([self.valid, self._fresh(new, seq)], axis=1)
        self.lengths = self.lengths + new
        if any(self.session.state_shape(p)[2] != self.slots for p, _ in self.pairs):
            raise TrtattnError("the carried presents do not have one slot per token fed so far: "
                               "advance the cache by the step's sequence length")

    def load(self, presents, lengths):
        lengths = self._new(lengths, None)
        seq = 0  # the presents' length; pairs is never empty (__init__)
        for past, _ in self.pairs:
            if past not in presents:
                raise TrtattnError(f"no present for {past} to seed the cache with")
            value = presents[past]
            seq = value.shape[2]
            self.session.set_state(past, value)
        self.valid = np.arange(seq)[None] < lengths[:, None]
        self.lengths = lengths.copy()

    def read(self, past, row):
        value = self.session.get_state(past)[row]
        return value[:, self.valid[row]]


class StaticCache(KVCache):
    """Preallocated buffers written at each row's write index (the kv-cache form)."""

    style = "static"

    def __init__(self, session, batch: int, capacity: int | None = None, config: dict | None = None):
        pairs = [(inp, out) for out, inp in session.aliases.items()]
        if WRITE_INDEX not in session.input_names:
            raise TrtattnError(f"{session.name}: not a kv-cache form (no {WRITE_INDEX} input); use ConcatCache")
        if not pairs:
            raise TrtattnError(f"{session.name}: its cache outputs do not alias its cache inputs; a kv-cache form "
                               "updates them in place")
        super().__init__(session, sorted(pairs), batch)
        # the LLM kv-cache form takes packed tokens (cu_seqlens); an op's own cache (op_cache.py) padded [B, S] queries
        self.packed = CU_SEQLENS in session.input_names
        self.capacity = _capacity(session, self.pairs[0][0], capacity)
        for past, _ in self.pairs:
            n, h = cache_dims(session, past, config)
            session.zeros_state(past, (self.batch, n, self.capacity, h))

    def step_feeds(self, ids, new_lengths=None):
        ids = np.asarray(ids, np.int64)
        new = self._new(new_lengths, ids.shape[1])
        if (new > ids.shape[1]).any():
            raise TrtattnError(f"a row has more new tokens than the step's {ids.shape[1]}")
        written = new if self.packed else np.full_like(new, ids.shape[1])  # a padded step writes all its slots
        if (self.lengths + written > self.capacity).any():
            raise TrtattnError(f"the KV cache is full: a row would write past its capacity of {self.capacity} tokens "
                               "(TensorRT would drop the write silently); give a larger capacity")
        self._cu = cu_seqlens(new)
        if not self.packed:  # right-padded rows: a row's padding is written after its tokens, overwritten next step
            feeds = {"input_ids": ids, "position_ids": self.lengths[:, None] + np.arange(ids.shape[1])[None],
                     WRITE_INDEX: self.lengths.copy()}
        else:
            feeds = {"input_ids": pack_rows(row[:n] for row, n in zip(ids, new)),
                     "position_ids": pack_rows(self.lengths[b] + np.arange(n) for b, n in enumerate(new)),
                     CU_SEQLENS: self._cu, WRITE_INDEX: self.lengths.copy()}
        return self._as_the_form_reads(feeds, new)

    def _as_the_form_reads(self, feeds: dict[str, np.ndarray], new: np.ndarray) -> dict[str, np.ndarray]:
        """A form that still reads the keys' attention_mask (ONNX Runtime GenAI's models make seqlens_k from it)
        gets each row's keys, its write index + new tokens, which it must agree with; one that computes its
        positions itself gets no position_ids."""
        inputs = set(self.session.input_names)
        if "attention_mask" in inputs:
            keys = self.lengths + new
            feeds["attention_mask"] = (np.arange(keys.max())[None] < keys[:, None]).astype(np.int64)
        if "position_ids" not in inputs:
            del feeds["position_ids"]
        return feeds

    def last(self, logits, new_lengths=None):
        if not self.packed:  # [B, S, V]: each row's last real token
            return logits[np.arange(logits.shape[0]), np.diff(self._cu) - 1]
        return logits[0, self._cu[1:] - 1]  # [1, T, V]: each row's last token

    def advance(self, new_lengths, seq: int | None = None):
        self.lengths = self.lengths + self._new(new_lengths, seq)

    def load(self, presents, lengths):
        lengths = self._new(lengths, None)
        for past, _ in self.pairs:
            if past not in presents:
                raise TrtattnError(f"no present for {past} to seed the cache with")
            value = presents[past]
            if value.shape[2] > self.capacity:
                raise TrtattnError(f"a prefill of {value.shape[2]} tokens does not fit a cache of {self.capacity}")
            buf = np.zeros(value.shape[:2] + (self.capacity,) + value.shape[3:], value.dtype)
            buf[:, :, :value.shape[2]] = value
            self.session.set_state(past, buf)  # once per request; decode steps then never copy
        self.lengths = lengths.copy()

    def read(self, past, row):
        return self.session.get_state(past)[row][:, :self.lengths[row]]


def make_cache(session, batch: int, *, capacity: int | None = None, padding_side: str = "right",
               config: dict | None = None) -> KVCache:
    """StaticCache for a kv-cache form (it has cache_write_index), ConcatCache otherwise (whose prompts
    are padded on `padding_side`; a StaticCache packs them: no padding). `config`: the model's, for cache
    dims the model leaves dynamic (cache_dims)."""
    if WRITE_INDEX in session.input_names:
        return StaticCache(session, batch, capacity, config)
    return ConcatCache(session, batch, padding_side=padding_side, config=config)
