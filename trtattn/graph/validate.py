"""Is this a valid ONNX model? Asked of every model trtattn reads and of every model it writes.

Two checks, cheapest first, each failing with one line that names the node or value at fault:

- `structural`: what a reader would trip over, walked over the graph and every subgraph (with the names
  of the scopes around it): every graph input typed, every node input defined before it is read, every
  graph output produced, every op known to its domain at the model's opset (onnx.defs), or to a domain
  the model imports that ONNX does not define (com.microsoft, trt, a plugin's: their owners check them),
  or a local function. Cost: one pass over the nodes, whatever the weights.
- ONNX's strict type and shape inference (the full check of `onnx.checker`, without its demand that every
  graph input and output have a shape: an unknown rank is valid) when the proto, without weights left on
  disk, is small enough to copy; a model past that gets the structural check only.

A model read (`check_read`) that fails only ONNX's strict inference but loads in ONNX Runtime is taken,
with a note: exporters write such models (paddle2onnx's opset-7 int64 Constant, which opset 7's schema
does not allow) and ONNX Runtime, the reference every result is verified against, runs them. What
trtattn writes is always held to the strict check.
"""

from __future__ import annotations

import onnx
import onnx.defs

from ..errors import ModelLoadError, TrtattnError
from .external import all_tensors, nbytes

FULL_CHECK_LIMIT = 512 << 20  # bytes of weights in the proto up to which onnx.checker's full check runs
# the domains onnx.defs defines: an op in them must be known to it
_ONNX_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training", "ai.onnx.preview"}


class InvalidModelError(ModelLoadError):
    """The model is not valid ONNX (read) or trtattn made an invalid one (write)."""


def check(model: onnx.ModelProto, what: str, full: bool | None = None) -> None:
    """Raise InvalidModelError naming `what` (a path, or 'the fused model') and the node or value at fault."""
    _structure(model, what)
    _strict(model, what, full)


def check_read(model: onnx.ModelProto, path) -> str | None:
    """check() of a model read from `path`; a strict-inference failure ONNX Runtime does not share is a note
    (returned), not an error."""
    _structure(model, str(path))
    try:
        _strict(model, str(path))
    except InvalidModelError as strict:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception:
            raise strict from None
        return f"{strict} -- ONNX Runtime loads it, so it is read as ONNX Runtime reads it"
    return None


def _structure(model: onnx.ModelProto, what: str) -> None:
    try:
        structural(model)
    except TrtattnError as e:
        raise InvalidModelError(f"{what}: {e}") from None


def _strict(model: onnx.ModelProto, what: str, full: bool | None = None) -> None:
    """ONNX's strict type and shape inference, when the proto's weights are small enough to copy."""
    if full is None:
        full = sum(nbytes(t) for t in all_tensors(model) if t.HasField("raw_data")) <= FULL_CHECK_LIMIT
    if full:
        try:  # onnx.checker.check_model would refuse graph inputs and outputs of unknown rank, which are valid
            onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        except Exception as e:  # InferenceError: the first line names the node and what is wrong
            first = next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
            raise InvalidModelError(f"{what}: invalid ONNX ({first})") from None


def structural(model: onnx.ModelProto) -> None:
    """Raise TrtattnError (one line) on the first thing no runtime could read."""
    opsets = {(i.domain or ""): i.version for i in model.opset_import}
    if "" not in opsets and "ai.onnx" not in opsets:
        raise TrtattnError("the model imports no ONNX opset (opset_import has no default domain)")
    functions = {(f.domain, f.name) for f in model.functions}
    _check_graph(model.graph, set(), opsets, functions, top=True)


def _check_graph(graph: onnx.GraphProto, outer: set[str], opsets: dict, functions: set, top: bool) -> None:
    where = "graph" if top else f"subgraph '{graph.name}'"
    known = set(outer)
    for vi in graph.input:
        if top and vi.type.WhichOneof("value") is None:  # subgraph inputs may leave their types to inference
            raise TrtattnError(f"{where} input '{vi.name}' has no type")
        if top and vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == onnx.TensorProto.UNDEFINED:
            raise TrtattnError(f"{where} input '{vi.name}' has no element type")
        known.add(vi.name)
    known.update(t.name for t in graph.initializer)
    known.update(t.values.name for t in graph.sparse_initializer)
    for node in graph.node:
        label = f"node '{node.name or node.op_type}' ({node.op_type})"
        for name in node.input:
            if name and name not in known:
                raise TrtattnError(f"{label} reads '{name}', which nothing before it defines")
        _check_op(node, label, opsets, functions)
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                        list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
                _check_graph(sub, known, opsets, functions, top=False)
        known.update(o for o in node.output if o)
    for vi in graph.output:
        if vi.name not in known:
            raise TrtattnError(f"{where} output '{vi.name}' is produced by no node")


def _check_op(node: onnx.NodeProto, label: str, opsets: dict, functions: set) -> None:
    domain = node.domain or ""
    if (domain, node.op_type) in functions:
        return
    version = opsets.get(domain, opsets.get("ai.onnx") if domain == "" else None)
    if version is None:
        raise TrtattnError(f"{label} is in domain '{domain}', which the model does not import")
    if domain not in _ONNX_DOMAINS:
        return  # a domain ONNX does not define (com.microsoft, trt, plugins): its runtime knows its ops
    if not onnx.defs.has(node.op_type, domain):
        shown = f"{domain}::" if domain else ""
        raise TrtattnError(f"{label}: '{shown}{node.op_type}' is not an ONNX op (unknown op type)")
    try:
        onnx.defs.get_schema(node.op_type, version, domain)
    except onnx.defs.SchemaError:
        raise TrtattnError(f"{label}: '{node.op_type}' does not exist at opset {version} of the model") from None
