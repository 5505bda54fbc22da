"""A read-only view of an onnx-graphsurgeon graph for matching.

The matcher reads structure from the graph as exported and values from a constant-folded copy
(so a scale written as Div(1, Sqrt(Cast(Shape(q)[-1]))) reads as 0.125), without changing
the graph it will later rewrite.

Weights are never read to build the view: `import_graph` gives weights that stay on disk
(graph/external.py) memory-mapped values, and the folded copy treats them as unknown.
"""

from __future__ import annotations

import weakref

import ml_dtypes
import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from . import external, shape_slices
from .dependence import value_operands
from .shapes import DEFAULT_OPSET, Inferred, known_shapes_and_types

# Ops that never change values on the attention paths (dropout is inactive at inference).
PASSTHROUGH = {"Identity", "Dropout"}
FLOAT_TYPES = {np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)}


class MappedValues(LazyValues):
    """Values of a weight left on disk: memory-mapped from its file the first time something reads them
    (nothing is read before), and exported as the original TensorProto, which names those bytes."""

    def __init__(self, tensor: onnx.TensorProto, folder):
        super().__init__(tensor)
        self.folder = folder
        self.array: np.ndarray | None = None

    def load(self):
        if self.array is None:
            self.array = external.mapped(self.tensor, self.folder)
        return self.array


class _Mapped:
    """The MappedValues import_graph gave each constant, by the constant's identity (entries go with it)."""

    def __init__(self):
        self.items: dict[int, tuple] = {}

    def add(self, constant: gs.Constant, values: MappedValues) -> None:
        key = id(constant)

        def forget(_: weakref.ref) -> None:  # the constant is gone: so is its entry
            self.items.pop(key, None)

        self.items[key] = (weakref.ref(constant, forget), values)

    def get(self, constant: gs.Constant) -> MappedValues | None:
        item = self.items.get(id(constant))
        return item[1] if item is not None and item[0]() is constant else None


_MAPPED = _Mapped()


def import_graph(model: onnx.ModelProto) -> gs.Graph:
    """onnx-graphsurgeon's import; the weights a lazily loaded model (io.load(..., load_external_data=False))
    left on disk are read from their files only if something uses their values (MappedValues)."""
    graph = gs.import_onnx(model)
    folder = external.data_dir(model)
    if folder is not None:
        protos = {t.name: t for t in external.all_tensors(model) if t.data_location == onnx.TensorProto.EXTERNAL}
        for constant in _constants(graph):
            proto = protos.get(constant.name) if constant.data_location == onnx.TensorProto.EXTERNAL else None
            if proto is not None:
                values = MappedValues(proto, folder)
                if proto.data_type == onnx.TensorProto.BFLOAT16:
                    values.dtype = np.dtype(ml_dtypes.bfloat16)
                constant.values = values
                _MAPPED.add(constant, values)
    bf16_as_numpy(graph)
    return graph


def mapped_constant(name: str, tensor: onnx.TensorProto, folder) -> gs.Constant:
    """A Constant whose values are the external `tensor`'s bytes in `folder`, as import_graph gives a weight
    left on disk: mapped only if read, exported as the reference."""
    values = MappedValues(tensor, folder)
    constant = gs.Constant(name, values)
    _MAPPED.add(constant, values)
    return constant


def bf16_as_numpy(graph: gs.Graph) -> None:
    """onnx-graphsurgeon leaves a bf16 tensor's dtype the ONNX enum (it knows no numpy bf16): ml_dtypes' bfloat16,
    which onnx reads and writes, so a bf16 model is rewritten as any other."""
    bf16 = np.dtype(ml_dtypes.bfloat16)
    for g in [graph, *graph.subgraphs(recursive=True)]:
        for t in g.tensors().values():
            if isinstance(t, gs.Variable) and t.dtype == onnx.TensorProto.BFLOAT16:
                t.dtype = bf16
            elif isinstance(t, gs.Constant) and t.dtype == onnx.TensorProto.BFLOAT16:  # (dtype reads no values)
                t.values.dtype = bf16  # a weight in the proto, read (one on disk was typed by import_graph)


