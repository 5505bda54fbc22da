"""Numerical comparison through Polygraphy: its Comparator runs the runners, its compare function
(CompareFunc.simple) compares every output and gives each output's max abs error; nothing here recomputes them.

The attention outputs of every site are compared too (they keep their tensor names through the
rewrite), so an error is pinned to the site that caused it. NaN never counts as equal to anything
(Polygraphy's rule): a NaN where the reference has a number, or the other way round, fails.
"""

from __future__ import annotations

import contextlib
import io
import math
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..errors import VerificationError
from ..graph.dims import fit_dims
from ..graph.domains import random_nodes
from ..graph.feeds import make_feeds, other_step_feeds
from ..graph.user_inputs import GivenInputs, InputsUsed
from ..timings import timed
from ..verification import Verification
from .adapters import Adapter
from .difference import max_abs_error
from .inputs import default_domains, fed_draws, finite, search, searched_or_note, seeded_pair
from .requant import Envelope, envelope, forced_errors, level
from .runners import onnx_runner, quiet_polygraphy
from .tolerance import requantized


@dataclass
class Outcome:
    passed: bool
    output_errors: dict[str, float] = field(default_factory=dict)  # graph output -> max abs error
    site_errors: dict[str, float] = field(default_factory=dict)  # site output tensor -> max abs error
    iterations: int = 0
    atol: float = 0.0
    rtol: float = 0.0
    nan_mismatch: list[str] = field(default_factory=list)
    bounds: dict[str, float] = field(default_factory=dict)  # name -> the max abs error allowed (atol + rtol * max|ref|)
    slices: int = 0  # > 0: the largest model ran in this many slices of layers (graph/slices.py)
    inputs: InputsUsed | None = None  # which inputs it ran on
    lengths: list = field(default_factory=list)  # a ragged form's check: each iteration's per-row lengths
    # name -> (the original's shape, the candidate's) where they differ and cannot be compared
    shapes_differ: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    why: str = ""  # why some bounds are wider than atol + rtol: a quantizer downstream of the sites (requant.py)

    def within(self, name: str, error: float | None) -> bool:
        """Whether `error` (a max abs error of output or site `name`) is within its bound."""
        return error is not None and error <= self.bounds.get(name, self.atol)

    def summary(self) -> Verification:
        return Verification(passed=self.passed, iterations=self.iterations, atol=self.atol, rtol=self.rtol,
                            max_abs_err=max(self.output_errors.values(), default=0.0), outputs=self.output_errors,
                            nan_mismatch=self.nan_mismatch,
                            bounds={k: v for k, v in self.bounds.items() if k in self.output_errors or k in self.site_errors},
                            slices=self.slices or None, inputs=self.inputs, lengths=self.lengths or None,
                            shapes_differ=self.shapes_differ or None)


def default_feeds(model: onnx.ModelProto, *, dims=None, seed: int = 0, iterations: int = 2,
                  window: int | None = None) -> list[dict]:
    """`iterations` feed dicts at the dims the model runs on, then one at each of the fit's other dims (a prefill
    beside a step over a past: graph/dims.py's Fit.also). `window`: the narrowest sliding window of the model's
    sites (graph/feeds.most_padding)."""
    dims = fit_dims(model, dims)  # dims the model runs on (graph/dims.py); nothing to do once fitted
    return [make_feeds(model, dims=dims, seed=seed + i, window=window) for i in range(iterations)] + \
        [other_step_feeds(model, dims=other, seed=seed, window=window) for other in getattr(dims, "also", ())]


