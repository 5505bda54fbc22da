"""Not attention stays out, the same way in every layer (match/likeness.py: one decision with its reason), and an
integer softmax between the two products is listed, not passed over (issue 32)."""

from __future__ import annotations

import re

import pytest

from trtattn.graph.view import GraphView, import_graph
from trtattn.match import match
from trtattn.match.likeness import likeness
from trtattn.rewrite.fuse import fuse_model
from trtattn.testing.not_attention import not_attention_model


def _unnamed(reason: str) -> str:
    return re.sub(r"\b[A-Za-z]+_\d+\b", "N", reason)


@pytest.mark.parametrize("kind,ignored,why", [
    ("router", 1, "a classifier head or a router"),
    ("nystrom", 1, "weigh no values of the input independent of themselves"),
    ("linear", 2, "summed over its queries"),
])
def test_what_is_not_attention_is_ignored_with_its_reason_in_every_layer(kind, ignored, why):
    result = fuse_model(not_attention_model(kind))
    assert result.ok, [(r.site.name, r.reason) for r in result.reports]
    assert len(result.ignored) == 2 * ignored
    assert all(r.site.q_heads for r in result.reports)
    per_layer = [sorted(_unnamed(i.reason) for i in result.ignored[k * ignored:(k + 1) * ignored]) for k in (0, 1)]
    assert per_layer[0] == per_layer[1]  # identically in both layers
    assert any(why in i.reason for i in result.ignored)


def test_the_attention_kernels_of_nystrom_still_fuse():
    result = fuse_model(not_attention_model("nystrom"))
    assert sum(r.row()["status"] == "fused" for r in result.reports) == 6  # the MHA and kernels 1 and 3, twice


def test_an_integer_softmax_between_the_products_is_listed_in_every_layer():
    result = fuse_model(not_attention_model("integer"))
    listed = [r for r in result.reports if r.row()["status"] == "not fused"]
    assert not result.ok and len(listed) == 2
    assert all("an integer softmax" in r.reason for r in listed)
    assert _unnamed(listed[0].reason) == _unnamed(listed[1].reason)


def test_a_model_whose_only_softmaxes_are_integer_ones_is_not_said_to_have_no_attention():
    result = fuse_model(not_attention_model("integer", attention=False))
    assert result.verification.get("note") != "no attention found"
    assert len(result.reports) == 2 and not result.ok


def test_one_decision_gives_a_typed_verdict():
    model = not_attention_model("linear", layers=1)
    graph = import_graph(model)
    view = GraphView(graph, model)
    match(graph, view)
    verdicts = {n.name: likeness(view, n) for n in graph.nodes if n.op == "Softmax"}
    assert [v.attention for v in verdicts.values()] == [True, False, False]
    assert all(v.reason for v in verdicts.values() if not v.attention)