def export_graph(graph: gs.Graph, like: onnx.ModelProto, do_type_check: bool = True) -> onnx.ModelProto:
    """onnx-graphsurgeon's export of a graph from import_graph(like): a weight left on disk is written as the
    reference to its bytes, even after something read it (onnx-graphsurgeon would copy the values it loaded
    into the proto); a weight given new values goes in the proto. The result records where the weights are,
    as `like` does."""
    for constant in _constants(graph):
        values = _MAPPED.get(constant)
        if values is None or values.array is None:
            continue  # never read: onnx-graphsurgeon exports the reference itself
        if constant.values is values.array:
            constant.values = values  # read, not changed: the reference again
        else:
            constant.data_location = None  # new values: they go in the proto
    model = gs.export_onnx(graph, do_type_check=do_type_check)
    model.ir_version = ir_version_like(like)
    external.set_data_dir(model, external.data_dir(like))
    return model


def ir_version_like(like: onnx.ModelProto) -> int:
    """`like`'s IR version, at least 4: under IR 3 an initializer is typed only as a graph input too, and
    onnx-graphsurgeon exports initializers without those inputs (an opset-7 export came out invalid)."""
    return max(like.ir_version, 4)


def _constants(graph: gs.Graph):
    """Every Constant of a graph and of its subgraphs."""
    for t in graph.tensors().values():
        if isinstance(t, gs.Constant):
            yield t
    for node in graph.nodes:
        for attr in node.attrs.values():
            if isinstance(attr, gs.Graph):
                yield from _constants(attr)


