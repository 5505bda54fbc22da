"""trtattn/cli/fuse_trt.py: `trtattn fuse --ops trt`, its exit status and what it writes."""

from tests.conftest import tampering
from trtattn.routes.prepare import forms


# Survivors of issue 20's mutation run (benchmarks/mutate.py):
# each test fails when the line its docstring names is mutated.
def test_fuse_ops_trt_exits_nonzero_and_writes_nothing_when_its_check_fails(zoo_export, tmp_path, monkeypatch,
                                                                             capsys):
    """cli/fuse_trt.py:79 (exit status): ViT's padded form is not re-verified (nothing lowered), so only the
    TensorRT-op model's check sees the tampered weights: it fails, nothing is written, the exit status is 1."""
    from trtattn.cli import main

    monkeypatch.setattr(forms, "verify_form", tampering(forms.verify_form))
    out = tmp_path / "vit.trt.onnx"
    code = main(["-q", "fuse", str(zoo_export("vit", "torchscript")), "-o", str(out), "--ops", "trt",
                 "--precision", "fp32"])
    printed = capsys.readouterr().out
    assert code == 1 and "not written" in printed, printed
    assert not out.exists() and not out.with_suffix(".json").exists()
