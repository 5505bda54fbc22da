"""trtattn/rewrite/verdicts.py: what a failing site tries next, as a value (a Fallback) the fuse loop applies:
its rotation left outside the op first, then its returned logits computed beside the op, else kept with why."""

from __future__ import annotations

from trtattn.rewrite.verdicts import fallback, logits_beside, rotation_dropped
from trtattn.site import AttentionSite, Rope, RopeKind, SiteKind, SiteOutcome, SiteStatus

ROPE = Rope(RopeKind.HALF_SPLIT, 8, "cos", "sin", "q0", "k0", op_caches=True)


def _site(**changes) -> AttentionSite:
    return AttentionSite(name="attn", kind=SiteKind.SELF, query="q", key="k", value="v", output="y").replace(**changes)


def test_the_rotation_goes_first_then_the_logits_and_deciding_changes_nothing():
    outcome = SiteOutcome(_site(rope=ROPE, qk_output="logits", qk_mode=0))
    first = fallback(outcome, "off by 0.5")
    assert outcome.site.rope is ROPE  # a decision is a value: nothing applied yet
    first.apply()
    assert outcome.site.rope is None and outcome.site.qk_output == "logits" and outcome.status == SiteStatus.FUSED
    assert "left as the graph computes it" in outcome.site.notes[-1]
    fallback(outcome, "off by 0.5").apply()
    assert outcome.site.qk_output is None and "computed beside the op" in outcome.site.notes[-1]
    fallback(outcome, "off by 0.5").apply()
    assert outcome.status == SiteStatus.NOT_FUSED and outcome.reason == "off by 0.5"


def test_nothing_to_leave_out():
    assert rotation_dropped(_site(rope=Rope(RopeKind.HALF_SPLIT, 8, "cos", "sin", "q0", "k0"))) is None
    assert logits_beside(_site(qk_output="probs", qk_mode=3)) is None  # the probabilities have no other way out
    assert logits_beside(_site()) is None
