"""Input domains a model accepts, and the random ops that make its outputs change from run to run.

Feeds drawn from a standard normal make some originals non-finite: a noise level or a scale under a log
or a square root, lengths that must lie within the sequence (a mean over zero tokens). Each input that
could be the cause has a ladder of domains, widest first: floats normal, positive, [0, 1], zero (a noise
input at zero turns its noise off); integers that index no embedding table {0, 1}, then lengths within
the sequence. Token ids (below the embedding table's rows), masks, positions and flags keep their roles'
values. verify/inputs.py climbs the ladders until the original's outputs are finite and repeatable.
"""

from __future__ import annotations

import zlib

import numpy as np
import onnx

from .dim_names import dim_value
from .feeds import make_feeds
from .io import attach_weights, weights_aside
from .roles import InputSpec, RoleKind, input_specs

RANDOM_OPS = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial")
FLOAT_LADDER = ("normal", "positive", "[0, 1]", "zero")
INTEGER_LADDER = ("{0, 1}", "lengths within the sequence")


def ladder(spec: InputSpec) -> tuple[str, ...]:
    """The domains an input may take, widest first (one: the input keeps its role's values)."""
    kind = spec.kind
    if spec.dtype.kind == "f" and kind in (RoleKind.FLOAT, RoleKind.CACHE):
        return FLOAT_LADDER
    if spec.dtype.kind in "iu" and kind is RoleKind.TOKEN_IDS and int(spec.role.get("vocab") or 2) <= 2:
        return INTEGER_LADDER  # no embedding table: not token ids, maybe lengths
    return (role_domain(spec),)


def role_domain(spec: InputSpec) -> str:
    kind = spec.kind
    if kind is RoleKind.TOKEN_IDS:
        vocab = int(spec.role.get("vocab") or 2)
        return f"ids < {vocab} (the embedding table's rows)" if vocab > 2 else "{0, 1}"
    true_at = f" (True at the {spec.role['true_at']})" if spec.role.get("true_at") else ""
    if kind is RoleKind.PADDING_MASK:
        keys = spec.role.get("key_axis", 1)
        return "padding mask" + true_at + (f", keys on axis {keys}" if keys != len(spec.shape) - 1 else "")
    if kind is RoleKind.MASK:  # graph/mask_reading.py: a mask with a query axis
        return f"mask{true_at}, random, key 0 kept in every row"
    if kind is RoleKind.ADDITIVE_MASK:
        return "additive mask: normal where kept, -1e4 where not, key 0 kept in every row"
    if kind is RoleKind.FLOAT and spec.dtype.kind in "iu":
        return "{0, 1}"
    if kind is RoleKind.LENGTH:  # linked to the dims (roles.LINKED_LENGTHS)
        add = int(spec.role.get("add", 0))
        return " + ".join(map(str, spec.role.get("of", ()))) + (f" {'+' if add > 0 else '-'} {abs(add)}" if add else "")
    return {RoleKind.FLOAT: "normal", RoleKind.CACHE: "normal",
            RoleKind.POSITION_IDS: "positions after the cache"}.get(kind, kind.value)


def feeds_in(model: onnx.ModelProto, domains: dict[str, str], *, dims: dict, seed: int,
             specs: list[InputSpec] | None = None) -> dict[str, np.ndarray]:
    """make_feeds' feed dict, with the inputs named in `domains` drawn from those domains instead."""
    specs = specs if specs is not None else input_specs(model)
    feeds = make_feeds(model, dims=dims, seed=seed, specs=specs)
    rng = np.random.default_rng([seed, 7])
    for spec in specs:
        domain = domains.get(spec.name)
        if domain is None or domain == ladder(spec)[0]:
            continue
        shape, dtype = feeds[spec.name].shape, spec.dtype
        value: np.ndarray
        if domain == "positive":
            value = np.abs(rng.standard_normal(shape)) + 0.1
        elif domain == "[0, 1]":
            value = rng.uniform(0.0, 1.0, shape)
        elif domain == "zero":
            value = np.zeros(shape)
        elif domain == "lengths within the sequence":
            value = rng.integers(1, max(dim_value("seq", dims), 1) + 1, size=shape)
        else:
            continue
        feeds[spec.name] = value.astype(dtype)
    return feeds


def random_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Every node that draws random values, in If/Loop/Scan bodies too."""
    found = []

    def walk(graph: onnx.GraphProto):
        for node in graph.node:
            if node.op_type in RANDOM_OPS and node.domain in ("", "ai.onnx"):
                found.append(node)
            for a in node.attribute:
                for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs):
                    walk(g)

    walk(model.graph)
    return found


def node_seed(node: onnx.NodeProto) -> float:
    """The seed a random node gets for a comparison: its own, else one derived from its name, so the
    original and the rewritten model (which keeps the node's name) draw the same values."""
    own = next((a.f for a in node.attribute if a.name == "seed"), None)
    return own if own is not None else float(zlib.crc32(f"{node.op_type}:{node.name}".encode()) % 100003)


def with_seeds(model: onnx.ModelProto, seeds: dict[str, float]) -> onnx.ModelProto:
    """A copy of `model` (the weights shared by reference, not copied twice) whose random nodes named in
    `seeds` have those seed attributes; `model` itself is not modified."""
    seeded = onnx.ModelProto()
    with weights_aside(model) as weights:  # copy the structure, not the weights
        seeded.CopyFrom(model)
    attach_weights(seeded, weights)
    for node in random_nodes(seeded):
        if node.name in seeds:
            kept = [a for a in node.attribute if a.name != "seed"]
            del node.attribute[:]
            node.attribute.extend(kept + [onnx.helper.make_attribute("seed", float(seeds[node.name]))])
    return seeded
