"""Is this a valid ONNX model? Asked of every model trtattn reads and of every model it writes.

Two checks, cheapest first, each naming the node or value at fault in one line:

- `structural`: what a reader would trip over, walked over the graph and every subgraph (with the names
  of the scopes around it): every graph input typed, every node input defined before it is read, every
  graph output produced, every op known to its domain at the model's opset (onnx.defs), or to a domain
  the model imports that ONNX does not define (com.microsoft, trt, a plugin's: their owners check them),
  or a local function. Cost: one pass over the nodes, whatever the weights.
- ONNX's strict type and shape inference (the full check of `onnx.checker`, without its demand that every
  graph input and output have a shape: an unknown rank is valid) when the proto, without weights left on
  disk, is small enough to copy; a model past that gets the structural check only.

ONNX Runtime with default session options is the reference every result is verified against, so a model
read (`check_read`) is refused only when ONNX Runtime refuses it too. What ONNX Runtime repairs the same way
every time is repaired (a domain the model uses but does not import is imported; nodes out of order are
sorted, every name kept); a model failing another check (an op ONNX Runtime registers in the default
domain below its ONNX opset, or that ONNX does not define: its transformer optimizer writes both; a type
exporters write that the opset does not allow) is read with a note when ONNX Runtime builds a session for
it. A model written (`check_written`) passes every check the model it came from passed, and a check it
is excused from (its input failed it too) only if ONNX Runtime loads it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import onnx
import onnx.defs

from .. import timings
from ..errors import ModelLoadError, TrtattnError
from .dependence import node_reads
from .external import FOLDER_OPTION, all_tensors, data_dir, nbytes

FULL_CHECK_LIMIT = 512 << 20  # bytes of weights in the proto up to which onnx.checker's full check runs
# the domains onnx.defs defines: an op in them must be known to it
TRT_DOMAIN = "trt"  # TensorRT's own ONNX ops (trtattn_plugins.schema.DOMAIN)
_ONNX_DOMAINS = {"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training", "ai.onnx.preview"}


class InvalidModelError(ModelLoadError):
    """The model is not valid ONNX (read) or trtattn made an invalid one (write)."""


@dataclass(frozen=True)
class Finding:
    """One failed check: `check` names it, `subject` what it is about (an op as (domain, op_type), a
    domain), so the same failure in a model and in the model made from it compare equal; `text` says it."""

    check: str  # "import", "order", "op", "structure" or "strict"
    subject: tuple
    text: str


def check(model: onnx.ModelProto, what: str, full: bool | None = None) -> None:
    """Raise InvalidModelError naming `what` (a path, or 'the fused model') and the node or value at fault."""
    _structure(model, what)
    _strict(model, what, full)


def findings(model: onnx.ModelProto, full: bool | None = None) -> list[Finding]:
    """Every structural failure, then ONNX's strict inference's (which runs only on a sound structure)."""
    found = list(_structural_findings(model))
    if not found:
        try:
            _strict(model, "", full)
        except InvalidModelError as e:
            found.append(Finding("strict", (), str(e).removeprefix(": ")))
    return found


def check_read(model: onnx.ModelProto, path) -> str | None:
    """check() of a model read from `path`, as ONNX Runtime reads it: what ONNX Runtime repairs is repaired
    in `model` (imports, node order), anything else it runs is read; the note (one line) says what failed,
    None when nothing did. Refused (InvalidModelError) only with ONNX Runtime's reason."""
    notes = _drop_stale_constant_shapes(model)
    found = findings(model)
    if not found:
        return f"{path}: " + "; ".join(notes) if notes else None
    missing = sorted({f.subject[0] for f in found if f.check == "import"})
    if missing:
        model.opset_import.extend(onnx.helper.make_opsetid(d, 1) for d in missing)
        notes.append(f"{next(f.text for f in found if f.check == 'import')}: imported as ONNX Runtime does")
    if any(f.check == "order" for f in found):
        sort_nodes(model.graph)
        notes.append(f"{next(f.text for f in found if f.check == 'order')}: nodes sorted as ONNX Runtime sorts them")
    left = findings(model) if notes else found
    if left:  # a model past protobuf's limit (weights read in) is opened from its file, repaired the same way
        refusal = onnx_runtime_refusal(str(path) if _too_large(model) else model.SerializeToString(), data_dir(model))
        if refusal is not None:
            raise InvalidModelError(f"{path}: {left[0].text}; ONNX Runtime refuses it too: {refusal}")
        notes.append(f"{left[0].text} -- ONNX Runtime loads it, so it is read as ONNX Runtime reads it")
    return f"{path}: " + "; ".join(notes)


