"""Numerical verification through Polygraphy's Comparator.

On CPU: the rewritten ONNX model against the original, both on ONNX Runtime. The attention
outputs of every site are compared too (they keep their tensor names through the rewrite), so
an error is pinned to the site that caused it. Fully masked rows: where the original gives NaN
the rewrite must give NaN too (both NaN counts as equal), anything else is a mismatch.
"""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass, field

import numpy as np
import onnx

from . import inputs as inputs_mod

# Tolerances by precision (absolute, relative) for engine-vs-ONNX-Runtime checks.
TOLERANCES = {"fp32": (1e-4, 1e-4), "tf32": (1e-3, 1e-3), "fp16": (2e-2, 2e-2), "bf16": (6e-2, 6e-2),
              "fp8": (2e-1, 2e-1), "int8": (2e-1, 2e-1)}


@dataclass
class Outcome:
    passed: bool
    output_errors: dict[str, float] = field(default_factory=dict)
    site_errors: dict[str, float] = field(default_factory=dict)
    iterations: int = 0
    atol: float = 0.0
    rtol: float = 0.0
    nan_mismatch: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {"passed": self.passed, "iterations": self.iterations, "atol": self.atol, "rtol": self.rtol,
                "max_abs_err": max(self.output_errors.values(), default=0.0),
                "outputs": self.output_errors, "nan_mismatch": self.nan_mismatch}


def _quiet_polygraphy():
    from polygraphy.logger import G_LOGGER
    from polygraphy.util import array

    G_LOGGER.module_severity = G_LOGGER.ERROR
    if not getattr(array.is_torch, "_trtattn", False):
        # Polygraphy asks of every array whether it is a torch tensor by importing torch (0.8 s where
        # torch is installed); no array can be one before torch is imported by someone else
        original = array.is_torch

        def is_torch(obj):
            return "torch" in sys.modules and original(obj)

        is_torch._trtattn = True
        array.is_torch = is_torch


def runner_for(stack: contextlib.ExitStack, model: onnx.ModelProto, outputs=(), name: str | None = None):
    """A Polygraphy ONNX Runtime runner for `model` that also outputs `outputs`, valid while
    `stack` is open. Past 2 GB the model goes to a temporary file with external data; the session
    is made when Polygraphy activates the runner, so only one model is in ONNX Runtime at a time."""
    from polygraphy.backend.onnxrt import OnnxrtRunner, SessionFromOnnx

    from .onnxio import extra_outputs, session_source

    stack.enter_context(extra_outputs(model, outputs))
    source = stack.enter_context(session_source(model))
    return OnnxrtRunner(SessionFromOnnx(source, providers=["cpu"]), name=name)


def max_abs_error(a: np.ndarray, b: np.ndarray) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf")
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    if (nan_a != nan_b).any():
        return float("inf")
    diff = np.abs(np.where(nan_a, 0.0, a) - np.where(nan_b, 0.0, b))
    return float(diff.max()) if diff.size else 0.0


def default_feeds(model: onnx.ModelProto, *, dims=None, seed: int = 0, iterations: int = 2) -> list[dict]:
    return [inputs_mod.make_feeds(model, dims=dims, seed=seed + i) for i in range(iterations)]


def compare_models(original: onnx.ModelProto, candidate: onnx.ModelProto, sites=(), *, dims=None, seed: int = 0,
                   atol: float = 1e-4, rtol: float = 1e-4, feeds: list[dict] | None = None) -> Outcome:
    """Run both models on ONNX Runtime (CPU) through Polygraphy and compare every output."""
    from polygraphy.comparator import Comparator, CompareFunc

    _quiet_polygraphy()
    site_outputs = [s.output for s in sites if s.output]
    feeds = feeds if feeds is not None else default_feeds(original, dims=dims, seed=seed)
    with contextlib.ExitStack() as stack:
        runners = [runner_for(stack, original, site_outputs, "original"),
                   runner_for(stack, candidate, site_outputs, "rewritten")]
        with contextlib.redirect_stdout(io.StringIO()):
            results = Comparator.run(runners, data_loader=feeds)
    with contextlib.redirect_stdout(io.StringIO()):
        accuracy = Comparator.compare_accuracy(results, compare_func=CompareFunc.simple(atol=atol, rtol=rtol))
    outcome = Outcome(passed=bool(accuracy), iterations=len(feeds), atol=atol, rtol=rtol)
    (_, ref_runs), (_, new_runs) = list(results.items())[:2]
    graph_outputs = [o.name for o in original.graph.output]
    for ref, new in zip(ref_runs, new_runs):
        for name in ref.keys():
            if name not in new:
                continue
            err = max_abs_error(ref[name], new[name])
            if np.isnan(np.asarray(ref[name], dtype=np.float64)).any() != np.isnan(np.asarray(new[name], dtype=np.float64)).any():
                outcome.nan_mismatch.append(name)
            buckets = [outcome.output_errors] if name in graph_outputs else []
            if name in site_outputs:  # a site's result may itself be a graph output
                buckets.append(outcome.site_errors)
            for bucket in buckets:
                bucket[name] = max(bucket.get(name, 0.0), err)
    # Polygraphy's verdict (elementwise atol or rtol) and a strict bound on the max abs error
    outcome.passed = outcome.passed and all(e <= atol for e in outcome.output_errors.values())
    return outcome


