"""onnx's backend cases of the Attention op through the TensorRT route and `normalize`, as the command line runs
them, measured: `fuse --ops trt` (exit code, the form it took, converted or the limit it names), the written
model with TensorRT's ops run on the case's own inputs through trtattn_plugins against onnx's reference
outputs, `build` (its plan; without TensorRT it stops with exit 4 after it) and `normalize`.

    for case in conformance_cases("Attention", expanded=False):
        outcome = run_case(case, workdir)

Used by tests/routes/test_conformance_ops.py and benchmarks/conformance.py (--ops).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from .conformance import ConformanceCase

# the limits of IAttention a case may name, and how to see them in the model itself
LIMITS = {"softcap": "soft-capped"}


@dataclass
class CaseOutcome:
    name: str
    features: str
    skipped: str | None = None  # why the case is not run (a model ONNX Runtime refuses)
    not_run: str | None = None  # why a case that converts cannot run as it is (bf16: checked emulated in fp32 instead)
    fuse_exit: int | None = None
    form: str = "-"
    why: str = ""  # the limit named (exit 1) or the error (exit 2/3)
    reference_error: dict[str, float] = field(default_factory=dict)  # output -> max |written - onnx's reference|
    reference_bound: dict[str, float] = field(default_factory=dict)  # output -> what the precision allows
    build_exit: int | None = None
    plan_dtypes: list[str] = field(default_factory=list)  # build's plan: each IAttention's dtype, then each input's
    normalize_exit: int | None = None

    @property
    def converted(self) -> bool:
        return self.fuse_exit == 0

    @property
    def matches_reference(self) -> bool:
        return bool(self.reference_error) and all(self.reference_error[k] <= self.reference_bound[k]
                                                  for k in self.reference_error)


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def expected_limit(model: onnx.ModelProto) -> str | None:
    """The IAttention limit this model's Attention node has, read from the node: it soft-caps its logits; None
    when it has none (a QK output is computed beside IAttention, over a past cache too)."""
    node = next(n for n in model.graph.node if n.op_type == "Attention")
    return "softcap" if _attrs(node).get("softcap") else None


def features(case: ConformanceCase) -> str:
    """The configuration of the case's Attention node, in a few words."""
    node = next(n for n in case.model.graph.node if n.op_type == "Attention")
    a, x = _attrs(node), case.inputs
    names = [i.name for i in case.model.graph.input]
    q, k, v = (x[n] for n in node.input[:3])
    rank = q.ndim
    nq, nkv = (a.get("q_num_heads"), a.get("kv_num_heads")) if rank == 3 else (q.shape[1], k.shape[1])
    words = [f"{rank}-D", f"{nq}/{nkv} heads"]
    if rank == 3:
        dq, dv = q.shape[2] // nq, v.shape[2] // nkv
    else:
        dq, dv = q.shape[3], v.shape[3]
    if dq != dv:
        words.append(f"V head {dv} vs {dq}")
    opt = lambda i: node.input[i] if len(node.input) > i and node.input[i] in names else None  # noqa: E731
    if "scale" in a:
        words.append("scale")
    if a.get("is_causal"):
        words.append("causal")
    mask = opt(3)
    if mask:
        words.append(f"{'bool' if x[mask].dtype == np.bool_ else 'float'} mask rank {x[mask].ndim}")
    if opt(4):
        words.append("past/present")
    if opt(6):
        words.append("nonpad_kv_seqlen")
    for w in ("left_window_size", "right_window_size"):
        if a.get(w, -1) >= 0:
            words.append(f"{w.split('_')[0]} window {a[w]}")
    if a.get("softcap"):
        words.append("softcap")
    if len(node.output) > 3 and node.output[3]:
        words.append(f"qk_matmul_output mode {a.get('qk_matmul_output_mode', 0)}")
    words.append(str(q.dtype))
    return ", ".join(words)


def _cli(args: list[str]) -> tuple[int, str, str]:
    from ..cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["-q", *args])
    return code, out.getvalue(), err.getvalue()


def ort_refuses(case: ConformanceCase) -> str | None:
    """ONNX Runtime's refusal of the case's model on its own inputs (first line), or None when it runs it."""
    import onnxruntime as ort

    try:
        ort.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, case.inputs)
    except Exception as e:  # ORT's errors have no public common base
        return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    return None


