"""A real SHA model from torch code: a tiny module that runs its attention one head at a time in a Python
loop (`q[:, :, i]`, `torch.stack(outs, 2)`), as NPU-targeted model code does, exported by torch.onnx."""

from __future__ import annotations

from pathlib import Path


def export_sha(path: str | Path, *, dynamo: bool, layers: int = 2, dim: int = 32, heads: int = 4, seed: int = 0) -> Path:
    """Write the model to `path` (TorchScript at opset 17, or dynamo), with dynamic batch and length; random weights.
    Inputs x [B, T, dim] and attention_mask [B, T, T] (int64, 0 where a key is masked)."""
    import torch

    class SingleHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (torch.nn.Linear(dim, dim) for _ in range(4))

        def forward(self, x, mask):
            b, t, _ = x.shape
            size = dim // heads
            q, k, v = (f(x).view(b, t, heads, size) for f in (self.q, self.k, self.v))
            bias = (mask == 0).float() * -10000.0
            outs = []
            for i in range(heads):
                logits = (q[:, :, i] * size ** -0.5) @ k[:, :, i].transpose(1, 2) + bias
                outs.append(logits.softmax(-1) @ v[:, :, i])
            return x + self.o(torch.stack(outs, 2).reshape(b, t, dim))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([SingleHeads() for _ in range(layers)])

        def forward(self, x, mask):
            for layer in self.layers:
                x = layer(x, mask)
            return x

    torch.manual_seed(seed)
    net = Net().eval()
    args = (torch.randn(2, 6, dim), torch.ones(2, 6, 6, dtype=torch.int64))
    path = Path(path)
    names = ["x", "attention_mask"]
    if dynamo:
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
        torch.onnx.export(net, args, str(path), input_names=names, dynamo=True,
                          dynamic_shapes={"x": {0: batch, 1: seq}, "mask": {0: batch, 1: seq, 2: seq}})
    else:
        torch.onnx.export(net, args, str(path), input_names=names, dynamo=False, opset_version=17,
                          dynamic_axes={"x": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq", 2: "seq"}})
    return path
