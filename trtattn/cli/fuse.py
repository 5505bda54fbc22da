"""trtattn fuse MODEL -o OUT: every attention -> the standard ONNX Attention op, verified."""

from __future__ import annotations

from ..graph import io as onnxio
from ..graph.inputs import parse_dims
from ..report import site_table, write_json
from ..version import __version__
from . import fuse_trt
from .common import add_model_out, add_verify_opts, check_output, verdict


def add_parser(sub) -> None:
    f = sub.add_parser("fuse", help="rewrite every attention into the standard ONNX Attention op, verified")
    add_model_out(f)
    add_verify_opts(f)
    fuse_trt.add_options(f)  # --ops trt: TensorRT's own ops (cli/fuse_trt.py)


def run(args, progress) -> int:
    from ..rewrite.fuse import fuse_model

    if fuse_trt.wanted(args):
        return fuse_trt.run(args, progress)
    check_output(args.model, args.output, args.force)
    model = onnxio.load(args.model)  # bad input: one line, before any progress output
    result = fuse_model(model, dims=parse_dims(args.dims), seed=args.seed, atol=args.atol, progress=progress)
    return report(result, model, args.model, args.output, args.report, progress)


def report(result, model, model_path, output, report_path, progress) -> int:
    """The per-site table, the output (only when every site fused and verified) and the report."""
    rows = [r.row() for r in result.reports]
    fused = sum(r["status"] == "fused" for r in rows)
    if rows:
        print(site_table(rows))
    print(f"{len(rows)} attention sites, {fused} fused, {len(rows) - fused} skipped; "
          f"verification: {verdict(result.verification)}")
    written = None
    if result.ok:
        if not result.changed:  # nothing to fuse: the output is the input, unchanged
            written = onnxio.copy_model(model_path, output, model)
        else:
            with progress.step(f"writing {output}"):
                written = onnxio.save(result.model, output, protect=(model_path,))
        print(f"wrote {written}")
    else:
        print(f"not written: {output} (every site must fuse and verify)")
    if report_path:
        write_json({"trtattn_version": __version__, "input": str(model_path), "output": str(written) if written else None,
                    "sites": rows, "ignored": [{"name": i.name, "reason": i.reason} for i in result.ignored],
                    "verification": result.verification,
                    "counts": {"sites": len(rows), "fused": fused, "skipped": len(rows) - fused}},
                   report_path, protect=(model_path, output))
    return 0 if result.ok else 1
