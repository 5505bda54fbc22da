"""Export a zoo entry with torch's TorchScript or dynamo ONNX exporter.

The exported model carries metadata (`trtattn.inputs`) describing what each input means, so that
verification feeds realistic data without guessing. Entries of the "dims" class carry only a
`trtattn.zoo` record (name, exporter, sites): they are exported as a user's export would be.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import warnings
from pathlib import Path

import onnx

from ..errors import TrtattnError
from ..graph import io as onnxio

TORCHSCRIPT_OPSET = 17
DYNAMO_OPSET = 23  # torch lowers SDPA to the standard ONNX Attention op from opset 23


class ExportError(TrtattnError):
    pass


def _quiet():
    warnings.filterwarnings("ignore")
    for name in ("torch", "torch.onnx", "torch.export", "transformers", "onnxscript"):
        logging.getLogger(name).setLevel(logging.ERROR)


def root_cause(e: BaseException) -> str:
    """The innermost exception, in one line: what the record of a failed export shows."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".strip()


def _export_torchscript(built, path: str, opset: int):
    import torch

    torch.onnx.export(built.module, tuple(built.inputs.values()), path, input_names=list(built.inputs),
                      output_names=built.outputs, dynamic_axes={**built.axes, **_output_axes(built)},
                      opset_version=opset, dynamo=False)


def _output_axes(built):
    # batch is dynamic everywhere; the rest is inferred by the exporter
    return {o: {0: "batch"} for o in built.outputs}


def _export_dynamo(built, path: str, opset: int):
    import torch
    from torch.export import Dim

    shapes = tuple({axis: Dim.AUTO for axis in built.axes.get(name, {})} or None for name in built.inputs)
    program = torch.onnx.export(built.module, tuple(built.inputs.values()), input_names=list(built.inputs),
                                output_names=built.outputs, dynamic_shapes=(shapes,),  # forward(*args)
                                opset_version=opset,
                                dynamo=True, verbose=False, optimize=True)
    if program is None:  # only the TorchScript exporter returns nothing
        raise RuntimeError(f"{path}: torch.onnx.export(dynamo=True) returned no ONNX program")
    program.save(path)


def _name_dims(model: onnx.ModelProto, built):
    """Give the symbolic dims of the inputs our names (dynamo calls them s0, s1, ...), everywhere."""
    rename: dict[str, str] = {}
    for vi in model.graph.input:
        for axis, name in built.axes.get(vi.name, {}).items():
            dim = vi.type.tensor_type.shape.dim[axis]
            if dim.dim_param and dim.dim_param != name:
                rename.setdefault(dim.dim_param, name)
    if not rename:
        return
    for vi in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        for dim in vi.type.tensor_type.shape.dim:
            if dim.dim_param in rename:
                dim.dim_param = rename[dim.dim_param]


def export_target(entry, exporter: str, path, force: bool) -> Path:
    """`path` as a Path, once the exporter is known, can export the entry, and nothing would be overwritten."""
    if exporter not in ("torchscript", "dynamo"):
        raise TrtattnError(f"unknown exporter '{exporter}'; use torchscript or dynamo")
    if exporter in entry.unsupported:
        raise ExportError(f"{entry.name} cannot be exported with {exporter}: {entry.unsupported[exporter]}")
    path = Path(path)
    if path.exists() and not force:
        raise TrtattnError(f"{path} exists; pass --force to overwrite it")
    return path


def export_entry(entry, exporter: str, path, *, opset: int | None = None, force: bool = False) -> Path:
    path = export_target(entry, exporter, path, force)
    _quiet()
    built = entry.build()
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "model.onnx")
        try:
            if exporter == "torchscript":
                _export_torchscript(built, raw, opset or TORCHSCRIPT_OPSET)
            else:
                _export_dynamo(built, raw, opset or DYNAMO_OPSET)
        except Exception as e:
            raise ExportError(f"{entry.name}: the {exporter} exporter failed: {root_cause(e)}") from None
        model = onnx.load(raw)
    del model.metadata_props[:]
    classes = entry.classes_for(exporter) if hasattr(entry, "classes_for") else ()
    record = {"zoo": entry.name, "exporter": exporter, "expected_sites": entry.expected_sites}
    if "dims" in classes:
        # the point of a "dims" entry: the model as a real export has it, with the exporter's own dim
        # names and nothing that tells verification which sizes fit
        model.metadata_props.add(key="trtattn.zoo", value=json.dumps({**record, "classes": list(classes)}))
        return onnxio.save(model, path, external_data="external_data" in classes)
    _name_dims(model, built)
    present = {i.name for i in model.graph.input}  # exporters drop inputs the model does not use
    meta = {**record, "inputs": {k: v for k, v in built.roles.items() if k in present}, "dims": built.dims}
    if classes:
        meta["classes"] = list(classes)
    model.metadata_props.add(key="trtattn.inputs", value=json.dumps(meta))
    return onnxio.save(model, path, external_data="external_data" in classes)
