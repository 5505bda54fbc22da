"""trtattn verify CANDIDATE --onnx ORIGINAL: an engine (TensorRT) or an ONNX model (ONNX Runtime) against
the original on ONNX Runtime, with the tolerances of its precision."""

from __future__ import annotations

import json
from pathlib import Path

from ..contract import is_engine_path
from ..report import inputs_phrase, table
from .common import add_inputs_opt, add_memory_opt, given_inputs, load_model
from .dims import parse_dims
from .values import dims_text, non_negative, positive


def add_parser(sub) -> None:
    v = sub.add_parser("verify", help="compare an engine (TensorRT) or ONNX model (ONNX Runtime) with the original")
    v.add_argument("candidate", help="NAME.engine, or an ONNX model (fused, normalised or a form)")
    v.add_argument("--onnx", required=True, help="the original ONNX model")
    v.add_argument("--sidecar", help="the engine's NAME.json (default: next to the engine)")
    v.add_argument("--precision", choices=["fp32", "tf32", "fp16", "bf16", "fp8", "int8"],
                   help="tolerances for this precision (default: the sidecar's, else fp32)")
    v.add_argument("--dims", type=dims_text, help="symbolic dim values, e.g. batch=2,seq=16")
    v.add_argument("--seed", type=non_negative, default=0)
    add_memory_opt(v)
    v.add_argument("--iterations", type=positive, default=2, help="input sets to compare (default 2; --inputs: its sets)")
    add_inputs_opt(v)
    v.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args, progress) -> int:
    from ..verify import verify_candidate

    original = load_model(args.onnx, progress)  # weights left on disk: ONNX Runtime maps them
    if not is_engine_path(args.candidate):
        load_model(args.candidate, progress)  # an invalid candidate: one line naming it
    sidecar = json.loads(Path(args.sidecar).read_text()) if args.sidecar else None
    with progress.step(f"comparing {args.candidate} with {args.onnx}"):
        result = verify_candidate(args.candidate, original, sidecar=sidecar, precision=args.precision,
                                  dims=parse_dims(args.dims), seed=args.seed, iterations=args.iterations,
                                  inputs=given_inputs(args, original))
    data = result.to_json()
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        bounds = data.get("bounds", {})
        rows = [{"name": k, "err": v, "bound": bounds.get(k, data["atol"])} for k, v in data["outputs"].items()]
        rows += [{"name": f"site {k}", "err": v, "bound": data["atol"]} for k, v in data["sites"].items()]
        for r in rows:
            r["ok"] = r["err"] <= r["bound"]
        print(table(rows, [("name", "output"), ("err", "max abs error"), ("bound", "allowed"), ("ok", "ok")]))
        for note in data["notes"]:
            print(f"note: {note}")
        if result.outcome.inputs:
            print(f"inputs: {inputs_phrase(result.outcome.inputs)}")
        print(f"{result.runner} ({result.form}, {result.precision}) vs ONNX Runtime on the original: "
              f"{'passed' if data['passed'] else 'FAILED'} over {data['iterations']} input sets")
    return 0 if data["passed"] else 1
