"""Swin's shifted-window mask (issue 18): a constant [nW, S, S] additive mask added to the logits viewed
[B*nW, N, S, S] -> [B, nW, N, S, S] (Swin-v2 adds it twice) and viewed back. The view splits the op's
batch axis in two; its sizes are what the Reshape target says, computed at run time (nW from the mask's
shape) or written as a constant, never a size borrowed from another axis (the heads). Torch exports of
a window attention written as Hugging Face's Swin writes it."""

import collections
import io
import warnings

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch", reason="the exports need torch")

from trtattn.match.axes import Atoms, regroup  # noqa: E402
from trtattn.rewrite.fuse import fuse_model  # noqa: E402

WINDOWS, SEQ, DIM, HEADS = 4, 16, 16, 2


class WindowAttention(torch.nn.Module):
    """x [B, nW, S, D]: self-attention inside each window, with a -100/0 mask per window added `times`
    times (Swin 1, Swin-v2 2). computed_windows: the mask is cut to x's windows at run time, so nW in the
    logits' view is read from the mask's shape (Swin computes its mask from the image size)."""

    def __init__(self, times=1, computed_windows=True):
        super().__init__()
        self.times, self.computed = times, computed_windows
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        g = torch.Generator().manual_seed(0)
        self.register_buffer("mask", torch.where(torch.rand(WINDOWS, SEQ, SEQ, generator=g) < 0.3, -100.0, 0.0))

    def forward(self, x):
        b, nw, s, d = x.shape
        x = x.reshape(-1, s, d)
        q, k, v = self.qkv(x).reshape(-1, s, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / (d // HEADS) ** 0.5
        mask = self.mask[:nw] if self.computed else self.mask
        mask_shape = mask.shape[0]
        scores = scores.view(scores.shape[0] // mask_shape, mask_shape, HEADS, s, s)
        for _ in range(self.times):
            scores = scores + mask.unsqueeze(1).unsqueeze(0)
        scores = scores.view(-1, HEADS, s, s)
        out = torch.softmax(scores, -1) @ v
        return out.transpose(1, 2).reshape(b, nw, s, d)


def export(module, computed=True) -> onnx.ModelProto:
    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.randn(2, WINDOWS, SEQ, DIM),), buf, input_names=["x"],
                          dynamic_axes={"x": {0: "batch", 1: "windows"} if computed else {0: "batch"}},
                          opset_version=17, dynamo=False)
    return onnx.load_from_string(buf.getvalue())


@pytest.mark.parametrize("times", [1, 2])
@pytest.mark.parametrize("computed", [True, False], ids=["nW-computed", "nW-constant"])
def test_window_mask_after_a_batch_split_is_fused(times, computed):
    torch.manual_seed(0)
    result = fuse_model(export(WindowAttention(times, computed), computed))
    assert [r.status for r in result.reports] == ["fused"], [r.row() for r in result.reports]
    assert result.ok and result.verification.max_abs_err <= 1e-4
    ops = collections.Counter(n.op_type for n in result.model.graph.node)
    assert ops["Attention"] == 1 and ops["Softmax"] == 0
    # the mask matters: the fused model without it would differ (so the numbers above checked it)
    assert result.reports[0].site.mask.value == "additive"


def test_window_mask_fused_model_runs_at_other_batches():
    """The batch split's sizes are read at run time: the fused model matches at batches 1 and 3 too."""
    ort = pytest.importorskip("onnxruntime", reason="running the models needs onnxruntime")
    torch.manual_seed(0)
    model = export(WindowAttention(2, True))
    result = fuse_model(model)
    assert result.ok
    a = ort.InferenceSession(model.SerializeToString())
    b = ort.InferenceSession(result.model.SerializeToString())
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, WINDOWS, SEQ, DIM)).astype(np.float32)
        np.testing.assert_allclose(b.run(None, {"x": x})[0], a.run(None, {"x": x})[0], atol=1e-5)


def test_batch_split_takes_no_size_from_another_axis():
    """[B*nW, 2, 16, 16] -> [?, ?, 2, 16, 16]: the split of the unknown batch is two unknown parts, not a part of
    size 2 borrowed from the heads' dim (which put nW = 2 into the rewrite: an Expand that failed)."""
    atoms = Atoms()
    for name, size in (("x0", None), ("x1", 2), ("m", 16), ("n", 16)):
        atoms.new(name, size)
    frame = (("x0",), ("x1",), ("m",), ("n",))
    out = regroup(atoms, frame, ["unk__1", 2, 16, 16], ["unk__2", "unk__3", 2, 16, 16], "Reshape r")
    assert out == (("x0.0",), ("x0.1",), ("x1",), ("m",), ("n",))
    assert atoms.known("x0.0") is None and atoms.known("x0.1") is None
    # a static part still lands where the other side says its size: [B*4, ...] -> [?, 4, ...]
    atoms = Atoms()
    for name, size in (("x0", None), ("x1", 2), ("m", 16), ("n", 16)):
        atoms.new(name, size)
    out = regroup(atoms, frame, ["unk__1", 2, 16, 16], ["unk__2", 4, 2, 16, 16], "Reshape r")
    assert out == (("x0.0",), ("x0.1",), ("x1",), ("m",), ("n",)) and atoms.known("x0.1") == 4