# ---------------------------------------------------------------- forms and engines
class Adapter:
    """How a candidate (a form model or an engine) takes the original's inputs and how its
    outputs line up with the original's. The padded form takes them as they are."""

    form = "padded"

    def __init__(self, original: onnx.ModelProto, candidate_inputs: list[str]):
        self.original = original
        self.inputs = candidate_inputs

    def feeds(self, feeds: dict) -> dict:
        return {k: v for k, v in feeds.items() if k in self.inputs}

    def line_up(self, feeds: dict, ref: dict, out: dict) -> tuple[dict, dict]:
        return ref, out

    def original_feeds(self, dims, seed) -> dict:
        return inputs_mod.make_feeds(self.original, dims=dims, seed=seed)


class PackedAdapter(Adapter):
    """Ragged rows end to end: the original's padded outputs are packed the same way."""

    form = "packed"

    def lengths(self, feeds: dict) -> list[int]:
        masks = [s.name for s in inputs_mod.input_specs(self.original) if s.role.get("kind") == "padding_mask"]
        batch, seq = next(v.shape for v in feeds.values() if v.ndim == 2)
        return [int(feeds[masks[0]][b].sum()) for b in range(batch)] if masks else [seq] * batch

    def feeds(self, feeds: dict) -> dict:
        from .forms import pack

        return pack(feeds, self.inputs, self.lengths(feeds))

    def line_up(self, feeds, ref, out):
        lengths = self.lengths(feeds)
        batch, seq = len(lengths), max(lengths)
        packed = {name: np.concatenate([v[b, :n] for b, n in enumerate(lengths)])[None]
                  for name, v in ref.items() if v.ndim >= 2 and v.shape[0] == batch and v.shape[1] >= seq}
        return packed, {k: v for k, v in out.items() if k in packed}

    def original_feeds(self, dims, seed):
        return inputs_mod.make_feeds(self.original, dims=dims, seed=seed, padding=True)


class CacheAdapter(Adapter):
    """Past K/V placed at the start of preallocated caches, every row at the same write index;
    the candidate's caches are compared over the positions the original's presents cover, and
    the free positions after them must stay untouched (zero)."""

    form = "kv-cache"
    slack = 3

    def __init__(self, original, candidate_inputs, caches: list[str]):
        super().__init__(original, candidate_inputs)
        self.caches = caches

    def original_feeds(self, dims, seed):
        return inputs_mod.make_feeds(self.original, dims=dims, seed=seed, padding=False)

    def feeds(self, feeds):
        from .forms import WRITE_INDEX

        out = {k: v for k, v in feeds.items() if k in self.inputs and k not in self.caches}
        past = feeds[self.caches[0]].shape[2]
        new = next((v.shape[1] for k, v in feeds.items() if k == "input_ids"), 1)
        capacity = past + new + self.slack
        for name in self.caches:
            v = feeds[name]
            buf = np.zeros(v.shape[:2] + (capacity,) + v.shape[3:], v.dtype)
            buf[:, :, :past] = v
            out[name] = buf
        out[WRITE_INDEX] = np.full((feeds[self.caches[0]].shape[0],), past, np.int64)
        return out

    def line_up(self, feeds, ref, out):
        ref2, out2 = {}, {}
        for name, v in ref.items():
            got = out.get(name)
            if got is None:
                continue
            if got.ndim == 4 and got.shape != v.shape and got.shape[:2] == v.shape[:2]:
                filled = v.shape[2]
                ref2[name] = v
                out2[name] = got[:, :, :filled]
                ref2[name + "[free]"] = np.zeros_like(got[:, :, filled:])
                out2[name + "[free]"] = got[:, :, filled:]
            else:
                ref2[name], out2[name] = v, got
        return ref2, out2


def adapter_for(original: onnx.ModelProto, candidate_inputs: list[str], cache_inputs: list[str] | None = None) -> Adapter:
    from .forms import CU_SEQLENS, WRITE_INDEX

    if CU_SEQLENS in candidate_inputs:
        return PackedAdapter(original, candidate_inputs)
    if WRITE_INDEX in candidate_inputs:
        return CacheAdapter(original, candidate_inputs, cache_inputs or [])
    return Adapter(original, candidate_inputs)


