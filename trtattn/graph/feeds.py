"""Feeds for verification that mean what the model means: token ids inside the vocabulary, masks as the
model reads them (graph/mask_reading.py: padding masks with real padding along their measured key axis,
other masks random with keys kept in every row), positions after the cache, flags; a fixed seed."""

from __future__ import annotations

import numpy as np
import onnx

from .dim_names import dim_value, resolve_dims
from .mask_reading import DROP, keep_value, mask_candidates, measured_role, read_masks
from .roles import InputSpec, RoleKind, input_specs


def make_feeds(model: onnx.ModelProto, *, dims: dict[str, int] | None = None, seed: int = 0,
               padding: bool = True, shapes: dict[str, list[int]] | None = None,
               specs: list[InputSpec] | None = None, all_keys: bool = False,
               window: int | None = None) -> dict[str, np.ndarray]:
    """One feed dict. `padding=False` gives padding masks without padding (a form's check spreads the rows'
    lengths itself); a mask with a query axis stays random, or the check would not exercise it. `all_keys`:
    every mask keeps every key (a probe reading the pattern the model's own mask adds). `window`: the narrowest
    sliding window of keys the model's attention has (None: none), which bounds a padding (most_padding)."""
    rng = np.random.default_rng(seed)
    specs = specs if specs is not None else input_specs(model)
    dims = resolve_dims(model, dims, specs=specs)
    specs = mask_specs(model, specs, dims=dims, shapes=shapes)
    masks = np.random.default_rng([seed, 11])  # the masks' own draws: the other inputs' stay as they were
    feeds = {}
    sized = {spec.name: list(shapes[spec.name]) if shapes and spec.name in shapes else
             [d if isinstance(d, int) else dim_value(d, dims) for d in spec.shape] for spec in specs}
    queries = query_length(specs, sized)
    for spec in specs:
        shape = sized[spec.name]
        measured = "key_axis" in spec.role
        feeds[spec.name] = _mask(spec, shape, masks, padding and not all_keys, all_keys, (queries, window)) \
            if measured else _value(spec, shape, rng, padding and not all_keys, dims, (queries, window))
        if spec.kind is RoleKind.FLAG and "value" not in spec.role:
            # an If condition alternates with the seed, so that feeds of two seeds run both branches
            feeds[spec.name] = np.full(shape, seed % 2 == 0, dtype=spec.dtype)
    return feeds


def other_step_feeds(model: onnx.ModelProto, *, dims: dict[str, int], seed: int = 0,
                     window: int | None = None) -> dict[str, np.ndarray]:
    """Feeds at a cache length other than the fitted one (graph/dims.py's Fit.also: a prefill, a decode step),
    padded as make_feeds pads (padded_keys: at a prefill a left-padded row has no padding)."""
    return make_feeds(model, dims=dims, seed=seed, window=window)


