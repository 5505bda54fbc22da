"""trtattn fuse MODEL -o OUT: every attention -> the standard ONNX Attention op, verified.
(MODEL may be an export folder: every model in it, the other files copied; cli/folder.py.)

Exit 0 when every attention-like softmax (and attention op) fused and verified, or the model has none
(the output is the input); 1 when one is not fused (listed with why) or the verification fails, and
then nothing is written, unless --allow-partial: the fused sites only, verified, and exit 0.
"""

from __future__ import annotations

from ..folder import is_folder
from ..graph import io as onnxio
from ..report import counts, site_table, summary_line, verdict, write_json
from ..version import __version__
from . import folder, fuse_trt
from .common import add_model_out, add_verify_opts, check_output, check_report_html, given_inputs, load_model
from .dims import parse_dims


def add_parser(sub) -> None:
    f = sub.add_parser("fuse", help="rewrite every attention into the standard ONNX Attention op, verified")
    add_model_out(f)
    add_verify_opts(f)
    f.add_argument("--allow-partial", action="store_true",
                   help="write the sites that fused and verified and exit 0 even if some attention is not fused "
                        "(those are still listed)")
    fuse_trt.add_options(f)  # --ops trt: TensorRT's own ops (cli/fuse_trt.py)


def run(args, progress) -> int:
    from ..rewrite.fuse import fuse_model

    if is_folder(args.model):  # an export folder: every model in it (cli/folder.py)
        return folder.run(args, progress, "fuse")
    if fuse_trt.wanted(args):
        return fuse_trt.run(args, progress)
    check_output(args.model, args.output, args.force, args.report)
    check_report_html(args)
    model = load_model(args.model, progress)  # weights stay on disk; bad input: one line, before any progress output
    result = fuse_model(model, dims=parse_dims(args.dims), seed=args.seed, atol=args.atol, progress=progress,
                        inputs=given_inputs(args, model))
    code = report(result, model, args.model, args.output, args.report, progress, allow_partial=args.allow_partial)
    if args.report_html:
        from ..pictures import fuse_entry, write_html

        with progress.step(f"drawing {args.report_html}"):
            write_html(args.report_html, [fuse_entry(str(args.model), model, result)], protect=(args.model, args.output))
        print(f"wrote {args.report_html}")
    return code


def report(result, model, model_path, output, report_path, progress, allow_partial: bool = False) -> int:
    """The per-site table, the summary line, the output (only when every site fused and verified, or
    with allow_partial the verified part) and the report; the exit code."""
    if result.reports:
        print(site_table(result.reports))
    print(f"{summary_line(result.reports, result.ignored)}; verification: {verdict(result.verification)}")
    for note in result.notes:
        print(f"note: {note}")
    partial = allow_partial and not result.ok and not result.verification.failed
    written = None
    if result.ok or partial:
        if not result.changed:  # nothing fused: the output is the input, unchanged
            written = onnxio.copy_model(model_path, output, model)
        else:
            with progress.step(f"writing {output}"):
                written = onnxio.save(result.model, output, protect=(model_path,), progress=progress)
        print(f"wrote {written}" + (" (the sites that fused; --allow-partial)" if partial else ""))
    else:
        print(f"not written: {output} (every attention must fuse and verify; --allow-partial writes the sites that did)")
    if report_path:
        write_json({"trtattn_version": __version__, "input": str(model_path), "output": str(written) if written else None,
                    "sites": [r.row() for r in result.reports],
                    "ignored": [{"name": i.name, "reason": i.reason} for i in result.ignored],
                    "verification": result.verification, "dims": result.dims,
                    "counts": counts(result.reports, result.ignored)},
                   report_path, protect=(model_path, output))
    return 0 if result.ok or partial else 1