def compare_runners(reference, candidate, adapter: Adapter, *, dims=None, seed: int = 0, iterations: int = 2,
                    atol: float = 1e-4, rtol: float = 1e-4) -> Outcome:
    """Polygraphy runners for the original (ONNX Runtime) and a candidate with possibly different
    I/O (a form model on ONNX Runtime, an engine on TensorRT): each runs on its own feeds, the
    outputs are lined up, and Polygraphy's comparator judges them."""
    from polygraphy.comparator import Comparator, CompareFunc, IterationResult, RunResults

    _quiet_polygraphy()
    original_feeds = [adapter.original_feeds(dims, seed + i) for i in range(iterations)]
    candidate_feeds = [adapter.feeds(f) for f in original_feeds]
    from polygraphy.exception import PolygraphyException

    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            ref_runs = Comparator.run([reference], data_loader=original_feeds)
            new_runs = Comparator.run([candidate], data_loader=candidate_feeds)
    except PolygraphyException as e:
        from .errors import VerificationError

        missing = sorted(set(adapter.inputs) - set(candidate_feeds[0]))
        hint = f" (the original has no input for {', '.join(missing)}: is it the model the candidate came from?)" \
            if missing else ""
        raise VerificationError(f"cannot run the comparison: {str(e).splitlines()[0]}{hint}") from None
    lined = RunResults()
    ref_iters, new_iters = [], []
    for feeds, ref, new in zip(original_feeds, list(ref_runs.values())[0], list(new_runs.values())[0]):
        a, b = adapter.line_up(feeds, {k: np.asarray(v) for k, v in ref.items()}, {k: np.asarray(v) for k, v in new.items()})
        ref_iters.append(IterationResult(a, runner_name="original"))
        new_iters.append(IterationResult(b, runner_name="candidate"))
    lined.append(("original", ref_iters))
    lined.append(("candidate", new_iters))
    with contextlib.redirect_stdout(io.StringIO()):
        accuracy = Comparator.compare_accuracy(lined, compare_func=CompareFunc.simple(atol=atol, rtol=rtol))
    outcome = Outcome(passed=bool(accuracy), iterations=iterations, atol=atol, rtol=rtol)
    for ref, new in zip(ref_iters, new_iters):
        for name in ref.keys():
            if name in new:
                outcome.output_errors[name] = max(outcome.output_errors.get(name, 0.0), max_abs_error(ref[name], new[name]))
    if not outcome.output_errors:
        outcome.passed = False
    outcome.passed = outcome.passed and all(e <= atol for e in outcome.output_errors.values())
    return outcome


# ---------------------------------------------------------------- trtattn verify
@dataclass
class Verification:
    candidate: str
    runner: str  # onnxruntime | tensorrt
    form: str
    precision: str
    outcome: Outcome
    site_errors: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"candidate": self.candidate, "runner": self.runner, "form": self.form, "precision": self.precision,
                **self.outcome.summary(), "sites": self.site_errors, "notes": self.notes}


def _site_outputs(sites) -> dict[str, str]:
    return {s.output: s.name for s in sites if s.output}


def verify_candidate(candidate: str, original: onnx.ModelProto, *, sidecar: dict | None = None,
                     precision: str | None = None, dims=None, seed: int = 0, iterations: int = 2) -> Verification:
    """An engine (on TensorRT) or an ONNX model (on ONNX Runtime) against the original ONNX model
    on ONNX Runtime, with the tolerance of the precision it runs in."""
    from pathlib import Path

    from . import onnxio
    from .forms import cache_inputs
    from .match import match

    precision = precision or (sidecar or {}).get("precision") or "fp32"
    if precision not in TOLERANCES:
        from .errors import TrtattnError

        raise TrtattnError(f"unknown precision '{precision}'; one of {', '.join(TOLERANCES)}")
    atol, rtol = TOLERANCES[precision]
    sites = match(original).sites
    site_names = _site_outputs(sites)
    notes = []
    with contextlib.ExitStack() as stack:
        reference = runner_for(stack, original, list(site_names), "onnxruntime")
        if str(candidate).endswith(".onnx"):
            model = onnxio.load(candidate)
            inputs = [i.name for i in model.graph.input]
            caches = cache_inputs(model)
            present = {t.name for t in list(model.graph.value_info) + list(model.graph.output)} | \
                {o for n in model.graph.node for o in n.output}
            runner = runner_for(stack, model, [n for n in site_names if n in present], "candidate")
            kind = "onnxruntime"
        else:
            from .trt.runner import engine_runner

            runner, inputs, caches = engine_runner(Path(candidate), sidecar)
            kind = "tensorrt"
        adapter = adapter_for(original, inputs, caches)
        outcome = compare_runners(reference, runner, adapter, dims=dims, seed=seed, iterations=iterations,
                                  atol=atol, rtol=rtol)
    site_errors = {site_names[k]: v for k, v in outcome.output_errors.items() if k in site_names}
    if adapter.form == "padded" and not site_errors:
        notes.append("per-site errors need the site outputs on the candidate (build with --mark-sites)")
    if adapter.form != "padded" and not site_errors:
        notes.append(f"{adapter.form} form: per-site outputs have another layout than the original's; outputs compared")
    outcome.output_errors = {k: v for k, v in outcome.output_errors.items() if k not in site_names}
    return Verification(str(candidate), kind, adapter.form, precision, outcome, site_errors, notes)