def _judge(results, *, atol: float, rtol: float, iterations: int,
           moves: dict[str, float] | None = None) -> tuple[Outcome, dict[str, float]]:
    """Polygraphy's verdict on the first two runners' results and each output's worst max abs error
    over the iterations (NaN in an error: inf, and the output is listed as a NaN mismatch). Each output's
    bound is atol + rtol * its largest reference magnitude (the bound numpy's allclose gives at the
    reference's largest element: fp16 rounds an output of 30 to steps of 1/64): every element's error must
    be within it (or within rtol of the element), so must the max abs error. `moves`: per output, how far a
    quantizer after the attention may move it (requant.py), added to its bound."""
    from polygraphy.comparator import CompareFunc

    bounds: dict[str, float] = {}
    for iteration in results[0][1]:  # the reference's magnitudes
        for name, value in iteration.items():
            scale = float(np.max(np.abs(value), initial=0.0)) if np.size(value) else 0.0
            bounds[name] = max(bounds.get(name, atol), atol + rtol * (scale if math.isfinite(scale) else 0.0))
    bounds = requantized(bounds, moves or {})
    # Polygraphy's elementwise verdict with each output's bound as its atol: rounding errors scale with the
    # values an element is computed from, not with the element (a logit near 0 after 32 fp16 layers)
    with contextlib.redirect_stdout(io.StringIO()), np.printoptions(threshold=0, edgeitems=1, precision=3):
        # numpy scalars: Polygraphy asks of a Python float whether it is a torch tensor, importing torch (4-6 s);
        # it formats every compared array for a log line it then drops: 11 ms each at numpy's print settings
        per_output = {"": np.float64(atol), **{k: np.float64(v) for k, v in bounds.items()}}
        compare = CompareFunc.simple(atol=per_output, rtol=np.float64(rtol))
        # the compare function on each pair of iterations, as Comparator.compare_accuracy calls it, and not
        # compare_accuracy itself: besides, it computes 12 statistics of each runner's every output for a log
        # line it drops (half the comparison's time: 0.2 s of CPU on TorchScript BART's 16 output iterations)
        (_, reference), (_, candidate) = results[0], results[1]
        runs = [compare(ref, cand) for ref, cand in zip(reference, candidate)]
    outcome = Outcome(passed=all(bool(r) for compared in runs for r in compared.values()), iterations=iterations,
                      atol=atol, rtol=rtol, bounds=bounds)
    errors: dict[str, float] = {}
    failed: set[str] = set()  # outputs Polygraphy's elementwise verdict fails
    for i, compared in enumerate(runs):  # one compare function, one pair of runners: {output: result} each
        for name, result in compared.items():
            if isinstance(result, bool):  # Polygraphy's False for shapes it cannot line up: no metrics
                ref, cand = results[0][1][i][name], results[1][1][i][name]
                outcome.shapes_differ[name] = (list(np.shape(ref)), list(np.shape(cand)))
                err, ok = max_abs_error(ref, cand), False
            else:
                err, ok = float(result.max_absdiff), bool(result)
            if not math.isfinite(err):  # Polygraphy's inf - inf or -inf - lowest: read the arrays again
                err = max_abs_error(results[0][1][i][name], results[1][1][i][name])
                ok = outcome.within(name, err)
            if math.isnan(err):
                err = math.inf
                if name not in outcome.nan_mismatch:
                    outcome.nan_mismatch.append(name)
            if not ok:
                failed.add(name)
            errors[name] = max(errors.get(name, 0.0), err)
    # Polygraphy's verdict (elementwise atol or rtol) and the bound on each max abs error
    outcome.passed = not failed and bool(errors) and all(outcome.within(k, e) for k, e in errors.items())
    return outcome, errors


def _prefetched(runners: list, feeds: list[dict]) -> list:
    """Runners as given; a runner over a model in slices runs every feed dict slice by slice first, so each
    slice's session is made once (graph/slices.py)."""
    for r in runners:
        if hasattr(r, "prefetch"):
            r.prefetch(feeds)
    return runners


