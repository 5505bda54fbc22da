"""rewrite/fuse.py: a multi-head site merged from single-head ones that does not fuse gives way to its heads."""

from __future__ import annotations

from trtattn.match import analyse
from trtattn.rewrite.fuse import NOT_FUSED, _site_report, _unmerge
from trtattn.site import SiteStatus
from trtattn.testing.sha import sha_model


def test_a_merged_site_that_fails_is_replaced_by_its_heads_with_why():
    _, result, meanings = analyse(sha_model(layers=1), merge=True)
    (site,) = result.sites
    assert len(site.merged) == 4 and list(result.heads_merged) == [site.name]
    reports = [_site_report(site, meanings)]
    assert not _unmerge(reports, result.heads_merged, meanings)  # fused: nothing to do
    reports[0].status, reports[0].reason = NOT_FUSED, "verification failed: max abs error 1"
    assert _unmerge(reports, result.heads_merged, meanings)
    assert [r.site.name for r in reports] == list(site.merged)
    assert all(r.status == SiteStatus.FUSED and r.site.q_heads == 1 for r in reports)
    assert all("did not fuse (verification failed: max abs error 1): fused one head at a time" in r.site.notes[-1]
               for r in reports)
    assert not _unmerge(reports, result.heads_merged, meanings)  # once only
