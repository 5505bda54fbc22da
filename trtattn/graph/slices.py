"""Running a model too large for memory in slices of consecutive layers, one ONNX Runtime session at a time.

ONNX Runtime's CPU provider turns each fp16 MatMul weight into an fp32 copy while it runs, and any
session over a whole 8B-parameter model maps its 16 GB of weights. A model whose weights are more than
half the memory available is therefore run in slices cut from its graph (nodes in their topological
order, cut where the fewest activations cross; each slice at most a budget of weights): a slice's
session is opened, run, and freed before the next, and the activations crossing a cut are carried from
one slice to the next. The slices together compute exactly what the whole model computes, so the
verification of a sliced run is that of the whole model, site outputs included; it only costs a session
per slice. TRTATTN_SLICE_MB sets the budget (0: never slice).
"""

from __future__ import annotations

import functools
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from ..errors import TrtattnError
from . import external
from .dependence import node_reads
from .evaluate import cut_out, evaluator, ort_session
from .memory import available_memory  # noqa: F401  (part of this module's API)

SLICE_ENV = "TRTATTN_SLICE_MB"
MIN_BUDGET = 256 << 20


def resident_bytes(t: onnx.TensorProto) -> int:
    """What a weight costs in an ONNX Runtime CPU session: fp16/bf16 twice their size (the provider keeps an
    fp32 copy of a MatMul's fp16 weight: 1.07 GB on disk, 2.1 GB resident)."""
    return external.nbytes(t) * (2 if t.data_type in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16) else 1)


def resident_size(model: onnx.ModelProto) -> int:
    return sum(resident_bytes(t) for t in model.graph.initializer)


