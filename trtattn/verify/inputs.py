"""The inputs a verification runs on: the user's (`--inputs`), or feeds searched in the model's own domain
until the original's outputs are finite (graph/domains.py). Random ops get a fixed seed on both models, or,
where the candidate cannot take one (an engine), the original's outputs must repeat on the same inputs;
otherwise verification is refused with one line naming the node."""

from __future__ import annotations

import numpy as np
import onnx

from ..errors import VerificationError
from ..graph.domains import feeds_in, ladder, node_seed, random_nodes, with_seeds
from ..graph.evaluate import ort_session
from ..graph.roles import input_specs
from ..graph.user_inputs import InputsUsed

MAX_RUNS = 32  # runs of the original, at most, in a search


def default_domains(model: onnx.ModelProto) -> InputsUsed:
    """What make_feeds draws each input from (every input at the widest rung of its ladder)."""
    return InputsUsed("searched", domains={s.name: ladder(s)[0] for s in input_specs(model)})


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
    note = "random ops compared with a fixed seed on both models: " + ", ".join(
        f"{n.name or '(unnamed)'} ({n.op_type})" for n in nodes)
    return with_seeds(original, seeds), with_seeds(candidate, seeds), note


def search(original: onnx.ModelProto, *, dims: dict, seed: int, iterations: int,
           random: list | None = None) -> tuple[list[dict], InputsUsed]:
    """Feeds on which the original's outputs are finite (and, with `random` nodes in it, the same on a second run):
    the inputs' domain ladders climbed together until they are, then each input taken back down as far as
    it stays so. One line when no domain tried works."""
    specs = input_specs(original)
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
