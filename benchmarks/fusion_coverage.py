#!/usr/bin/env python
"""Attention-fusion coverage, cost and scale of trtattn, ONNX Runtime's optimizer and onnxscript.

    python benchmarks/fusion_coverage.py [--quick] [--json FILE] [--models a,b] [--exporters x,y]
                                         [--no-coverage] [--no-scaling] [--no-large] [--8b] [--profile-slow]

- coverage and cost, per zoo model and exporter: attention sites (from the zoo config), sites fused by
  trtattn (reports "fused", counted only when its verification passed) and by each peer (fused attention
  ops counted in the peer's *output model*, never what the tool says it did; a crash counts 0 and is
  noted); seconds and peak memory of each tool in a fresh process, from loading the model to saving the
  result, against the floor (onnx.load + onnx.save of the same model). trtattn runs with its
  verification and without it (the peers do not verify);
- per-layer cost: Llama written by trtattn/testing/write_llama.py at 2 to 32 layers;
- large models: the 2.2 GB Llama and, with --8b, Llama-3-8B's shapes in fp16 (16 GB), every tool once
  against issue 11's targets (peak / weights, time / floor, the fastest peer).

The pieces live in benchmarks/fusion/ (measure, worker, bench, explore, large, tables). Zoo exports go
to --work-dir and are reused; write_llama models too (except the 8B one, deleted after its row).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fusion import large as large_mod  # noqa: E402
from fusion import tables  # noqa: E402
from fusion.bench import ORT_MODEL_TYPE, Bench, ort_kwargs  # noqa: E402
from fusion.explore import explore_ort  # noqa: E402
from fusion.measure import PEERS, ROOT, TOOLS, machine  # noqa: E402
from fusion.worker import check_worker, export_worker, tool_worker  # noqa: E402

QUICK_MODELS = ["bart", "bert", "gpt2", "llama", "llama-cache", "swin-sdpa", "t5", "whisper-decoder-cache"]
QUICK_EXPORTERS = ["torchscript", "dynamo"]


def _mem_total_gb() -> float:
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) / 2**20


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"a subset ({', '.join(QUICK_MODELS)}; per-layer cost at "
                    f"{', '.join(map(str, large_mod.QUICK_SCALING_LAYERS))} layers; no large model)")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--models", help="comma-separated zoo names (default: all; with --quick: the quick subset)")
    ap.add_argument("--exporters", help="comma-separated: torchscript, dynamo (default: each entry's exporters)")
    ap.add_argument("--work-dir", default=str(ROOT / "out" / "bench"), help="exports and outputs (default out/bench)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per tool run (default 3600)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per tool and model; the fastest counts (default 2)")
    ap.add_argument("--export-timeout", type=float, default=1800)
    ap.add_argument("--mem-cap-gb", type=float, default=round(_mem_total_gb() - 2.5, 1),
                    help="kill a tool whose resident memory passes this (default: the machine's memory - 2.5 GB)")
    ap.add_argument("--no-coverage", action="store_true", help="skip the per-model coverage table")
    ap.add_argument("--export-only", action="store_true", help="only export the models into --work-dir")
    ap.add_argument("--explore-ort", action="store_true",
                    help="try every plausible ORT optimizer model type / opt level per family and print the best")
    ap.add_argument("--no-scaling", action="store_true")
    ap.add_argument("--scaling-layers", help="e.g. 2,8,32")
    ap.add_argument("--no-warmup", action="store_true")
    ap.add_argument("--no-large", action="store_true")
    ap.add_argument("--large", action="store_true", help="run the 2.2 GB model even with --quick")
    ap.add_argument("--8b", dest="huge", action="store_true",
                    help="also Llama-3-8B's shapes in fp16 (writes 15 GB, about 30 min, needs ~20 GB of memory)")
    ap.add_argument("--keep-8b", action="store_true", help="keep the written 8B model in --work-dir")
    ap.add_argument("--no-check-peers", action="store_true", help="do not check peers' outputs on ONNX Runtime")
    ap.add_argument("--profile-slow", action="store_true",
                    help="profile trtattn (cProfile) on rows where it is slower than a peer or > 3x the floor")
    # worker modes (internal)
    ap.add_argument("--_worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_export", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_check", action="store_true", help=argparse.SUPPRESS)
    for a in ("--tool", "--model", "--out", "--family", "--result", "--ort-kwargs", "--profile", "--base", "--name",
              "--exporter", "--overrides"):
        ap.add_argument(a, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def coverage(bench: Bench, args, report: dict) -> None:
    from trtattn import zoo

    names = args.models.split(",") if args.models else (QUICK_MODELS if args.quick else list(zoo.ZOO))
    exporters = args.exporters.split(",") if args.exporters else (QUICK_EXPORTERS if args.quick else list(zoo.EXPORTERS))
    bench.say("coverage and cost:")
    for name in names:
        entry = zoo.get(name)
        for exporter in entry.exporters:
            if exporter not in exporters:
                continue
            path, meta = bench.export(name, exporter)
            if path is None:
                report["export_failures"].append({"model": name, "exporter": exporter, "error": meta.get("error")})
                continue
            if args.export_only:
                continue
            row = bench.row(name, exporter, path, entry.family, entry.expected_sites,
                            ort_kwargs(entry.family, entry.config()), check=not args.no_check_peers)
            row["export_seconds"] = meta.get("seconds")
            report["rows"].append(row)


def profile_slow(bench: Bench, every: list[dict], slow: list[str]) -> None:
    bench.say("profiling trtattn where it is slow (the three largest such models):")
    prof_dir = bench.work / "profiles"
    prof_dir.mkdir(exist_ok=True)
    flagged = [r for r in every if any(s.startswith(f"{r['model']}/{r['exporter']}:") for s in slow)]
    for r in sorted(flagged, key=lambda r: -r["size_mb"])[:3]:
        folder = f"{r['model']}.{r['exporter']}" if r["exporter"] != "write_llama" else r["model"]
        pf = prof_dir / f"{r['model']}.{r['exporter']}.prof"
        bench.run_tool("trtattn", bench.work / "models" / folder / "model.onnx", r["model"], None, profile=str(pf))
        r["profile"], r["profile_top"] = str(pf), tables.profile_top(pf)


def show(report: dict, args) -> None:
    m = report["machine"]
    print(f"# Attention fusion coverage, cost and scale ({'quick' if args.quick else 'full'} run, "
          f"{report['seconds_total'] / 60:.1f} min)\n")
    print(f"Machine: {m.get('cpu', '?')}, {m['cpus']} CPUs, {m.get('mem_gb', '?')} GB; python {m['python']}, "
          + ", ".join(f"{k} {v}" for k, v in m.items() if k not in ("cpu", "cpus", "mem_gb", "python")) + ".\n")
    if report["rows"]:
        print("## Coverage and cost\n")
        print("Fused counts are attention ops in each tool's output model (trtattn: sites fused and verified). "
              "Seconds: load + fuse (+ verify) + save, in a fresh process; MB: peak RSS of that process.\n")
        print(tables.coverage_table(report["rows"]) + "\n")
    if report["scaling"]:
        print("## Per-layer cost (Llama written by write_llama.py, hidden 256)\n")
        print(tables.scaling_table(report["scaling"]) + "\n")
    if report["large"]:
        print("## Large models\n")
        print(tables.large_table(report["large"]) + "\n")
        print(tables.targets(report["large"]) + "\n")
    every = report["rows"] + report["scaling"] + report["large"]
    notes = []
    for r in every:
        for t, e in r["errors"].items():
            notes.append(f"- {r['model']}/{r['exporter']} {t}: {e}")
        for t in PEERS:
            det = r["details"].get(t, {})
            if det.get("output_matches_original") is False:
                notes.append(f"- {r['model']}/{r['exporter']} {t}: output differs from the original "
                             f"(max abs err {det.get('check_max_abs_err')})")
            if det.get("check_error"):
                notes.append(f"- {r['model']}/{r['exporter']} {t}: its output does not run: {det['check_error']}")
        for t in ("trtattn", "trtattn_noverify"):
            for sk in r["details"].get(t, {}).get("skipped", []):
                notes.append(f"- {r['model']}/{r['exporter']} {t}: not fused {sk['name']}: {sk['reason']}")
    notes += [f"- export {f['model']}/{f['exporter']} failed: {f['error']}" for f in report["export_failures"]]
    if notes:
        print("## Errors and sites not fused\n")
        print("\n".join(dict.fromkeys(notes)) + "\n")
    if tables.slow_rows(report["rows"]):
        print("## Where trtattn is slower than the fastest peer or > 3x the load+save floor\n")
        print(tables.slow_summary(report["rows"]) + "\n")
    for r in (r for r in every if r.get("profile_top")):
        print(f"{r['model']}/{r['exporter']} ({r['profile']}):\n```\n" + "\n".join(r["profile_top"]) + "\n```\n")
    print(f"ORT optimizer model types: {', '.join(f'{k}={v}' for k, v in ORT_MODEL_TYPE.items())}.")


def main(argv=None) -> int:
    args = parse(argv)
    if args._worker:
        return tool_worker(args)
    if args._export:
        return export_worker(args)
    if args._check:
        return check_worker(args)
    started = time.perf_counter()
    bench = Bench(args)
    report = {"machine": machine(), "quick": args.quick, "ort_model_types": ORT_MODEL_TYPE, "rows": [],
              "scaling": [], "large": [], "export_failures": []}
    if args.explore_ort:
        from trtattn import zoo

        explore_ort(bench, args.models.split(",") if args.models else list(zoo.ZOO),
                    args.exporters.split(",") if args.exporters else list(zoo.EXPORTERS))
        return 0
    if not args.export_only and not args.no_warmup:
        # one untimed run of every tool: the first process to import torch, sympy and onnxruntime after boot
        # reads them from disk, which would be charged to whichever row comes first
        warm = large_mod.written(bench, "llama-2L", {**large_mod.SCALING_SHAPE, "layers": 2})
        bench.say("warm-up (untimed) ...")
        for tool in TOOLS:
            bench.run_tool(tool, warm, "llama", large_mod._kwargs({**large_mod.SCALING_SHAPE, "layers": 2}))
    if not args.no_coverage:
        coverage(bench, args, report)
    if not args.no_scaling and not args.export_only:
        layers = [int(x) for x in args.scaling_layers.split(",")] if args.scaling_layers else (
            large_mod.QUICK_SCALING_LAYERS if args.quick else large_mod.SCALING_LAYERS)
        bench.say(f"per-layer cost (write_llama, {layers} layers):")
        report["scaling"] = large_mod.scaling(bench, layers)
    if ((not args.no_large and not args.quick) or args.large or args.huge) and not args.export_only:
        bench.say("large models (external data):")
        report["large"] = large_mod.large(bench, huge=args.huge, keep_huge=args.keep_8b)
    every = report["rows"] + report["scaling"] + report["large"]
    slow = tables.slow_rows(every)
    if args.profile_slow and slow:
        profile_slow(bench, every, slow)
    report["seconds_total"] = round(time.perf_counter() - started, 1)
    show(report, args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
