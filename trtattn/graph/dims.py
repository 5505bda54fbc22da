"""Dims the original model runs on, for verification and probing.

The default dims (graph/dim_names.py) fit most models. Some exports do not run on them: TorchScript
bakes the example's length into Reshape targets or padding (LED runs at lengths 7, 11, 15, ...);
raw audio through strided convolutions needs hundreds of samples (wav2vec2); torch.export gives
one dim several names. `fit_dims` checks the dims on ONNX Runtime and, when the model does not run
on them, tries others, cheapest first: lengths the graph bakes in (static dims, Reshape targets),
lengths next to the default, then lengths grown geometrically to a bound; first one dim at a
time, then every sequence-like dim together, then the unified dims taken apart. Candidates whose
output shapes (torch.export writes them as expressions of the input dims) would be empty are
skipped without a run. When none runs, one line names the node that fails and the `--dims` to give.

Memory: before any run, the activations it would hold are estimated from the shapes (graph/memory.py);
a candidate over the budget (--max-memory) is skipped and named in the reasons, and dims given or
declared that are over it are refused with one line, so no probe can take the machine down.

Cost: nothing for a model whose metadata (`trtattn.inputs`, written by the zoo and kept by trtattn's
outputs) declares the dims it was exported at, nor with `check=False`; otherwise one ONNX Runtime
session (graph optimizations off, so it opens fast) and a run per candidate, stopping at the first
that fits (LED, 6000 nodes: 2 s, most of it opening the session; wav2vec2: 0.2 s for 21 runs).
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from .. import timings
from ..errors import TrtattnError
from ..timings import timed
from . import memory
from .dim_facts import OpDims
from .dim_names import BATCH, DEFAULT_DIM, DEFAULT_DIMS, SEQ, dim_classes, evaluate, names_in, resolve_dims
from .feeds import make_feeds
from .io import session_source, weights_size
from .op_dims import op_dims
from .ort_threads import set_threads
from .roles import declared_dims, input_specs

BOUND = 1 << 16  # the longest sequence tried
MAX_TRIALS = 64  # runs of the model, at most, before giving up
_NEAR = 8  # lengths next to the default tried on either side
_ORT_NODE = re.compile(r"running (\w+) node\. Name:'([^']*)' Status Message: (.*)", re.DOTALL)


class DimsDoNotFit(TrtattnError):
    """The original model runs on none of the dims tried."""


class Fit(dict):
    """Dims (name -> value) the model runs on, with why they are what they are (`reasons`, one
    sentence each); passing a Fit back to fit_dims returns it as it is."""

    def __init__(self, dims: dict, reasons: list[str] | None = None, skipped: list[str] | None = None, runs: int = 0,
                 one_key: dict[str, tuple] | None = None, also: list[dict] | None = None):
        super().__init__(dims)
        # other dims verification runs at too: a prefill (every cache empty) beside a step over a past
        self.also = list(also or [])
        self.reasons = list(reasons or [])
        self.skipped = list(skipped or [])  # candidate dims not tried because their run would pass the memory budget
        self.runs = runs  # runs of the model it took to find them
        # the output of the product with V of each attention softmax left at a length of 1 at these dims (what a
        # site calls its output) -> the softmax's (query, key) lengths
        self.one_key = dict(one_key or {})


@timed("fit dims")
def fit_dims(model: onnx.ModelProto, dims: dict | None = None, *, check: bool = True,
             failure: BaseException | None = None, progress=None, given=None) -> Fit:
    """Dims the original `model` runs on: `dims` (the user's) completed by what its attention ops fix
    (graph/op_dims.py: head sizes, total = past + new, batch 1 over a past) and the defaults when the model
    runs on them, else the first candidate that does. Raises DimsDoNotFit. A site reading a cache is also
    checked at a prefill (every cache empty): `Fit.also`.

    `check=False` trusts the defaults without a run (a flow that runs the original anyway can then
    call again with `failure=`, the error that run gave, to search from there). `given` (the user's
    inputs, graph.user_inputs.GivenInputs) fixes every dim its arrays cover: nothing is searched, and
    the model must run on them."""
    if isinstance(dims, Fit) and failure is None:
        return dims
    user = dict(dims or {})
    specs = input_specs(model)
    if given is not None:
        return _done(_given_fit(model, specs, user, given), progress)
    ops = op_dims(model)
    ops.check_user(user)
    classes = dim_classes(specs)

    def resolve(over: dict) -> dict:
        """resolve_dims with what the ops fix set, where `over` (the user's and a candidate's) does not set it."""
        base = resolve_dims(model, over, specs=specs)
        changed = {k: v for k, v in ops.decode(base, over).items() if base.get(k) != v}
        return resolve_dims(model, {**over, **changed}, specs=specs) if changed else base

    guess = resolve(user)
    notes = _unified(classes, guess) + ops.reasons() + ops.batch_note(guess, user)
    _within_budget(model, guess, user)
    if failure is None and (not check or declared_dims(model)):
        return _done(Fit(guess, notes), progress)  # trusted, or the model says it is dynamic in its dims
    variables = _variables(specs, classes, {**user, **ops.fixed})
    lengths = [n for n, batch in variables.items() if not batch]

    def longer(base: dict, at: dict) -> list[tuple[dict, dict]]:
        """(change, dims) for each length doubled, up to 4 times, alone then all together, from `at` (which the
        user's and search's dims `base` give)."""
        groups = [[n] for n in lengths] + ([lengths] if len(lengths) > 1 else [])
        changes = [{n: max(at.get(n, DEFAULT_DIM), 1) << k for n in names} for k in range(1, 5) for names in groups]
        return [(c, resolve({**base, **c})) for c in changes]

    with trial(model, specs) as run:
        first, short = (_problem(failure), {}) if failure is not None else run(guess)
        if first is None:
            fit = Fit(guess, notes, runs=1)
            fit = _attended(run, model, fit, short, lambda: longer(user, guess), progress)
            return _done(_with_prefill(run, fit, ops, user, resolve), progress)
        found, tried, skipped, limit = _search(run, model, variables, guess, classes, specs, ops, user, resolve,
                                               progress)
        if found is not None:
            change, candidate, short = found
            shown = ", ".join(f"{k}={v}" for k, v in change.items())
            was = ", ".join(f"{k}={guess.get(k, DEFAULT_DIM)}" for k in change)
            fit = Fit(candidate, notes + [f"{shown} (the model does not run at {was}: {first})"]
                      + _skipped_note(skipped, limit), skipped, tried)
            fit = _attended(run, model, fit, short, lambda: longer({**user, **change}, candidate), progress)
            return _done(_with_prefill(run, fit, ops, user, resolve), progress)
    names = list(dict.fromkeys([*user, *variables]))
    if not names:
        raise DimsDoNotFit(f"the model does not run on ONNX Runtime at its static shapes: {first}")
    raise DimsDoNotFit(f"the model does not run at {show(guess, names)} (nor at {tried - 1} other dims tried"
                       f"{f'; {len(skipped)} skipped for memory, over {memory.show(limit)}' if skipped else ''}): "
                       f"{first}; give sizes it runs on with --dims {','.join(f'{n}=N' for n in names)}")


def _search(run, model: onnx.ModelProto, variables: dict[str, bool], guess: dict, classes: dict, specs, ops: OpDims,
            user: dict, resolve, progress) -> tuple[tuple[dict, dict, dict] | None, int, list[str], int]:
    """The first candidate change the model runs at, as (change, dims, its softmaxes at one key) (None: none), with
    the runs tried, the candidates skipped for memory and the memory budget."""
    hints = _hints(model)
    tried, skipped, limit = 1, [], memory.budget()
    candidates = list(_candidates(variables, guess, classes, hints, _broadcast_batch(specs), set(ops.pasts)))
    with contextlib.closing(iter(progress.count(candidates, "searching dims the model runs on", unit="dims")
                                 if progress is not None else (c for c in candidates))) as counted:  # the bar ends here
        for change in counted:
            candidate = resolve({**user, **change})
            if _empty_output(model, candidate) or not ops.within_limits(candidate):
                continue
            need = memory.activation_bytes(model, candidate)
            if need > limit:
                skipped.append(f"{show(change, change)} (~{memory.show(need)})")
                continue
            tried += 1
            problem, short = run(candidate)
            if problem is None:
                return (change, candidate, short), tried, skipped, limit
            if tried >= MAX_TRIALS:
                break
    return None, tried, skipped, limit


def _with_prefill(run, fit: Fit, ops: OpDims, user: dict, resolve) -> Fit:
    """`fit` with, where an op reads a cache and the user gave no past length, the same dims at a prefill (every
    cache empty) in `fit.also` when the model runs there (at the default batch, else at the fit's): verification
    then covers an empty and a non-empty cache. Said in the reasons either way; not counted in `fit.runs` (the
    runs that found the dims)."""
    problem, prefill, changed = None, {}, {}
    for batch in ({b: DEFAULT_DIMS.get(b, DEFAULT_DIMS[BATCH]) for b in ops.batches}, {b: fit[b] for b in ops.batches
                                                                                       if b in fit}):
        empty = ops.prefill(fit, user, batch)
        if empty is None or all(fit.get(p) == 0 for p in ops.pasts):
            return fit
        prefill = resolve({**user, **{k: v for k, v in empty.items() if fit.get(k) != v}})
        changed = {k: v for k, v in prefill.items() if fit.get(k) != v}
        problem, _ = run(prefill)
        if problem is None:
            fit.also.append(prefill)
            fit.reasons.append(f"also verified at a prefill (empty cache): {show(prefill, changed)}")
            return fit
    fit.reasons.append(f"not verified at a prefill (empty cache) too: at {show(prefill, changed)} {problem}")
    return fit


def _given_fit(model: onnx.ModelProto, specs, user: dict, given) -> Fit:
    """The dims of the user's inputs (theirs over --dims where both name one), checked by one run of the
    original on their first set."""
    covered = given.dims(model)
    fit = Fit(resolve_dims(model, {**user, **covered}, specs=specs),
              [f"{show(covered, covered)} from the inputs given (--inputs {given.path})"] if covered else [], runs=1)
    differ = {k: v for k, v in user.items() if k in covered and covered[k] != v}
    if differ:
        fit.reasons.append(f"--dims {show(differ, differ)} set aside: the inputs given have "
                           f"{show(covered, differ)}")
    with trial(model, specs) as run:
        failed, short = run(fit, feeds=given.sets[0])
    fit.one_key = _by_output(short)  # the user's lengths: said, not changed
    if failed is not None:
        raise DimsDoNotFit(f"the model does not run on the inputs given (--inputs {given.path}): {failed}")
    return fit


def _attended(run, model: onnx.ModelProto, fit: Fit, short: dict, longer, progress) -> Fit:
    """`fit` (dims the model runs on), or, where an attention's softmax has one key or one query there, the first
    of the longer lengths `longer()` gives ((change, dims) pairs) at which the model runs and none has: over one
    key any softmax is 1, whatever its logits, and one query hides what a mask does across queries, so verification
    there proves nothing of the attention. Where none fits, `fit` names the softmaxes left so (`one_key`)."""
    if not short:
        return fit
    limit, changes, tried = memory.budget(), longer(), 0
    counted = progress.count(changes, "searching lengths where every attention has more than one key", unit="dims") \
        if progress is not None and changes else (c for c in changes)
    with contextlib.closing(iter(counted)) as each:  # the bar ends here
        for change, candidate in each:
            if _empty_output(model, candidate) or memory.activation_bytes(model, candidate) > limit:
                continue
            problem, left = run(candidate)
            tried += 1
            if problem is None and not left:
                was = ", ".join(f"{k}={fit[k]}" for k in change)
                return Fit(candidate, fit.reasons + [f"{show(change, change)} (at {was} {_one_key(short)})"], fit.skipped,
                           fit.runs + tried)
    return Fit(fit, fit.reasons + [f"{_one_key(short)} at every length tried: verified at a length of 1 only"],
               fit.skipped, fit.runs + tried, _by_output(short), fit.also)


def _one_key(short: dict) -> str:
    """'Softmax 'a' has one key (query 4, key 1)' for each attention softmax left at a length of 1."""
    return "; ".join(f"Softmax '{name}' has {'one key' if k == 1 else 'one query'} (query {q or '?'}, key {k})"
                     for name, (q, k, _) in short.items())


def _by_output(short: dict) -> dict[str, tuple]:
    """Softmax -> (query, key, product output), as the product's output -> (query, key): a site's output names it
    whether or not its nodes have names."""
    return {product: (q, k) for q, k, product in short.values()}


def _within_budget(model: onnx.ModelProto, dims: dict, user: dict) -> None:
    """Refuse dims (the user's, declared or default) whose run would pass the memory budget."""
    need, limit = memory.activation_bytes(model, dims), memory.budget()
    if need > limit:
        given = show(dims, user) if user else "its default dims"
        raise TrtattnError(f"running the model at {given} needs about {memory.show(need)} of activations, over the "
                           f"memory budget of {memory.show(limit)}; give smaller --dims or a larger --max-memory")


def _skipped_note(skipped: list[str], limit: int) -> list[str]:
    if not skipped:
        return []
    shown = ", ".join(skipped[:6]) + (f" and {len(skipped) - 6} more" if len(skipped) > 6 else "")
    return [f"skipped for memory (over the budget of {memory.show(limit)}): {shown}"]


def _done(fit: Fit, progress) -> Fit:
    if progress is not None and getattr(progress, "enabled", False):
        for reason in fit.reasons:
            print(f"[trtattn] dims: {reason}", file=progress.stream, flush=True)
    return fit


def show(dims: dict, names) -> str:
    return ", ".join(f"{n}={dims[n]}" for n in names if n in dims)


def _unified(classes: dict[str, str], dims: dict) -> list[str]:
    """One sentence per dim that several names, or an anonymous dim, stand for."""
    why = {BATCH: "axis 0 of every input", SEQ: "axis 1 of token ids, masks and positions"}
    members: dict[str, list[str]] = {}
    for name, label in classes.items():
        if name != label:
            members.setdefault(label, []).append(name)
    return [f"{label}={dims[label]} for {', '.join(names)}" + (f" ({why[label]})" if label in why else "")
            for label, names in members.items()]


def _variables(specs, classes: dict[str, str], user: dict) -> dict[str, bool]:
    """The dims to search (name -> whether it is a batch dim), lengths first; not those the user gave."""
    fixed = set(user) | {classes[k] for k in user if k in classes}
    found: dict[str, bool] = {}
    for spec in specs:
        for axis, d in enumerate(spec.shape):
            if isinstance(d, str):
                names = [classes[d]] if d in classes else names_in(d)
                for name in names:
                    found[name] = found.get(name, False) or (axis == 0 and len(names) == 1)
    return dict(sorted(((n, b) for n, b in found.items() if n not in fixed), key=lambda item: item[1]))


def _broadcast_batch(specs) -> bool:
    """Whether a per-token input (rank 2 or more) is fixed at 1 on the batch axis that another input leaves
    free (position_ids [1, S] broadcast over the batch): ops that take it per row (RotaryEmbedding) then
    run at batch 1 only. (A one-element flag [1] says nothing about the batch.)"""
    return any(len(spec.shape) >= 2 and spec.shape[0] == 1 for spec in specs) and \
        any(spec.shape and isinstance(spec.shape[0], str) for spec in specs)


def _candidates(variables: dict[str, bool], guess: dict, classes: dict[str, str], hints: list[int],
                broadcast: bool = False, pasts: frozenset | set = frozenset()):
    """Changes to try, cheapest first: the batch at 1 when an input broadcasts over it, every cache empty (an op's
    past length at 0: a prefill), then one dim at a time, then every length together, then the members of each
    unified dim apart."""
    if broadcast and any(variables.values()):
        yield {name: 1 for name, batch in variables.items() if batch}
    if any(p in variables for p in pasts):
        yield {p: 0 for p in pasts if p in variables}
    for name, batch in variables.items():
        for value in _values(guess.get(name, DEFAULT_DIM), hints, batch):
            yield {name: value}
    lengths = [name for name, batch in variables.items() if not batch]
    if len(lengths) > 1:
        for value in _values(DEFAULT_DIM, hints, False):
            yield {name: value for name in lengths}
    for label, batch in variables.items():
        members = [n for n, cls in classes.items() if cls == label and n != label]
        if len(members) > 1:
            for name in members:
                for value in _values(guess.get(name, DEFAULT_DIM), hints, batch):
                    yield {name: value}


def _values(start: int, hints: list[int], batch: bool) -> list[int]:
    """Values for one dim: for a batch, 1 then small hints; for a length, the hints nearest to the
    start (baked lengths), the lengths next to it, then doubling up to BOUND."""
    if batch:
        out = [1] + [h for h in hints if h <= 16]
    elif start < 1:  # an empty cache: the lengths from the default up
        out = [DEFAULT_DIM << k for k in range(64) if DEFAULT_DIM << k <= BOUND]
    else:
        near = sorted(hints, key=lambda h: abs(math.log2(h / start)))[:_NEAR]
        around = [x for k in range(1, _NEAR + 1) for x in (start - k, start + k) if x >= 1]
        grown = [start << k for k in range(1, 64) if start << k <= BOUND]
        out = near + around + grown
    return [v for v in dict.fromkeys(out) if v != start]


def _hints(model: onnx.ModelProto) -> list[int]:
    """Lengths the graph may have baked in: static dims of its tensors and constant Reshape/Expand/Tile targets."""
    graph = model.graph
    found = {d.dim_value for vi in list(graph.value_info) + list(graph.output)
             for d in vi.type.tensor_type.shape.dim if d.HasField("dim_value")}
    inits = {i.name: i for i in graph.initializer if len(i.dims) == 1 and i.dims[0] <= 8}
    consts = {n.output[0]: n.attribute[0].t for n in graph.node
              if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}
    for n in graph.node:
        if n.op_type in ("Reshape", "Expand", "Tile") and len(n.input) > 1:
            target = inits.get(n.input[1]) or consts.get(n.input[1])
            if target is not None and target.data_type == onnx.TensorProto.INT64 and len(target.dims) == 1:
                found.update(int(x) for x in numpy_helper.to_array(target))
    return sorted(h for h in found if 1 < h <= BOUND)


def _empty_output(model: onnx.ModelProto, dims: dict) -> bool:
    """Whether a dim the graph writes as an expression of the input dims (torch.export does) would
    be below 1 at these dims: the run would fail or give an empty output."""
    for vi in list(model.graph.output) + list(model.graph.value_info):
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and names_in(d.dim_param) != [d.dim_param]:
                value = evaluate(d.dim_param, dims)
                if value is not None and value < 1:
                    return True
    return False


def _problem(error: BaseException) -> str:
    """ONNX Runtime's error as one clause naming the node: "Conv node '/conv' fails: Invalid input shape: {8}"."""
    text = str(error)
    m = _ORT_NODE.search(text)
    if not m:
        return text.strip().splitlines()[0] if text.strip() else type(error).__name__
    op, node, message = m.groups()
    message = message.strip().splitlines()[0]
    message = re.sub(r"^\S+\.(?:h|cc|cpp):\d+ \S.*?\) ", "", message)  # the C++ source location and function
    return f"{op} node '{node}' fails: {message}"


@contextlib.contextmanager
def trial(model: onnx.ModelProto, specs):
    """One ONNX Runtime session on the original, as `run(dims)`: it runs the model on the verification's first
    feeds at those dims (or on `feeds`) and returns what went wrong (None: it runs, and no output is empty) and the attention
    softmaxes (_attention_softmaxes) whose query or key length is 1 there (name -> (query, key, product output))."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # failing runs are expected here: no error logs
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # opens faster
    set_threads(options, weights_size(model))
    outputs = [o.name for o in model.graph.output]
    softmaxes = [s for s in _attention_softmaxes(model) if s[1] not in outputs]
    nodes, added = len(model.graph.node), len(model.graph.output)
    for i, (_, logits, _, _) in enumerate(softmaxes):  # their shapes, for the session only
        model.graph.node.append(onnx.helper.make_node("Shape", [logits], [f"trtattn_fit_shape/{i}"]))
        model.graph.output.append(onnx.helper.make_tensor_value_info(f"trtattn_fit_shape/{i}", onnx.TensorProto.INT64, None))
    try:
        with session_source(model) as source:
            timings.session_made()
            try:
                session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
            except Exception as e:  # ONNX Runtime's errors have no common public base class
                raise TrtattnError(f"ONNX Runtime cannot open the model: {_problem(e)}") from None
    finally:
        del model.graph.node[nodes:], model.graph.output[added:]

    def run(dims: dict, feeds: dict | None = None) -> tuple[str | None, dict[str, tuple]]:
        try:
            values = session.run(None, feeds if feeds is not None else make_feeds(model, dims=dims, specs=specs))
        except Exception as e:
            return _problem(e), {}
        empty = [name for name, v in zip(outputs, values) if np.size(v) == 0]
        if empty:
            return f"output '{empty[0]}' is empty", {}
        lengths = {name: (*length(tuple(int(d) for d in v)), product)
                   for (name, _, length, product), v in zip(softmaxes, values[len(outputs):])}
        return None, {name: qkp for name, qkp in lengths.items() if 1 in qkp[:2]}

    yield run


# what may stand between an attention's Softmax and its product with V (casts, dropout, masks, layout, Q/DQ)
_TO_VALUES = 6


def _attention_softmaxes(model: onnx.ModelProto) -> list[tuple[str, str, Callable[[tuple], tuple], str]]:
    """The main graph's Softmax nodes whose output reaches a MatMul or Einsum within _TO_VALUES nodes (a softmax
    that weighs values, as an attention's does), each as (node name, its input, shape -> (query, key) lengths,
    that product's output)."""
    graph = model.graph
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    found = []
    for i, node in enumerate(graph.node):
        product = _weighs(node, readers) if node.op_type == "Softmax" and node.input else None
        if product is None:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1 if opset >= 13 else 1)
        found.append((node.name or f"Softmax_{i}", node.input[0], _lengths(axis, flattened=opset < 13), product))
    return found


def _weighs(node: onnx.NodeProto, readers: dict) -> str | None:
    """The output of the first product (MatMul, Einsum) `node`'s output reaches within _TO_VALUES nodes."""
    frontier = [node]
    for _ in range(_TO_VALUES):
        frontier = [r for n in frontier for o in n.output for r in readers.get(o, [])]
        product = next((r for r in frontier if r.op_type in ("MatMul", "Einsum", "MatMulInteger", "QLinearMatMul")), None)
        if product is not None:
            return product.output[0]
    return None


def _lengths(axis: int, flattened: bool):
    """shape -> (query, key) lengths of a softmax over `axis` (before opset 13 over every axis from it on): the
    key length, and the query length from the axis before it when that is not the first (else None: not known)."""
    def lengths(shape: tuple) -> tuple[int | None, int]:
        at = axis % len(shape) if shape else 0
        key = int(np.prod(shape[at:])) if flattened else int(shape[at]) if shape else 1
        return (int(shape[at - 1]) if at >= 2 else None), key
    return lengths
