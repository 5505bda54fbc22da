"""Which 2-D mask inputs an Attention op reads as per-row key flags, so that the padded and kv-cache forms
may give IAttention their row sums as key_value_lengths: decided by axes, measured, never by name or dtype.

A mask input is read as lengths only when its axis 0 lands on the logits' batch axis and its axis 1 on
their key axis, every query row and head reading the same flag (a [B, S] padding mask). A [Sq, Skv] mask
(axis 0 on the query axis, broadcast over the batch) or one whose key flags differ per query row is a
general mask, which IAttention takes as its mask (op_fit.py).

Measured on the fused model: the Attention's mask is evaluated (ONNX Runtime, one session over the nodes it
needs) with the input keeping every token, then with one token dropped at a cell (b, j); the Attention
mask, broadcast to [B, N, Sq, Skv] as ONNX does, must change at batch row b and key j only, and where j is
the first key, at every query row (graph/mask_reading.reads_key_flags: the cells a toggle changes are located
on the logits' axes as the feeds' mask reading locates them). Two cells, (1, 0) and (0, 1), so that the two
axes cannot trade places.
Whether the rows are prefixes (right padding) is what the form's verification then checks on ONNX Runtime.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from ...graph.evaluate import evaluator
from ...graph.feeds import make_feeds
from ...graph.mask_reading import keep_value, reads_key_flags
from ...graph.roles import InputSpec, input_specs

MASK = 3  # ONNX Attention's attn_mask input


def key_flag_masks(graph: gs.Graph, model: onnx.ModelProto, candidates: dict[str, str], dims=None) -> set[str]:
    """The Attention nodes of `candidates` (node -> the 2-D mask input its attn_mask's values come from)
    whose attn_mask reads that input as [batch, key] flags (module doc)."""
    nodes = {n.name: n for n in graph.nodes if n.name in candidates}
    if not nodes:
        return set()
    names = sorted(nodes)
    run = evaluator(graph, [nodes[n].inputs[MASK] for n in names], model)
    specs = {s.name: s for s in input_specs(model)}
    feeds = make_feeds(model, dims=dims, padding=False, specs=list(specs.values()))
    base = dict(zip(names, run(feeds)))
    found = set(names)
    for source in sorted(set(candidates[n] for n in names)):
        rows, width = feeds[source].shape
        for cell in sorted({(min(1, rows - 1), 0), (0, min(1, width - 1))}):
            changed = dict(zip(names, run({**feeds, source: _dropped(specs[source], (rows, width), cell)})))
            found -= {n for n in names if candidates[n] == source and not reads_key_flags(base[n], changed[n], cell,
                                                                                       (rows, width))}
    return found


def _dropped(spec: InputSpec, shape: tuple[int, int], cell: tuple[int, int]) -> np.ndarray:
    """The mask keeping every token but the one at `cell`, in the input's convention."""
    keep = np.ones(shape, bool)
    keep[cell] = False
    return keep_value(spec, keep, additive=False)
