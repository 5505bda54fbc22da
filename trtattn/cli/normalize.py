"""trtattn normalize MODEL -o OUT: TensorRT's fusion rules (Q pre-scaled, one Where/Add mask), verified;
optionally ModelOpt FP8/INT8 Q/DQ around every attention."""

from __future__ import annotations

from ..errors import TrtattnError
from ..folder import is_folder
from ..graph import io as onnxio
from ..graph.feeds import make_feeds
from ..report import table, verdict, write_json
from ..site import SiteStatus
from ..version import __version__
from . import folder
from .common import add_model_out, add_verify_opts, check_output, check_report_html, given_inputs, load_model
from .dims import parse_dims

COLUMNS = [("name", "site"), ("heads", "heads q/kv"), ("head_size", "head"), ("scale", "scale"),
           ("scale_before", "scale was"), ("scale_to", "scale to"), ("mask_form", "mask form"),
           ("action", "action"), ("implicit_before", "implicit before"), ("implicit", "implicit"),
           ("iattention", "IAttention"), ("why", "why not")]


def add_parser(sub) -> None:
    n = sub.add_parser("normalize", help="rewrite attention to TensorRT's fusion rules (Q pre-scale, one Where/Add mask)")
    add_model_out(n)
    add_verify_opts(n)
    n.add_argument("--fold-scale-into-weights", action="store_true",
                   help="fold the softmax scale into Q's projection weights where Q comes straight from one")
    n.add_argument("--precision", choices=["fp32", "fp16", "bf16", "fp8", "int8"],
                   help="precision the fusability verdict is for (default: the model's own when its weights are bf16 "
                        "or fp16, else fp16; --quantize sets it)")
    n.add_argument("--quantize", choices=["fp8", "int8"],
                   help="ModelOpt post-training quantization with Q/DQ around every attention (needs the quant extra)")
    n.add_argument("--calib", help="calibration data for --quantize: an .npz of arrays keyed by input name")


def run(args, progress) -> int:
    from ..rewrite.normalize import normalize_model

    if is_folder(args.model):  # an export folder: every model in it (cli/folder.py)
        return folder.run(args, progress, "normalize")
    check_output(args.model, args.output, args.force, args.report)
    check_report_html(args)
    model = load_model(args.model, progress)
    if args.quantize and not args.calib:
        raise TrtattnError("--quantize needs calibration data: --calib DATA.npz (arrays keyed by input name)")
    if args.quantize:
        args.precision = args.quantize
    dims = parse_dims(args.dims)
    given = given_inputs(args, model)
    result = normalize_model(model, fold_scale_into_weights=args.fold_scale_into_weights, precision=args.precision,
                             dims=dims, seed=args.seed, atol=args.atol, progress=progress,
                             inputs=given)
    rows = [{**s.row(), "why": "; ".join(dict.fromkeys(s.after_reasons())) or "-"} for s in result.sites]
    if rows:
        print(table(rows, COLUMNS))
    print(f"{len(rows)} attention sites, {sum(r.status == SiteStatus.REWRITTEN for r in result.sites)} rewritten; "
          f"cleanup folded {result.cleanup.folded_nodes} nodes and removed {result.cleanup.noops_removed} no-ops; "
          f"verification: {verdict(result.verification)}")
    for note in [result.precision_choice, *result.notes]:
        if note:
            print(f"note: {note}")
    if args.quantize and result.ok:
        from ..rewrite.quantize import QUANT_COLUMNS, load_calibration, quantize_checked

        feeds = given.sets if given else [make_feeds(model, dims=dims, seed=args.seed + i, padding=False)
                                          for i in range(2)]
        onnxio.materialize(model)  # ModelOpt calibrates with the weights in memory
        onnxio.materialize(result.model)
        quantized, summary, passed = quantize_checked(model, result.model, args.quantize,
                                                      load_calibration(args.calib), feeds, progress)
        print(table([s.row() for s in summary.sites], QUANT_COLUMNS))
        assert summary.accuracy is not None  # quantize_checked measures it
        print(f"{args.quantize} vs fp32: worst relative L2 error {summary.accuracy.worst_relative:.3g} "
              f"(tolerance {summary.accuracy.tolerance})")
        result.quantization = summary
        result.model, result.changed = quantized, True
        if not passed:
            result.verification.passed = False
    written = None
    if result.ok:
        if not result.changed:
            print("nothing to improve: the model already follows TensorRT's attention rules; output = input")
            written = onnxio.copy_model(args.model, args.output, model)
        else:
            written = onnxio.save(result.model, args.output, protect=(args.model,), progress=progress)
        print(f"wrote {written}")
    else:
        print(f"not written: {args.output}")
    if args.report:
        write_json({"trtattn_version": __version__, "input": str(args.model), "output": str(written) if written else None,
                    "precision": result.precision, "changed": result.changed, "cleanup": result.cleanup, "sites": rows,
                    "ignored": [{"name": i.name, "reason": i.reason} for i in result.ignored],
                    "verification": result.verification, "quantization": result.quantization},
                   args.report, protect=(args.model, args.output))
    if args.report_html:
        from ..pictures import normalize_entry, write_html

        with progress.step(f"drawing {args.report_html}"):
            write_html(args.report_html, [normalize_entry(str(args.model), model, result)],
                       protect=(args.model, args.output))
        print(f"wrote {args.report_html}")
    return 0 if result.ok else 1