class GraphView:
    def __init__(self, graph: gs.Graph, model: onnx.ModelProto | None = None, fold: bool = True,
                 dims: dict | None = None, inferred: Inferred | None = None):
        """`inferred`: the shapes and types where the caller has them (graph/measure.py's inferred_shapes);
        else the model's inferences are run here."""
        self.graph = graph
        self.model = model  # what graph/measure.py runs to measure shapes inference could not name
        self.dims = dict(dims) if dims else None  # the dims the model runs at (graph/dims.py), where it measures
        self.opset = int(graph.opset) if graph.opset else DEFAULT_OPSET
        self._folded: dict[str, gs.Tensor] = {}
        self.shape_only: set[str] = set()  # outputs of the graph's shape arithmetic (constants and shapes alone)
        if inferred is None:
            inferred = Inferred(*known_shapes_and_types(model)) if model is not None else Inferred()
        self._shapes, self._types = inferred.shapes, inferred.types
        self.premeasured = inferred.measured  # what graph/measure.py's `measured` reads before measuring again
        if fold:
            self._fold()
        self.tensors = graph.tensors()
        self.outputs = {t.name for t in graph.outputs}
        self.inputs = {t.name for t in graph.inputs}
        # initializers that are also graph inputs (keep_initializers_as_inputs): constants at their default
        self.defaults = ({i.name for i in model.graph.input} & {t.name for t in model.graph.initializer}
                         if model is not None else set())

    # ------------------------------------------------------------ set-up
    def _fold(self):
        import onnxruntime

        onnxruntime.set_default_logger_severity(3)  # folding is best effort: no optimizer chatter
        # fold a copy of just the nodes that compute from constants and shapes (a graph's shape arithmetic,
        # not its layers: copying the whole graph cost more than the folding), knowing the inferred shapes,
        # so Shape -> Gather of static dims folds too; weights on disk are not constants there
        cone = _constant_cone(self.graph)
        self.shape_only = {t.name for n in cone for t in n.outputs if t.name}
        values = {n.outputs[0].name: n.attrs["value"] for n in cone if _constant_node(n)}  # no nodes in the copy:
        nodes = [n for n in cone if not _constant_node(n)]  # TorchScript writes every constant as a node
        if not nodes:
            return
        made = {id(t) for n in nodes for t in n.outputs}
        read = {id(t): t for n in nodes for t in n.inputs if isinstance(t, gs.Variable) and id(t) not in made}
        folded = gs.Graph(nodes=nodes, inputs=list(read.values()), outputs=[t for n in nodes for t in n.outputs],
                          opset=self.graph.opset, import_domains=self.graph.import_domains).copy()
        for t in list(folded.inputs):
            if t.name in values:
                t.to_constant(np.asarray(values[t.name].values))
        folded.inputs = [t for t in folded.inputs if isinstance(t, gs.Variable)]
        _casts_to_known_types(folded, self.dtype)
        for name, t in folded.tensors().items():
            if isinstance(t, gs.Variable) and name in self._shapes:  # unk__N: named by one inference, not shared
                t.shape = [None if isinstance(d, str) and d.startswith("unk__") else d for d in self.shape(t) or []]
        _static_shapes_as_constants(folded)
        shape_slices.explicit(folded)  # the rest (dynamic): a Gather or Slice of their static dims folds right
        level = gs.logger.G_LOGGER.severity
        gs.logger.G_LOGGER.severity = gs.logger.G_LOGGER.ERROR
        try:
            folded.fold_constants(fold_shapes=True, error_ok=True, flatten_subgraphs=False)
        except Exception:  # folding is an aid: the matcher still works from constants it sees directly
            pass
        finally:
            gs.logger.G_LOGGER.severity = level
        self._folded = {name: t for name, t in folded.tensors().items() if isinstance(t, gs.Constant)}

    # ------------------------------------------------------------ structure
    @staticmethod
    def producer(t: gs.Tensor) -> gs.Node | None:
        return t.inputs[0] if isinstance(t, gs.Variable) and t.inputs else None

    @staticmethod
    def consumers(t: gs.Tensor) -> list[gs.Node]:
        return list(t.outputs)

    def skip_passthrough_up(self, t: gs.Tensor) -> gs.Tensor:
        """Walk up through Identity / Dropout / single-input Concat / no-op Cast."""
        while True:
            n = self.producer(t)
            if n is None:
                return t
            if n.op in PASSTHROUGH or (n.op == "Concat" and len(n.inputs) == 1) or self.is_noop_cast(n):
                t = n.inputs[0]
                continue
            return t

    def is_noop_cast(self, n: gs.Node) -> bool:
        if n.op != "Cast":
            return False
        src = self.dtype(n.inputs[0])
        dst = onnx.helper.tensor_dtype_to_np_dtype(n.attrs["to"]) if "to" in n.attrs else None
        return src is not None and dst is not None and np.dtype(src) == np.dtype(dst)

    def is_float_cast(self, n: gs.Node) -> bool:
        """A Cast between float types (mixed-precision softmax); values kept up to rounding."""
        if n.op != "Cast" or "to" not in n.attrs:
            return False
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(n.attrs["to"])) in FLOAT_TYPES

    # ------------------------------------------------------------ values
    def const(self, t: gs.Tensor) -> np.ndarray | None:
        if isinstance(t, gs.Constant):
            return np.asarray(t.values)
        n = self.producer(t)
        if n is not None and n.op == "Constant" and "value" in n.attrs:
            v = n.attrs["value"]
            return np.asarray(v.values if isinstance(v, gs.Constant) else v)
        folded = self._folded.get(t.name)
        return np.asarray(folded.values) if folded is not None else None

    def unfolded(self) -> list[gs.Variable]:
        """The outputs of the graph's shape arithmetic that folding could not make constants (what they
        read has dims inference did not follow: a Slice whose end is computed)."""
        return [t for name in sorted(self.shape_only) if isinstance(t := self.tensors.get(name), gs.Variable)
                and name not in self._folded]

    def scalar(self, t: gs.Tensor) -> float | None:
        v = self.const(t)
        if v is None or v.size != 1 or v.dtype.kind not in "fiu":
            return None
        return float(v.reshape(()))

    def ints(self, t: gs.Tensor) -> list[int] | None:
        v = self.const(t)
        if v is None or v.dtype.kind not in "iu":
            return None
        return [int(x) for x in v.reshape(-1)]

    # ------------------------------------------------------------ shapes and types
    def shape(self, t: gs.Tensor) -> list | None:
        """The most static shape known: the graph's own or the inferred one."""
        if isinstance(t, gs.Constant):
            return list(t.shape)  # from the proto's dims: never loads the values
        own = list(t.shape) if t.shape is not None else None
        inferred = self._shapes.get(t.name)
        if inferred is None or (own is not None and _static(own) > _static(inferred)):
            return own
        return inferred

    def rank(self, t: gs.Tensor) -> int | None:
        s = self.shape(t)
        return len(s) if s is not None else None

    def dim(self, t: gs.Tensor, axis: int) -> int | None:
        s = self.shape(t)
        if s is None or not -len(s) <= axis < len(s):
            return None
        d = s[axis]
        return d if isinstance(d, int) and d > 0 else None

    def dtype(self, t: gs.Tensor):
        """The element type (numpy): the graph's own (a Constant's from its proto: the values are not loaded), the
        inferred one, or what the Cast that makes it says; None when none is known."""
        if t.dtype is not None:
            return t.dtype
        if t.name in self._types:
            return onnx.helper.tensor_dtype_to_np_dtype(self._types[t.name])
        if t.inputs and t.inputs[0].op == "Cast" and "to" in t.inputs[0].attrs:
            return onnx.helper.tensor_dtype_to_np_dtype(int(t.inputs[0].attrs["to"]))
        return None