def slice_budget(model: onnx.ModelProto, available: int | None = None) -> int | None:
    """Resident bytes of weights per slice for `model`, or None to run it whole: whole unless its weights,
    as a session holds them, are more than half the available memory (then an eighth of it per slice), or
    as TRTATTN_SLICE_MB says. `available`: the memory figure to decide by (default: the kernel's)."""
    if os.environ.get(SLICE_ENV):
        mb = int(os.environ[SLICE_ENV])
        return (mb << 20) if mb > 0 else None
    weights = resident_size(model)
    available = available_memory() if available is None else available
    if not available or weights <= available // 2:
        return None
    return max(available // 8, MIN_BUDGET)


@dataclass
class Slice:
    nodes: list  # NodeProtos, in order
    inputs: list[str]  # graph inputs it reads
    carried_in: list[str]  # activations it reads from earlier slices
    outputs: list[str]  # what it gives: activations later slices read, graph and extra outputs it makes
    weights: int = 0
    model: onnx.ModelProto | None = field(default=None, repr=False)


def plan(model: onnx.ModelProto, outputs, budget: int) -> list[Slice]:
    """The model's nodes in slices of at most `budget` resident bytes of weights (a node heavier than that
    alone), cut where the fewest activations cross. `outputs`: every name the run must give (graph outputs
    first)."""
    nodes = list(model.graph.node)
    graph_inputs = {i.name for i in model.graph.input}
    weights = {t.name: resident_bytes(t) for t in model.graph.initializer}
    made = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    reads = [node_reads(n) for n in nodes]
    last = {}
    for k, names in enumerate(reads):
        for name in names:
            last[name] = k
    crossing = [0] * (len(nodes) + 1)  # activations alive across the cut before node k
    for name, k in made.items():
        if last.get(name, -1) > k:
            crossing[k + 1] += 1
            crossing[last[name] + 1] -= 1
    for k in range(1, len(crossing)):
        crossing[k] += crossing[k - 1]
    cuts, start = [0], 0
    held: dict[str, int] = {}
    for k, names in enumerate(reads):
        need = {n: weights[n] for n in names if n in weights}
        if k > start and sum({**held, **need}.values()) > budget:
            # in the slice's second half, so a dip in crossings near its start does not make slivers
            cut = min(range(start + 1 + (k - start) // 2, k + 1), key=lambda c: (crossing[c], -c))
            cuts.append(cut)
            start = cut
            held = {n: weights[n] for r in reads[cut:k] for n in r if n in weights}
        held.update(need)
    cuts.append(len(nodes))
    wanted = list(dict.fromkeys(outputs))
    slices = []
    for a, b in zip(cuts, cuts[1:]):
        part = nodes[a:b]
        read = list(dict.fromkeys(n for r in reads[a:b] for n in r))
        mine = {o for n in part for o in n.output if o}
        carried_in = [n for n in read if n in made and made[n] < a]
        later = {n for n, k in last.items() if k >= b}
        gives = [n for n in mine if n in later] + [n for n in wanted if n in mine]
        slices.append(Slice(part, [n for n in read if n in graph_inputs], carried_in, list(dict.fromkeys(gives)),
                            sum(weights[n] for n in read if n in weights)))
    return slices


def _slice_model(model: onnx.ModelProto, piece: Slice, carried: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The slice as a model: its inputs typed like the model's (graph inputs) or like the values carried in."""
    given = {i.name: i for i in model.graph.input}
    inits = {t.name: t for t in model.graph.initializer}
    inputs = [given[n] for n in piece.inputs]
    for name in piece.carried_in:
        value = carried[name]
        inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(value.dtype),
                                                    [None] * value.ndim))
    read = {n for node in piece.nodes for n in node_reads(node)}
    outputs = [onnx.ValueInfoProto(name=n) for n in piece.outputs]
    graph = helper.make_graph(piece.nodes, f"{model.graph.name}_slice", inputs, outputs,
                              initializer=[inits[n] for n in read if n in inits])
    sliced = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    sliced.functions.extend(model.functions)
    external.set_data_dir(sliced, external.data_dir(model))
    return sliced


def run(model: onnx.ModelProto, slices: list[Slice], feeds_list: list[dict], outputs, level: str = "basic",
        progress=None, label: str = "") -> list[OrderedDict]:
    """The values of `outputs` for each feed dict, computed slice after slice: each slice's session is made
    once, run on every feed dict, and freed before the next (its weights are read once for all of them);
    only the activations later slices read are kept between slices. `progress` (report.Progress) counts
    the slices."""
    carried: list[dict[str, np.ndarray]] = [{} for _ in feeds_list]
    got: list[dict[str, np.ndarray]] = [{} for _ in feeds_list]
    text = f"running {label or model.graph.name} in slices of layers"
    counted = progress.count(slices, text, unit="slice") if progress is not None else slices
    for k, piece in enumerate(counted):
        if not piece.outputs:  # nothing asked of it, nothing later reads from it
            continue
        if piece.model is None:  # made at the first run, when the carried values' types are known
            piece.model = _slice_model(model, piece, carried[0])
        session = ort_session(piece.model, level=level)
        needed = {n for later in slices[k + 1:] for n in later.carried_in}
        for feeds, kept, out in zip(feeds_list, carried, got):
            values = session.run(piece.outputs, {**{n: feeds[n] for n in piece.inputs},
                                                 **{n: kept[n] for n in piece.carried_in}})
            for name, value in zip(piece.outputs, values):  # copied: ONNX Runtime's output can hold the
                kept[name] = out[name] = np.array(value)  # session's memory arena alive after the session
            for name in [n for n in kept if n not in needed]:
                del kept[name]
        del session
    results = []
    for feeds, out in zip(feeds_list, got):
        missing = [n for n in outputs if n not in out and n not in feeds]
        if missing:
            raise TrtattnError(f"the sliced run of {model.graph.name} did not produce {', '.join(missing[:3])}")
        results.append(OrderedDict((n, out[n] if n in out else feeds[n]) for n in outputs))
    return results


def bounded_evaluator(graph, outputs, like: onnx.ModelProto, level: str = "basic", quiet: bool = False):
    """evaluate.evaluator's run(feeds), in slices of layers (one session at a time) when `like`'s weights are over
    the slicing budget: values that read many layers' weights (a Shape of the logits, for the mask probe of a model
    whose view cannot name their lengths) would otherwise open one session over them all (an 8B's 16 GB, held
    twice as fp32)."""
    budget = slice_budget(like)
    if not budget:
        return evaluator(graph, outputs, like, level=level, quiet=quiet)
    cut = cut_out(graph, outputs, like)
    names = [t.name for t in outputs]
    pieces = plan(cut, names, budget)

    def run_sliced(feeds: dict) -> list:
        return list(run(cut, pieces, [feeds], names, level=level)[0].values())

    return run_sliced


def sliced_runner(model: onnx.ModelProto, outputs=(), name: str | None = None, level: str = "basic",
                  budget: int | None = None, progress=None):
    """A Polygraphy runner that runs `model` in slices of at most `budget` bytes of weights (slice_budget's
    choice by default), giving its graph outputs and `outputs`."""
    budget = budget or slice_budget(model) or resident_size(model) + 1
    wanted = [o.name for o in model.graph.output] + [o for o in outputs if o not in {x.name for x in model.graph.output}]
    return _runner_class()(model, plan(model, wanted, budget), wanted, level, name, progress)


def _same_feeds(a: dict, b) -> bool:
    return set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


@functools.cache
def _runner_class():
    from polygraphy.backend.base import BaseRunner
    from polygraphy.common import TensorMetadata
    from polygraphy.datatype import DataType

    class SlicedOnnxrtRunner(BaseRunner):
        """ONNX Runtime over a model cut in slices (graph/slices.py), through Polygraphy's runner interface."""

        def __init__(self, model, slices, outputs, level, name=None, progress=None):
            super().__init__(name=name, prefix="onnxrt-sliced-runner")
            self.model, self.slices, self.outputs, self.level = model, slices, outputs, level
            self.progress = progress

        def activate_impl(self):
            pass

        def get_input_metadata_impl(self):
            meta = TensorMetadata()
            inits = {t.name for t in self.model.graph.initializer}
            for vi in self.model.graph.input:
                if vi.name in inits:
                    continue
                tt = vi.type.tensor_type
                dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
                shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
                meta.add(vi.name, dtype=DataType.from_dtype(dtype), shape=shape)
            return meta

        def prefetch(self, feeds_list: list[dict]) -> None:
            """Run every feed dict now, slice by slice (a slice's weights are read once for all of them);
            infer then answers each of them, in this order, from what was computed."""
            self.ahead = list(zip(feeds_list, run(self.model, self.slices, feeds_list, self.outputs, self.level,
                                                  self.progress, f"the {self.name} model")))

        def infer_impl(self, feed_dict):
            start = time.perf_counter()
            ahead = getattr(self, "ahead", [])
            if ahead and _same_feeds(ahead[0][0], feed_dict):
                out = ahead.pop(0)[1]
            else:
                out = run(self.model, self.slices, [dict(feed_dict)], self.outputs, self.level)[0]
            self.inference_time = time.perf_counter() - start
            return out

        def deactivate_impl(self):
            pass

    return SlicedOnnxrtRunner
