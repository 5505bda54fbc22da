"""Shapes measured by running the model at two sizes: what each dim of a tensor is, by numbers.

Shape inference names a dim it cannot follow with a fresh symbol (`unk__28`) or none at all: tf2onnx
computes Reshape targets with ReduceProd and Max over Shape slices, which ONNX's inference does not
follow, and ONNX Runtime's symbolic inference gives up on some models altogether. Such a name says
nothing about which dims are equal or what they are made of. Here the model runs on ONNX Runtime twice,
at the dims it runs at (the defaults, or those graph/dims.py found) and with every input dim multiplied by
its own prime (or, when the model needs two of them equal, all by the same one), and each wanted tensor's
shape is read at both (Shape nodes added for the run, then removed; only the shapes leave ONNX Runtime). A
dim is then a `Sizes`, its value at each run: static where the two agree (heads, head dims, a unit axis),
varying with the input where they differ (batch, positions), and distinct primes keep independent input
dims apart. The probes are small (those dims and a few times them); a model that does not run at them is
not measured.

Values are evaluated the same way (`value`): a tensor of the graph's shape arithmetic that folding could not
make a constant (it reads the shape of a Slice whose end is computed, say) is run at both probes, and one
that is the same at both does not change with the dims: a constant (a scale, a head count). One that differs
(the batch, a length) is not.
"""

from __future__ import annotations

import weakref

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from .dim_names import dim_classes, resolve_dims
from .evaluate import cut_out, ort_session
from .feeds import make_feeds
from .op_dims import op_dims
from .roles import input_specs
from .shapes import Inferred, dims_of, infer, known_shapes_and_types, left_unnamed, merged, unnamed

PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29)


class Sizes(tuple):
    """A dim's value at each run (the default dims, then the scaled ones)."""

    @property
    def static(self) -> bool:
        return len(set(self)) == 1

    def __repr__(self) -> str:
        return str(self[0]) if self.static else "(" + "|".join(map(str, self)) + ")"


def probe_dims(model: onnx.ModelProto, dims: dict | None = None) -> tuple[dict[str, int], list[dict[str, int]]]:
    """The dims of the first run (`dims`, the dims the model runs at, over the defaults) and the choices for the
    second, in order: each input dim (unified dims together) times its own prime, then every input dim times 3,
    then each of the first with one dim kept (a dim the model runs at one value of only, as a recogniser's image
    height, would stop every other from being measured)."""
    specs = input_specs(model)
    base = resolve_dims(model, dims, specs=specs)
    classes = dim_classes(specs)
    ops = op_dims(model)  # sizes the attention ops fix are not scaled; their totals are the scaled parts' sum
    names = sorted({d for s in specs for d in s.shape if isinstance(d, str) and d in base and d not in ops.fixed})
    labels = sorted({classes.get(n, n) for n in names})
    if len(labels) > len(PRIMES):
        raise ValueError("too many independent input dims to measure")
    choices = []
    primes = dict(zip(labels, PRIMES))
    kept = [{**primes, label: 1} for label in labels] if len(labels) > 1 else []
    for prime in (primes, dict.fromkeys(labels, 3), *kept):
        scaled = dict(base)
        for n in names:
            scaled[n] = base[n] * prime[classes.get(n, n)]
        for label, p in prime.items():
            if label in base:
                scaled[label] = base[label] * p
        choices.append(ops.decode(scaled, {}) if ops else scaled)
    return base, choices


def measure(graph: gs.Graph, model: onnx.ModelProto, tensors: list[gs.Tensor],
            dims: dict | None = None) -> dict[str, list[Sizes]]:
    """name -> the measured shape of each of `tensors` (graph tensors), or {} when the model does not run at
    the probe dims (from `dims`: probe_dims). `graph` gets Shape nodes for the duration and comes back as it was."""
    wanted = [t for t in tensors if isinstance(t, gs.Variable)]
    if not wanted:
        return {}
    mark = len(graph.nodes)
    outs = []
    try:
        for i, t in enumerate(wanted):
            out = gs.Variable(f"measure_shape/{i}", dtype=np.int64)
            graph.nodes.append(gs.Node("Shape", f"measure/{i}", inputs=[t], outputs=[out]))
            outs.append(out)
        runs = _runs(graph, model, outs, dims=dims)
        if runs is None:  # a model that does not run at the probe dims: nothing measured, names decide
            return {}
    finally:
        for node in graph.nodes[mark:]:  # leave the graph as it was: the matcher reads its consumers
            node.inputs.clear()
            node.outputs.clear()
        del graph.nodes[mark:]
    shapes: dict[str, list[Sizes]] = {}
    for t, *values in zip(wanted, *runs):
        ranks = {len(v) for v in values}
        if len(ranks) == 1:
            shapes[t.name] = [Sizes(int(v[i]) for v in values) for i in range(ranks.pop())]
    return shapes


