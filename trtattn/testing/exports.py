"""A torch module exported to an ONNX model, as the tests that write small model code (a learned probe, a router,
Swin-v2's cosine attention) need it: TorchScript exporter, a temporary file, the exporter's warnings silenced.
torch is imported when called, so importing this module costs nothing."""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import onnx


def export_module(module, args: tuple, names: list[str], axes: dict, *, opset: int = 17,
                  output_names: list[str] | None = None) -> onnx.ModelProto:
    """`module` in eval mode, exported with torch.onnx.export(dynamo=False) for inputs `args` named `names`
    with dynamic `axes`."""
    import torch

    with tempfile.TemporaryDirectory() as tmp, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = Path(tmp) / "model.onnx"
        torch.onnx.export(module.eval(), args, path, input_names=names, output_names=output_names,
                          dynamic_axes=axes, opset_version=opset, dynamo=False)
        return onnx.load(path)
