"""OUT.json next to a model written with TensorRT's ONNX ops: the engine's sidecar as `trtattn build` writes
it (sites and their layer names, I/O contract, in-place aliases, profiles), plus what trtexec needs to build
the same engine: the --minShapes/--optShapes/--maxShapes strings of every profile and the command line.
`trtattn inspect LAYERINFO.json --sites OUT.json --require-fused` reads it as it reads an engine's."""

from __future__ import annotations

from pathlib import Path

import onnx

from ...graph.shapes import tensor_types
from ...trt.engine import sidecar as engine_sidecar
from ...trt.plan import BuildPlan, describe_io
from ...verification import Verification

SHAPE_FLAGS = (("min", "--minShapes"), ("opt", "--optShapes"), ("max", "--maxShapes"))


def _name(name: str) -> str:
    """An input name as trtexec reads it: quoted when it holds the separators ',' or ':'."""
    return f"'{name}'" if ("," in name or ":" in name) else name


def shape_strings(profiles: list[dict]) -> list[dict[str, str]]:
    """[{"--minShapes": "input_ids:1x1,...", "--optShapes": ..., "--maxShapes": ...}], one per profile (trtexec
    makes one optimisation profile per repetition of the three flags)."""
    return [{flag: ",".join(f"{_name(name)}:{'x'.join(str(d) for d in row[key])}" for name, row in p.items())
             for key, flag in SHAPE_FLAGS} for p in profiles]


def trtexec_command(onnx_path: str | Path, profiles: list[dict], engine: str | Path, layer_info: str | Path) -> list[str]:
    """The trtexec build of the written model: strongly typed (the precision is in the tensors), with detailed
    layer info so that `trtattn inspect` can see which kernel each attention runs."""
    args = ["trtexec", f"--onnx={onnx_path}", "--stronglyTyped", "--profilingVerbosity=detailed",
            f"--saveEngine={engine}", f"--exportLayerInfo={layer_info}", "--skipInference"]
    for shapes in shape_strings(profiles):
        args += [f"{flag}={value}" for flag, value in shapes.items()]
    return args


def _as_planned(output: dict, planned: dict[str, list], names: set[str]) -> dict:
    """An output's dims as the engine's are named (trt/plan.named_outputs: after the inputs' dim the original's
    symbolic shapes prove it, 'seq' for the exporter's 'Mullast_hidden_state_dim_1'), where the written model
    declares the exporter's name and the plan has proven one; every other dim as the written model declares it."""
    shape = planned.get(output["name"])
    if shape is None or len(shape) != len(output["shape"]):
        return output
    dims = [p if isinstance(d, str) and d not in names and isinstance(p, str) and p in names else d
            for d, p in zip(output["shape"], shape)]
    return {**output, "shape": dims}


def sidecar(plan: BuildPlan, model: onnx.ModelProto, onnx_path: str | Path, *, source: str = "",
            verification: Verification | None = None) -> dict:
    """The engine sidecar of `plan` for the written `model` (its own graph I/O: caches at their static capacity)."""
    info = engine_sidecar(plan, trt_version=None, source=source, gpu=None)
    types = tensor_types(model)
    info["io"]["inputs"] = [describe_io(types, i.name).to_json() for i in model.graph.input]
    planned = {o.name: o.shape for o in plan.outputs}
    names = {d for i in info["io"]["inputs"] for d in i["shape"] if isinstance(d, str)}
    info["io"]["outputs"] = [_as_planned(describe_io(types, o.name).to_json(), planned, names)
                             for o in model.graph.output]
    stem = Path(onnx_path).with_suffix("")
    info["route"] = "trtexec"
    info["onnx"] = str(onnx_path)
    info["ops"] = sorted({f"{n.domain}::{n.op_type}" for n in model.graph.node if n.domain == "trt"})
    info["trtexec"] = {"shapes": shape_strings(plan.profiles),
                       "command": trtexec_command(onnx_path, plan.profiles, f"{stem}.engine", f"{stem}.layers.json")}
    info["verification"] = verification.to_json() if verification is not None else None
    return info
