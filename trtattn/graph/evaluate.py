"""ONNX Runtime sessions over models whose weights may stay on disk, and evaluation of a few tensors of a
graph on a cut-out of just the nodes they need.

Sessions are opened from the serialized model with ONNX Runtime's external-data folder option, so
weights on disk are memory-mapped by ONNX Runtime (never copied through Python), and with prepacking
off: a prepacked MatMul weight is a second, anonymous copy of it (measured on a 2.2 GB fp32 model:
5.7 s and 1.9 GB to open with prepacking, 0.3 s and 70 MB without, the same peak once run).
"""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs

from .. import timings
from . import external, io
from .ort_threads import set_threads
from .view import export_graph

LEVELS = ("disable", "basic", "extended", "all")
# Past this many bytes of weights a session runs without ONNX Runtime's memory arena: the arena keeps the
# largest buffers it ever gave out, such as the fp32 copy of an fp16 weight a Cast makes for a CPU MatMul.
NO_ARENA_BYTES = 1 << 30


def session_options(level: str = "basic", *, weights: int = 0, folder=None):
    import onnxruntime as ort

    if level not in LEVELS:
        raise ValueError(f"graph optimization level '{level}': one of {', '.join(LEVELS)}")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[level]
    options.add_session_config_entry("session.disable_prepacking", "1")
    set_threads(options, weights)
    if weights > NO_ARENA_BYTES:
        options.enable_cpu_mem_arena = False
    if folder is not None:
        options.add_session_config_entry(external.FOLDER_OPTION, str(folder))
    return options


def ort_session(model: onnx.ModelProto, *, level: str = "basic", providers=("CPUExecutionProvider",),
                register=None):
    """An ONNX Runtime session for `model` (its weights read from the folder it records, memory-mapped).
    `level`: ONNX Runtime's graph optimization level: "basic" (default: constant folding, no fusions, so
    fp16 weights are not folded into fp32 copies), "disable", "extended" or "all". `register(options)`
    may add custom-op libraries before the session is made."""
    import onnxruntime as ort

    weights = io.weights_size(model)
    large = io.is_large(model)  # more than protobuf can serialize in the proto itself: opened from a file
    # from bytes, the weights left on disk are found through the folder option; a file written by session_source
    # has its data beside it (the folder option would send ONNX Runtime to the original's data instead)
    options = session_options(level, weights=weights, folder=None if large else external.data_dir(model))
    if register is not None:
        register(options)
    timings.session_made()
    if large:
        with io.session_source(model) as path:
            return ort.InferenceSession(path, options, providers=list(providers))
    return ort.InferenceSession(model.SerializeToString(), options, providers=list(providers))


def needed_nodes(graph: gs.Graph, outputs) -> list[gs.Node]:
    """The nodes of `graph` the `outputs` depend on, in the graph's order (which is topological)."""
    seen: set[int] = set()
    stack = [t for t in outputs]
    wanted: set[int] = set()
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        for node in t.inputs:
            if id(node) not in wanted:
                wanted.add(id(node))
                stack.extend(node.inputs)
                stack.extend(_outer_inputs(node))
    return [n for n in graph.nodes if id(n) in wanted]


def _outer_inputs(node: gs.Node):
    """Tensors of the enclosing graph that a node's subgraphs read."""
    for attr in node.attrs.values():
        if isinstance(attr, gs.Graph):
            inner = {id(t) for n in attr.nodes for t in n.outputs} | {id(t) for t in attr.inputs}
            for n in attr.nodes:
                for t in n.inputs:
                    if id(t) not in inner and not isinstance(t, gs.Constant):
                        yield t


def cut_out(graph: gs.Graph, outputs, like: onnx.ModelProto) -> onnx.ModelProto:
    """A model of just the nodes `outputs` need, leaving `graph` untouched: graph inputs they read stay
    inputs, weights stay where they are (on disk for a lazily loaded `like`)."""
    nodes = needed_nodes(graph, outputs)
    read = {id(t) for n in nodes for t in list(n.inputs) + list(_outer_inputs(n))}
    inputs = [t for t in graph.inputs if id(t) in read or any(o is t for o in outputs)]
    sub = gs.Graph(nodes=nodes, inputs=inputs, outputs=list(outputs), opset=graph.opset,
                   import_domains=graph.import_domains, functions=graph.functions)
    model = export_graph(sub, like, do_type_check=False)
    return model


def evaluator(graph: gs.Graph, outputs, like: onnx.ModelProto, level: str = "basic", quiet: bool = False):
    """run(feeds) -> the values of `outputs` (tensors of `graph`), from one session over the cut-out nodes
    they need, made once and reused for every feed dict; feeds the cut-out does not take are left out. `quiet`:
    a run that fails is expected (the caller drops it), so ONNX Runtime logs no error for it."""
    def silent(options):
        options.log_severity_level = 4

    session = ort_session(cut_out(graph, outputs, like), level=level, register=silent if quiet else None)
    needed = {i.name for i in session.get_inputs()}
    names = [t.name for t in outputs]

    def run(feeds: dict) -> list:
        return session.run(names, {k: v for k, v in feeds.items() if k in needed})

    return run


def runtime_errors() -> tuple[type[Exception], ...]:
    """The exceptions a model that does not load or run raises through a session or Polygraphy's runners:
    ONNX Runtime's own (its Python binding's classes, which share no base but Exception), Polygraphy's
    refusal, and ours (a kernel of plugins/ raises one naming its node). Anything else is a bug of ours and
    must surface as a crash, never as a site's reason."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state
    from polygraphy.exception import PolygraphyException

    from trtattn_plugins import TrtOpError

    from ..errors import TrtattnError

    ort = tuple(c for c in vars(ort_state).values() if isinstance(c, type) and issubclass(c, Exception))
    return (*ort, PolygraphyException, TrtOpError, TrtattnError)
