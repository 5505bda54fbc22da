#!/usr/bin/env python
"""Coverage of the foreign-export corpus (tests/data/foreign/): trtattn beside ONNX Runtime's
transformer optimizer and onnxscript's rewriter.

    python benchmarks/foreign_coverage.py [--json FILE] [--only NAME,...] [--timeout S]

Per corpus file: the attention sites the manifest expects; trtattn as a user runs it (`trtattn fuse
FILE -o OUT --report R.json`, its exit code): sites it found, fused (counted only when the verification
passed), listed as not fused (with the reason), silent misses (expected - found); for each peer, the
fused attention ops it *wrote* (in its output, beyond those already in the input) and whether its output
still matches the original on ONNX Runtime (trtattn's verification inputs; bound 1e-3 + 1e-3 * max|ref|,
1e-2 for fp16 models). A peer's crash counts 0 and is noted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from fusion.measure import count_attention  # noqa: E402  (benchmarks/fusion: next to this script, on its path)


def run_trtattn(path: Path, tmp: Path, timeout: float) -> dict:
    report = tmp / f"{path.stem}.report.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "plugins"), os.environ.get("PYTHONPATH", "")]))
    t0 = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "trtattn", "fuse", str(path), "-o", str(tmp / f"{path.stem}.fused.onnx"),
                               "--force", "--report", str(report)], capture_output=True, text=True, timeout=timeout, env=env)
        code, tail = done.returncode, (done.stdout + done.stderr).strip().splitlines()[-1:]
    except subprocess.TimeoutExpired:
        return {"exit": "timeout", "found": 0, "fused": 0, "listed": 0, "reasons": [], "seconds": timeout}
    seconds = time.perf_counter() - t0
    if not report.exists():
        return {"exit": code, "found": 0, "fused": 0, "listed": 0, "reasons": tail, "seconds": seconds}
    r = json.loads(report.read_text())
    sites = r["sites"]
    passed = r["verification"].get("passed") is not False
    fused = sum(s["status"] == "fused" for s in sites) if passed else 0
    return {"exit": code, "found": len(sites), "fused": fused, "listed": sum(s["status"] != "fused" for s in sites),
            "reasons": [f"{s['name']}: {s['reason']}" for s in sites if s["status"] != "fused"],
            "verification": r["verification"].get("passed"), "seconds": seconds}


def ort_kwargs(name: str) -> dict:
    """The ORT optimizer told the truth: its model type and each model's heads and hidden size (its own
    detection fails on most of these graphs). Zoo-derived files: 4 heads of 64; the others 4 of 32."""
    zoo = name.split(".")[0].split("-")[0] in ("bert", "gpt2", "llama")
    model_type = "gpt2" if name.startswith("gpt2") else "bert"
    return {"model_type": model_type, "num_heads": 4, "hidden_size": 64 if zoo else 32}


def _peer_output(tool: str, path: Path, out: Path) -> None:
    if tool == "ort_optimizer":
        from onnxruntime.transformers.optimizer import optimize_model

        optimize_model(str(path), opt_level=0, use_gpu=False, **ort_kwargs(path.name)).save_model_to_file(str(out))
    else:
        import onnx_ir as ir
        from onnxscript.rewriter.ort_fusions import optimize_for_ort

        model, _ = optimize_for_ort(ir.load(str(path)))
        ir.save(model, str(out))


def _matches(original: Path, rewritten: Path) -> tuple[bool | None, float | None]:
    import numpy as np
    import onnx
    import onnxruntime as ort

    from trtattn.graph.dims import fit_dims
    from trtattn.graph.feeds import make_feeds
    from trtattn.graph.precision import Weighing, model_precision

    model = onnx.load(str(original))
    feeds = make_feeds(model, dims=fit_dims(model, None), seed=0)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(str(original), opts, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(str(rewritten), opts, providers=["CPUExecutionProvider"]).run(None, feeds)
    tol = 1e-2 if model_precision(model, Weighing.STORED).name == "fp16" else 1e-3
    worst, ok = 0.0, True
    for a, b in zip(ref, got):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        err = float(np.max(np.abs(a - b))) if a.size else 0.0
        worst = max(worst, err)
        ok = ok and err <= tol + tol * float(np.max(np.abs(a), initial=0.0))
    return ok, worst


def run_peer(tool: str, path: Path, tmp: Path) -> dict:
    import onnx

    out = tmp / f"{path.stem}.{tool}.onnx"
    before = sum(count_attention(onnx.load(str(path))).values())
    try:
        _peer_output(tool, path, out)
        written = sum(count_attention(onnx.load(str(out))).values()) - before
    except Exception as e:  # a crash is a result: 0 written
        return {"written": 0, "verified": None, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"}
    try:
        ok, err = _matches(path, out)
    except Exception as e:
        return {"written": max(written, 0), "verified": False, "error": f"output does not run: {str(e).splitlines()[0][:160]}"}
    return {"written": max(written, 0), "verified": ok, "max_abs_err": err}


def table(rows: list[dict]) -> str:
    head = ["file", "exporter", "sites", "found", "fused+verified", "listed", "silent", "exit", "ORT opt (ok)", "onnxscript (ok)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    tot = dict.fromkeys(("sites", "found", "fused", "listed", "silent", "ort", "ox"), 0)
    for r in rows:
        t, o, x = r["trtattn"], r["ort_optimizer"], r["onnxscript"]
        silent = max(0, r["expected_sites"] - t["found"])

        def peer(p):
            mark = {True: "yes", False: "NO", None: "-"}[p.get("verified")]
            return f"{p['written']} ({mark})" + (" crash" if p.get("error") and not p["written"] else "")
        lines.append(f"| {r['file']} | {r['exporter']} | {r['expected_sites']} | {t['found']} | {t['fused']} | "
                     f"{t['listed']} | {silent} | {t['exit']} | {peer(o)} | {peer(x)} |")
        for k, v in (("sites", r["expected_sites"]), ("found", t["found"]), ("fused", t["fused"]), ("listed", t["listed"]),
                     ("silent", silent), ("ort", o["written"] if o.get("verified") else 0),
                     ("ox", x["written"] if x.get("verified") else 0)):
            tot[k] += v
    lines.append(f"| **total** | | {tot['sites']} | {tot['found']} | {tot['fused']} | {tot['listed']} | {tot['silent']} | | "
                 f"{tot['ort']} verified | {tot['ox']} verified |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from trtattn.zoo.foreign import MANIFEST, load_manifest

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--only", help="comma-separated corpus file names")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args(argv)
    rows = [r for r in load_manifest() if not args.only or r["file"] in args.only.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for row in rows:
            path = MANIFEST.parent / row["file"]
            row["trtattn"] = run_trtattn(path, Path(tmp), args.timeout)
            for tool in ("ort_optimizer", "onnxscript"):
                row[tool] = run_peer(tool, path, Path(tmp))
            print(f"{row['file']}: {json.dumps(row['trtattn'])[:300]}", file=sys.stderr, flush=True)
    print(table(rows))
    notes = [f"- {r['file']}: trtattn listed {reason}" for r in rows for reason in r["trtattn"]["reasons"]]
    notes += [f"- {r['file']}: {t} {r[t]['error']}" for r in rows for t in ("ort_optimizer", "onnxscript") if r[t].get("error")]
    if notes:
        print("\nNot fused, with the reason given:\n" + "\n".join(notes))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
