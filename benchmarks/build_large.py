#!/usr/bin/env python
"""`trtattn build MODEL --save-onnx DIR` up to the TensorRT build, on a model loaded with its weights left
on disk, with the seconds and the peak memory of every step: for models too large to load.

    python benchmarks/build_large.py MODEL.onnx --save-onnx DIR [--form padded|kv-cache|packed]
                                     [--precision fp32|fp16|bf16] [--dims batch=2,seq=8] [--keep]

The steps are trtattn.routes.prepare.prepare's (fuse every attention and verify it; derive the form and verify it;
the precision; the plan; the cut model) and the two writes `--save-onnx` does. `trtattn build` loads its
input with its weights (cli/build.py); this script loads it as `trtattn fuse` does, which is what a model
of 16 GB needs on a 24 GB machine. Both written models are deleted at the end unless --keep (an 8B model's
form and cut model are 15 GB each). --precision fp32 keeps the model's own dtypes (an fp16 model stays
fp16); fp16/bf16 convert with ModelOpt AutoCast, which needs the weights in memory.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def peak_mb() -> float:
    from trtattn.host_memory import peak_rss

    return (peak_rss() or 0) / 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--save-onnx", required=True, help="folder for the verified form model and the cut model")
    ap.add_argument("--form", default="padded", choices=["padded", "packed", "kv-cache"])
    ap.add_argument("--precision", default="fp32", help="fp32 (default here: the model's own dtypes), fp16, bf16")
    ap.add_argument("--dims", help="e.g. batch=2,seq=8")
    ap.add_argument("--keep", action="store_true", help="keep the written models")
    args = ap.parse_args(argv)

    from trtattn.cli.dims import parse_dims
    from trtattn.graph import external, io
    from trtattn.report import Progress
    from trtattn.routes.prepare import describe, prepare

    steps = []

    def step(name: str, start: float) -> float:
        now = time.perf_counter()
        steps.append((name, now - start, peak_mb()))
        return now

    t0 = time.perf_counter()
    model = io.load(args.model, load_external_data=False)
    t = step("load (weights left on disk)", t0)
    name = Path(args.model).stem
    prepared = prepare(model, name=name, form=args.form, precision=args.precision, dims=parse_dims(args.dims),
                       progress=Progress(), source=str(args.model))
    t = step(f"prepare: fuse + verify, {args.form} form + verify, precision, plan, cut", t)
    print(describe(prepared.plan))
    out = Path(args.save_onnx)
    form_path, cut_path = out / f"{name}.{args.form}.onnx", out / f"{name}.{args.form}.cut.onnx"
    io.save(prepared.form_model, form_path, protect=(args.model,))
    t = step(f"write {form_path.name}", t)
    cut = prepared.cut.model
    if external.data_dir(cut) is None and external.data_dir(prepared.form_model) is not None:
        print("note: the cut model does not record where its weights are (trt/cut.py drops the form model's "
              "metadata); taken from the form model", file=sys.stderr)
        external.set_data_dir(cut, external.data_dir(prepared.form_model))
    io.save(cut, cut_path, protect=(args.model,))
    step(f"write {cut_path.name}", t)
    total = time.perf_counter() - t0
    weights = io.weights_size(model) / 2**20
    print("\n| step | seconds | peak MB so far |\n|---|---|---|")
    for what, seconds, peak in steps:
        print(f"| {what} | {seconds:.1f} | {peak:.0f} |")
    print(f"| **total** | **{total:.1f}** | **{peak_mb():.0f}** ({peak_mb() / weights:.2f}x the {weights:.0f} MB "
          f"of weights) |")
    verification = prepared.fused.verification
    print(f"fuse: {sum(r.status == 'fused' for r in prepared.fused.reports)} of {len(prepared.fused.reports)} sites "
          f"fused; verification {'passed' if verification.get('passed') else verification}, max abs error "
          f"{verification.get('max_abs_err')}, {verification.get('slices') or 'no'} slices")
    if not args.keep:
        for p in (form_path, cut_path):
            for f in p.parent.glob(p.name + "*"):
                f.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
