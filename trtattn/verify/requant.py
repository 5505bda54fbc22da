"""How far a dynamically quantized model's tensors move after its attention when the attention moves within its
bound: a quantizer downstream of a site (DynamicQuantizeLinear, or an op that quantizes its input at run time)
computes its scale from the values it reads and rounds to it, so a fused site whose output differs from the
original's by a rounding error can land an element a whole step to the other side of a rounding boundary, and
the layers after it carry that step (several quantizers in a chain, several steps) to the outputs.

No formula gives that move (it depends on which elements cross, the weights that read them, and every layer
after), so it is evaluated: the original itself runs with each site's output moved by its bound (atol + rtol *
its largest magnitude, a random sign per element), and each tensor after a quantizer is allowed MARGIN times what
the original's own tensor moved (envelope). Tensors no quantizer after a site reaches keep their bound.

A site after such a quantizer is not judged by that move (a site wrong by less than the cascade would hide in
it): it is judged by its own error (forced_errors), the candidate run with every site's output replaced, for
the layers after it, by the original's, so each site computes from the original's inputs, within its own bound.

All of it runs at ONNX Runtime's default graph optimization level, the reference's own (level): at "basic", the
level the other comparisons use, ONNX Runtime's fusions depend on the opset, and the rewrite raises it (to 23 for
the Attention op), so the rewritten model's ops after the attention run other kernels than the original's:
Div/Erf/Mul becomes one Gelu at opset 20 and over, at basic, and a rounding difference there is whole steps
after a quantizer, no bound of the sites' moves covers it (SpeechT5, 10 layers, quantize_dynamic per channel
QUInt8: sites 3-9 off by 4e-4 to 6e-3 at basic, each 0 at the default level and with no optimization).
At the default level ONNX Runtime fuses both models' Div/Erf/Mul (com.microsoft's Gelu and ONNX's), as the user
runs them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from ..graph.evaluate import ort_session
from .difference import worst_error

# ops that quantize what they read to a scale computed from it at run time (ONNX Runtime's dynamic quantization)
QUANTIZERS = {("", "DynamicQuantizeLinear"), ("ai.onnx", "DynamicQuantizeLinear"),
              ("com.microsoft", "DynamicQuantizeMatMul"), ("com.microsoft", "QAttention"),
              ("com.microsoft", "DynamicQuantizeLSTM")}
DRAWS = 2  # moved runs per feed: each draw flips other elements, the envelope is the widest
# The widest move, twice: a candidate whose sites cross a rounding boundary is one more run of the same cascade,
# and a few runs' widest is not the widest there is. Measured on a 10-layer int8 BERT (hidden 512, quantize_dynamic
# per tensor, int8, reduce_range): 24 moved runs moved the output 0.0292-0.0377, the fused model 0.0308.
MARGIN = 2.0
_EXACT = "/trtattn_requant_exact"  # the site's own output, before the move added to it
_MOVE = "/trtattn_requant_move"
_FORCED = "/trtattn_requant_forced"  # a site's output as the original computes it, read by the layers after


@dataclass
class Envelope:
    """Per tensor, how far the original's own tensor moved with its sites moved within their bounds (only
    tensors after a quantizer that reads a site)."""

    moves: dict[str, float] = field(default_factory=dict)
    quantizers: list[str] = field(default_factory=list)  # the op types of the quantizers after the sites

    def why(self, names) -> str:
        """The reason the bounds of `names` (those compared) are wider, or "" when none is."""
        widened = sorted(n for n in names if self.moves.get(n, 0.0) > 0.0)
        if not widened:
            return ""
        worst = max(widened, key=lambda n: self.moves[n])
        kinds = ", ".join(f"{self.quantizers.count(k)} {k}" for k in dict.fromkeys(self.quantizers))
        return (f"{len(widened)} tensor(s) after {len(self.quantizers)} dynamic quantizer(s) downstream of the "
                f"attention ({kinds}) allowed {MARGIN:g}x what the original's own moved with each site's output "
                f"moved within its bound (+{self.moves[worst]:.3g} at '{worst}'): a quantizer rounds a rounding "
                "difference to whole steps; both compared at ONNX Runtime's default optimization level, as they run")


def level(model: onnx.ModelProto, sites: list[str]) -> str:
    """The graph optimization level (graph/evaluate.LEVELS) `model` and a rewrite of it are compared at: ONNX
    Runtime's default ("all") where a quantizer reads a site (see above), "basic" otherwise."""
    return "all" if downstream_quantizers(model, sites) else "basic"


def downstream_quantizers(model: onnx.ModelProto, starts: list[str]) -> list[onnx.NodeProto]:
    """The quantizers of the main graph (QUANTIZERS) that read (transitively) any of `starts`."""
    return _reach(model, starts)[0]


def requantized_names(model: onnx.ModelProto, starts: list[str]) -> set[str]:
    """The tensors of the main graph computed (transitively) from a quantizer that reads any of `starts`."""
    return _reach(model, starts)[1]


def _reach(model: onnx.ModelProto, starts: list[str]) -> tuple[list[onnx.NodeProto], set[str]]:
    reached, after, found = set(starts), set(), []
    for node in model.graph.node:  # topologically sorted: one pass reaches everything downstream
        if any(i in after for i in node.input):
            after.update(node.output)
        if not any(i in reached for i in node.input):
            continue
        reached.update(node.output)
        if (node.domain, node.op_type) in QUANTIZERS:
            found.append(node)
            after.update(node.output)
    return found, after


