#!/usr/bin/env python
"""The tensor-parallel split of a large model, found and checked in slices of layers, with the seconds and
the peak memory of each step.

    python benchmarks/tp_large.py MODEL.onnx [--ranks 2] [--slice-mb 256] [--out DIR] [--keep]

Steps: load (weights left on disk unless --in-memory; the ranks' are slices of them), the split (measured in
slices of layers), the rank forms written to DIR one rank and one weight at a time (as `build --tp` writes
them; default: a folder beside the model, removed at the end unless --keep), the check (the original in
slices, the rank set read from those files one rank's wave at a time). --slice-mb forces the slice budget
(default: graph/slices.py's, slicing a model over half the memory).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path


def peak_mb() -> float:
    from trtattn.host_memory import peak_rss

    return (peak_rss() or 0) / 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--slice-mb", type=int)
    ap.add_argument("--out", help="folder for the rank forms (default: MODEL's folder/NAME.tpN, removed after)")
    ap.add_argument("--keep", action="store_true", help="keep the rank forms written")
    ap.add_argument("--in-memory", action="store_true", help="load the weights (default: left on disk, "
                    "memory-mapped when read, as `trtattn fuse` loads a model)")
    args = ap.parse_args(argv)

    from trtattn.graph import io
    from trtattn.graph.slices import resident_size, slice_budget
    from trtattn.routes.parallel import split_model
    from trtattn.verify.tolerance import tolerance_for

    start = time.perf_counter()

    def step(name: str, t0: float) -> float:
        now = time.perf_counter()
        print(f"{name}: {now - t0:.1f} s, peak {peak_mb():.0f} MB", flush=True)
        return now

    model = io.load(args.model, load_external_data=args.in_memory)
    t = step("load", start)
    budget = (args.slice_mb << 20) if args.slice_mb else slice_budget(model)
    weights = resident_size(model)
    print(f"weights {weights / 2**30:.2f} GiB resident, slice budget {budget and budget >> 20} MB")
    forms = split_model(model, args.ranks, budget=budget)
    t = step(f"split over {args.ranks} (measured in slices)", t)
    print(f"sites split {sum(s.q_per_rank is not None for s in forms.plan.sites)}/{len(forms.plan.sites)}, "
          f"replicated {len(forms.plan.replicated)}")
    source = Path(args.model)
    out = Path(args.out) if args.out else source.parent / f"{source.stem}.tp{args.ranks}"
    atol, rtol = tolerance_for(model)  # the precision's, as build --tp checks its ranks
    try:
        paths = forms.write(out, source.stem, protect=(str(source),))
        t = step(f"{args.ranks} rank forms written", t)
        sizes = [(p.stat().st_size + Path(str(p) + ".data").stat().st_size) / 2**30 for p in paths]
        print(f"rank files {', '.join(f'{s:.2f}' for s in sizes)} GiB")
        check = forms.verify(atol=atol, rtol=rtol)
        t = step("check (original in slices, ranks read from their files wave by wave)", t)
    finally:
        if not args.keep:
            for p in out.glob(f"{source.stem}.rank*of{args.ranks}.onnx*"):
                p.unlink()
            if not args.out:
                shutil.rmtree(out, ignore_errors=True)
    print(f"passed {check.passed}, max abs error {max(check.errors.values()):.3g} (atol {atol:g} + rtol {rtol:g} x "
          f"max |reference|: bounds {min(check.bounds.values()):.3g} to {max(check.bounds.values()):.3g}), "
          f"peak / weights {peak_mb() * 2**20 / weights:.2f}x, total {time.perf_counter() - start:.0f} s")
    return 0 if check.passed else 1


if __name__ == "__main__":
    sys.exit(main())
