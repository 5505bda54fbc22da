"""trtattn inspect ENGINE|LAYERINFO: which attentions fused, from the engine's layer info."""

from __future__ import annotations

import json

from ..inspect import inspect, render_table


def add_parser(sub) -> None:
    p = sub.add_parser(
        "inspect", help="prove from an engine's layer info that every attention runs as a fused kernel",
        description="Classify every attention of an engine as fused (an mha/fmha kernel or tactic in its layer info, "
                    "or the sidecar's record of a build with decomposable=False), unproven or not fused, with the "
                    "precision each ran in.")
    p.add_argument("source", metavar="ENGINE|LAYERINFO",
                   help="a serialized engine (needs TensorRT), a trtexec --exportLayerInfo JSON or a trtexec "
                        "--dumpLayerInfo log (both best with --profilingVerbosity=detailed)")
    p.add_argument("--sites", metavar="SIDECAR.json",
                   help="the sidecar trtattn build writes next to the engine: its sites must all be found")
    p.add_argument("--require-fused", action="store_true",
                   help="exit 1 unless attention is found, every attention is proven fused, every sidecar site is "
                        "found and every FP8/INT8 site ran in its quantized type")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args, progress) -> int:
    report = inspect(args.source, sites=args.sites)
    print(json.dumps(report, indent=2) if args.json else render_table(report))
    failures = report["summary"]["failures"]
    if args.require_fused and failures:
        if not args.json:  # stdout stays pure JSON
            print("--require-fused failed: " + "; ".join(failures))
        return 1
    return 0
