"""trtattn build MODEL: a TensorRT engine in which every attention is an IAttention (route 1, the
network API). Without TensorRT it prints the plan (and writes it with --plan-json) and exits 4."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import MissingDependencyError, SitesRefused, TrtattnError
from ..graph import io as onnxio
from .common import (
    add_inputs_opt,
    add_memory_opt,
    add_report_html,
    check_report_html,
    exit_without_tensorrt,
    given_inputs,
    load_model,
)
from .dims import parse_dims
from .values import dims_text, positive


def add_parser(sub) -> None:
    from ..graph.precision import COMPUTE_PRECISIONS
    from ..trt.profiles import DEFAULT_MAX_BATCH

    b = sub.add_parser("build", help="build a TensorRT engine in which every attention is an IAttention")
    b.add_argument("model", help="input ONNX model, or an export folder: one engine per part and pipeline.json "
                                 "(never modified)")
    b.add_argument("--name", help="engine name (default: the model file's stem)")
    b.add_argument("--out-dir", default="engines", help="where NAME.engine and NAME.json go (default engines/)")
    b.add_argument("--form", choices=["padded", "packed", "kv-cache"],
                   help="padded BHND; packed tokens with cumulative lengths; a preallocated KV cache (default: "
                        "kv-cache when an Attention op takes past_key/past_value inputs, else padded)")
    b.add_argument("--precision", choices=list(COMPUTE_PRECISIONS),
                   help="the whole model's precision (default: the model's own when its weights are bf16 or fp16, "
                        "else fp16: ModelOpt AutoCast keeps what is numerically sensitive in fp32); fp32 attention "
                        "has no fused kernel")
    b.add_argument("--calib", help="fp8/int8: calibration data, an .npz of arrays keyed by input name (samples along "
                                   "axis 0); not needed for a model ModelOpt has already quantized")
    b.add_argument("--io-dtype", choices=["fp16", "bf16"],
                   help="convert the model's float inputs and outputs to the precision too (default: kept as they "
                        "are; a kv-cache form's caches always take the attention's dtype)")
    b.add_argument("--decomposable", action="store_true",
                   help="let TensorRT fall back to unfused attention where no fused kernel fits (default: fail)")
    b.add_argument("--min-shapes", help="trtexec style, e.g. input_ids:1x1,attention_mask:1x1")
    b.add_argument("--opt-shapes")
    b.add_argument("--max-shapes")
    b.add_argument("--max-batch", type=positive, default=DEFAULT_MAX_BATCH,
                   help=f"the profiles' largest batch (default {DEFAULT_MAX_BATCH})")
    b.add_argument("--max-positions", type=positive,
                   help="the profiles' longest sequence (default: the model's maximum positions)")
    b.add_argument("--max-cache", type=positive,
                   help="kv-cache form: the caches' static capacity (default: the maximum positions)")
    b.add_argument("--timing-cache", help="read and update this timing cache file")
    b.add_argument("--workspace", type=positive, help="workspace limit in MiB")
    b.add_argument("--save-onnx", help="also write the verified form model and the cut model to this folder")
    b.add_argument("--plan-json", help="write the build plan as JSON here (with or without TensorRT)")
    b.add_argument("--force", action="store_true", help="replace an existing engine")
    b.add_argument("--mark-sites", action="store_true",
                   help="also output every attention's result, for per-site errors in trtattn verify")
    b.add_argument("--dims", type=dims_text, help="symbolic dim values for verification, e.g. batch=2,seq=16")
    b.add_argument("--tp", type=positive, default=1,
                   help="tensor parallel over N ranks (GPUs): one form and engine per rank, NAME.tp.json for the set")
    add_memory_opt(b)
    add_report_html(b)
    add_inputs_opt(b, folder=" With an export folder: a folder of one file per part, ROLE.npz or ROLE.json "
                            "(encoder, decoder, decoder_with_past); a part without one is verified on generated inputs.")


def run(args, progress) -> int:
    if args.tp > 1:
        from .build_tp import run_tp

        if args.save_onnx:  # before any work: the rank forms would silently go elsewhere
            raise TrtattnError(f"--save-onnx {args.save_onnx} does not apply with --tp: each rank's verified form is "
                               f"written beside its engine in --out-dir ({args.out_dir})")

        return run_tp(args, progress)
    if Path(args.model).is_dir():  # an export folder: one engine per part and pipeline.json
        return _run_folder(args, progress)
    from ..routes.builder import build
    from ..routes.prepare import Limits, describe, prepare
    from ..trt import compat
    from ..trt.profiles import parse_shapes

    check_report_html(args)
    model = load_model(args.model, progress)  # weights stay on disk: memory follows the work (an 8B model is 16 GB)
    name = args.name or Path(args.model).stem
    shapes = (parse_shapes(args.min_shapes), parse_shapes(args.opt_shapes), parse_shapes(args.max_shapes))
    limits = Limits(max_batch=args.max_batch, max_positions=args.max_positions, max_cache=args.max_cache)
    try:
        prepared = prepare(model, name=name, form=args.form, precision=args.precision, io_dtype=args.io_dtype,
                           calib=args.calib, dims=parse_dims(args.dims), decomposable=args.decomposable, shapes=shapes,
                           limits=limits, progress=progress, source=str(args.model), mark_sites=args.mark_sites,
                           inputs=given_inputs(args, model))
    except SitesRefused as e:
        from .fuse_trt import refused

        return refused(e, f"{args.out_dir}/{name}.engine")
    print(describe(prepared.plan))
    if args.report_html:
        from ..pictures import build_entry, write_html

        with progress.step(f"drawing {args.report_html}"):
            write_html(args.report_html, [build_entry(f"{name} ({prepared.plan.form}, {prepared.plan.precision})", prepared)],
                       protect=(args.model,))
        print(f"wrote {args.report_html}")
    if args.plan_json:
        onnxio.atomic_write(Path(args.plan_json), (json.dumps(prepared.plan.plan_json(), indent=2) + "\n").encode())
        print(f"wrote {args.plan_json}")
    if args.save_onnx:
        out = Path(args.save_onnx)
        onnxio.save(prepared.form_model, out / f"{name}.{prepared.plan.form}.onnx", protect=(args.model,))
        onnxio.save(prepared.cut.model, out / f"{name}.{prepared.plan.form}.cut.onnx", protect=(args.model,))
        print(f"wrote {out / f'{name}.{prepared.plan.form}.onnx'} (verified on ONNX Runtime) and the cut model")
    try:
        trt = compat.import_tensorrt()
    except MissingDependencyError as e:
        return exit_without_tensorrt(e)
    with progress.step(f"building {name} with TensorRT {trt.__version__}"):
        engine_path, json_path = build(prepared, trt, args.out_dir, force=args.force,
                                       timing_cache=Path(args.timing_cache) if args.timing_cache else None,
                                       workspace_mb=args.workspace)
    print(f"wrote {engine_path} and {json_path}")
    return 0


def _run_folder(args, progress) -> int:
    """`build DIR`: every part prepared (verified forms, plans) into OUT_DIR/DIR-name with pipeline.json;
    with TensorRT each part built. Exit 4 without TensorRT (forms, plans and sidecar written), 1 when a
    part cannot be prepared (listed with why)."""
    from ..folder_engines import prepare_folder, write_sidecar
    from ..report import table
    from ..routes.builder import build
    from ..routes.prepare import describe
    from ..trt import compat

    out = Path(args.out_dir) / Path(args.model).resolve().name
    result = prepare_folder(args.model, out, precision=args.precision, dims=parse_dims(args.dims), force=args.force,
                            progress=progress, inputs=args.inputs)
    for part in result.parts:
        if part.prepared is not None:
            print(f"--- {part.role} ({part.source.name}{', ' + part.branch if part.branch else ''})")
            print(describe(part.prepared.plan))
    print(table([{"part": p.role, "source": p.source.name, "branch": p.branch or "-", "form": p.form,
                  "status": "prepared" if p.error is None else "not prepared", "why": p.error or p.note or "-"}
                 for p in result.parts],
                [("part", "part"), ("source", "from"), ("branch", "branch"), ("form", "form"), ("status", "status"),
                 ("why", "why not")]))
    engines = {}
    try:
        trt = compat.import_tensorrt()
    except MissingDependencyError as e:
        print(f"wrote {write_sidecar(result)} and the verified forms and plans in {out}")
        return exit_without_tensorrt(e) if result.ok else 1
    for part in result.parts:
        if part.prepared is None:
            continue
        with progress.step(f"building {part.role} with TensorRT {trt.__version__}"):
            engine_path, _ = build(part.prepared, trt, out, force=args.force,
                                   timing_cache=Path(args.timing_cache) if args.timing_cache else None,
                                   workspace_mb=args.workspace)
        engines[part.role] = Path(engine_path).name
    print(f"wrote {write_sidecar(result, engines)} and {len(engines)} engines in {out}")
    return 0 if result.ok else 1