def _runs(graph: gs.Graph, model: onnx.ModelProto, outs: list[gs.Variable], padding: bool = False,
          dims: dict | None = None) -> list | None:
    """The values of `outs` at the first run and at the first choice of second run that runs (`padding`: the
    feeds' padding masks mask some positions; `dims`: as for probe_dims)."""
    def quiet(options):  # a choice that does not run is expected: no error chatter
        options.log_severity_level = 4

    from . import slices

    names = [t.name for t in outs]
    try:
        base, choices = probe_dims(model, dims)
        cut = cut_out(graph, outs, model)
        budget = slices.slice_budget(model)
        if budget:  # weights over half the memory: run in slices of layers, one session at a time
            pieces = slices.plan(cut, names, budget)

            def run(feeds: dict) -> list:
                return list(slices.run(cut, pieces, [feeds], names, level="disable")[0].values())
        else:
            session = ort_session(cut, level="disable", register=quiet)  # opens fastest
            needed = {i.name for i in session.get_inputs()}

            def run(feeds: dict) -> list:
                return session.run(names, {k: v for k, v in feeds.items() if k in needed})

        first = run(make_feeds(model, dims=base, padding=padding, all_keys=not padding))
    except Exception:
        return None
    for dims in choices:
        try:
            return [first, run(make_feeds(model, dims=dims, padding=padding, all_keys=not padding))]
        except Exception:
            continue
    return None


def inferred_shapes(graph: gs.Graph, model: onnx.ModelProto, dims: dict | None = None) -> Inferred:
    """The shapes and types of `graph`'s tensors a GraphView reads: ONNX's inference, and where it leaves a dim
    of a main-graph tensor it cannot name (unk__N: TorchScript's head splits), that dim measured: a size where
    it is the same at both probe runs, an input dim's name where it varies as that dim does. The same run
    measures what `measured` will ask for (each regrouped tensor whose shape ONNX does not make static), so the
    view does not open a second session for it. What ONNX Runtime's symbolic inference adds there is the same sizes, found by
    algebra over the graph at 0.7 s a fuse (0.5 s of it importing sympy), against one session run twice.
    A shape replaces ONNX's only where it has more sizes, as between the two inferences. The symbolic inference
    still runs (known_shapes_and_types) where measuring cannot stand in for it: weights over the slicing budget
    (a run would read them all), a tensor ONNX gives no type, or one that is not measured (the model does not
    run at the probe dims)."""
    from .slices import slice_budget

    if slice_budget(model):
        return Inferred(*known_shapes_and_types(model))
    onnx_only = infer(model, symbolic=False)
    shapes, types = merged(onnx_only)
    if onnx_only and not left_unnamed(onnx_only):  # infer stops after ONNX's here too: the same result
        return Inferred(shapes, types)
    produced = [t for n in graph.nodes for t in n.outputs if isinstance(t, gs.Variable) and t.name]
    unknown = [t for t in produced if unnamed(shapes.get(t.name))]
    if not onnx_only or any(t.name not in types for t in produced):
        return Inferred(*known_shapes_and_types(model))
    inputs = [t for t in graph.inputs if isinstance(t, gs.Variable)]
    named = {id(t) for t in unknown + inputs}
    later = [t for t in _regrouped(graph) if id(t) not in named and not _static(shapes.get(t.name))]
    got = measure(graph, model, unknown + inputs + later, dims)
    if any(t.name not in got for t in unknown):
        return Inferred(*known_shapes_and_types(model))
    names: dict[Sizes, str] = {}  # how each named input dim varies -> its name
    for vi in model.graph.input:
        for axis, name in enumerate(dims_of(vi) or ()):
            if isinstance(name, str) and axis < len(got.get(vi.name, ())):
                names.setdefault(got[vi.name][axis], name)
    fresh: dict[Sizes, str] = {}  # a dim that varies as no input dim does: a fresh unk__N, as ONNX names one
    for t in unknown:
        # (a name of our own would read as a symbolic dim of the model, dim_names.is_free: a Reshape writing 1
        # into SigLIP's learned probe query was refused as a baked query length so)
        found = [s[0] if s.static else names.get(s) or fresh.setdefault(s, f"unk__{900000 + len(fresh)}")
                 for s in got[t.name]]
        known = shapes.get(t.name)
        if known is None or sum(isinstance(d, int) for d in found) > sum(isinstance(d, int) for d in known):
            shapes[t.name] = found
    return Inferred(shapes, types, got)