def padded_keys(width: int, side: str | None, queries: int | None, window: int | None = None) -> int:
    """How many of a padded row's `width` keys the feeds pad: a quarter, at most most_padding."""
    return min(max(1, width // 4), most_padding(width, side, queries, window))


def most_padding(width: int, side: str | None, queries: int | None, window: int | None = None) -> int:
    """The most keys of a row that can be padding with every query row keeping a key whatever else the model
    masks. A row with no key has an output no model defines (in fp16 the original's masked logits overflow to -inf
    in some cells and its softmax averages the rest, the fused op's does otherwise), so comparing it would test
    arithmetic, not the rewrite. The queries are the last `queries` keys (None: all of them). Left padding stays
    within the keys before the first query (the past): a causal query sees none after itself, so a padded first
    query of a prefill sees nothing. Right padding leaves the padded last query a key within its sliding `window`
    (None: no window; a causal query still sees the tokens before it)."""
    if side == "left":
        return max(0, width - (queries or width))
    return max(0, (width if window is None else min(width, window)) - 1)


def query_length(specs: list[InputSpec], shapes: dict[str, list[int]]) -> int | None:
    """The query length a step's inputs give: the last axis of its token ids or positions (None without them)."""
    lengths = [shapes[s.name][-1] for s in specs
               if s.kind in (RoleKind.TOKEN_IDS, RoleKind.POSITION_IDS) and shapes[s.name]]
    return min(lengths) if lengths else None


def measured_specs(model: onnx.ModelProto, dims: dict | None = None) -> list[InputSpec]:
    """The model's input specs (roles.input_specs) with the masks' roles as measured at `dims` (mask_specs)."""
    specs = input_specs(model)
    return mask_specs(model, specs, dims=resolve_dims(model, dims, specs=specs))


def mask_specs(model: onnx.ModelProto, specs: list[InputSpec], *, dims: dict,
               shapes: dict[str, list[int]] | None = None) -> list[InputSpec]:
    """`specs` with the roles of the masks the model reads one way (graph/mask_reading.py) as measured;
    the rest as they are."""
    if not mask_candidates(model, specs):
        return specs
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in specs:
        shape = list(shapes[spec.name]) if shapes and spec.name in shapes else \
            [d if isinstance(d, int) else dim_value(d, dims) for d in spec.shape]
        feeds[spec.name] = _value(spec, shape, rng, False, dims)
    readings = read_masks(model, specs, feeds)
    return [InputSpec(s.name, s.dtype, s.shape, measured_role(s, readings[s.name])) if s.name in readings else s
            for s in specs]


def _mask(spec: InputSpec, shape: list[int], rng: np.random.Generator, padding: bool, all_keys: bool,
          reach: tuple[int | None, int | None]) -> np.ndarray:
    """A measured mask's values (mask_reading.measured_role): a padding mask keeps a prefix of keys per batch
    row, as _value's [B, S] one does, along its own axes (padded_keys of them padding); another mask keeps each
    key at random and key 0 in every row (so that no row is all masked, with a causal mask too); an additive one
    is normal where kept.
    `padding=False`: a padding mask keeps every key; `all_keys`: every mask does."""
    key = spec.role["key_axis"]
    keep = np.ones(shape, bool)
    if padding and spec.kind is RoleKind.PADDING_MASK:
        rows, width = shape[spec.role["batch_axis"]], shape[key]
        if rows >= 2 and width >= 4:
            lengths = [width] * (rows - 1) + [width - padded_keys(width, spec.role.get("side"), *reach)]
            flags = np.arange(width)[None, :] < np.asarray(lengths)[:, None]
            if spec.left_padded:
                flags = flags[:, ::-1]
            flags = flags.T if spec.role["batch_axis"] > key else flags
            keep = np.broadcast_to(flags.reshape([d if a in (key, spec.role["batch_axis"]) else 1
                                                  for a, d in enumerate(shape)]), shape).copy()
    elif spec.kind is not RoleKind.PADDING_MASK and not all_keys:
        keep = rng.random(shape) < 0.6
        np.moveaxis(keep, key, -1)[..., 0] = True
    if spec.kind is RoleKind.ADDITIVE_MASK:  # a bias where kept (a scale applied to it shows), -1e4 where not
        return np.where(keep, rng.standard_normal(shape), DROP).astype(spec.dtype)
    return keep_value(spec, keep, False)


def _value(spec: InputSpec, shape: list[int], rng: np.random.Generator, padding: bool, dims: dict,
           reach: tuple[int | None, int | None] = (None, None)) -> np.ndarray:
    kind = spec.kind
    dt = spec.dtype
    if kind is RoleKind.TOKEN_IDS:
        vocab = int(spec.role.get("vocab") or 2)
        low = 3 if vocab > 8 else 0  # keep clear of special tokens (pad/bos/eos) when there are many
        return rng.integers(low, vocab, size=shape).astype(dt)
    if kind in (RoleKind.PADDING_MASK, RoleKind.ONES_MASK):
        if kind is RoleKind.PADDING_MASK and padding and len(shape) == 2 and shape[0] >= 2 and shape[1] >= 4:
            lengths = [shape[1]] * (shape[0] - 1) + [shape[1] - padded_keys(shape[1], spec.role.get("side"), *reach)]
            return mask_of_lengths(spec, shape[1], lengths)
        return mask_of_lengths(spec, shape[1], [shape[1]] * shape[0]) if len(shape) == 2 else \
            (np.zeros if spec.true_at_padding else np.ones)(shape, dtype=dt)
    if kind is RoleKind.FLAG:
        return np.full(shape, spec.role.get("value", True), dtype=dt)
    if kind is RoleKind.WRITE_INDEX:  # every row appends after a cache of the past length
        return np.full(shape, dim_value("past", dims), dtype=dt)
    if kind is RoleKind.CU_SEQLENS:  # rows of the sequence length, end to end
        return (np.arange(shape[0]) * dim_value("seq", dims)).astype(dt)
    if kind is RoleKind.LENGTH:  # a length linked to the dims (roles.LINKED_LENGTHS): the sum of them, plus "add"
        total = sum(d if isinstance(d, int) else dim_value(d, dims) for d in spec.role.get("of", ()))
        return np.full(shape, total + int(spec.role.get("add", 0)), dtype=dt)
    if kind is RoleKind.POSITION_IDS:  # positions continue after the cache ("offset": the past length dim)
        seq = shape[-1] if shape else 1
        offset = dim_value(spec.role["offset"], dims) if spec.role.get("offset") else 0
        return np.broadcast_to(np.arange(seq) + offset, shape).astype(dt).copy()
    if dt.kind in "iu":
        return rng.integers(0, 2, size=shape).astype(dt)
    if dt == np.bool_:
        return np.ones(shape, dtype=np.bool_)
    return rng.standard_normal(shape).astype(dt)


def mask_of_lengths(spec: InputSpec, width: int, lengths) -> np.ndarray:
    """A [B, width] padding mask in the input's own convention (side, true at padding or at tokens, dtype)
    whose row b keeps lengths[b] tokens."""
    keep = np.arange(width)[None, :] < np.asarray(lengths, dtype=np.int64)[:, None]
    if spec.left_padded:
        keep = keep[:, ::-1]
    return (~keep if spec.true_at_padding else keep).astype(spec.dtype)


def spread_lengths(rows: int, low: int, high: int) -> list[int]:
    """`rows` lengths from `high` down to `low`, evenly spread: the rows of a check differ in length and
    each keeps at least `low` tokens."""
    if rows < 2:
        return [high] * rows
    return [int(round(high - (high - low) * b / (rows - 1))) for b in range(rows)]