def reference_check(case: ConformanceCase, outcome: CaseOutcome, given, precision: str = "fp16") -> None:
    """The TensorRT-op model `fuse --ops trt` writes, run on the case's inputs through trtattn_plugins, against
    onnx's reference outputs within the tolerance of the precision it computes in. A bf16 model runs emulated in
    fp32 (rewrite/precision/emulate.py: every bf16 tensor rounded, each op in fp32): ONNX Runtime has no bf16 kernel."""
    from trtattn_plugins.session import Session

    from ..contract import cache_inputs
    from ..graph.precision import FEED_DTYPES
    from ..rewrite.precision.emulate import bf16_emulated
    from ..routes.prepare import form_adapter
    from ..routes.trt_ops import fuse_trt, runnable
    from ..verify import Check, tolerance
    from ..verify.difference import worst_error

    result = fuse_trt(case.model, name="case", inputs=given, precision=precision)
    form = result.prepared.form_model
    adapter = form_adapter(result.prepared.model, [i.name for i in form.graph.input], cache_inputs(form))
    written = runnable(result)
    session = Session(bf16_emulated(written) if precision == "bf16" else written)
    types = {i.name: i.type for i in session.get_inputs()}  # a kv-cache form's caches take the attention's dtype
    inputs = {k: v.astype(np.float32) if v.dtype.name == "bfloat16" else v for k, v in case.inputs.items()}
    feeds = {k: v.astype(FEED_DTYPES[types[k]]) if types.get(k) in FEED_DTYPES else v
             for k, v in adapter.feeds(inputs).items()}
    names = [o.name for o in session.get_outputs()]
    got = dict(zip(names, session.run(names, feeds)))
    ref, out = adapter.line_up(inputs, dict(case.outputs), got)
    atol, rtol = tolerance(Check.ENGINE, result.prepared.plan.precision)
    for name, want in ref.items():  # (a logit masked with -inf agrees with one masked so: qk_matmul_output)
        outcome.reference_error[name] = worst_error(want, out[name])
        finite = np.abs(np.asarray(want, np.float64))
        outcome.reference_bound[name] = atol + rtol * float(np.max(finite[np.isfinite(finite)], initial=0.0))


def run_case(case: ConformanceCase, work: Path, *, build: bool = True, normalize: bool = True) -> CaseOutcome:
    """The case through `fuse --ops trt` (verified on its own inputs), the reference check, `build` and
    `normalize` (module doc). A bf16 case goes in bf16 (--precision bf16, verified emulated in fp32), on generated
    inputs: it converts, but is not run as it is."""
    import json

    from ..graph.user_inputs import GivenInputs

    outcome = CaseOutcome(case.name, features(case))
    work.mkdir(parents=True, exist_ok=True)
    model_path, inputs_path = work / f"{case.name}.onnx", work / f"{case.name}.inputs.npz"
    onnx.save(case.model, model_path)
    np.savez(inputs_path, **case.inputs)  # type: ignore[arg-type]
    bf16 = case.cpu_unrunnable == "bf16"
    refused = None if bf16 else ort_refuses(case)
    if refused:  # the reference cannot run it: each command must say so in one line (exit 2), never crash
        outcome.skipped = f"ONNX Runtime refuses the model: {refused}"
        for attr, args in (("fuse_exit", ["fuse", str(model_path), "-o", str(work / "x.onnx"), "--ops", "trt"]),
                           ("build_exit", ["build", str(model_path), "--out-dir", str(work / "engines")]),
                           ("normalize_exit", ["normalize", str(model_path), "-o", str(work / "n.onnx")])):
            code, _, err = _cli([*args, "--force"])
            setattr(outcome, attr, code)
            outcome.why = outcome.why or (err.strip().splitlines() or [""])[-1]
        return outcome
    if bf16:
        outcome.not_run = "bf16: ONNX Runtime's CPU provider runs no bf16 kernel"
    precision = ["--precision", "bf16"] if bf16 else []
    given = [] if bf16 else ["--inputs", str(inputs_path)]  # bf16 arrays: numpy saves them as raw bytes
    written = work / f"{case.name}.trt.onnx"
    report = work / f"{case.name}.trt.report.json"
    code, out, err = _cli(["fuse", str(model_path), "-o", str(written), "--ops", "trt", *given, *precision,
                           "--report", str(report), "--force"])
    outcome.fuse_exit = code
    if code == 0:
        outcome.form = json.loads(report.read_text())["form"]
        reference_check(case, outcome, None if bf16 else GivenInputs.load(inputs_path, case.model),
                        "bf16" if bf16 else "fp16")
    elif code == 1:
        lines = [line for line in out.splitlines() if "cannot be TensorRT's attention ops" in line or "FAILED" in line]
        outcome.why = lines[-1] if lines else out.strip().splitlines()[-1]
    else:
        outcome.why = (err.strip().splitlines() or [""])[-1]
    if build:
        plan = work / f"{case.name}.plan.json"
        outcome.build_exit, _, _ = _cli(["build", str(model_path), "--out-dir", str(work / "engines"), *precision,
                                         "--plan-json", str(plan), "--force"])
        if plan.is_file():
            made = json.loads(plan.read_text())
            outcome.plan_dtypes = [s["dtype"] for s in made["sites"]] + [i["dtype"] for i in made["inputs"]]
    if normalize:
        outcome.normalize_exit, _, _ = _cli(["normalize", str(model_path), "-o", str(work / f"{case.name}.norm.onnx"),
                                             *given, "--force"])
    return outcome
