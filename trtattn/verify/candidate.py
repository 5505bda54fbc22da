"""`trtattn verify`: an engine (on TensorRT) or an ONNX model (on ONNX Runtime) against the original ONNX
model on ONNX Runtime, with the tolerance of the precision it runs in."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from ..contract import cache_inputs
from ..graph import io as onnxio
from ..graph.dims import fit_dims
from ..graph.view import GraphView, import_graph
from ..match import match
from .adapters import adapter_for
from .compare import Outcome, compare_runners
from .runners import engine_runner, onnx_runner
from .tolerance import Check, tolerance


@dataclass
class CandidateCheck:
    candidate: str
    runner: str  # onnxruntime | tensorrt
    form: str
    precision: str
    outcome: Outcome
    site_errors: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"candidate": self.candidate, "runner": self.runner, "form": self.form, "precision": self.precision,
                **self.outcome.summary().to_json(), "sites": self.site_errors, "notes": self.notes}


def verify_candidate(candidate: str, original: onnx.ModelProto, *, sidecar: dict | None = None,
                     precision: str | None = None, dims=None, seed: int = 0, iterations: int = 2,
                     inputs=None) -> CandidateCheck:
    """`candidate` against `original` on the user's input sets (`inputs`, a GivenInputs) or on feeds in the
    original's domain (verify/inputs.py)."""
    precision = precision or (sidecar or {}).get("precision") or "fp32"
    atol, rtol = tolerance(Check.ENGINE, precision)
    dims = fit_dims(original, dims, given=inputs)  # the dims the original runs at: the match measures there, as fuse does
    graph = import_graph(original)  # weights left on disk stay there
    site_names = {s.output: s.name for s in match(graph, GraphView(graph, original, dims=dims)).sites if s.output}
    notes = []
    with contextlib.ExitStack() as stack:
        reference = onnx_runner(stack, original, list(site_names), "onnxruntime")
        if str(candidate).endswith(".onnx"):
            model = onnxio.load(candidate, load_external_data=False)
            names = [i.name for i in model.graph.input]
            caches = cache_inputs(model)
            present = {t.name for t in list(model.graph.value_info) + list(model.graph.output)} | \
                {o for n in model.graph.node for o in n.output}
            runner = onnx_runner(stack, model, [n for n in site_names if n in present], "candidate")
            kind = "onnxruntime"
        else:
            runner, names, caches = engine_runner(Path(candidate), sidecar)
            kind = "tensorrt"
        adapter = adapter_for(original, names, caches)
        outcome = compare_runners(reference, runner, adapter, dims=dims, seed=seed, iterations=iterations,
                                  atol=atol, rtol=rtol, given=inputs)
    site_errors = {site_names[k]: v for k, v in outcome.output_errors.items() if k in site_names}
    if adapter.form == "padded" and not site_errors:
        notes.append("per-site errors need the site outputs on the candidate (build with --mark-sites)")
    if adapter.form != "padded" and not site_errors:
        notes.append(f"{adapter.form} form: per-site outputs have another layout than the original's; outputs compared")
    outcome.output_errors = {k: v for k, v in outcome.output_errors.items() if k not in site_names}
    # compared at ONNX Runtime's basic level; loaded as a user loads it, unless it is for TensorRT (its trt:: ops
    # run here only through the plugins' CPU model, and trtexec is what loads it)
    if kind == "onnxruntime" and not any(n.domain == "trt" for n in model.graph.node):
        refusal = onnxio.default_session_refusal(model)
        if refusal is not None:
            outcome.passed = False
            notes.append(f"ONNX Runtime with default session options refuses the candidate: {refusal}")
    return CandidateCheck(str(candidate), kind, adapter.form, precision, outcome, site_errors, notes)
