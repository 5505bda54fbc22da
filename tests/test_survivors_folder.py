"""Tests for the survivors of mutating trtattn/folder.py (benchmarks/mutate.py, base d3efd07), on small folders
written here (tests/test_folder.py's run on zoo exports): the report's rows and verdicts, the refusals before any
work, and one folder fused with a model to fuse, one to copy with its data file, and plain files."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import onnx
import pytest

from tests.conftest import sha256
from trtattn.errors import TrtattnError
from trtattn.folder import FileResult, FolderResult, check_folders, process_folder
from trtattn.rewrite.fuse import SiteReport
from trtattn.rewrite.normalize import SiteNormalization
from trtattn.site import AttentionSite, SiteKind, SiteStatus
from trtattn.testing.graphs import attention_model
from trtattn.verification import Verification


def _site(name: str = "attn") -> AttentionSite:
    return AttentionSite(name=name, kind=SiteKind.SELF, query="q", key="k", value="v", output="y")


def test_a_files_row_counts_what_was_done_and_what_was_not():
    sites = [SiteReport(_site()), SiteReport(_site(), SiteStatus.NOT_FUSED, "why"),
             SiteNormalization(_site(), SiteStatus.REWRITTEN), SiteNormalization(_site(), SiteStatus.SKIPPED, "why"),
             SiteNormalization(_site(), SiteStatus.KEPT, "already")]
    row = FileResult("m.onnx", "fused", sites, verification=Verification(passed=True, max_abs_err=1.5e-6)).row()
    assert row == {"file": "m.onnx", "action": "fused", "sites": 5, "done": 2, "not_done": 2, "ok": True,
                   "verification": "passed (1.5e-06)"}


@pytest.mark.parametrize("verification,verdict", [
    (Verification.nothing(), "-"), (Verification(note="no input"), "no input"), (Verification(), "not run"),
    (Verification(passed=False, max_abs_err=0.25), "FAILED (0.25)"), (Verification(passed=True), "passed"),
])
def test_the_verdict_says_passed_failed_or_why_not_run(verification, verdict):
    assert FileResult("m.onnx", "fused", verification=verification).row()["verification"] == verdict


def test_the_folder_report_lists_files_sites_and_ignored_by_file(tmp_path):
    fused, failed = SiteReport(_site("a")), SiteReport(_site("b"), SiteStatus.NOT_FUSED, "why")
    files = [FileResult("a.onnx", "fused", [fused], [{"name": "n", "reason": "r"}], Verification(passed=True)),
             FileResult("config.json", "copied"),
             FileResult("b.onnx", "not written", [failed], ok=False)]
    result = FolderResult(tmp_path, None, files)
    assert not result.ok and [f.path for f in result.models] == ["a.onnx", "b.onnx"]
    report = result.report()
    assert report["output"] is None and report["ok"] is False
    assert report["sites"] == [{"file": "a.onnx", **fused.row()}, {"file": "b.onnx", **failed.row()}]
    assert [(r["name"], r["status"]) for r in report["sites"]] == [("a", "fused"), ("b", "not fused")]
    assert report["ignored"] == [{"file": "a.onnx", "name": "n", "reason": "r"}]
    assert report["verification"] == {"a.onnx": {"passed": True}, "b.onnx": {}}
    assert FolderResult(tmp_path, tmp_path / "o", files[:2]).report()["ok"] is True


def test_folders_are_refused_before_any_work(tmp_path):
    src = tmp_path / "src"
    (src / "inner").mkdir(parents=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(TrtattnError, match="file: not a folder"):
        check_folders(tmp_path / "file", tmp_path / "out", False)
    for out in (src, src / "inner", tmp_path):
        with pytest.raises(TrtattnError, match="it is the input folder .*, inside it or around it"):
            check_folders(src, out, True)
    (tmp_path / "taken").mkdir()
    with pytest.raises(TrtattnError, match="taken exists \\(use --force to replace it\\)"):
        check_folders(src, tmp_path / "taken", False)
    assert check_folders(src, tmp_path / "taken", True) == (src, tmp_path / "taken")
    with pytest.raises(TrtattnError, match="file exists and is not a folder"):
        check_folders(src, tmp_path / "file", True)
    with pytest.raises(TrtattnError, match="unknown folder mode 'squash'"):
        process_folder(src, tmp_path / "out", mode="squash")
    with pytest.raises(TrtattnError, match="a directory with no ONNX model"):
        process_folder(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.fixture()
def export(tmp_path):
    """model.onnx (an attention to fuse), sub/head.onnx (no attention) with its weight in head.bin, and
    config files."""
    folder = tmp_path / "export"
    (folder / "sub").mkdir(parents=True)
    onnx.save(attention_model(), str(folder / "model.onnx"))
    head = onnx.helper.make_graph(
        [onnx.helper.make_node("MatMul", ["x", "w"], ["y"])], "head",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])],
        [onnx.numpy_helper.from_array(np.ones((8, 4), np.float32), "w")])
    onnx.save(onnx.helper.make_model(head, opset_imports=[onnx.helper.make_opsetid("", 17)]),
              str(folder / "sub" / "head.onnx"), save_as_external_data=True, location="head.bin", size_threshold=0)
    (folder / "config.json").write_text(json.dumps({"model_type": "test"}))
    (folder / "sub" / "notes.txt").write_text("kept as it is")
    return folder


def _snapshot(folder):
    return {str(p.relative_to(folder)): sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_folder_is_fused_model_by_model_and_every_other_file_copied(export, tmp_path):
    before = _snapshot(export)
    out = tmp_path / "out"
    result = process_folder(export, out)
    assert result.ok and result.output == out
    assert {f.path: f.action for f in result.files} == {
        "config.json": "copied", "model.onnx": "fused", "sub/head.onnx": "unchanged", "sub/notes.txt": "copied"}
    assert _snapshot(export) == before  # the input only read
    written = _snapshot(out)
    assert set(written) == {"config.json", "model.onnx", "sub/head.onnx", "sub/head.bin", "sub/notes.txt"}
    for same in ("config.json", "sub/head.onnx", "sub/head.bin", "sub/notes.txt"):
        assert written[same] == before[same], same
    assert [n.op_type for n in onnx.load(str(out / "model.onnx")).graph.node].count("Attention") == 1
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~_umask()  # not mkdtemp's 0700
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "out"]  # no scratch left beside it


def test_a_model_with_an_attention_not_fused_stops_the_folder_unless_partial(export, tmp_path):
    from tests.match.logit_ops.test_mul_mask import multiplied

    unfusable = multiplied(attention_model(opset=18, mask_style="additive_input"), "mul", "attention_mask",
                           offset=False)  # a product with no offset after it: listed, not fused
    onnx.save(unfusable, str(export / "model.onnx"))
    out = tmp_path / "out"
    result = process_folder(export, out)
    assert not result.ok and result.output is None and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # the scratch removed
    model = next(f for f in result.files if f.path == "model.onnx")
    assert not model.ok and model.row()["not_done"] == 1
    result = process_folder(export, out, allow_partial=True)
    assert not result.ok and result.output == out and (out / "model.onnx").is_file()
    assert _snapshot(out)["model.onnx"] == _snapshot(export)["model.onnx"]  # nothing fused: copied as it was
    out_again = process_folder(export, out, force=True)  # an existing output replaced only with force
    assert out_again.output is None and (out / "model.onnx").is_file()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_folder_is_normalized_model_by_model(export, tmp_path):
    result = process_folder(export, tmp_path / "out", mode="normalize")
    actions = {f.path: f.action for f in result.files}
    assert result.ok and actions["model.onnx"] == "normalized" and actions["sub/head.onnx"] == "unchanged"
    (site,) = next(f for f in result.files if f.path == "model.onnx").sites
    assert site.status == SiteStatus.REWRITTEN and site.row()["action"] == "rewritten"  # normalize's words
