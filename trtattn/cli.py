"""The `trtattn` command line. Subcommands are thin over the library (as Polygraphy's tools are).

Errors a user can act on (bad input, missing dependency, failed verification) print one line
and exit non-zero; no traceback unless --debug.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from .errors import TrtattnError


def _add_model_out(p):
    p.add_argument("model", help="input ONNX model (never modified)")
    p.add_argument("-o", "--output", required=True, help="output ONNX model")
    p.add_argument("--report", help="write a JSON report here")
    p.add_argument("--force", action="store_true", help="replace OUTPUT if it exists")


def _check_output(model, output, force: bool) -> None:
    from . import onnxio

    if onnxio.same_file(model, output):
        raise TrtattnError(f"refusing to write over the input model {model}; choose another output path")
    if Path(output).exists() and not force:
        raise TrtattnError(f"{output} exists; pass --force to replace it")


def _add_verify_opts(p):
    p.add_argument("--dims", help="values of symbolic dims for verification, e.g. batch=2,seq=16")
    p.add_argument("--seed", type=int, default=0, help="seed of the verification inputs (default 0)")
    p.add_argument("--atol", type=float, default=1e-4, help="max abs error allowed (default 1e-4, fp32)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="trtattn", description=__doc__.splitlines()[0])
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    sub = ap.add_subparsers(dest="command", required=True)

    z = sub.add_parser("zoo", help="the built-in models (transformers, random weights, no downloads)")
    zsub = z.add_subparsers(dest="zoo_command", required=True)
    zl = zsub.add_parser("list", help="list zoo models, their working exporters and attention sites")
    zl.add_argument("--json", action="store_true")
    ze = zsub.add_parser("export", help="export a zoo model to ONNX")
    ze.add_argument("name")
    ze.add_argument("--exporter", default="torchscript", help="torchscript (default) or dynamo")
    ze.add_argument("-o", "--output", required=True)
    ze.add_argument("--opset", type=int)
    ze.add_argument("--force", action="store_true", help="overwrite OUTPUT if it exists")

    f = sub.add_parser("fuse", help="rewrite every attention into the standard ONNX Attention op, verified")
    _add_model_out(f)
    _add_verify_opts(f)

    n = sub.add_parser("normalize", help="rewrite attention to TensorRT's fusion rules (Q pre-scale, one Where/Add mask)")
    _add_model_out(n)
    _add_verify_opts(n)
    n.add_argument("--fold-scale-into-weights", action="store_true",
                   help="fold the softmax scale into Q's projection weights where Q comes straight from one")
    n.add_argument("--precision", default="fp16", choices=["fp32", "fp16", "bf16", "fp8", "int8"],
                   help="precision the fusability verdict is for (default fp16; --quantize sets it)")
    n.add_argument("--quantize", choices=["fp8", "int8"],
                   help="ModelOpt post-training quantization with Q/DQ around every attention (needs the quant extra)")
    n.add_argument("--calib", help="calibration data for --quantize: an .npz of arrays keyed by input name")

    b = sub.add_parser("build", help="build a TensorRT engine in which every attention is an IAttention")
    b.add_argument("model", help="input ONNX model (never modified)")
    b.add_argument("--name", help="engine name (default: the model file's stem)")
    b.add_argument("--out-dir", default="engines", help="where NAME.engine and NAME.json go (default engines/)")
    b.add_argument("--form", default="padded", choices=["padded", "packed", "kv-cache"],
                   help="padded BHND (default); packed tokens with cumulative lengths; preallocated KV cache")
    b.add_argument("--precision", default="fp16", choices=["fp16", "bf16", "fp32"],
                   help="dtype the attention runs in (default fp16; fp32 has no fused kernel)")
    b.add_argument("--decomposable", action="store_true",
                   help="let TensorRT fall back to unfused attention where no fused kernel fits (default: fail)")
    b.add_argument("--min-shapes", help="trtexec style, e.g. input_ids:1x1,attention_mask:1x1")
    b.add_argument("--opt-shapes")
    b.add_argument("--max-shapes")
    b.add_argument("--timing-cache", help="read and update this timing cache file")
    b.add_argument("--workspace", type=int, help="workspace limit in MiB")
    b.add_argument("--save-onnx", help="also write the verified form model and the cut model to this folder")
    b.add_argument("--force", action="store_true", help="replace an existing engine")
    b.add_argument("--mark-sites", action="store_true",
                   help="also output every attention's result, for per-site errors in trtattn verify")
    b.add_argument("--dims", help="symbolic dim values for verification and the profile's opt, e.g. batch=2,seq=16")

    v = sub.add_parser("verify", help="compare an engine (TensorRT) or ONNX model (ONNX Runtime) with the original")
    v.add_argument("candidate", help="NAME.engine, or an ONNX model (fused, normalised or a form)")
    v.add_argument("--onnx", required=True, help="the original ONNX model")
    v.add_argument("--sidecar", help="the engine's NAME.json (default: next to the engine)")
    v.add_argument("--precision", choices=["fp32", "tf32", "fp16", "bf16", "fp8", "int8"],
                   help="tolerances for this precision (default: the sidecar's, else fp32)")
    v.add_argument("--dims", help="symbolic dim values, e.g. batch=2,seq=16")
    v.add_argument("--seed", type=int, default=0)
    v.add_argument("--iterations", type=int, default=2, help="input sets to compare (default 2)")
    v.add_argument("--json", action="store_true", help="print the result as JSON")

    from .runtime import cli as runtime_cli
    from .trt.inspect import add_inspect_parser

    add_inspect_parser(sub)
    runtime_cli.add_run_parser(sub)
    runtime_cli.add_bench_parser(sub)

    d = sub.add_parser("demo", help="export a zoo model, fuse it, verify it, print the sites")
    d.add_argument("--model", default=None, help="zoo model (default: the zoo's default)")
    d.add_argument("--exporter", default="torchscript")
    d.add_argument("--out-dir", default="out/demo", help="where the ONNX files go (default out/demo)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except TrtattnError as e:
        print(f"trtattn: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trtattn: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # an internal error: one line, traceback on request
        if args.debug:
            raise
        print(f"trtattn: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", file=sys.stderr)
        return 3


def _dispatch(args) -> int:
    from .report import Progress

    progress = Progress(enabled=not args.quiet)
    if args.command == "zoo":
        return _zoo(args, progress)
    if args.command == "fuse":
        return _fuse(args.model, args.output, args.report, args, progress)
    if args.command == "demo":
        return _demo(args, progress)
    if args.command == "normalize":
        return _normalize(args, progress)
    if args.command == "build":
        return _build(args, progress)
    if args.command == "verify":
        return _verify(args, progress)
    if args.command in ("run", "bench"):
        from .runtime import cli as runtime_cli

        return (runtime_cli.run_command if args.command == "run" else runtime_cli.bench_command)(args, progress)
    if args.command == "inspect":
        from .trt.inspect import run_inspect

        return run_inspect(args)
    raise TrtattnError(f"unknown command {args.command}")


def _zoo(args, progress) -> int:
    from . import zoo
    from .report import table

    if args.zoo_command == "list":
        rows = zoo.listing()
        if args.json:
            print(json.dumps([{k: r[k] for k in ("name", "exporters", "expected_sites")} for r in rows], indent=2))
        else:
            shown = [{**r, "exporters": ", ".join(r["exporters"]),
                      "unsupported": "; ".join(f"{k}: {v}" for k, v in r["unsupported"].items())} for r in rows]
            print(table(shown, [("name", "model"), ("expected_sites", "sites"), ("exporters", "exporters"),
                                ("description", "what it exercises"), ("unsupported", "cannot export")]))
        return 0
    with progress.step(f"exporting {args.name} with {args.exporter}"):
        path = zoo.export(args.name, args.exporter, args.output, opset=args.opset, force=args.force)
    print(path)
    return 0


def _fuse(model_path, output, report_path, args, progress) -> int:
    from . import onnxio
    from .fuse import fuse_model
    from .inputs import parse_dims

    _check_output(model_path, output, getattr(args, "force", False))
    model = onnxio.load(model_path)  # bad input: one line, before any progress output
    result = fuse_model(model, dims=parse_dims(getattr(args, "dims", None)), seed=getattr(args, "seed", 0),
                        atol=getattr(args, "atol", 1e-4), progress=progress)
    return _report_fuse(result, model, model_path, output, report_path, progress)


def _report_fuse(result, model, model_path, output, report_path, progress) -> int:
    """The per-site table, the output (only when every site fused and verified) and the report."""
    from . import onnxio
    from .report import site_table, write_json

    rows = [r.row() for r in result.reports]
    fused = sum(r["status"] == "fused" for r in rows)
    if rows:
        print(site_table(rows))
    print(f"{len(rows)} attention sites, {fused} fused, {len(rows) - fused} skipped; "
          f"verification: {_verdict(result.verification)}")
    written = None
    if result.ok:
        if not result.changed:  # nothing to fuse: the output is the input, unchanged
            written = _copy_model(model_path, output, model)
        else:
            with progress.step(f"writing {output}"):
                written = onnxio.save(result.model, output, protect=(model_path,))
        print(f"wrote {written}")
    else:
        print(f"not written: {output} (every site must fuse and verify)")
    if report_path:
        from . import __version__

        write_json({"trtattn_version": __version__, "input": str(model_path), "output": str(written) if written else None,
                    "sites": rows, "ignored": [{"name": i.name, "reason": i.reason} for i in result.ignored],
                    "verification": result.verification,
                    "counts": {"sites": len(rows), "fused": fused, "skipped": len(rows) - fused}},
                   report_path, protect=(model_path, output))
    return 0 if result.ok else 1


NORMALIZE_COLUMNS = [("name", "site"), ("heads", "heads q/kv"), ("head_size", "head"), ("scale", "scale"),
                     ("scale_before", "scale was"), ("scale_to", "scale to"), ("mask_form", "mask form"),
                     ("action", "action"), ("implicit_before", "implicit before"), ("implicit", "implicit"),
                     ("iattention", "IAttention"), ("why", "why not")]


def _normalize(args, progress) -> int:
    from . import onnxio
    from .inputs import parse_dims
    from .passes.normalize import normalize_model
    from .report import table, write_json

    _check_output(args.model, args.output, args.force)
    model = onnxio.load(args.model)
    if args.quantize and not args.calib:
        raise TrtattnError("--quantize needs calibration data: --calib DATA.npz (arrays keyed by input name)")
    if args.quantize:
        args.precision = args.quantize
    result = normalize_model(model, fold_scale_into_weights=args.fold_scale_into_weights, precision=args.precision,
                             dims=parse_dims(args.dims), seed=args.seed, atol=args.atol, progress=progress)
    rows = [r.row() for r in result.sites]
    for r in rows:
        why = [w for w in (r.get("implicit_why"), r.get("iattention_why")) if w and w != "-"]
        r["why"] = "; ".join(dict.fromkeys(why)) or "-"
    if rows:
        print(table(rows, NORMALIZE_COLUMNS))
    print(f"{len(rows)} attention sites, {sum(r['action'] == 'rewritten' for r in rows)} rewritten; "
          f"cleanup folded {result.cleanup['folded_nodes']} nodes and removed {result.cleanup['noops_removed']} no-ops; "
          f"verification: {_verdict(result.verification)}")
    if args.quantize and result.ok:
        from .inputs import make_feeds
        from .passes.quantize import QUANT_COLUMNS, REL_TOLERANCE, compare, load_calibration, quantize

        calib = load_calibration(args.calib)
        with progress.step(f"ModelOpt {args.quantize} quantization, calibrating on CPU"):
            quantized = quantize(result.model, args.quantize, calib)
        summary = quantized.summary()
        print(table(summary["sites"], QUANT_COLUMNS))
        with progress.step(f"comparing the {args.quantize} model with the fp32 original on ONNX Runtime"):
            feeds = [make_feeds(model, dims=parse_dims(args.dims), seed=args.seed + i, padding=False) for i in range(2)]
            errors = compare(model, quantized.model, feeds)
        worst = max((e["rel"] for e in errors.values()), default=float("inf"))
        bound = REL_TOLERANCE[args.quantize]
        summary["accuracy"] = {"outputs": errors, "worst_relative": worst, "tolerance": bound, "passed": worst <= bound}
        print(f"{args.quantize} vs fp32: worst relative L2 error {worst:.3g} (tolerance {bound})")
        result.quantization = summary
        result.model, result.changed = quantized.model, True
        if worst > bound:
            result.verification["passed"] = False
    written = None
    if result.ok:
        if not result.changed:
            print("nothing to improve: the model already follows TensorRT's attention rules; output = input")
            written = _copy_model(args.model, args.output, model)
        else:
            written = onnxio.save(result.model, args.output, protect=(args.model,))
        print(f"wrote {written}")
    else:
        print(f"not written: {args.output}")
    if args.report:
        from . import __version__

        write_json({"trtattn_version": __version__, "input": str(args.model), "output": str(written) if written else None,
                    "precision": args.precision, "changed": result.changed, "cleanup": result.cleanup, "sites": rows,
                    "ignored": [{"name": i.name, "reason": i.reason} for i in result.ignored],
                    "verification": result.verification, "quantization": result.quantization},
                   args.report, protect=(args.model, args.output))
    return 0 if result.ok else 1


def _build(args, progress) -> int:
    from . import onnxio
    from .build import build, describe, prepare
    from .errors import MissingDependencyError
    from .inputs import parse_dims
    from .trt import compat
    from .trt.config import parse_shapes

    model = onnxio.load(args.model)
    name = args.name or Path(args.model).stem
    shapes = (parse_shapes(args.min_shapes), parse_shapes(args.opt_shapes), parse_shapes(args.max_shapes))
    prepared = prepare(model, name=name, form=args.form, precision=args.precision, dims=parse_dims(args.dims),
                       decomposable=args.decomposable, shapes=shapes, progress=progress, source=str(args.model),
                       mark_sites=args.mark_sites)
    print(describe(prepared.plan))
    if args.save_onnx:
        out = Path(args.save_onnx)
        onnxio.save(prepared.form_model, out / f"{name}.{args.form}.onnx", protect=(args.model,))
        onnxio.save(prepared.cut.model, out / f"{name}.{args.form}.cut.onnx", protect=(args.model,))
        print(f"wrote {out / f'{name}.{args.form}.onnx'} (verified on ONNX Runtime) and the cut model")
    try:
        trt = compat.import_tensorrt()
    except MissingDependencyError as e:
        print(f"trtattn: {e}.", file=sys.stderr)
        return 4
    with progress.step(f"building {name} with TensorRT {trt.__version__}"):
        engine_path, json_path = build(prepared, trt, args.out_dir, force=args.force,
                                       timing_cache=Path(args.timing_cache) if args.timing_cache else None,
                                       workspace_mb=args.workspace)
    print(f"wrote {engine_path} and {json_path}")
    return 0


def _verify(args, progress) -> int:
    from . import onnxio
    from .inputs import parse_dims
    from .report import table
    from .verify import verify_candidate

    original = onnxio.load(args.onnx)
    sidecar = json.loads(Path(args.sidecar).read_text()) if args.sidecar else None
    with progress.step(f"comparing {args.candidate} with {args.onnx}"):
        result = verify_candidate(args.candidate, original, sidecar=sidecar, precision=args.precision,
                                  dims=parse_dims(args.dims), seed=args.seed, iterations=args.iterations)
    data = result.to_json()
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        atol = data["atol"]
        rows = [{"name": k, "err": v, "ok": v <= atol} for k, v in data["outputs"].items()]
        rows += [{"name": f"site {k}", "err": v, "ok": v <= atol} for k, v in data["sites"].items()]
        print(table(rows, [("name", "output"), ("err", "max abs error"), ("ok", f"<= {atol:g}")]))
        for note in data["notes"]:
            print(f"note: {note}")
        print(f"{result.runner} ({result.form}, {result.precision}) vs ONNX Runtime on the original: "
              f"{'passed' if data['passed'] else 'FAILED'} over {data['iterations']} input sets")
    return 0 if data["passed"] else 1


def _verdict(v: dict) -> str:
    if v.get("note"):
        return v["note"]
    if v.get("passed") is None:
        return "not run"
    err = v.get("max_abs_err")
    return ("passed" if v["passed"] else "FAILED") + (f" (max abs error {err:.3g} over {v.get('iterations')} inputs)"
                                                       if err is not None else "")


def _copy_model(src, dst, model) -> Path:
    from . import onnxio

    if any(t.data_location == 1 for t in model.graph.initializer):  # external data: re-save next to dst
        return onnxio.save(model, dst, protect=(src,))
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copyfile(src, tmp)
    tmp.replace(dst)
    return dst


def _demo(args, progress) -> int:
    from . import zoo

    name = args.model or zoo.DEFAULT_MODEL
    out = Path(args.out_dir)
    exported = out / f"{name}.{args.exporter}.onnx"
    fused = out / f"{name}.{args.exporter}.fused.onnx"
    print(f"trtattn demo: {name} ({zoo.get(name).description}), exported with {args.exporter}")
    with progress.step(f"exporting {name} with {args.exporter}"):
        zoo.export(name, args.exporter, exported, force=True)
    # fuse and verify (the report and the fused ONNX), then the engine: planned here, built where
    # TensorRT is (the docker/ container)
    from . import onnxio
    from .build import build, describe, prepare
    from .errors import MissingDependencyError
    from .fuse import fuse_model
    from .trt import compat

    model = onnxio.load(exported)
    try:
        prepared = prepare(model, name=f"{name}_{args.exporter}", progress=progress, source=str(exported))
    except TrtattnError as e:  # a site that cannot fuse: the fuse report below says which and why
        print(f"engine plan: {e}")
        prepared = None
    fuse_result = prepared.fused if prepared else fuse_model(model, progress=progress)
    code = _report_fuse(fuse_result, model, str(exported), str(fused),
                        str(out / f"{name}.{args.exporter}.report.json"), progress)
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