def check_written(model: onnx.ModelProto, what: str, sources: list[onnx.ModelProto], source=None,
                  found: list[Finding] | None = None) -> None:
    """check() of a model about to be written, made from `sources` (the models it was read from): a failure
    of a check some source fails too is excused when ONNX Runtime loads the model (`source`: its bytes or a
    path, default the serialized model); any other raises InvalidModelError naming `what`. `found`: the
    model's findings() when the caller has them."""
    found = findings(model) if found is None else found
    if not found:
        return
    excused = {(f.check, f.subject) for s in sources for f in findings(s)}
    new = [f for f in found if (f.check, f.subject) not in excused]
    if new:
        raise InvalidModelError(f"{what}: {new[0].text}")
    if any(n.domain == TRT_DOMAIN for n in model.graph.node):  # TensorRT's own ops: ONNX Runtime runs them
        refusal = trt_ops_refusal(model)  # through trtattn_plugins' kernels only (plugins/), never without
    else:
        refusal = onnx_runtime_refusal(model.SerializeToString() if source is None else source, data_dir(model))
    if refusal is not None:
        raise InvalidModelError(f"{what}: {found[0].text}, and ONNX Runtime refuses it: {refusal}")


# ONNX Runtime's transformer that gives each fp16 weight a cast fp32 copy (at its default level, on CPU): it
# changes how weights are held, not what loads, and costs twice the weights (1 GB fp16 Llama: 75 MB and 0.5 s
# to open without it, 1.97 GB and 6 s with it). Unknown names are ignored by ONNX Runtime.
WEIGHT_COPYING_TRANSFORMERS = ("FuseFp16InitializerToFp32NodeTransformer",)


def _drop_stale_constant_shapes(model: onnx.ModelProto) -> list[str]:
    """value_info that gives a Constant's output another shape than the tensor it holds (GenAI's builder
    declares its 1-element INT64 constants as scalars) is dropped, the constant's own shape being the one ONNX
    Runtime takes. A hint, not the model: hidden while ONNX Runtime's own ops stop the strict check, it would
    refuse the model once they are lowered (rewrite/lower). One note naming the first, with the count."""
    held = {n.output[0]: list(a.t.dims) for n in model.graph.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx")
            for a in n.attribute if a.name == "value"}
    stale = []
    for info in model.graph.value_info:
        if info.name in held and info.type.tensor_type.HasField("shape"):
            declared = [d.dim_value if d.HasField("dim_value") else None for d in info.type.tensor_type.shape.dim]
            if len(declared) != len(held[info.name]) or any(d is not None and d != h for d, h in
                                                            zip(declared, held[info.name])):
                stale.append((info, declared))
    for info, _ in stale:
        model.graph.value_info.remove(info)
    if not stale:
        return []
    info, declared = stale[0]
    return [f"value_info of {info.name} said shape {declared} where its Constant holds {held[info.name]}"
            + (f" (and {len(stale) - 1} more)" if len(stale) > 1 else "") + ": dropped, as ONNX Runtime takes the constant's"]


def onnx_runtime_refusal(source, folder=None) -> str | None:
    """None when ONNX Runtime (CPU, default session options: every graph optimization on) builds a session
    for `source` (a serialized model or a path; `folder`: where weights left on disk are), else its reason
    in one line. What only lays weights out otherwise in memory is off: prepacking, the fp32 copies of fp16
    weights (WEIGHT_COPYING_TRANSFORMERS)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.disable_prepacking", "1")
    options.intra_op_num_threads = 1  # it runs nothing: a pool of threads would only be started and joined
    if folder is not None and not isinstance(source, str):
        options.add_session_config_entry(FOLDER_OPTION, str(folder))
    timings.session_made()
    try:
        ort.InferenceSession(source, options, providers=["CPUExecutionProvider"],
                             disabled_optimizers=list(WEIGHT_COPYING_TRANSFORMERS))
    except Exception as e:
        return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)
    return None


def trt_ops_refusal(model: onnx.ModelProto) -> str | None:
    """onnx_runtime_refusal of a model with TensorRT's own ONNX ops (`fuse --ops trt`), loaded as verification
    runs it: ONNX Runtime (CPU, default session options) with trtattn_plugins' kernels of those ops registered.
    A model with an op the plugins do not document is refused with the plugins' reason."""
    import onnxruntime as ort

    import trtattn_plugins

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.disable_prepacking", "1")
    folder = data_dir(model)
    if folder is not None:
        options.add_session_config_entry(FOLDER_OPTION, str(folder))
    try:
        trtattn_plugins.Session(model, options=options)
    except Exception as e:  # ONNX Runtime's errors share no base; the plugins' TrtOpError lists a line per node
        text = " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__
        return text if len(text) < 300 else text[:300] + "..."

    return None