def _regrouped(graph: gs.Graph) -> list[gs.Tensor]:
    """What every Reshape and Flatten of the graph reads and writes, and every product (MatMul, Einsum) reads and
    writes: the tensors whose measured shapes the matcher asks for where the inferred ones are not static."""
    regrouped = {id(x): x for n in graph.nodes if n.op in ("Reshape", "Flatten") for x in (n.inputs[0], n.outputs[0])}
    regrouped.update({id(x): x for n in graph.nodes if n.op in ("MatMul", "Einsum") for x in [*n.inputs, *n.outputs]})
    return [x for x in regrouped.values() if isinstance(x, gs.Variable)]


_MEASURED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # view -> {name: [Sizes]}


def measured(view, t: gs.Tensor) -> list[Sizes] | None:
    """The measured shape of `t`, a tensor of `view`'s graph (None: the view has no model, or the model did not
    run). The first call measures what every Reshape and Flatten of the graph reads and writes, and what every
    product (MatMul, Einsum) reads and writes, where the inferred shape is not static, in one run per probe,
    unless inferred_shapes measured them all already (the view's `premeasured`); later calls read the result."""
    model = getattr(view, "model", None)
    if model is None:
        return None
    if view not in _MEASURED:
        unknown = [x for x in _regrouped(view.graph) if not _static(view.shape(x))]
        early = getattr(view, "premeasured", {})  # measured with the shapes at the same dims (inferred_shapes)
        if all(x.name in early for x in unknown):
            _MEASURED[view] = {x.name: early[x.name] for x in unknown}
        else:
            _MEASURED[view] = measure(view.graph, model, unknown, getattr(view, "dims", None))
    shapes = _MEASURED[view]
    if t.name in shapes:
        return shapes[t.name]
    own = view.shape(t)
    return [Sizes((d, d)) for d in own] if own is not None and _static(own) else None


def shape_or_measured(view, t: gs.Tensor) -> list | None:
    """`t`'s inferred shape where it is static, else its measured one where `measured` has it (a product's
    operands after a Reshape whose target the graph computes), else the inferred one."""
    own = view.shape(t)
    if _static(own):
        return own
    got = measured(view, t)
    return got if got is not None else own


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, (int, np.integer)) and d > 0 for d in shape)


_VALUES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # view -> {name: value the same at both runs}


def value(view, t: gs.Tensor) -> np.ndarray | None:
    """`t`'s constant value: folded (view.const), or, for a tensor of the shape arithmetic folding left unknown,
    evaluated at both probe dims and the same at both. None: not a constant, or not known to be one. The first
    call evaluates every such tensor of the view's graph in one run per probe; later calls read the result."""
    folded = view.const(t)
    if folded is not None or getattr(view, "model", None) is None or t.name not in view.shape_only:
        return folded
    if view not in _VALUES:
        _VALUES[view] = _constants(view)
    return _VALUES[view].get(t.name)


def _constants(view) -> dict[str, np.ndarray]:
    wanted = view.unfolded()
    runs = _runs(view.graph, view.model, wanted, dims=view.dims) if wanted else None
    if runs is None:
        return {}
    return {t.name: np.asarray(a) for t, a, b in zip(wanted, *runs)
            if np.shape(a) == np.shape(b) and np.array_equal(a, b)}


def scalar_value(view, t: gs.Tensor) -> float | None:
    """A scalar `value`, as a float."""
    v = value(view, t)
    if v is None or v.size != 1 or v.dtype.kind not in "fiu":
        return None
    return float(v.reshape(()))


_ZEROS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # view -> {name: is zero}


def is_zero(view, t: gs.Tensor) -> bool:
    """Whether `t` is 0 at every element: a constant of zeros, or a tensor of the graph evaluated on the model's
    feeds (padding masks masking some positions) at both probe dims and 0 everywhere at both (the other branch
    of a select tf2onnx lowers as Cast(c) * x + y * Cast(Not(c)), with y = 0). False when it cannot be told."""
    folded = view.const(t)
    if folded is not None:
        return folded.size > 0 and not np.any(folded)
    model = getattr(view, "model", None)
    if model is None or not isinstance(t, gs.Variable):
        return False
    known = _ZEROS.setdefault(view, {})
    if t.name not in known:
        runs = _runs(view.graph, model, [t], padding=True, dims=view.dims)
        known[t.name] = runs is not None and all(np.size(r[0]) > 0 and not np.any(r[0]) for r in runs)
    return known[t.name]
