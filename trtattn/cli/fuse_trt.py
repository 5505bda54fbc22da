"""trtattn fuse MODEL -o OUT.onnx --ops trt [--form ...] [--precision ...]: the form `build` would lower, with
each site as TensorRT's own TRT_Attention (or TRT_QuantizedAttention) op and each cache update as
TRT_KVCacheUpdate, verified on CPU through trtattn_plugins, plus OUT.json (the engine's sidecar and the
trtexec shapes). For `trtexec --onnx=OUT.onnx --stronglyTyped`; exits 0 only when the check passed."""

from __future__ import annotations

from pathlib import Path

from ..errors import SitesRefused, TrtattnError
from ..graph import io as onnxio
from ..report import table, verdict, write_json
from ..version import __version__
from .common import check_output, given_inputs, load_model
from .dims import parse_dims

OPS = ("onnx", "trt")
COLUMNS = [("name", "site"), ("op", "TensorRT op"), ("form", "form"), ("heads", "heads q/kv"), ("head_size", "head"),
           ("q_scale", "Q scale"), ("causal_kind", "causal_kind"), ("mask", "mask"), ("lengths", "lengths"),
           ("dtype", "dtype"), ("quantize", "softmax quantize")]


def add_options(p) -> None:
    p.add_argument("--ops", choices=OPS, default="onnx",
                   help="onnx (default): the standard ONNX Attention op; trt: TensorRT's own TRT_Attention / "
                        "TRT_KVCacheUpdate ops in the form `trtattn build` lowers, for trtexec --onnx (writes OUT.json)")
    p.add_argument("--form", choices=["padded", "packed", "kv-cache"],
                   help="with --ops trt: padded BHND, packed tokens with cu_seqlens, or a preallocated KV cache (default: "
                        "kv-cache when an Attention op takes past_key/past_value inputs, else padded)")
    p.add_argument("--precision", choices=["fp16", "bf16", "fp32", "fp8", "int8"],
                   help="with --ops trt: what the attention computes in, as `trtattn build` (default: the model's "
                        "own when its weights are bf16 or fp16, else fp16)")
    p.add_argument("--calib", help="with --ops trt --precision fp8/int8: calibration data, an .npz of arrays keyed by "
                                   "input name (samples along axis 0), unless the model has its Q/DQ")


def wanted(args) -> bool:
    """Does this `fuse` run write TensorRT's ops? (--form/--precision without --ops trt is an error.)"""
    if args.ops == "trt":
        return True
    if args.form or args.precision or args.calib:
        raise TrtattnError("--form, --precision and --calib choose what `--ops trt` writes; add --ops trt")
    return False


def sidecar_path(output) -> Path:
    return Path(output).with_suffix(".json")


def refused(e: SitesRefused, output) -> int:
    """Sites that cannot be what was asked, each with why (a limit of IAttention, not bad input): exit 1."""
    print(table([{"site": site, "why": why} for site, why in e.sites], [("site", "site"), ("why", "why not")]))
    print(f"{len(e.sites)} attention site(s) cannot be TensorRT's attention ops: "
          + "; ".join(f"{site}: {why}" for site, why in e.sites))
    print(f"not written: {output}")
    return 1


def run(args, progress) -> int:
    from ..routes.trt_ops import fuse_trt

    check_output(args.model, args.output, args.force)
    check_output(args.model, sidecar_path(args.output), args.force)
    model = load_model(args.model, progress, with_weights=True)
    try:
        result = fuse_trt(model, name=Path(args.output).stem, form=args.form, precision=args.precision,
                          calib=args.calib, dims=parse_dims(args.dims), progress=progress, source=str(args.model),
                          inputs=given_inputs(args, model))
    except SitesRefused as e:
        return refused(e, args.output)
    rows = result.rows()
    print(table([r.to_json() for r in rows], COLUMNS))
    plan = result.prepared.plan
    v = result.verification
    print(f"{len(rows)} attention sites as TensorRT ops ({plan.form} form), {len(plan.ropes)} RotaryEmbedding, "
          f"{len(plan.cache_updates)} TRT_KVCacheUpdate; verification on CPU (trtattn_plugins): "
          + verdict(v))
    for note in plan.notes:
        print(f"note: {note}")
    written = None
    if result.ok:
        with progress.step(f"writing {args.output}"):
            written = onnxio.save(result.model, args.output, protect=(args.model,))
        info = result.sidecar(written)
        write_json(info, sidecar_path(args.output), protect=(args.model, args.output))
        print(f"wrote {written} and {sidecar_path(args.output)}")
        print("build it with: " + " ".join(info["trtexec"]["command"]))
    else:
        print(f"not written: {args.output} (the TensorRT ops must match the original on ONNX Runtime)")
    if args.report:
        write_json({"trtattn_version": __version__, "input": str(args.model), "output": str(written) if written else None,
                    "ops": "trt", "form": plan.form, "sites": rows, "verification": v, "notes": plan.notes},
                   args.report, protect=(args.model, args.output))
    return 0 if result.ok else 1