@timed("verify")
def compare_models(original: onnx.ModelProto, candidate: onnx.ModelProto, sites=(), *, dims=None, seed: int = 0,
                   atol: float = 1e-4, rtol: float = 1e-4, feeds: list[dict] | None = None,
                   given: GivenInputs | None = None, progress=None, atol_given: bool = False) -> Outcome:
    """Run both models on ONNX Runtime (CPU) through Polygraphy and compare every output: on the user's
    inputs (`given`), on `feeds`, or on feeds in the model's domain (searched when the original's outputs
    are not finite on the default ones). Random ops are seeded alike in both models. `progress`
    (report.Progress) counts the slices of a model run in slices of layers."""
    quiet_polygraphy()
    original, candidate, random_note = seeded_pair(original, candidate)
    used = given.used() if given is not None else None
    if given is not None:
        feeds = given.sets + _other_steps(original, dims, seed, used, narrowest_window(sites))
    elif feeds is None:
        dims = fit_dims(original, dims)
        feeds = default_feeds(original, dims=dims, seed=seed, window=narrowest_window(sites))
        used = default_domains(original, dims)
        used.iterations = len(feeds)
    site_outputs = [s.output for s in sites if s.output]
    at = level(original, site_outputs)  # ONNX Runtime's default after a quantizer (requant.py), else basic
    results, slices = _run_both(original, candidate, sites, feeds, progress, at)
    graph_outputs = {o.name for o in original.graph.output}
    if used is not None and used.source == "searched" and not finite(
            v for it in results[0][1] for k, v in it.items() if k in graph_outputs):  # not finite on these: search
        found = searched_or_note(used, original, dims=dims, seed=seed, iterations=len(feeds))
        if found is not None:
            feeds, used = found
            results, slices = _run_both(original, candidate, sites, feeds, progress, at)
    moved = Envelope() if atol_given else \
        _requant_envelope(original, site_outputs, feeds, results, (atol, rtol), seed, at)
    outcome, errors = _judge(results, atol=atol, rtol=rtol, iterations=len(feeds), moves=moved.moves)
    outcome.slices = slices
    outcome.why = moved.why(errors)
    if moved.moves:  # a site after a quantizer: its own error, every site computing from the original's inputs
        _, cut, fed = fed_draws(original, candidate, feeds)  # on the random draws the comparison ran
        errors.update(forced_errors(cut, site_outputs, fed, [dict(it.items()) for it in results[0][1]], at))
        outcome.passed = not outcome.nan_mismatch and all(outcome.within(k, e) for k, e in errors.items())
    outcome.output_errors = {k: v for k, v in errors.items() if k in graph_outputs}
    outcome.site_errors = {k: v for k, v in errors.items() if k in site_outputs}  # a site may be an output too
    outcome.passed = outcome.passed and all(outcome.within(k, e) for k, e in outcome.output_errors.items())
    if used is not None:
        if random_note:
            used.notes.append(random_note)
        outcome.inputs = used
    return outcome


def _requant_envelope(original, site_outputs: list[str], feeds: list[dict], results, tol, seed: int,
                      at: str) -> Envelope:
    """How far the original's own tensors after a quantizer move with its sites moved within `tol` (requant.py),
    on the feeds both models ran (the original's results give each site's magnitude)."""
    if not site_outputs:
        return Envelope()
    references = [dict(it.items()) for it in results[0][1]]
    compared = list(dict.fromkeys(k for it in references for k in it))
    original, _, feeds = fed_draws(original, original, feeds)  # random ops cut: each moved run on the same draws
    return envelope(original, site_outputs, compared, feeds, references, tol, seed, at)


def narrowest_window(sites) -> int | None:
    """The narrowest sliding window of keys of `sites` (None: none has one), which bounds the feeds' padding."""
    return min((s.window for s in sites if getattr(s, "window", None)), default=None)


def _other_steps(original: onnx.ModelProto, dims, seed: int, used, window: int | None) -> list[dict]:
    """Feeds at the fit's other dims (a decode step over a cache the graph appends to, beside the user's first step:
    graph/cache_steps.py), said in `used`: the user's inputs alone would verify one cache length."""
    others = list(getattr(dims, "also", ()))
    if others:
        used.iterations += len(others)
        used.notes.append(f"and {len(others)} set(s) of inputs drawn at other cache lengths: " + "; ".join(
            ", ".join(f"{k}={v}" for k, v in other.items() if dims.get(k) != v) for other in others))
    return [other_step_feeds(original, dims=other, seed=seed, window=window) for other in others]


