"""The inputs a verification runs on: the user's (`--inputs`), or feeds searched in the model's own domain
until the original's outputs are finite (graph/domains.py). Random ops get a fixed seed on both models, and
the values the original draws are fed to both in place of the nodes (fed_draws: the candidate need not run
the op itself, which ONNX Runtime cannot at every opset: no RandomNormalLike-22 kernel for fuse's opset-23
output). Where the candidate cannot take a seed (an engine), the original's outputs must repeat on the same
inputs; otherwise verification is refused with one line naming the node."""

from __future__ import annotations

import collections

import numpy as np
import onnx

from ..errors import VerificationError
from ..graph.domains import feeds_in, ladder, node_seed, random_nodes, with_seeds
from ..graph.evaluate import ort_session
from ..graph.feeds import measured_specs
from ..graph.io import attach_weights, extra_outputs, weights_aside
from ..graph.user_inputs import InputsUsed

MAX_RUNS = 32  # runs of the original, at most, in a search


def default_domains(model: onnx.ModelProto, dims: dict | None = None) -> InputsUsed:
    """What make_feeds draws each input from (every input at the widest rung of its ladder; masks as measured)."""
    return InputsUsed("searched", domains={s.name: ladder(s)[0] for s in measured_specs(model, dims)})


def finite(values) -> bool:
    return all(np.isfinite(v).all() for v in values if isinstance(v, np.ndarray) and v.dtype.kind == "f")


def seeded_pair(original: onnx.ModelProto, candidate: onnx.ModelProto):
    """(original, candidate, note): both with every random node of the original seeded alike (the
    rewrite keeps their names); the models themselves when there is none. One line naming a random node
    the candidate lacks."""
    nodes = random_nodes(original)
    if not nodes:
        return original, candidate, None
    theirs = {n.name: n.op_type for n in random_nodes(candidate)}
    for node in nodes:
        if theirs.get(node.name) != node.op_type:
            raise VerificationError(f"node '{node.name}' ({node.op_type}) draws new random values on every run and "
                                    "the rewritten model has no node of that name to seed alike: give inputs that make "
                                    "the outputs repeatable with --inputs FILE")
    seeds = {n.name: node_seed(n) for n in nodes}
    note = "random ops compared with a fixed seed on both models (the original's draws fed to both): " + ", ".join(
        f"{n.name or '(unnamed)'} ({n.op_type})" for n in nodes)
    return with_seeds(original, seeds), with_seeds(candidate, seeds), note


def fed_draws(original: onnx.ModelProto, candidate: onnx.ModelProto, feeds: list[dict]):
    """(original, candidate, feeds) with every random node of the main graph (seeded: seeded_pair) cut out of
    both models, its outputs made graph inputs, and the values the original draws on each feed dict added to
    it: both models compute on the same draws, and the candidate does not run the op (ONNX Runtime has no
    RandomNormalLike kernel at opset 22+). Nodes in If/Loop bodies stay seeded alike. The models as they are
    when there is no random node to cut."""
    found = {id(n) for n in random_nodes(original)}
    names = collections.Counter(n.name for n in original.graph.node)
    mine = [n for n in original.graph.node if id(n) in found and n.name and names[n.name] == 1]  # matched by name
    theirs = {n.name: n for n in candidate.graph.node if n.name in {m.name for m in mine}}
    mine = [n for n in mine if n.name in theirs]
    if not mine:
        return original, candidate, feeds
    drawn = [o for n in mine for o in n.output if o]
    with extra_outputs(original, drawn):
        session = ort_session(original)
        wanted = [o.name for o in session.get_outputs() if o.name in drawn]
        values = [dict(zip(wanted, session.run(wanted, f))) for f in feeds]
    renames = {t: o for n in mine for o, t in zip(n.output, theirs[n.name].output) if o and t}
    return (_cut(original, {n.name for n in mine}, values[0]),
            _cut(candidate, set(theirs), {t: values[0][o] for t, o in renames.items()}),
            [{**f, **v, **{t: v[o] for t, o in renames.items()}} for f, v in zip(feeds, values)])