def envelope(model: onnx.ModelProto, sites: list[str], compared: list[str], feeds: list[dict],
             references: list[dict], tol: tuple[float, float], seed: int = 0, level: str = "all") -> Envelope:
    """The Envelope of `compared` tensors of `model` over `feeds`, each site (in `sites`) moved by its bound
    `tol` (atol, rtol) at its largest magnitude in `references` (the original's results on `feeds`, with the
    site outputs). Empty when no quantizer reads a site: the products after the attention are not requantized."""
    quantizers, after = _reach(model, sites)
    produced = {o for n in model.graph.node for o in n.output}
    moved = [s for s in sites if s in produced and all(s in r for r in references)]
    wanted = [n for n in compared if n in after and n not in sites]  # a site: judged by forced_errors
    if not quantizers or not moved or not wanted or not feeds:
        return Envelope()
    session = ort_session(_moved_model(model, moved, wanted, references[0]), level=level)
    inputs = {i.name for i in session.get_inputs()}
    fetch = [n + _EXACT if n in moved else n for n in wanted]
    rng = np.random.default_rng(seed)
    moves = dict.fromkeys(wanted, 0.0)
    for feed, ref in zip(feeds, references):
        base = {k: v for k, v in feed.items() if k in inputs}
        zero = {s + _MOVE: np.zeros_like(ref[s]) for s in moved}
        still = session.run(fetch, {**base, **zero})  # the same session's own unmoved values
        for _ in range(DRAWS):
            shift = {s + _MOVE: _shift(ref[s], tol, rng) for s in moved}
            for name, a, b in zip(wanted, still, session.run(fetch, {**base, **shift})):
                moves[name] = max(moves[name], _max_diff(a, b))
    return Envelope({k: MARGIN * v for k, v in moves.items()}, [q.op_type for q in quantizers])


def _shift(ref: np.ndarray, tol: tuple[float, float], rng) -> np.ndarray:
    """A move of a site's output by its whole bound, a random sign per element."""
    scale = float(np.max(np.abs(ref), initial=0.0)) if np.size(ref) else 0.0
    bound = tol[0] + tol[1] * (scale if np.isfinite(scale) else 0.0)
    return (rng.choice([-1.0, 1.0], size=np.shape(ref)) * bound).astype(ref.dtype)


def _max_diff(a, b) -> float:
    """The largest finite difference: a moved run that overflows says nothing about how far a rounding moves."""
    with np.errstate(invalid="ignore"):
        d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return float(np.max(np.where(np.isfinite(d), d, 0.0), initial=0.0))


def _moved_model(model: onnx.ModelProto, sites: list[str], wanted: list[str], reference: dict) -> onnx.ModelProto:
    """`model` with each site's output computed as exact + move: `move` a new input, `exact` the node's own
    output (also an output, to measure the site's move from the others alone), and the `wanted` tensors output."""
    moved = onnx.ModelProto()
    moved.CopyFrom(model)
    graph = moved.graph
    nodes = list(graph.node)
    del graph.node[:]
    for node in nodes:
        here = [out for out in node.output if out in sites]
        node.output[:] = [out + _EXACT if out in sites else out for out in node.output]
        graph.node.append(node)  # a copy: renamed before, and the Add right after it keeps the order topological
        graph.node.extend(onnx.helper.make_node("Add", [out + _EXACT, out + _MOVE], [out], name=out + _MOVE)
                          for out in here)
    dtype = {s: onnx.helper.np_dtype_to_tensor_dtype(np.asarray(reference[s]).dtype) for s in sites}
    graph.input.extend(onnx.helper.make_tensor_value_info(s + _MOVE, dtype[s], None) for s in sites)
    known = {o.name for o in graph.output}
    graph.output.extend(onnx.helper.make_empty_tensor_value_info(n) for n in
                        [s + _EXACT for s in sites] + [n for n in wanted if n not in known and n not in sites])
    return moved


def forced_errors(candidate: onnx.ModelProto, sites: list[str], feeds: list[dict], references: list[dict],
                  level: str = "all") -> dict[str, float]:
    """Each site's own max abs error over `feeds`: `candidate` run with the layers after every site reading the
    original's output of that site (`references`, the original's results on `feeds`) instead of its own, so no
    site's input carries another site's difference through a quantizer."""
    produced = {o for n in candidate.graph.node for o in n.output}
    forced = [s for s in sites if s in produced and all(s in r for r in references)]
    if not forced or not feeds:
        return {}
    model = onnx.ModelProto()
    model.CopyFrom(candidate)
    for node in model.graph.node:
        node.input[:] = [i + _FORCED if i in forced else i for i in node.input]
    dtype = {s: onnx.helper.np_dtype_to_tensor_dtype(np.asarray(references[0][s]).dtype) for s in forced}
    model.graph.input.extend(onnx.helper.make_tensor_value_info(s + _FORCED, dtype[s], None) for s in forced)
    known = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(s) for s in forced if s not in known)
    session = ort_session(model, level=level)
    inputs = {i.name for i in session.get_inputs()}
    errors = dict.fromkeys(forced, 0.0)
    for feed, ref in zip(feeds, references):
        fed = {**{k: v for k, v in feed.items() if k in inputs}, **{s + _FORCED: ref[s] for s in forced}}
        for s, value in zip(forced, session.run(forced, fed)):
            errors[s] = max(errors[s], worst_error(ref[s], value))
    return errors

