"""rewrite/fuse.py: a multi-head site merged from single-head ones that does not fuse gives way to its heads.

rewrite/fuse.py: a site's reason is never a Python exception's own text; an unexpected exception is a crash,
exit 3 (issue 34, Gemma 2: "the rewritten model does not run: 'bool' object has no attribute 'max_absdiff'")."""

from __future__ import annotations

import json

import numpy as np
import onnx

from trtattn.cli import main
from trtattn.match import analyse
from trtattn.rewrite.fuse import NOT_FUSED, _site_report, _unmerged
from trtattn.site import SiteStatus
from trtattn.testing.contrib_graphs import group_query_feeds, group_query_model
from trtattn.testing.sha import sha_model


def test_a_merged_site_that_fails_is_replaced_by_its_heads_with_why():
    _, result, meanings = analyse(sha_model(layers=1), merge=True)
    (site,) = result.sites
    assert len(site.merged) == 4 and list(result.heads_merged) == [site.name]
    reports = [_site_report(site, meanings)]
    assert not _unmerged(reports, result.heads_merged, meanings)  # fused: nothing to do
    reports[0].status, reports[0].reason = NOT_FUSED, "verification failed: max abs error 1"
    (split,) = _unmerged(reports, result.heads_merged, meanings)
    assert [r.site.name for r in reports] == [site.name]  # a decision: nothing changes until it is applied
    split.apply()
    assert [r.site.name for r in reports] == list(site.merged)
    assert all(r.status == SiteStatus.FUSED and r.site.q_heads == 1 for r in reports)
    assert all("did not fuse (verification failed: max abs error 1): fused one head at a time" in r.site.notes[-1]
               for r in reports)
    assert not _unmerged(reports, result.heads_merged, meanings)  # once only


def _gemma2_shared_buffer(tmp_path):
    """Gemma 2's sliding layer (window 8, softcap 50) as GroupQueryAttention, fed as ONNX Runtime GenAI feeds
    a shared past/present buffer: a past of capacity 16 holding 8 tokens, one new. GQA's present keeps the
    buffer's 16 rows; the fused Attention op concatenates (17): the shapes differ."""
    model = group_query_model(local_window_size=8, softcap=50.0)
    onnx.save(model, tmp_path / "gemma2.onnx")
    feeds = group_query_feeds(1, 1, 16, seqlens=[8])
    feeds["total_sequence_length"] = np.array(9, dtype=np.int32)
    np.savez(tmp_path / "feeds.npz", **feeds)
    return tmp_path / "gemma2.onnx", tmp_path / "feeds.npz"


def test_an_output_of_another_shape_is_a_reason_naming_the_shapes(tmp_path):
    model, feeds = _gemma2_shared_buffer(tmp_path)
    report = tmp_path / "r.json"
    code = main(["-q", "fuse", str(model), "-o", str(tmp_path / "f.onnx"), "--inputs", str(feeds),
                 "--report", str(report)])
    assert code == 1 and not (tmp_path / "f.onnx").exists()
    written = json.loads(report.read_text())
    (row,) = written["sites"]
    assert row["status"] == "not fused"
    assert "'present_key' has shape [1, 2, 17, 8] where the original's is [1, 2, 16, 8]" in row["reason"]
    assert "attribute" not in row["reason"]
    assert written["verification"]["shapes_differ"]["present_key"] == [[1, 2, 16, 8], [1, 2, 17, 8]]


def test_an_unexpected_exception_in_verification_is_a_crash_not_a_reason(tmp_path, monkeypatch, capsys):
    """Only what a model that does not run raises (ONNX Runtime's errors, Polygraphy's, ours) is a site's reason."""
    from trtattn.rewrite import fuse

    def broken(*args, **kwargs):
        raise AttributeError("'bool' object has no attribute 'max_absdiff'")

    model, feeds = _gemma2_shared_buffer(tmp_path)
    monkeypatch.setattr(fuse, "compare_models", broken)
    code = main(["-q", "fuse", str(model), "-o", str(tmp_path / "f.onnx"), "--inputs", str(feeds)])
    assert code == 3 and not (tmp_path / "f.onnx").exists()
    assert "internal error: AttributeError" in capsys.readouterr().err


def test_a_model_that_does_not_run_is_still_a_sites_reason(tmp_path, monkeypatch):
    """ONNX Runtime's own refusal (here: a kernel's) stays the site's reason, its first line."""
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    from trtattn.rewrite import fuse

    def refused(*args, **kwargs):
        raise Fail("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Attention node.")

    model, feeds = _gemma2_shared_buffer(tmp_path)
    monkeypatch.setattr(fuse, "compare_models", refused)
    report = tmp_path / "r.json"
    code = main(["-q", "fuse", str(model), "-o", str(tmp_path / "f.onnx"), "--inputs", str(feeds),
                 "--report", str(report)])
    (row,) = json.loads(report.read_text())["sites"]
    assert code == 1 and row["reason"].startswith("the rewritten model does not run: [ONNXRuntimeError] : 1 : FAIL")