def _cut(model: onnx.ModelProto, names: set[str], examples: dict) -> onnx.ModelProto:
    """A copy of `model` (weights shared, not copied twice) without the nodes `names`, their outputs graph
    inputs of the dtype and rank of `examples`."""
    cut = onnx.ModelProto()
    with weights_aside(model) as weights:
        cut.CopyFrom(model)
    attach_weights(cut, weights)
    kept = [n for n in cut.graph.node if n.name not in names]
    del cut.graph.node[:]
    cut.graph.node.extend(kept)
    for name, value in examples.items():
        elem = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
        cut.graph.input.append(onnx.helper.make_tensor_value_info(name, elem, [None] * value.ndim))
    return cut


def search(original: onnx.ModelProto, *, dims: dict, seed: int, iterations: int,
           random: list | None = None) -> tuple[list[dict], InputsUsed]:
    """Feeds on which the original's outputs are finite (and, with `random` nodes in it, the same on a second run):
    the inputs' domain ladders climbed together until they are, then each input taken back down as far as
    it stays so. One line when no domain tried works."""
    specs = measured_specs(original, dims)
    ladders = {s.name: ladder(s) for s in specs}
    climbing = [n for n, rungs in ladders.items() if len(rungs) > 1]
    session = ort_session(original)
    runs = 0
    repeatable = bool(random)

    def accepted(domains: dict) -> bool:
        nonlocal runs
        for i in range(iterations):
            feeds = feeds_in(original, domains, dims=dims, seed=seed + i, specs=specs)
            first = session.run(None, feeds)
            runs += 1
            if not finite(first):
                return False
            if repeatable:
                again = session.run(None, feeds)
                runs += 1
                if not all(np.array_equal(a, b, equal_nan=True) for a, b in zip(first, again)):
                    return False
        return True

    rung = {n: 0 for n in climbing}
    top = max((len(ladders[n]) for n in climbing), default=1)
    for level in range(top):
        rung = {n: min(level, len(ladders[n]) - 1) for n in climbing}
        if accepted({n: ladders[n][k] for n, k in rung.items()}):
            break
    else:
        tried = "; ".join(f"{n}: {', '.join(ladders[n])}" for n in climbing) or "no input has another domain to try"
        if random:
            raise VerificationError(f"node '{random[0].name}' ({random[0].op_type}) draws new random values on every run "
                                    f"and the original's outputs do not repeat on any inputs tried ({tried}): give "
                                    "inputs that make them repeatable with --inputs FILE")
        raise VerificationError(f"the original model's outputs are not finite on any inputs tried ({tried}): "
                                "give inputs it accepts with --inputs FILE")
    for n in climbing:  # each input back to the widest domain that keeps the outputs finite
        for lower in range(rung[n]):
            if runs >= MAX_RUNS:
                break
            trial = {**rung, n: lower}
            if accepted({m: ladders[m][k] for m, k in trial.items()}):
                rung = trial
                break
    chosen = {n: ladders[n][k] for n, k in rung.items()}
    feeds = [feeds_in(original, chosen, dims=dims, seed=seed + i, specs=specs) for i in range(iterations)]
    domains = {s.name: ladders[s.name][rung.get(s.name, 0)] for s in specs}
    used = InputsUsed("searched", iterations=iterations, domains=domains)
    if random:
        used.notes.append("random ops (" + ", ".join(f"{n.name} ({n.op_type})" for n in random)
                          + "): their outputs repeat on these inputs")
    return feeds, used


def searched_or_note(used: InputsUsed, original: onnx.ModelProto, **how) -> tuple[list[dict], InputsUsed] | None:
    """search's feeds; None when no domain makes the outputs finite (an original that outputs -inf by design):
    the comparison then keeps its feeds, and `used` says so."""
    try:
        return search(original, **how)
    except VerificationError as e:
        used.notes.append(str(e).split(": give inputs")[0])
        return None
