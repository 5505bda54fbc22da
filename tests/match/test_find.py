"""trtattn/match/find.py: finding the sites, and what keeps one from fusing."""

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from tests.conftest import site_statuses
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.graphs import attention_model


# Survivors of issue 20's mutation run (benchmarks/mutate.py):
# each test fails when the line its docstring names is mutated.
def baked_length_model(seq=6, head=8, which=(0, 1, 2)):
    """attention_model's rank-3 export with Q, V and K (`which`: their order in the graph) merged to [B*N, S, H]
    by a constant Reshape target [-1, 6, 8] instead of one read from Shape: at any other length it attends
    within blocks of 6. (K's alone baked fuses: the original then fails at other lengths, so nothing differs.)"""
    g = gs.import_onnx(attention_model(rank=3, seq=seq, head=head))
    merges = []
    for node in g.nodes:
        target = node.inputs[1] if node.op == "Reshape" else None
        if target is not None and target.inputs and target.inputs[0].op == "Concat":
            first = target.inputs[0].inputs[0]
            if isinstance(first, gs.Constant) and list(first.values) == [-1]:  # the [B*N] merge of Q, V or K
                merges.append(node)
    assert len(merges) == 3
    for i in which:
        merges[i].inputs[1] = gs.Constant(f"baked_{i}", np.array([-1, seq, head], np.int64))
    g.cleanup()
    return gs.export_onnx(g)


def test_length_baked_into_the_head_merge_is_not_fused():
    """find.py:121 (the baked-length check): without it the site is fused and verified at the one length
    the graph was built for, and written; at another length it is off by 1.57."""
    result = fuse_model(baked_length_model())
    assert not result.ok
    [(status, reason)] = site_statuses(result)
    assert status == "not fused" and "writes the query length 6" in reason and "symbolic" in reason, reason


@pytest.mark.parametrize("kv_heads, note", [(2, "GQA head repeat x2 dropped"), (4, None)])
def test_the_report_says_a_gqa_repeat_was_dropped_only_where_there_was_one(kv_heads, note):
    from trtattn.match import match

    [site] = match(attention_model(heads=4, kv_heads=kv_heads)).sites
    repeats = [n for n in site.notes if "GQA head repeat" in n]
    assert repeats == ([note] if note else [])
