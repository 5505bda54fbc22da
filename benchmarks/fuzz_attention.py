#!/usr/bin/env python
"""The attention mutation fuzzer (issue 10): mutate zoo exports and hand-built graphs around each
attention site, fuse every mutant with trtattn, and count per mutation kind what was fused, listed as
not fused, missed, crashed or written wrong.

    python benchmarks/fuzz_attention.py [--cases 300] [--seed 0] [--jobs 2] [--sources a,b|quick|all]
                                        [--json FILE] [--cli-every 10]
    python benchmarks/fuzz_attention.py --case 'bert.torchscript/1/einsum/bmm1' [--save DIR]
    python benchmarks/fuzz_attention.py --list-kinds

The full run is `--cases 1200 --sources all`. Zoo exports are reused from TRTATTN_ZOO_CACHE (else
out/fuzz/zoo). The package is benchmarks/fuzz/ (see its __init__ for the parts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from trtattn.testing.fuzz import runner  # noqa: E402
from trtattn.testing.fuzz.graphops import KINDS  # noqa: E402
from trtattn.testing.fuzz.oracle import run_case  # noqa: E402
from trtattn.testing.fuzz.sources import QUICK_SOURCES, all_sources  # noqa: E402


def _sources(spec: str) -> list[str]:
    if spec == "all":
        return all_sources()
    if spec == "quick":
        return list(QUICK_SOURCES)
    return [s for s in spec.split(",") if s]


def _one(cid: str, save: str | None) -> int:
    r = run_case(cid, cli=True, save=Path(save) if save else None)
    for key, value in r.to_dict().items():
        if key != "notes":
            print(f"{key:12s} {value}")
    for note in r.notes:
        print(note)
    if save:
        print(f"mutant and fused model in {save}/")
    return 0 if r.outcome in ("fused", "listed", "n/a") or (r.outcome == "no_effect") else 1


def _self_check(sources: list[str], kinds: list[str]) -> int:
    from collections import Counter, defaultdict

    sites = runner.site_counts(sources)
    per, bad = defaultdict(Counter), []
    for kind in kinds:
        for cid in sorted(runner.candidates(kind, sources, sites, 0)):
            try:
                r = run_case(cid, fuse=False)
            except Exception as e:
                per[kind]["source unusable"] += 1
                bad.append(f"unusable  {cid}  {type(e).__name__}: {e}")
                continue
            per[kind][r.outcome] += 1
            if r.outcome in ("invalid", "no_effect"):
                bad.append(f"{r.outcome:9s} {cid}  {r.reason}")
    for kind, c in per.items():
        print(f"{kind:18s} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    print("\n".join(bad))
    return 1 if any(b.startswith("invalid") for b in bad) else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=300, help="cases to run (default 300; the full run is >= 1000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--sources", default="all", help="'all' (default), 'quick', or comma-separated source names")
    ap.add_argument("--kinds", help="comma-separated mutation kinds (default: all; see --list-kinds)")
    ap.add_argument("--cli-every", type=int, default=10, help="check `trtattn fuse`'s exit code on every Nth case "
                    "(0: never)")
    ap.add_argument("--json", help="write every case result here")
    ap.add_argument("--case", help="rerun one case by its id SOURCE/SITE/KIND/VARIANT and print what happened")
    ap.add_argument("--save", help="with --case: write mutant.onnx and fused.onnx into this folder")
    ap.add_argument("--list-kinds", action="store_true", help="print the mutation kinds and their variants")
    ap.add_argument("--all-failures", action="store_true", help="print every failing case, not the first 60")
    ap.add_argument("--self-check", action="store_true", help="make and check every mutant of every site of the "
                    "sources without fusing: the fuzzer's own bugs (invalid mutants, no-effect changes)")
    args = ap.parse_args(argv)

    if args.list_kinds:
        for k in KINDS.values():
            print(f"{k.name:18s} {'keeps' if k.preserving else 'changes'} meaning  {', '.join(k.variants)}\n"
                  f"{'':18s} {k.doc.splitlines()[0] if k.doc else ''}")
        print("sources:", ", ".join(all_sources()))
        return 0
    if args.case:
        return _one(args.case, args.save)

    sources = _sources(args.sources)
    kinds = args.kinds.split(",") if args.kinds else list(KINDS)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        ap.error(f"unknown kinds {unknown}; known: {', '.join(KINDS)}")
    if args.self_check:
        return _self_check(sources, kinds)
    t0 = time.perf_counter()

    def progress(i, n, r):
        if sys.stderr.isatty() or i % 25 == 0 or i == n:
            print(f"\r[{i}/{n}] {time.perf_counter() - t0:6.0f}s  {r.outcome:9s} {r.id[:70]:70s}",
                  end="\n" if not sys.stderr.isatty() else "", file=sys.stderr, flush=True)

    results = runner.run(args.cases, args.seed, args.jobs, sources, args.cli_every, progress, kinds)
    elapsed = time.perf_counter() - t0
    print(file=sys.stderr)
    print(f"attention mutation fuzzer: {len(results)} cases, seed {args.seed}, {len(sources)} sources, "
          f"{args.jobs} jobs, {elapsed:.0f} s\n")
    print(runner.table(results))
    print()
    print(runner.error_summary(results))
    print(runner.cli_summary(results))
    for note in runner.unusable_sources(results):
        print(note)
    text = runner.failures(results, limit=10**6 if args.all_failures else 60)
    if text:
        print("\nfailing cases (rerun one: python benchmarks/fuzz_attention.py --case 'ID'):")
        print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"seed": args.seed, "cases": args.cases, "sources": sources,
                                               "seconds": round(elapsed, 1),
                                               "results": [r.to_dict() for r in results]}, indent=1))
    bad = sum(r.outcome in ("crashed", "wrong", "invalid", "missed") for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
