"""A torch module exported in memory, as the tests that write small model code (a learned probe, a router,
Swin-v2's cosine attention) need it: TorchScript exporter, no file, the exporter's warnings silenced.
torch is imported when called, so importing this module costs nothing."""

from __future__ import annotations

import io
import warnings

import onnx


def export_module(module, args: tuple, names: list[str], axes: dict, *, opset: int = 17,
                  output_names: list[str] | None = None) -> onnx.ModelProto:
    """`module` in eval mode, exported with torch.onnx.export(dynamo=False) for inputs `args` named `names`
    with dynamic `axes`."""
    import torch

    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, buf, input_names=names, output_names=output_names,
                          dynamic_axes=axes, opset_version=opset, dynamo=False)
    return onnx.load_from_string(buf.getvalue())