def _constant_node(node: gs.Node) -> bool:
    return node.op == "Constant" and len(node.outputs) == 1 and isinstance(node.attrs.get("value"), gs.Constant)


def _constant_cone(graph: gs.Graph) -> list[gs.Node]:
    """The nodes whose outputs follow from constants and tensor shapes and types alone, in graph order: nodes all
    of whose inputs read for their values are such outputs or constants (not weights left on disk)."""
    known: set[int] = set()
    cone = []
    for node in graph.nodes:
        if any(isinstance(a, gs.Graph) for a in node.attrs.values()):
            continue
        if all(not t.name or id(t) in known
               or (isinstance(t, gs.Constant) and t.data_location != onnx.TensorProto.EXTERNAL)
               for t in value_operands(node)):  # Shape of anything; CastLike of a constant to any tensor's type
            cone.append(node)
            known.update(id(t) for t in node.outputs)
    return cone


def _static_shapes_as_constants(graph: gs.Graph) -> None:
    """Shape of a tensor whose shape is static, as a constant (in the folded copy only): onnx-graphsurgeon's
    shape folding ignores Shape's start and end (opset 15), which would give Shape(q, start=-2, end=-1) the
    whole shape."""
    for n in list(graph.nodes):
        shape = n.inputs[0].shape if n.op == "Shape" and n.inputs else None
        if shape is None or not all(isinstance(d, int) and d >= 0 for d in shape):
            continue
        start, end = n.attrs.get("start", 0), n.attrs.get("end")
        values = np.array(list(shape)[start:end], dtype=np.int64)  # python's slice clamps as ONNX's Shape does
        out = n.outputs[0]
        n.outputs.clear()
        out.to_constant(values)
        graph.nodes.remove(n)


def _casts_to_known_types(graph: gs.Graph, dtype_of) -> None:
    """CastLike(x, t) as Cast(x, to=t's type) where t's type is known, so that it folds without t's values
    (in the folded copy only)."""
    for n in graph.nodes:
        like = n.inputs[1] if n.op == "CastLike" and len(n.inputs) == 2 else None
        dtype = dtype_of(like) if like is not None and not isinstance(like, gs.Constant) else None
        if dtype is not None:
            n.op, n.attrs = "Cast", {"to": onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))}
            n.inputs = n.inputs[:1]


def _static(shape: list) -> int:
    return sum(isinstance(d, int) and d > 0 for d in shape)
