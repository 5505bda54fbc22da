"""`trtattn fuse DIR -o OUT_DIR` and `trtattn normalize DIR -o OUT_DIR`: an export folder as one unit
(trtattn.folder). Prints a row per file and per site, writes one JSON report for the folder; exit 1 when
any model has an attention not fused or a failed verification (unless --allow-partial)."""

from __future__ import annotations

from ..errors import TrtattnError
from ..folder import process_folder
from ..report import table, write_json
from ..version import __version__
from .dims import parse_dims

FILE_COLUMNS = [("file", "file"), ("action", "action"), ("sites", "sites"), ("done", "done"),
                ("not_done", "not done"), ("verification", "verification")]
SITE_COLUMNS = [("file", "file"), ("name", "site"), ("status", "status"), ("action", "action"),
                ("max_abs_err", "max abs err"), ("reason", "why not"), ("why", "why not")]


def run(args, progress, mode: str) -> int:
    if getattr(args, "ops", None) == "trt":
        raise TrtattnError("--ops trt takes one model, not a folder; fuse the folder's models one by one")
    options = {"dims": parse_dims(args.dims), "seed": args.seed, "atol": args.atol}
    if mode == "normalize":
        if args.quantize:
            raise TrtattnError("--quantize takes one model, not a folder (calibration data is per model)")
        options.update(fold_scale_into_weights=args.fold_scale_into_weights, precision=args.precision)
    result = process_folder(args.model, args.output, mode=mode, force=args.force,
                            allow_partial=getattr(args, "allow_partial", False), progress=progress, **options)
    print(table([f.row() for f in result.models], FILE_COLUMNS))
    sites = result.site_rows()
    if sites:
        used = [c for c in SITE_COLUMNS if any(c[0] in r for r in sites)]
        print(table(sites, used))
    copied = sum(f.action == "copied" for f in result.files)
    models = result.models
    print(f"{len(models)} models, {sum(f.ok for f in models)} with every attention "
          f"{'fused' if mode == 'fuse' else 'normalized'} and verified; {copied} other files copied")
    for note in result.notes:
        print(f"note: {note}")
    if result.output:
        print(f"wrote {result.output}" + ("" if result.ok else " (the sites that fused; --allow-partial)"))
    else:
        print(f"not written: {args.output} (every attention of every model must {mode} and verify; "
              "--allow-partial writes what did)")
    if args.report:
        write_json({"trtattn_version": __version__, "mode": mode, **result.report()}, args.report,
                   protect=(args.model,))
    return 0 if result.ok or (getattr(args, "allow_partial", False) and result.output) else 1
