"""trtattn build MODEL --tp N: one form, plan and (with TensorRT) engine per rank, and one sidecar for the
set (NAME.tp.json). The split is found from the graph; the N rank forms are written one at a time (each
weight sliced from the model's file and written before the next: a model larger than memory splits) and
verified together from their files on ONNX Runtime with the collectives in numpy before they are moved into
OUT; without TensorRT it writes the rank forms, the per-rank plans and the sidecar, and exits 4, as build
does."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from ..errors import MissingDependencyError
from ..graph import external
from ..graph import io as onnxio
from ..graph.slices import slice_budget
from ..trt.profiles import max_positions
from .common import exit_without_tensorrt, load_model
from .dims import parse_dims


def tp_plan(forms, max_cache: int, name: str) -> dict:
    """The set's plan: per site its heads per rank, what stays whole and why, per rank its form, weights,
    KV-cache bytes at max_cache and the bytes its collectives move per token."""
    from ..routes.parallel import DOMAIN
    from ..routes.parallel.cost import initializer_bytes, rank_costs

    plan, split = forms.plan, forms.plan.split
    costs = rank_costs(forms, max_cache)
    whole_kv = sum((s.kv_heads or 0) * (s.head_size + s.v_head_size) * s.element_bytes for s in plan.sites) * max_cache
    return {
        "tensor_parallel": plan.ranks, "collective_domain": DOMAIN, "max_cache": max_cache,
        "gather_threshold_bytes": plan.gather_bytes,
        "sites": [{"name": s.name, "q_heads": s.q_heads, "kv_heads": s.kv_heads, "q_heads_per_rank": s.q_per_rank,
                   "kv_heads_per_rank": s.kv_per_rank, "ranks_per_kv_head": s.kv_replicas, "note": s.note}
                  for s in plan.sites],
        "collectives": [{"kind": "ALL_REDUCE", "tensor": plan.nodes[i].outputs[0].name, "after": plan.nodes[i].name}
                        for i in split.rows + split.vocab] + [{"kind": "ALL_GATHER", "tensor": k, "axis": v.axis}
                                                for k, v in split.gathered.items()],
        "sharded_inputs": {k: v.axis for k, v in split.input_shards.items()},
        "rank_cache_outputs": {k: v.axis for k, v in split.cached.items()},
        "replicated": [{"node": n, "why": why} for n, why in plan.replicated],
        "single_gpu": {"weight_bytes": initializer_bytes(forms.original), "kv_cache_bytes": whole_kv},
        "ranks": [{**c.as_dict(), "form": f"{name}.rank{c.rank}of{plan.ranks}.onnx",
                   "engine": f"{name}.rank{c.rank}of{plan.ranks}.engine"} for c in costs],
    }


def describe(plan: dict) -> str:
    from ..report import table

    n = plan["tensor_parallel"]
    lines = [f"tensor parallel over {n} ranks: {len(plan['collectives'])} collectives per step, "
             f"{sum(s['q_heads_per_rank'] is not None for s in plan['sites'])}/{len(plan['sites'])} sites split"]
    lines.append(table(plan["sites"], [("name", "site"), ("q_heads", "heads"), ("kv_heads", "kv"),
                                       ("q_heads_per_rank", "heads/rank"), ("kv_heads_per_rank", "kv/rank"),
                                       ("note", "note")]))
    rows = [{"rank": r["rank"], "weights": f"{r['weight_bytes'] / 2**20:.2f} MiB",
             "kv": f"{r['kv_cache_bytes'] / 2**20:.2f} MiB", "reduces": r["all_reduces"],
             "moved": f"{r['sent_bytes'] / 1024:.1f} KiB"} for r in plan["ranks"]]
    single = plan["single_gpu"]
    rows.append({"rank": "1 GPU", "weights": f"{single['weight_bytes'] / 2**20:.2f} MiB",
                 "kv": f"{single['kv_cache_bytes'] / 2**20:.2f} MiB", "reduces": 0, "moved": "0"})
    lines.append(table(rows, [("rank", "rank"), ("weights", "weights"),
                              ("kv", f"KV cache at {plan['max_cache']} (one sequence)"),
                              ("reduces", "ALL_REDUCEs/token"), ("moved", "sent/token (ring)")]))
    for r in plan["replicated"]:
        lines.append(f"  whole on every rank: {r['node']}: {r['why']}")
    return "\n".join(lines)


def run_tp(args, progress) -> int:
    if Path(args.model).is_dir():  # an export folder: each part's verified form split, tp.json for the folder
        return _folder(args, progress)
    source = Path(args.model)
    name = args.name or source.stem
    # a model over half the memory keeps its weights on disk (each rank's are sliced from the file as it is
    # written); a smaller one has them read in, which build's fp16 AutoCast step still needs
    model = load_model(source, progress)
    if slice_budget(model) is None:
        model = load_model(source, progress, with_weights=True)
    prepared = _prepared(args, progress, model, name, source)
    max_cache = args.max_cache or max_positions(model, source)[0] or 2048
    code, _ = _split(args, progress, prepared, prepared.form_model, name, Path(args.out_dir), source, max_cache)
    return code


def _folder(args, progress) -> int:
    """`build DIR --tp N`: the parts prepared as `build DIR` prepares them (each in its form: the encoder and
    first decoder step padded, the step with a cache kv-cache), then each part's verified form split."""
    from ..folder_engines import prepare_folder, write_sidecar

    out = Path(args.out_dir) / Path(args.model).resolve().name
    result = prepare_folder(args.model, out, precision=args.precision, dims=parse_dims(args.dims), force=args.force,
                            progress=progress, inputs=args.inputs)
    codes, parts, plans = [], {}, {}
    for part in result.parts:
        print(f"--- {part.role} ({part.source.name}{', ' + part.branch if part.branch else ''}, {part.form})")
        if part.prepared is None:
            print(f"trtattn: {part.role} not prepared: {part.error}")
            codes.append(1)
            continue
        form = onnxio.load(out / f"{part.role}.{part.form}.onnx")  # as written, with its weights
        planned = part.prepared.plan.limits.max_cache if part.prepared.plan.limits else None
        max_cache = args.max_cache or planned or max_positions(form)[0] or 2048
        code, plan = _split(args, progress, part.prepared, form, part.role, out, part.source, max_cache)
        codes.append(code)
        if plan is not None:
            parts[part.role] = {"source": part.source.name, "form": part.form, "plan": f"{part.role}.tp.json"}
            plans[part.role] = plan
    onnxio.atomic_write(out / "tp.json", (json.dumps({"tensor_parallel": args.tp, "parts": parts}, indent=2) + "\n")
                        .encode())
    sidecar = write_sidecar(result, tensor_parallel=args.tp, rank_sets=plans, built=all(c == 0 for c in codes))
    print(f"wrote {out / 'tp.json'} and {sidecar}")
    return 1 if any(c == 1 for c in codes) else max(codes)


