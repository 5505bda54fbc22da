"""The one outline fuse and normalize follow, as named steps; each command supplies its per-site rewriter.

    split branches (each command's own: rewrite/branches.py) -> read: widen a bf16 model, the tolerance, fit the
    dims -> analyse (match + probe) -> rewrite each site in its scope, rolled back when it fails -> verify -> the
    sites verified only over one key -> (fuse) decide what to try again (rewrite/fuse.py's Decision)

A step returns a typed value; what a site became is its SiteOutcome (site.py), set by the command's rewriter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import onnx
import onnx_graphsurgeon as gs

from ..graph.dims import Fit, fit_dims
from ..match import subgraphs
from ..report import Progress
from ..site import SiteOutcome
from ..verify import Outcome, compare_models, tolerance_for
from . import bf16


@dataclass
class Reading:
    """The model as a rewrite reads it: widened when ONNX Runtime cannot run its bf16, and the dims it runs on."""

    model: onnx.ModelProto  # the input, as given
    wide: onnx.ModelProto | None  # a bf16 model read widened to fp32 (rewrite/bf16.py); None otherwise
    dims: Any  # graph.dims.fit_dims's FittedDims: the dims the original runs on, and why
    atol: float
    rtol: float
    inputs: Any  # the user's GivenInputs (None: searched), of `model`
    wide_inputs: Any  # the same, widened with the model: of `runnable`
    user: dict = field(default_factory=dict)  # the dims the user gave (--dims): later steps keep them

    @property
    def runnable(self) -> onnx.ModelProto:
        """What ONNX Runtime matches, probes and verifies in fp32: the widened model, or the model."""
        return self.wide if self.wide is not None else self.model

    @property
    def notes(self) -> list[str]:
        return [bf16.NOTE] if self.wide is not None else []


def read(model: onnx.ModelProto, *, dims: dict | None, atol: float | None, rtol: float | None, inputs,
         progress: Progress, widened_tolerance: bool) -> Reading:
    """Widen a bf16 model ONNX Runtime cannot open (said once), take the tolerance of the precision it computes in
    (the widened model's when `widened_tolerance`: fuse verifies the widened rewrite in fp32) unless atol/rtol are
    given, and fit the dims the original runs on (graph/dims.py)."""
    low_atol, low_rtol = tolerance_for(model, atol, rtol)
    wide = bf16.read_widened(model)
    if wide is not None:
        progress.note(bf16.NOTE)
        if widened_tolerance:
            low_atol, low_rtol = tolerance_for(wide, atol, rtol)
    wide_inputs = inputs.widened(wide) if wide is not None and inputs is not None else inputs
    fit = fit_dims(wide if wide is not None else model, dims, progress=progress, given=wide_inputs)
    return Reading(model, wide, fit, low_atol, low_rtol, inputs, wide_inputs,
                   {} if isinstance(dims, Fit) else dict(dims or {}))


S = TypeVar("S")  # a command's scope: the graph a site is in and what its rewriter caches for it
Out = TypeVar("Out", bound=SiteOutcome)


class SiteRewriter(Generic[S, Out]):
    """A command's rewrite of one site (fuse's, normalize's): rewrite_each runs it in the site's scope and rolls
    it back when it raises what `catches` names."""

    catches: tuple[type[BaseException], ...] = ()  # what leaves the site as it was, with why (anything else raises)

    def scope(self, graph: gs.Graph, path: tuple) -> S:
        """The scope of the sites in the graph at `path` (made once per graph); KeyError when there is none."""
        raise NotImplementedError

    def nodes(self, scope: S) -> list:
        """The scope's node list, cut back to roll a failed rewrite back."""
        raise NotImplementedError

    def rewrite(self, scope: S, outcome: Out) -> None:
        raise NotImplementedError

    def failed(self, outcome: Out, error: BaseException) -> None:
        """The site left as it was, and why."""
        raise NotImplementedError


def rewrite_each(graph: gs.Graph, outcomes: Sequence[Out], rewriter: SiteRewriter[S, Out]) -> None:
    """Each site rewritten in its scope (the main graph or an If/Loop/Scan body, made once); a rewrite that raises
    what the rewriter catches has its nodes removed and the site kept as it was, with why."""
    scopes: dict[tuple, S] = {}
    for outcome in outcomes:
        path = outcome.site.graph
        try:
            if path not in scopes:
                scopes[path] = rewriter.scope(graph, path)
        except KeyError as e:  # no such body: the site stays as it was
            rewriter.failed(outcome, e)
            continue
        scope = scopes[path]
        nodes = rewriter.nodes(scope)
        mark = len(nodes)
        try:
            rewriter.rewrite(scope, outcome)
        except rewriter.catches as e:
            del nodes[mark:]
            rewriter.failed(outcome, e)


def find_scope(graph: gs.Graph, path: tuple) -> gs.Graph:
    """The graph a site is in: the main graph or an If/Loop/Scan body (KeyError when there is none)."""
    return subgraphs.find(graph, path)


def verify(original: onnx.ModelProto, candidate: onnx.ModelProto, sites: list, *, reading: Reading, seed: int,
           atol: float, rtol: float, emulated: bool, progress: Progress) -> Outcome:
    """`candidate` against `original` on ONNX Runtime: a bf16 pair emulated in fp32 (rewrite/bf16.py), else as
    they are; on the user's inputs when given. Sites inside a body are checked through the model's outputs."""
    outer = [s for s in sites if not s.graph]  # a body's tensors are not the graph's to output
    if emulated:
        with progress.step(f"verifying the bf16 model against the original, {bf16.RUN_ON}"):
            return bf16.verify_emulated(original, candidate, outer, dims=reading.dims, seed=seed, inputs=reading.inputs,
                                        atol=atol, rtol=rtol, progress=progress)
    with progress.step("verifying against the original on ONNX Runtime (Polygraphy)"):
        return compare_models(original, candidate, outer, dims=reading.dims, seed=seed, atol=atol, rtol=rtol,
                              given=reading.wide_inputs, progress=progress)


def one_key(fit, outcomes: Sequence[SiteOutcome]) -> list[str]:
    """The sites whose softmax the dims search left at one key at every length the model runs at (graph/dims.py):
    verified there, where any softmax gives 1, their check proves nothing."""
    left = getattr(fit, "one_key", {})
    return [o.site.name for o in outcomes if left.get(o.site.output, (0, 0))[1] == 1]
