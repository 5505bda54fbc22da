"""A rotation read by what it computes (match/rotation.py) written back as the ONNX RotaryEmbedding op (opset 23),
on the caches and position ids it was read from: the body it replaces goes with the graph's cleanup."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from ..graph.rotary import OP, RotaryAttrs, is_rotary
from ..site import AttentionSite
from ..site_names import site_scope


def write_rotations(graph: gs.Graph, tensors: dict, site: AttentionSite) -> int:
    """One RotaryEmbedding op in place of each rotated operand of `site` (Q, K); how many were written."""
    rope = site.rope
    if rope is None or not rope.op_caches:
        return 0
    tables = [tensors[rope.cos], tensors[rope.sin]] + ([tensors[rope.position_ids]] if rope.position_ids else [])
    attrs = RotaryAttrs(rope.interleaved, rope.rotary_embedding_dim, rope.num_heads or 0).as_attrs()
    sides = [(side, tensors[x], tensors[y]) for side, x, y in (("q", rope.q_input, rope.q_output),
                                                                 ("k", rope.k_input, rope.k_output))]
    count = 0  # every name resolved above: from here nothing raises, the graph changes whole or not at all
    for side, x, out in sides:
        if out.inputs and is_rotary(out.inputs[0].op, out.inputs[0].domain):  # already written (a rotation two sites share)
            continue
        out.inputs.clear()
        graph.nodes.append(gs.Node(OP, site_scope(site.name, "rope", side), dict(attrs),
                                   inputs=[x, *tables], outputs=[out]))
        count += 1
    return count
