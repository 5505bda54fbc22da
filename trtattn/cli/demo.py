"""trtattn demo: export a zoo model, fuse and verify it, print the sites, then the engine: planned
here, built where TensorRT is (the docker/ container)."""

from __future__ import annotations

from pathlib import Path

from ..errors import MissingDependencyError, TrtattnError
from ..graph import io as onnxio
from .fuse import report


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="export a zoo model, fuse it, verify it, print the sites")
    d.add_argument("--model", default=None, help="zoo model (default: the zoo's default)")
    d.add_argument("--exporter", default="torchscript")
    d.add_argument("--out-dir", default="out/demo", help="where the ONNX files go (default out/demo)")


def run(args, progress) -> int:
    from .. import zoo
    from ..rewrite.fuse import fuse_model
    from ..routes.builder import build
    from ..routes.prepare import describe, prepare
    from ..trt import compat

    name = args.model or zoo.DEFAULT_MODEL
    out = Path(args.out_dir)
    exported = out / f"{name}.{args.exporter}.onnx"
    fused = out / f"{name}.{args.exporter}.fused.onnx"
    print(f"trtattn demo: {name} ({zoo.get(name).description}), exported with {args.exporter}")
    with progress.step(f"exporting {name} with {args.exporter}"):
        zoo.export(name, args.exporter, exported, force=True)
    model = onnxio.load(exported)
    try:
        prepared = prepare(model, name=f"{name}_{args.exporter}", progress=progress, source=str(exported))
    except TrtattnError as e:  # a site that cannot fuse: the fuse report below says which and why
        print(f"engine plan: {e}")
        prepared = None
    fuse_result = prepared.fused if prepared else fuse_model(model, progress=progress)
    code = report(fuse_result, model, str(exported), str(fused), str(out / f"{name}.{args.exporter}.report.json"),
                  progress)
    if code != 0 or prepared is None:
        return code
    print(describe(prepared.plan))
    try:
        trt = compat.import_tensorrt()
    except MissingDependencyError as e:
        print(f"engine not built: {e}.")
        return 0
    engine, sidecar = build(prepared, trt, "engines", force=True)
    print(f"wrote {engine} and {sidecar}; check it with: trtattn inspect {engine} --sites {sidecar} --require-fused")
    return 0