def _rank_plans(prepared, forms) -> list:
    from ..routes.parallel.engine import rank_plan_from_prepared

    return [rank_plan_from_prepared(prepared, forms, r) for r in range(forms.plan.ranks)]


def _prepared(args, progress, model, name: str, source: Path):
    """build's verified form of `model` (what a one-GPU build would hand TensorRT)."""
    from ..routes.prepare import Limits, prepare
    from ..trt.profiles import parse_shapes

    shapes = (parse_shapes(args.min_shapes), parse_shapes(args.opt_shapes), parse_shapes(args.max_shapes))
    limits = Limits(max_batch=args.max_batch, max_positions=args.max_positions, max_cache=args.max_cache)
    return prepare(model, name=name, form=args.form, precision=args.precision, io_dtype=args.io_dtype,
                   calib=args.calib, dims=parse_dims(args.dims), decomposable=args.decomposable, shapes=shapes,
                   limits=limits, progress=progress, source=str(source))


def _split(args, progress, prepared, form, name: str, out: Path, source: Path,
           max_cache: int) -> tuple[int, dict | None]:
    """The rank set of build's verified form `form` (each rank's attention an IAttention over its heads):
    found, verified against the form, written with each rank's build plan; engines with TensorRT."""
    from ..routes.parallel import split_model
    from ..trt import compat
    from ..verify.tolerance import tolerance_for

    with progress.step(f"finding the split over {args.tp} ranks"):
        forms = split_model(form, args.tp, dims=parse_dims(args.dims))
    atol, rtol = tolerance_for(form)
    out.mkdir(parents=True, exist_ok=True)
    onnxio.remove_stale(out)
    # the ranks written one at a time (memory holds a weight, not the model) where the check reads them, and
    # moved into OUT only once they pass: nothing unverified is left there
    with tempfile.TemporaryDirectory(prefix=f".{name}.tp.trtattn-{os.getpid()}-", dir=out) as scratch:
        with progress.step(f"writing {args.tp} rank forms"):
            paths = forms.write(scratch, name, protect=(str(source),))
        with progress.step(f"verifying {args.tp} ranks on ONNX Runtime, collectives in numpy"):
            check = forms.verify(atol=atol, rtol=rtol)
        worst = max(check.errors.values(), default=0.0)
        print(f"{args.tp} ranks against the original: {'passed' if check.passed else 'FAILED'} "
              f"(max abs error {worst:.3g} over {len(forms.feeds)} inputs)")
        if not check.passed:
            for k, e in check.errors.items():
                print(f"  {k}: {e:.3g} (bound {check.bounds[k]:.3g})")
            return 1, None
        inputs = (str(source), *(str(p) for p in external.source_files(form)))  # the model and its weights
        for path, model in zip(paths, forms.models):
            for file in (path, Path(f"{path}.data")):
                onnxio.refuse_overwrite(out / file.name, inputs)
                os.replace(file, out / file.name)
            external.set_data_dir(model, out)
    plan = tp_plan(forms, max_cache, name)
    plan["verification"] = {"passed": check.passed, "max_abs_err": worst, "outputs": check.errors,
                            "against": "the verified form"}
    plan["form"], plan["precision"] = prepared.plan.form, prepared.plan.precision
    print(describe(plan))
    rank_plans = _rank_plans(prepared, forms)
    for r in range(args.tp):
        if rank_plans:  # each rank's build plan (its sites' heads, its collectives, its I/O and profiles)
            plan["ranks"][r]["plan"] = f"{name}.rank{r}of{args.tp}.plan.json"
            onnxio.atomic_write(out / plan["ranks"][r]["plan"],
                                (json.dumps(rank_plans[r][0].to_json(), indent=2, default=str) + "\n").encode())
    sidecar = out / f"{name}.tp.json"
    onnxio.atomic_write(sidecar, (json.dumps(plan, indent=2) + "\n").encode())
    if args.plan_json and not Path(args.model).is_dir():
        onnxio.atomic_write(Path(args.plan_json), (json.dumps(plan, indent=2) + "\n").encode())
    print(f"wrote {args.tp} rank forms and {sidecar}")
    try:
        trt = compat.import_tensorrt()
    except MissingDependencyError as e:
        return exit_without_tensorrt(e), plan
    from ..routes.parallel.engine import build_ranks

    with progress.step(f"building {args.tp} rank engines with TensorRT {trt.__version__}"):
        engines = build_ranks(forms.models, trt, out, name, max_positions=args.max_positions or max_cache,
                              force=args.force, source=str(source), plans=rank_plans or None)
    print(f"wrote {', '.join(str(e) for e in engines)}")
    return 0, plan
