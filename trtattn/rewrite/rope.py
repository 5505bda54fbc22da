"""A rotation read by what it computes (match/rotation.py) written back as the ONNX RotaryEmbedding op (opset 23),
on the caches and position ids it was read from: the body it replaces goes with the graph's cleanup."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ..site import AttentionSite
from ..site_names import site_scope


def write_rotations(graph: gs.Graph, tensors: dict, site: AttentionSite) -> int:
    """One RotaryEmbedding op in place of each rotated operand of `site` (Q, K); how many were written."""
    rope = site.rope
    if rope is None or not rope.op_caches:
        return 0
    tables = [tensors[rope.cos], tensors[rope.sin]] + ([tensors[rope.position_ids]] if rope.position_ids else [])
    attrs = {"interleaved": int(rope.interleaved), "rotary_embedding_dim": rope.rotary_embedding_dim}
    if rope.num_heads:
        attrs["num_heads"] = rope.num_heads
    sides = [(side, tensors[x], tensors[y]) for side, x, y in (("q", rope.q_input, rope.q_output),
                                                                 ("k", rope.k_input, rope.k_output))]
    count = 0  # every name resolved above: from here nothing raises, the graph changes whole or not at all
    for side, x, out in sides:
        if out.inputs and out.inputs[0].op == "RotaryEmbedding":  # already written (a rotation two sites share)
            continue
        out.inputs.clear()
        graph.nodes.append(gs.Node("RotaryEmbedding", site_scope(site.name, "rope", side), dict(attrs),
                                   inputs=[x, *tables], outputs=[out]))
        count += 1
    return count
