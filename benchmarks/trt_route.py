"""The trtexec route over the whole zoo (issue 13): every zoo model x exporter in every form, written with
TensorRT's own ONNX ops (`trtattn fuse --ops trt`) and verified on CPU through trtattn_plugins; and `trtattn
normalize` on each, with every attention Softmax checked against TensorRT's documented pattern.

    python benchmarks/trt_route.py                       # everything (about 40 min on 2 cores, exports cached)
    python benchmarks/trt_route.py --models llama,bert --forms padded --skip-normalize
    python benchmarks/trt_route.py --json out/bench/trt_route.json
    python benchmarks/trt_route.py --models llama,bert --skip-normalize --precision fp8 --dims batch=2,seq=32

Exports come from TRTATTN_ZOO_CACHE (or --work-dir) and are reused; each model runs in a child process (a
crash there is a CRASH row, the run goes on). Prints one table per part: for each
row the outcome (written + verified; a form the model does not have, with why; sites TensorRT's ops cannot
express, named) and the time; then the totals. Exits 1 if a written model failed its verification or a
normalized site is outside the pattern without a reason.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import onnx

import trtattn_plugins
from trtattn import zoo
from trtattn.cli.dims import parse_dims
from trtattn.errors import TrtattnError
from trtattn.report import table
from trtattn.testing.patterns import documented_pattern_violations

FORMS = ("padded", "packed", "kv-cache")


def export(name: str, exporter: str, work: Path) -> Path:
    path = work / f"{name}.{exporter}.onnx"
    if not path.exists():
        zoo.export(name, exporter, path)
    return path


def one_line(error: BaseException) -> str:
    return str(error).splitlines()[0][:160] if str(error) else type(error).__name__


def calibration(model: onnx.ModelProto, dims) -> dict:
    """Four realistic input sets along axis 0 (fp8/int8 need calibration data)."""
    import numpy as np

    from trtattn.graph.feeds import make_feeds

    feeds = [make_feeds(model, dims=dims, seed=seed) for seed in range(4)]
    return {k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]}


def trt_row(model: onnx.ModelProto, name: str, exporter: str, form: str, precision: str, dims) -> dict:
    from trtattn.routes.trt_ops import fuse_trt

    row = {"model": name, "exporter": exporter, "form": form}
    start = time.perf_counter()
    try:
        calib = calibration(model, dims) if precision in ("fp8", "int8") else None
        result = fuse_trt(model, name=name, form=form, precision=precision, calib=calib, dims=dims)
    except TrtattnError as e:
        text = one_line(e)
        row["outcome"] = ("refused: " if "TensorRT plugin" in text else "no form: ") + text
        row["seconds"] = time.perf_counter() - start
        return row
    except Exception as e:  # noqa: BLE001 (an internal error is a finding too: one row, the run goes on)
        row["outcome"] = f"ERROR {type(e).__name__}: {one_line(e)}"
        row["trace"] = traceback.format_exc(limit=3)
        row["seconds"] = time.perf_counter() - start
        return row
    row["seconds"] = time.perf_counter() - start
    ops = collections.Counter(n.op_type for n in result.model.graph.node if n.domain == "trt")
    row["ops"] = ", ".join(f"{v} {k}" for k, v in sorted(ops.items()))
    row["dtype"] = ",".join(sorted({a.dtype for a in result.prepared.plan.native}))
    problems = trtattn_plugins.check_model(result.model)  # every node exactly as documented (again, independently)
    row["schema"] = "ok" if not problems else f"{len(problems)} problems: {problems[0]}"
    row["rope"] = sum(n.op_type == "RotaryEmbedding" for n in result.model.graph.node)
    row["max_abs_err"] = result.verification.max_abs_err
    if problems:
        row["outcome"] = f"FAILED schema: {row['schema']}"
    elif not result.ok:
        row["outcome"] = f"FAILED: {result.verification.error or 'mismatch'}"
    else:
        row["outcome"] = "verified"
    return row


def normalize_row(model: onnx.ModelProto, name: str, exporter: str) -> dict:
    from trtattn.rewrite.normalize import normalize_model

    row = {"model": name, "exporter": exporter}
    start = time.perf_counter()
    try:
        result = normalize_model(model)
    except Exception as e:  # noqa: BLE001 (one row, the run goes on)
        row.update(outcome=f"ERROR {type(e).__name__}: {one_line(e)}", seconds=time.perf_counter() - start)
        return row
    row["seconds"] = time.perf_counter() - start
    row["sites"] = len(result.sites) + len(result.skipped)
    row["guards_moved"] = sum(r.probabilities == "NaN guard moved after BMM2" for r in result.sites)
    bad = dict(documented_pattern_violations(result.model))  # softmax -> what is in the way
    by_softmax = {r.site.softmax: r for r in result.sites}
    claims = ("rewritten", "kept: already in TensorRT's form")  # what normalize says is now TensorRT's form
    claimed = [s for s in bad if s in by_softmax and by_softmax[s].action in claims
               and "not TensorRT's form" not in by_softmax[s].probabilities]
    row["in_pattern"] = sum(r.site.softmax not in bad for r in result.sites if r.site.softmax)
    row["implicit"] = sum(bool(r.after.get("implicit")) for r in result.sites)
    row["fused_ops"] = sum(r.action.startswith("kept: already a fused op") for r in result.sites)
    reasons = [f"{r.site.name}: {r.action}" for r in result.sites if r.action.startswith(("skipped", "kept: "))
               and r.action != "kept: already in TensorRT's form" and not r.action.startswith("kept: already a fused")]
    reasons += [f"{s.name}: skipped by the matcher: {s.reason}" for s in result.skipped]
    if claimed:  # normalize says these are in TensorRT's form, and they are not
        row["outcome"] = "OUTSIDE: " + "; ".join(f"{s}: {bad[s]}" for s in claimed[:2])
    elif result.verification.failed:
        row["outcome"] = f"FAILED verification (max abs error {result.verification.max_abs_err})"
    else:
        row["outcome"] = "ok" if not reasons else "reported: " + "; ".join(reasons)[:200]
    why = sorted({r.after.get("implicit_why") for r in result.sites if not r.after.get("implicit")} - {None, "-"})
    row["why_not_implicit"] = "; ".join(why)[:160] or "-"
    return row


def one_model(args, name: str, exporter: str) -> dict:
    """The rows of one model x exporter (run in a child process: a crash there loses that model only)."""
    model = onnx.load(str(export(name, exporter, Path(args.work_dir))))
    rows = {"normalize": [], "trt": []}
    if not args.skip_normalize:
        rows["normalize"].append(normalize_row(model, name, exporter))
        print(f"normalize {name} {exporter}: {rows['normalize'][-1]['outcome']} "
              f"({rows['normalize'][-1]['seconds']:.1f}s)", file=sys.stderr, flush=True)
    for form in [] if args.skip_trt else [f for f in args.forms.split(",") if f]:
        rows["trt"].append(trt_row(model, name, exporter, form, args.precision, parse_dims(args.dims)))
        print(f"--ops trt {name} {exporter} {form}: {rows['trt'][-1]['outcome']} ({rows['trt'][-1]['seconds']:.1f}s)",
              file=sys.stderr, flush=True)
    return rows


def in_child(argv: list[str], name: str, exporter: str) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "rows.json"
        done = subprocess.run([sys.executable, __file__, *argv, "--child", name, exporter, str(out)], check=False)
        if done.returncode == 0 and out.exists():
            return json.loads(out.read_text())
    crash = f"CRASH: the child process exited with {done.returncode} (a signal when negative)"
    return {"normalize": [{"model": name, "exporter": exporter, "outcome": crash, "seconds": 0.0}],
            "trt": [{"model": name, "exporter": exporter, "form": "-", "outcome": crash, "seconds": 0.0}]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", help="comma-separated zoo names (default: all)")
    ap.add_argument("--exporters", help="comma-separated (default: each entry's)")
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--precision", default="fp16", help="as `fuse --ops trt --precision` (fp8/int8: calibrated on "
                                                         "four generated input sets)")
    ap.add_argument("--dims", help="symbolic dims for verification (and calibration), e.g. batch=2,seq=32")
    ap.add_argument("--skip-normalize", action="store_true")
    ap.add_argument("--skip-trt", action="store_true")
    ap.add_argument("--work-dir", default=os.environ.get("TRTATTN_ZOO_CACHE", "out/bench/models"))
    ap.add_argument("--json", help="write every row here")
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "EXPORTER", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        name, exporter, out = args.child
        Path(out).write_text(json.dumps(one_model(args, name, exporter), default=str))
        return 0
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    names = args.models.split(",") if args.models else list(zoo.ZOO)
    exporters = set(args.exporters.split(",")) if args.exporters else None
    child_args = ["--forms", args.forms, "--precision", args.precision, "--work-dir", str(work)]
    child_args += (["--dims", args.dims] if args.dims else []) + (["--skip-normalize"] if args.skip_normalize else []) \
        + (["--skip-trt"] if args.skip_trt else [])
    trt_rows, norm_rows = [], []
    for name in names:
        for exporter in zoo.get(name).exporters:
            if exporters and exporter not in exporters:
                continue
            export(name, exporter, work)  # here, so that a child never exports concurrently
            rows = in_child(child_args, name, exporter)
            norm_rows += [] if args.skip_normalize else rows["normalize"]
            trt_rows += [] if args.skip_trt else rows["trt"]
    failed = 0
    if trt_rows:
        print(table(trt_rows, [("model", "model"), ("exporter", "exporter"), ("form", "form"), ("ops", "TensorRT ops"),
                               ("dtype", "dtype"), ("schema", "schema"),
                               ("rope", "RoPE"), ("max_abs_err", "max abs err"), ("seconds", "s"), ("outcome", "outcome")]))
        counts = collections.Counter(r["outcome"].split(":")[0].split(" ")[0] for r in trt_rows)
        print("fuse --ops trt: " + ", ".join(f"{v} {k}" for k, v in counts.most_common())
              + f"; {sum(r['seconds'] for r in trt_rows):.0f} s in all\n")
        failed += sum(r["outcome"].startswith(("FAILED", "ERROR", "CRASH")) for r in trt_rows)
    if norm_rows:
        print(table(norm_rows, [("model", "model"), ("exporter", "exporter"), ("sites", "sites"),
                                ("guards_moved", "NaN guards moved"), ("in_pattern", "in pattern"),
                                ("fused_ops", "ONNX Attention ops"),
                                ("implicit", "implicit (fp16)"), ("seconds", "s"), ("outcome", "outcome"),
                                ("why_not_implicit", "why not implicit")]))
        sites = sum(r.get("sites", 0) for r in norm_rows)
        print(f"normalize: {sites} sites, {sum(r.get('in_pattern', 0) for r in norm_rows)} in TensorRT's documented "
              f"pattern, {sum(r.get('fused_ops', 0) for r in norm_rows)} already ONNX Attention ops (the parser maps "
              f"them to IAttention), {sum(r.get('guards_moved', 0) for r in norm_rows)} NaN guards moved; "
              f"{sum(r['seconds'] for r in norm_rows):.0f} s in all")
        failed += sum(r["outcome"].startswith(("OUTSIDE", "ERROR", "FAILED", "CRASH")) for r in norm_rows)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"trt": trt_rows, "normalize": norm_rows}, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
