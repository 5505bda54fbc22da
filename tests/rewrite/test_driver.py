"""trtattn/rewrite/driver.py: each site rewritten in its scope, a failed rewrite's nodes rolled back and the site
kept with why; what the rewriter does not catch raises; the sites verified only over one key."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx_graphsurgeon as gs
import pytest

from trtattn.rewrite import driver
from trtattn.site import AttentionSite, SiteKind, SiteOutcome, SiteStatus


def _outcome(name: str, graph: tuple = ()) -> SiteOutcome:
    return SiteOutcome(AttentionSite(name=name, kind=SiteKind.SELF, query="q", key="k", value="v", output=f"{name}_y",
                                     graph=graph))


class _AddsThenMaybeFails(driver.SiteRewriter[gs.Graph, SiteOutcome]):
    catches = (ValueError,)

    def __init__(self, failing: dict[str, type[Exception]]):
        self.failing = failing

    def scope(self, graph, path):
        return driver.find_scope(graph, path)

    def nodes(self, scope):
        return scope.nodes

    def rewrite(self, scope, outcome):
        x = gs.Variable(f"{outcome.site.name}_in", dtype=np.float32)
        scope.nodes.append(gs.Node("Identity", f"{outcome.site.name}/id", inputs=[x], outputs=[gs.Variable("o")]))
        if outcome.site.name in self.failing:
            raise self.failing[outcome.site.name]("cannot write it")
        outcome.status = SiteStatus.FUSED

    def failed(self, outcome, error):
        outcome.refuse(SiteStatus.NOT_FUSED, f"{type(error).__name__}: {error}")


def test_a_failed_rewrite_leaves_no_node_and_says_why_the_others_stay_written():
    graph = gs.Graph()
    done, failed, elsewhere = _outcome("a"), _outcome("b"), _outcome("c", graph=(("no such node", "body"),))
    driver.rewrite_each(graph, [done, failed, elsewhere], _AddsThenMaybeFails({"b": ValueError}))
    assert [n.name for n in graph.nodes] == ["a/id"]
    assert done.status == SiteStatus.FUSED
    assert failed.status == SiteStatus.NOT_FUSED and failed.reason == "ValueError: cannot write it"
    assert elsewhere.status == SiteStatus.NOT_FUSED and elsewhere.reason.startswith("KeyError")


def test_what_the_rewriter_does_not_catch_raises():
    with pytest.raises(RuntimeError, match="cannot write it"):
        driver.rewrite_each(gs.Graph(), [_outcome("a")], _AddsThenMaybeFails({"a": RuntimeError}))


def test_the_sites_left_at_one_key_are_named():
    fit = SimpleNamespace(one_key={"a_y": (4, 1), "b_y": (1, 4)})
    assert driver.one_key(fit, [_outcome("a"), _outcome("b"), _outcome("c")]) == ["a"]
    assert driver.one_key(SimpleNamespace(), [_outcome("a")]) == []