def _run_both(original, candidate, sites, feeds: list[dict], progress=None, at: str = "basic"):
    """Polygraphy's RunResults of the original and the candidate on `feeds` (with the site outputs), both at graph
    optimization level `at`, and the most slices of layers either ran in."""
    from polygraphy.comparator import Comparator

    site_outputs = [s.output for s in sites if s.output]
    original, candidate, feeds = fed_draws(original, candidate, feeds)
    with contextlib.ExitStack() as stack:
        runners = [onnx_runner(stack, original, site_outputs, "original", level=at, progress=progress),
                   onnx_runner(stack, candidate, site_outputs, "rewritten", level=at, progress=progress)]
        with contextlib.redirect_stdout(io.StringIO()):
            results = Comparator.run(_prefetched(runners, feeds), data_loader=feeds)
    return results, max(len(getattr(r, "slices", ())) for r in runners)


def compare_runners(reference, candidate, adapter: Adapter, *, dims=None, seed: int = 0, iterations: int = 2,
                    atol: float = 1e-4, rtol: float = 1e-4, given: GivenInputs | None = None) -> Outcome:
    """Polygraphy runners for the original (ONNX Runtime) and a candidate with possibly different I/O (a
    form model on ONNX Runtime, an engine on TensorRT): each runs on its own feeds, the outputs are lined
    up, and Polygraphy's comparator judges them. The original's feeds: the user's (`given`), or feeds in
    its domain, searched when its outputs are not finite or (random ops, which an engine cannot seed) do
    not repeat."""
    from polygraphy.comparator import IterationResult, RunResults

    quiet_polygraphy()
    if given is not None:
        original_feeds, used = given.sets, given.used()
    else:
        dims = adapter.fit(dims)  # dims the original runs on (graph/dims.py) and the form's check takes
        randoms = random_nodes(adapter.original)
        if randoms:  # the engine cannot be seeded: inputs on which the original repeats itself, or a refusal
            original_feeds, used = search(adapter.original, dims=dims, seed=seed, iterations=iterations,
                                          random=randoms)
        else:
            original_feeds = [adapter.original_feeds(dims, seed + i) for i in range(iterations)]
            used = default_domains(adapter.original, dims)
            used.iterations = len(original_feeds)
    ref_runs, new_runs = _run_each(reference, candidate, adapter, original_feeds)
    graph_outputs = {o.name for o in adapter.original.graph.output}
    if given is None and not finite(v for it in ref_runs for k, v in it.items() if k in graph_outputs):
        found = searched_or_note(used, adapter.original, dims=dims, seed=seed, iterations=iterations)
        if found is not None:
            original_feeds, used = found
            ref_runs, new_runs = _run_each(reference, candidate, adapter, original_feeds)
    ref_iters, new_iters = [], []
    for feeds, ref, new in zip(original_feeds, ref_runs, new_runs):
        a, b = adapter.line_up(feeds, dict(ref.items()), dict(new.items()))
        ref_iters.append(IterationResult(a, runner_name="original"))
        new_iters.append(IterationResult(b, runner_name="candidate"))
    lined = RunResults()
    lined.append(("original", ref_iters))
    lined.append(("candidate", new_iters))
    outcome, errors = _judge(lined, atol=atol, rtol=rtol, iterations=len(original_feeds))
    outcome.output_errors = errors
    outcome.slices = max(len(getattr(r, "slices", ())) for r in (reference, candidate))
    outcome.inputs = used
    outcome.lengths = [lengths for lengths in map(adapter.row_lengths, original_feeds) if lengths]
    return outcome


def _run_each(reference, candidate, adapter: Adapter, original_feeds: list[dict]) -> tuple[list, list]:
    """Each runner's iteration results on its own feeds (the candidate's made from the original's)."""
    from polygraphy.comparator import Comparator
    from polygraphy.exception import PolygraphyException

    candidate_feeds = [adapter.feeds(f) for f in original_feeds]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            ref_runs = Comparator.run(_prefetched([reference], original_feeds), data_loader=original_feeds)
            new_runs = Comparator.run(_prefetched([candidate], candidate_feeds), data_loader=candidate_feeds)
    except PolygraphyException as e:
        missing = sorted(set(adapter.inputs) - set(candidate_feeds[0]))
        hint = f" (the original has no input for {', '.join(missing)}: is it the model the candidate came from?)" \
            if missing else ""
        raise VerificationError(f"cannot run the comparison: {str(e).splitlines()[0]}{hint}") from None
    return list(ref_runs.values())[0], list(new_runs.values())[0]