def sort_nodes(graph: onnx.GraphProto, outer: frozenset[str] = frozenset()) -> None:
    """Put `graph`'s nodes (and its subgraphs') in an order where each comes after what it reads, the
    first ready node first (the order kept where it is already right); names and nodes are kept as they are.
    A cycle, or a name nothing defines, leaves those nodes last, for the structural check to name."""
    known = set(outer) | {i.name for i in graph.input} | {t.name for t in graph.initializer} | \
        {t.values.name for t in graph.sparse_initializer}
    for node in graph.node:
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                sort_nodes(sub, frozenset(known | {o for n in graph.node for o in n.output}))
    waiting, ordered = list(graph.node), []
    while waiting:
        ready = next((n for n in waiting if all(r in known for r in node_reads(n))), None)
        if ready is None:
            ordered.extend(waiting)
            break
        waiting.remove(ready)
        ordered.append(ready)
        known.update(o for o in ready.output if o)
    if [id(n) for n in ordered] != [id(n) for n in graph.node]:
        copies = [onnx.NodeProto() for _ in ordered]
        for c, n in zip(copies, ordered):
            c.CopyFrom(n)
        del graph.node[:]
        graph.node.extend(copies)


def _too_large(model: onnx.ModelProto) -> bool:
    return sum(nbytes(t) for t in all_tensors(model) if t.HasField("raw_data")) > (2**31 - 1) - (64 << 20)


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
    first = next(_structural_findings(model), None)
    if first is not None:
        raise TrtattnError(first.text)


def _structural_findings(model: onnx.ModelProto) -> Iterator[Finding]:
    opsets = {(i.domain or ""): i.version for i in model.opset_import}
    if "" not in opsets and "ai.onnx" not in opsets:
        yield Finding("structure", ("opset",), "the model imports no ONNX opset (opset_import has no default domain)")
        return
    functions = {(f.domain, f.name) for f in model.functions}
    yield from _check_graph(model.graph, set(), set(), opsets, functions, top=True)


def _check_graph(graph: onnx.GraphProto, outer: set[str], later: set[str], opsets: dict, functions: set,
                 top: bool) -> Iterator[Finding]:
    """`outer`: the names the scopes around define before this graph's node; `later`: those they define
    after it (a read of one is a node out of order, not a name nothing defines)."""
    where = "graph" if top else f"subgraph '{graph.name}'"
    known = set(outer)
    for vi in graph.input:
        if top and vi.type.WhichOneof("value") is None:  # subgraph inputs may leave their types to inference
            yield Finding("structure", ("input", vi.name), f"{where} input '{vi.name}' has no type")
        elif top and vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == onnx.TensorProto.UNDEFINED:
            yield Finding("structure", ("input", vi.name), f"{where} input '{vi.name}' has no element type")
        known.add(vi.name)
    known.update(t.name for t in graph.initializer)
    known.update(t.values.name for t in graph.sparse_initializer)
    defined = known | later | {o for n in graph.node for o in n.output if o}
    for node in graph.node:
        label = f"node '{node.name or node.op_type}' ({node.op_type})"
        for name in node.input:
            if name and name not in known:
                check = "order" if name in defined else "structure"
                yield Finding(check, ("read", name) if check == "structure" else (),
                              f"{label} reads '{name}', which nothing before it defines")
        yield from _check_op(node, label, opsets, functions)
        for a in node.attribute:
            for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                        list(a.graphs) if a.type == onnx.AttributeProto.GRAPHS else []):
                yield from _check_graph(sub, known, defined - known, opsets, functions, top=False)
        known.update(o for o in node.output if o)
    for vi in graph.output:
        if vi.name not in known:
            yield Finding("structure", ("output", vi.name), f"{where} output '{vi.name}' is produced by no node")


def _check_op(node: onnx.NodeProto, label: str, opsets: dict, functions: set) -> Iterator[Finding]:
    domain = node.domain or ""
    if (domain, node.op_type) in functions:
        return
    version = opsets.get(domain, opsets.get("ai.onnx") if domain == "" else None)
    if version is None:
        yield Finding("import", (domain,), f"{label} is in domain '{domain}', which the model does not import")
        return
    if domain not in _ONNX_DOMAINS:
        return  # a domain ONNX does not define (com.microsoft, trt, plugins): its runtime knows its ops
    if not onnx.defs.has(node.op_type, domain):
        shown = f"{domain}::" if domain else ""
        yield Finding("op", (domain, node.op_type), f"{label}: '{shown}{node.op_type}' is not an ONNX op (unknown op type)")
        return
    try:
        onnx.defs.get_schema(node.op_type, version, domain)
    except onnx.defs.SchemaError:
        yield Finding("op", (domain, node.op_type), f"{label}: '{node.op_type}' does not exist at opset {version} of the model")
