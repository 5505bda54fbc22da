"""onnx's backend conformance cases of the Attention op (opset 23/24) through trtattn, one row per case.

    python benchmarks/conformance.py --ops                  # the op cases: fuse --ops trt, build, normalize
    python benchmarks/conformance.py --ops --readme         # ... and replace that table in benchmarks/README.md
    python benchmarks/conformance.py --ops --json rows.json
    python benchmarks/conformance.py --expanded [--markdown] [--json FILE] [--only SUBSTRING]
    python benchmarks/conformance.py --expanded --normalize [--json FILE] [--only SUBSTRING]

--ops: the standard Attention node itself (trtattn/testing/op_cases.py runs each case as the command line does).
--expanded: each case as its `_expanded` form (the op replaced by its function body, as onnx.inliner and function
expansion write it) through `fuse` as the command runs it (trtattn.testing.conformance.fuse_case: read check, fuse
verified on the case's own inputs, check of what would be written), then the fused model on ONNX Runtime against
onnx's reference outputs. Columns: case, fused (one Attention op replaced the body), max abs error against the
reference and whether it is within the case's tolerance (FP16_ATOL for fp16), or why it did not fuse. bf16 cases
(ONNX Runtime's CPU provider cannot run them) are fused in bf16 and checked emulated in fp32 (every bf16 tensor
rounded, each op in fp32) against onnx's reference cast to fp32, within the bf16 rewrite tolerance. Then each
RotaryEmbedding case's body on Q and K of an attention (fuse_rotation_case): fused with one RotaryEmbedding op
per rotated input, the op on Q against onnx's reference output.
--expanded --normalize: the same bodies through `normalize` instead (trtattn.testing.conformance.normalize_case):
verified and written (exit 0; the written model against onnx's reference too), a site named with why (exit 1), or
broken (a verification failure or a crash: normalize's own rewrite wrong), counted by reason.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "plugins")]

from trtattn.testing.conformance import (  # noqa: E402
    conformance_cases,
    fuse_case,
    fuse_rotation_case,
    normalize_case,
)

OPS_HEADING = "Attention op cases through the TensorRT route and normalize"


def _exit(code) -> str:
    return "-" if code is None else str(code)


def ops_suite(work: Path) -> tuple[str, list[dict], str, list[str]]:
    """(heading, rows, summary, table lines) of every op case (onnx's data sets of one case are one model:
    the first is run)."""
    from trtattn.testing.conformance import conformance_cases
    from trtattn.testing.op_cases import run_case

    cases, seen = [], set()
    for case in conformance_cases("Attention", expanded=False):
        if case.name not in seen:
            seen.add(case.name)
            cases.append(case)
    rows = []
    for case in cases:
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TrtOpWarning: rows with no key, which the form zeroes
            outcome = run_case(case, work / case.name)
        row = asdict(outcome)
        row["seconds"] = round(time.perf_counter() - start, 2)
        row["matches_reference"] = outcome.matches_reference
        rows.append(row)
        print(f"{_exit(outcome.fuse_exit)} {case.name} {outcome.form} {outcome.skipped or outcome.why[:100]}",
              file=sys.stderr, flush=True)
    lines = ["| case | configuration | fuse --ops trt | form | onnx reference (max err / bound) | build | normalize |"
             " named limit / skipped because |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["skipped"]:
            ref = "-"
        elif r["reference_error"]:
            worst = max(r["reference_error"], key=lambda k: r["reference_error"][k] / max(r["reference_bound"][k], 1e-30))
            ref = (f"{'ok' if r['matches_reference'] else 'MISMATCH'} "
                   f"{r['reference_error'][worst]:.2g} / {r['reference_bound'][worst]:.2g}")
        else:
            ref = "-"
        fuse = {0: "converted, verified", 1: "limit (exit 1)"}.get(r["fuse_exit"], f"exit {_exit(r['fuse_exit'])}")
        why = r["skipped"] or (r["why"].split(": ", 1)[-1] if r["fuse_exit"] else "")
        if r["not_run"] and r["fuse_exit"] == 0:  # bf16: the TensorRT ops checked emulated in fp32, never run in bf16
            fuse, ref = "converted, not run (bf16)", ref.replace("ok", "ok, emulated", 1)
            why = ("bf16 not run on CPU (emulated in fp32); normalize: read widened, nothing to improve, written as "
                   "read (bf16)" if r["normalize_exit"] == 0 else "bf16 not run on CPU (emulated in fp32)")
        lines.append(f"| {r['name']} | {r['features']} | {fuse} | {r['form']} | {ref} | {_exit(r['build_exit'])} | "
                     f"{_exit(r['normalize_exit'])} | {why.replace('|', '/')[:160]} |")
    run = [r for r in rows if not r["skipped"] and not r["not_run"]]
    not_run = [r for r in rows if r["not_run"]]
    bf16_converted = [r for r in not_run if r["fuse_exit"] == 0 and r["matches_reference"] and r["build_exit"] == 4]
    converted = [r for r in run if r["fuse_exit"] == 0 and r["matches_reference"]]
    limits = [r for r in run if r["fuse_exit"] == 1]
    other = [r for r in run if r["fuse_exit"] not in (0, 1) or (r["fuse_exit"] == 0 and not r["matches_reference"])]
    refusals = {_exit(r[k]) for r in rows if r["skipped"] for k in ("fuse_exit", "build_exit", "normalize_exit")}
    summary = (f"{len(rows)} op cases: {len(converted)} of {len(run)} runnable converted to IAttention and verified "
               f"(ONNX Runtime through trtattn_plugins, and onnx's reference outputs), {len(limits)} named limits "
               f"(exit 1), {len(other)} other outcomes; {len(bf16_converted)} of {len(not_run)} bf16 cases converted, "
               f"not run (ONNX Runtime has no bf16 kernel: the TensorRT ops checked emulated in fp32 against onnx's "
               f"reference, build's plan in bf16; normalize exits "
               f"{'/'.join(sorted({_exit(r['normalize_exit']) for r in bf16_converted}))} for them; the other "
               f"{len(not_run) - len(bf16_converted)} stop where ONNX Runtime refuses the model widened to fp32); "
               f"{len(rows) - len(run) - len(not_run)} skipped "
               f"({', '.join(sorted({r['skipped'].split(':')[0] for r in rows if r['skipped']}))}: fuse, build and "
               f"normalize refuse them in one line with exit {'/'.join(sorted(refusals))}). "
               f"Build exits 4 (the plan made, no TensorRT here) for {sum(r['build_exit'] == 4 for r in run)}; "
               f"normalize exits 0 for {sum(r['normalize_exit'] == 0 for r in run)}.")
    return OPS_HEADING, rows, summary, lines


def replace_section(readme: Path, heading: str, body: str) -> None:
    """The section `## heading` of `readme` (up to the next `## `) replaced by `body`, or appended."""
    text = readme.read_text()
    marker = f"## {heading}\n"
    section = f"{marker}\n{body.rstrip()}\n"
    if marker in text:
        start = text.index(marker)
        end = text.find("\n## ", start + len(marker))
        text = text[:start] + section + (text[end:] if end >= 0 else "")
    else:
        text = text.rstrip() + "\n\n" + section
    readme.write_text(text)


def expanded_rows(only: str | None = None) -> list[dict]:
    rows = []
    for case in conformance_cases("Attention", expanded=True):
        if only and only not in case.name:
            continue
        rows.append(_timed_row(case.name, fuse_case, case, lambda out: {
            "fused": out.fused and out.ops.get("Attention") == 1, "max_abs_err": out.max_abs_err,
            "within": out.within, "reason": out.reason, "emulated": out.fused and out.run_on != "ONNX Runtime (CPU)"}))
    return rows


def _timed_row(name: str, run, case, row_of) -> dict:
    """The row of `run(case)` (`row_of` its outcome), with its seconds; a crash is a row too, never a silent miss."""
    t0 = time.perf_counter()
    try:
        out = run(case)
    except Exception as e:
        return {"case": name, "fused": False, "max_abs_err": None, "within": False,
                "reason": f"crash: {type(e).__name__}: {e}", "seconds": round(time.perf_counter() - t0, 2)}
    return {"case": name, **row_of(out), "seconds": round(time.perf_counter() - t0, 2)}


def normalized_rows(only: str | None = None) -> list[dict]:
    """Each runnable expanded case through normalize (normalize_case): exit 0 (verified, written), 1 (named) or a
    broken row (verification failed, a crash, or the written model off onnx's reference)."""
    rows = []
    for case in conformance_cases("Attention", expanded=True):
        if (only and only not in case.name) or case.cpu_unrunnable:
            continue
        t0 = time.perf_counter()
        try:
            out = normalize_case(case)
            broken = out.verified is False or (out.exit == 0 and not out.within)
            row = {"case": case.name, "exit": out.exit, "broken": broken, "max_abs_err": out.max_abs_err,
                   "reason": "; ".join(out.named) or ("verification failed" if out.verified is False else "")}
        except Exception as e:
            row = {"case": case.name, "exit": None, "broken": True, "max_abs_err": None,
                   "reason": f"crash: {type(e).__name__}: {e}"}
        rows.append({**row, "seconds": round(time.perf_counter() - t0, 2)})
    return rows


def normalized_summary(rows: list[dict]) -> str:
    """One line: how many verified, how many named and why (counted by reason), how many broken."""
    import collections
    import re

    named = [r for r in rows if r["exit"] == 1 and not r["broken"]]
    # the body's tensor names differ per case: the reason without them
    why = collections.Counter(re.sub(r"Attention_test_\w+?_function_\w+", "<tensor>", r["reason"]).split("; ")[0]
                              .removeprefix("skipped: ") for r in named)
    return (f"{sum(r['exit'] == 0 and not r['broken'] for r in rows)} of {len(rows)} runnable expanded cases "
            f"normalized and verified (exit 0, the written model matching onnx's reference), {len(named)} named "
            f"(exit 1: " + "; ".join(f"{n} {w}" for w, n in why.most_common()) + f"), "
            f"{sum(r['broken'] for r in rows)} broken")


def rotation_rows(only: str | None = None) -> list[dict]:
    """Each RotaryEmbedding body on Q and K of an attention (fuse_rotation_case): fused with one RotaryEmbedding op
    per rotated input, the op on Q against onnx's reference output."""
    rows = []
    for case in conformance_cases("RotaryEmbedding", expanded=True):
        if only and only not in case.name:
            continue
        rows.append(_timed_row(case.name, fuse_rotation_case, case, _rotation_row))
    return rows


def _rotation_row(out) -> dict:
    attrs = ", ".join(f"{k}={v}" for k, v in sorted((out.attention or {}).items()) if v)
    return {"fused": out.fused and out.ops.get("Attention") == 1 and out.ops.get("RotaryEmbedding") == 2,
            "max_abs_err": out.max_abs_err, "within": out.within, "reason": out.reason or attrs}


def markdown(rows: list[dict], rotations: list[dict]) -> str:
    runnable = [r for r in rows if r["fused"] is not None]
    good = sum(bool(r["fused"] and r["within"]) for r in runnable)
    bf16 = [r for r in runnable if "_bf16" in r["case"]]
    emulated = sum(bool(r["fused"] and r["within"] and r.get("emulated")) for r in bf16)
    lines = [f"{good} of {len(runnable)} cases fused into one Attention op and matching onnx's reference; of them "
             f"{emulated} of {len(bf16)} bf16 cases fused in bf16, checked emulated in fp32 (no bf16 kernel on CPU) "
             "within the bf16 tolerance.", "",
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
        fused = "skipped" if r["fused"] is None else ("no" if not r["fused"] else
                                                       "fused, checked emulated" if r.get("emulated") else "yes")
        err = "" if r["max_abs_err"] is None else f"{r['max_abs_err']:.2g}" + ("" if r["within"] else " (over)")
        # the body's tensors are named Attention_test_<case>_function_<name>: <name> says it
        reason = r["reason"].replace(f"Attention_test_{r['case']}_function_", "").replace("|", "\\|")
        if len(reason) > 240:
            reason = reason[:237] + "..."
        lines.append(f"| {r['case']} | {fused} | {err} | {reason} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    suite = ap.add_mutually_exclusive_group(required=True)
    suite.add_argument("--ops", action="store_true", help="the Attention op cases (fuse --ops trt, build, normalize)")
    suite.add_argument("--expanded", action="store_true", help="the function bodies (expanded cases) through fuse")
    ap.add_argument("--readme", action="store_true", help="--ops: replace the suite's table in benchmarks/README.md")
    ap.add_argument("--markdown", action="store_true", help="--expanded: print the table as markdown")
    ap.add_argument("--normalize", action="store_true", help="--expanded: the bodies through normalize, not fuse")
    ap.add_argument("--only", help="--expanded: cases whose name contains this")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--work-dir", help="--ops: where the cases' models and outputs go (default: a temporary folder)")
    args = ap.parse_args(argv)
    if args.expanded:
        return expanded_main(args)
    with tempfile.TemporaryDirectory() as tmp:
        heading, rows, summary, lines = ops_suite(Path(args.work_dir or tmp))
    how = ("Produced by `python benchmarks/conformance.py --ops --readme`: each case of onnx's backend suite for "
           "the Attention op (the installed onnx's, nothing downloaded) through `trtattn fuse --ops trt` verified on "
           "the case's own inputs, the written model (TensorRT's ops on trtattn_plugins' CPU kernels) against onnx's "
           "reference outputs within the fp16 tolerance (the route's default precision; bf16 cases with --precision bf16, "
           "emulated in fp32 within the bf16 tolerance), `trtattn build` and "
           "`trtattn normalize`. Exit codes: 0 done, 1 a limit named with the site, 4 the plan made without "
           "TensorRT.")
    body = "\n".join([how, "", summary, "", *lines])
    print(f"## {heading}\n\n{body}")
    if args.readme:
        replace_section(ROOT / "benchmarks" / "README.md", heading, body)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def expanded_main(args) -> int:
    if args.normalize:
        rows = normalized_rows(args.only)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        for r in rows:
            err = "" if r["max_abs_err"] is None else format(r["max_abs_err"], ".2g")
            print(f"{r['case']:<75} {'BROKEN' if r['broken'] else r['exit']!s:<6} {err:<8} {r['reason'][:200]}")
        print(normalized_summary(rows))
        return 1 if any(r["broken"] for r in rows) else 0
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
