#!/usr/bin/env python
"""onnx's backend node cases of the Attention op (opset 23/24) through trtattn, one row per case.

    python benchmarks/conformance.py --expanded [--markdown] [--json FILE] [--only SUBSTRING]

--expanded: each case as its `_expanded` form (the op replaced by its function body, as onnx.inliner and function
expansion write it) through `fuse` as the command runs it (trtattn.testing.conformance.fuse_case: read check, fuse
verified on the case's own inputs, check of what would be written), then the fused model on ONNX Runtime against
onnx's reference outputs. Columns: case, fused (one Attention op replaced the body), max abs error against the
reference and whether it is within the case's tolerance (FP16_ATOL for fp16), or why it did not fuse. bf16 cases
are named, not counted (ONNX Runtime's CPU provider cannot run them). Then each RotaryEmbedding case's body on Q
and K of an attention (fuse_rotation_case): fused with one RotaryEmbedding op per rotated input, the op on Q
against onnx's reference output.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtattn.testing.conformance import conformance_cases, fuse_case, fuse_rotation_case  # noqa: E402


def expanded_rows(only: str | None = None) -> list[dict]:
    rows = []
    for case in conformance_cases("Attention", expanded=True):
        if only and only not in case.name:
            continue
        if case.cpu_unrunnable:
            rows.append({"case": case.name, "fused": None, "max_abs_err": None, "within": None,
                         "reason": f"skipped: {case.cpu_unrunnable} (ONNX Runtime's CPU provider cannot run it)"})
            continue
        t0 = time.perf_counter()
        try:
            out = fuse_case(case)
        except Exception as e:  # a crash is a row too, never a silent miss
            rows.append({"case": case.name, "fused": False, "max_abs_err": None, "within": False,
                         "reason": f"crash: {type(e).__name__}: {e}", "seconds": time.perf_counter() - t0})
            continue
        rows.append({"case": case.name, "fused": out.fused and out.ops.get("Attention") == 1,
                     "max_abs_err": out.max_abs_err, "within": out.within, "reason": out.reason,
                     "seconds": round(time.perf_counter() - t0, 2)})
    return rows


def rotation_rows(only: str | None = None) -> list[dict]:
    """Each RotaryEmbedding body on Q and K of an attention (fuse_rotation_case): fused with one RotaryEmbedding op
    per rotated input, the op on Q against onnx's reference output."""
    rows = []
    for case in conformance_cases("RotaryEmbedding", expanded=True):
        if only and only not in case.name:
            continue
        t0 = time.perf_counter()
        try:
            out = fuse_rotation_case(case)
        except Exception as e:  # a crash is a row too, never a silent miss
            rows.append({"case": case.name, "fused": False, "max_abs_err": None, "within": False,
                         "reason": f"crash: {type(e).__name__}: {e}", "seconds": time.perf_counter() - t0})
            continue
        ok = out.fused and out.ops.get("Attention") == 1 and out.ops.get("RotaryEmbedding") == 2
        attrs = ", ".join(f"{k}={v}" for k, v in sorted((out.attention or {}).items()) if v)
        rows.append({"case": case.name, "fused": ok, "max_abs_err": out.max_abs_err, "within": out.within,
                     "reason": out.reason or attrs, "seconds": round(time.perf_counter() - t0, 2)})
    return rows


def markdown(rows: list[dict], rotations: list[dict]) -> str:
    runnable = [r for r in rows if r["fused"] is not None]
    good = sum(bool(r["fused"] and r["within"]) for r in runnable)
    lines = [f"{good} of {len(runnable)} runnable cases fused into one Attention op and matching onnx's reference "
             f"({len(rows) - len(runnable)} bf16 cases named, not counted).", "",
             "| case | fused | max abs err vs reference | reason |", "|---|---|---|---|"]
    lines += _table_rows(rows)
    if rotations:
        good = sum(bool(r["fused"] and r["within"]) for r in rotations)
        lines += ["", f"{good} of {len(rotations)} RotaryEmbedding bodies on Q and K of an attention read and written "
                  "back as one RotaryEmbedding op per rotated input (the attention fused), the op on Q matching "
                  "onnx's reference.", "",
                  "| case | fused, 2 RotaryEmbedding | max abs err vs reference | attributes written / reason |",
                  "|---|---|---|---|"]
        lines += _table_rows(rotations)
    return "\n".join(lines)


def _table_rows(rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        fused = "skipped" if r["fused"] is None else ("yes" if r["fused"] else "no")
        err = "" if r["max_abs_err"] is None else f"{r['max_abs_err']:.2g}" + ("" if r["within"] else " (over)")
        # the body's tensors are named Attention_test_<case>_function_<name>: <name> says it
        reason = r["reason"].replace(f"Attention_test_{r['case']}_function_", "").replace("|", "\\|")
        if len(reason) > 240:
            reason = reason[:237] + "..."
        lines.append(f"| {r['case']} | {fused} | {err} | {reason} |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--expanded", action="store_true", help="the function bodies (expanded cases) through fuse")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown (benchmarks/README.md)")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--only", help="cases whose name contains this")
    args = p.parse_args()
    if not args.expanded:
        p.error("only --expanded is implemented (the op cases through `fuse --ops trt` come separately)")
    rows = expanded_rows(args.only)
    rotations = rotation_rows(args.only)
    if args.json:
        Path(args.json).write_text(json.dumps(rows + rotations, indent=1))
    if args.markdown:
        print(markdown(rows, rotations))
    else:
        for r in rows + rotations:
            print(f"{r['case']:<75} {'skip' if r['fused'] is None else 'yes' if r['fused'] else 'no':<4} "
                  f"{'' if r['max_abs_err'] is None else format(r['max_abs_err'], '.2g'):<8} {r['reason']}")
    runnable = [r for r in rows + rotations if r["fused"] is not None]
    return 0 if all(r["fused"] and r["within"] or r["reason"] for r in runnable) else 1


if __name__ == "__main__":
    sys.exit(main())
