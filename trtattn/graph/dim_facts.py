"""What a model's attention ops say of its input dims (read by graph/op_dims.py): dims fixed, totals that are
a past plus the new tokens, pasts and new lengths, limits and floors, and how a set of dims is made to obey them
(`OpDims.apply`, `decode`, `prefill`). graph/dims.py searches within these facts."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import TrtattnError


@dataclass(frozen=True)
class Fixed:
    """A dim the model's ops or configs fix: its name, value and why (one clause naming the node or file)."""

    name: str
    value: int
    why: str


@dataclass(frozen=True)
class LengthSum:
    """total = sum(parts): a dim an op reads as the past plus the new tokens."""

    total: str
    parts: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class Covers:
    """rows >= sum(parts): a table of positions (a rotary cache given as an input) that must reach the total length."""

    rows: str
    parts: tuple[str, ...]
    why: str


@dataclass(frozen=True)
class ConfigSizes:
    """Sizes a model folder's config says (genai_config.json, config.json), for what the ops leave unknown."""

    source: str  # the file, for reasons
    head_size: int | None = None
    kv_heads: int | None = None


def head_size_by_contract(query_width: int | None, key_width: int | None, heads: int | None, kv_heads: int | None,
                          packed: bool) -> tuple[int | None, str]:
    """The head size an attention op's contract gives, and how: the query's width over its heads (Q, K and V packed
    in one input, [B, S, (N + 2 Nkv) H]: over all of them), else the key's width over the key/value heads; None
    where neither width is known or divides (graph/op_dims.py and rewrite/group_query.py both ask)."""
    if not heads:
        return None, ""
    if query_width is not None:
        parts = heads + 2 * kv_heads if packed and kv_heads else heads
        if query_width % parts == 0:
            formula = f"({heads} + 2 * {kv_heads}) heads" if packed else f"{heads} heads"
            return query_width // parts, f"its {'packed QKV' if packed else 'query'} width {query_width} over {formula}"
    if key_width is not None and kv_heads and key_width % kv_heads == 0:
        return key_width // kv_heads, f"its key width {key_width} over {kv_heads} key/value heads"
    return None, ""


@dataclass
class OpDims:
    """What the model's attention ops say of its input dims."""

    fixed: dict[str, Fixed] = field(default_factory=dict)
    sums: list[LengthSum] = field(default_factory=list)
    pasts: dict[str, str] = field(default_factory=dict)  # a cache's length dim -> the node reading it
    news: set[str] = field(default_factory=set)  # the new tokens' length dims of those nodes
    batches: set[str] = field(default_factory=set)  # their batch dims
    batch_one: str | None = None  # the node that takes several new tokens over a past at batch 1 only
    limits: dict[str, Fixed] = field(default_factory=dict)  # the most a dim may be
    floors: dict[str, Fixed] = field(default_factory=dict)  # the least a total length may be (a window buffer's)
    windows: set[str] = field(default_factory=set)  # the window buffers' length dims (fixed, never a past)
    covers: list[Covers] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.fixed or self.sums or self.pasts or self.covers)

    def check_user(self, user: dict) -> None:
        """Refuse a user's dim that an op fixes to another value, naming the op."""
        for name, value in user.items():
            fixed = self.fixed.get(name)
            if fixed is not None and fixed.value != value:
                raise TrtattnError(f"--dims {name}={value}: {fixed.why}, so {name} is {fixed.value}")

    def apply(self, dims: dict, user: dict | None = None) -> dict:
        """`dims` with the fixed sizes and the sums (total = past + new) set, where the user did not give them."""
        user = user or {}
        out = {**dims, **{n: f.value for n, f in self.fixed.items() if n not in user}}
        for s in self.sums:
            if s.total not in user and all(p in out for p in s.parts):
                out[s.total] = sum(out[p] for p in s.parts)
        self._raise_to_floors(out, user)
        for c in self.covers:
            if c.rows not in user and all(p in out for p in c.parts):
                out[c.rows] = max(out.get(c.rows, 0), sum(out[p] for p in c.parts))
        return out

    def _raise_to_floors(self, out: dict, user: dict) -> None:
        """A total below its floor made long enough: through its past when the past is not empty (a step), else
        through its new tokens (a prefill, which stays one), else itself when no sum names it."""
        for name, floor in self.floors.items():
            short = floor.value - out.get(name, floor.value)
            if short <= 0 or name in user:
                continue
            s = next((s for s in self.sums if s.total == name), None)
            if s is None:
                out[name] = floor.value
                continue
            past, new = s.parts
            grow = past if out.get(past, 0) > 0 or new in user else new
            if grow not in user:
                out[grow] += short
                out[name] = sum(out[p] for p in s.parts)

    def within_limits(self, dims: dict) -> bool:
        return all(dims.get(n, 0) <= f.value for n, f in self.limits.items()) and \
            all(dims.get(n, f.value) >= f.value for n, f in self.floors.items())

    def decode(self, dims: dict, user: dict) -> dict:
        """`dims` as a step over a non-empty past: batch 1 where an op takes several new tokens over a past at
        batch 1 only (and the user did not give the batch)."""
        out = dict(dims)
        if self.batch_one and self._over_a_past(out) and any(out.get(n, 1) > 1 for n in self.news):
            out.update({b: 1 for b in self.batches if b not in user})
        return self.apply(out, user)

    def batch_note(self, dims: dict, user: dict) -> list[str]:
        """Why the batch is 1 at `dims`, when decode set it so."""
        ones = [b for b in sorted(self.batches) if b not in user and dims.get(b) == 1]
        if not self.batch_one or not ones or not self._over_a_past(dims):
            return []
        return [f"{ones[0]}=1 ({self.batch_one} takes several new tokens over a past at batch 1 only on CPU)"]

    def _over_a_past(self, dims: dict) -> bool:
        """Whether `dims` is a step over a past: a non-empty past, or a window buffer (always there)."""
        return bool(self.windows) or any(dims.get(p, 0) > 0 for p in self.pasts)

    def prefill(self, dims: dict, user: dict, batch: dict) -> dict | None:
        """`dims` as a first prompt (every cache empty) at the batch `batch` gives; None when the user gave a past."""
        if not self.pasts or any(p in user for p in self.pasts):
            return None
        out = {**dims, **{p: 0 for p in self.pasts}, **{b: v for b, v in batch.items() if b in self.batches}}
        return self.apply(out, user)

    def reasons(self) -> list[str]:
        out = [f"{f.name}={f.value} ({f.why})" for f in self.fixed.values()]
        out += [f"{s.total} = {' + '.join(s.parts)} ({s.why})" for s in self.sums]
        out += [f"{c.rows} >= {' + '.join(c.parts)} ({c.why})" for c in self.covers]
        out += [f"{f.name} >= {f.value} ({f.why})" for f in self.floors.values()]
        return out
