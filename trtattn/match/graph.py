"""A read-only view of an onnx-graphsurgeon graph for matching.

The matcher reads structure from the graph as exported and values from a constant-folded copy
(so a scale written as Div(1, Sqrt(Cast(Shape(q)[-1]))) reads as 0.125), without changing
the graph it will later rewrite.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnx_graphsurgeon as gs

# Ops that never change values on the attention paths (dropout is inactive at inference).
PASSTHROUGH = {"Identity", "Dropout"}
FLOAT_TYPES = {np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64)}


def import_graph(model: onnx.ModelProto) -> gs.Graph:
    return gs.import_onnx(model)


class GraphView:
    def __init__(self, graph: gs.Graph, model: onnx.ModelProto | None = None, fold: bool = True):
        self.graph = graph
        self.opset = _opset(graph)
        self._folded: dict[str, gs.Tensor] = {}
        self._shapes: dict[str, list] = {}
        inferred = self._infer_shapes(model) if model is not None else None
        if fold:
            self._fold(inferred)
        self.tensors = graph.tensors()
        self.outputs = {t.name for t in graph.outputs}
        self.inputs = {t.name for t in graph.inputs}

    # ------------------------------------------------------------ set-up
    def _fold(self, inferred: onnx.ModelProto | None):
        import onnxruntime

        onnxruntime.set_default_logger_severity(3)  # folding is best effort: no optimizer chatter
        # fold a copy that knows the inferred shapes, so Shape -> Gather of static dims folds too
        folded = gs.import_onnx(inferred) if inferred is not None else self.graph.copy()
        gs_logger = logging.getLogger("onnx_graphsurgeon")
        level = gs.logger.G_LOGGER.severity
        gs.logger.G_LOGGER.severity = gs.logger.G_LOGGER.ERROR
        try:
            folded.fold_constants(fold_shapes=True, error_ok=True, flatten_subgraphs=False)
        except Exception:  # folding is an aid: the matcher still works from constants it sees directly
            pass
        finally:
            gs.logger.G_LOGGER.severity = level
        del gs_logger
        self._folded = {name: t for name, t in folded.tensors().items() if isinstance(t, gs.Constant)}

    def _infer_shapes(self, model: onnx.ModelProto):
        """ONNX shape inference, then ONNX Runtime's symbolic shape inference, which follows
        Reshape targets built from Shape/Gather/Concat (how TorchScript writes head splits)."""
        best = None
        for infer in (_onnx_shapes, _symbolic_shapes):
            try:
                inferred = infer(model)
            except Exception:
                continue
            best = inferred
            for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
                if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
                    shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                             for d in vi.type.tensor_type.shape.dim]
                    known = self._shapes.get(vi.name)
                    if known is None or sum(isinstance(d, int) for d in shape) > sum(isinstance(d, int) for d in known):
                        self._shapes[vi.name] = shape
        return best

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
        if isinstance(t, gs.Constant):
            return list(t.values.shape)
        s = self._shapes.get(t.name)
        if s is not None:
            return s
        return list(t.shape) if t.shape is not None else None

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
        if isinstance(t, gs.Constant):
            return t.values.dtype
        return t.dtype

    def attr(self, n: gs.Node, name: str, default=None):
        return n.attrs.get(name, default)


def _onnx_shapes(model):
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def _symbolic_shapes(model):
    """ONNX Runtime's symbolic shape inference, keeping what it inferred even when it could not
    infer everything. (Its infer_shapes() then saves the model as sym_shape_infer_temp.onnx in the
    working directory and raises: never let it write there.)"""
    import os
    import tempfile

    SymbolicShapeInference = _symbolic_module().SymbolicShapeInference
    engine = SymbolicShapeInference(2**31 - 1, True, True, 0)
    try:
        engine._preprocess(model)
        while engine.run_:
            engine._infer_impl()
        engine._update_output_from_vi()
        return engine.out_mp_
    except AttributeError:  # its internals changed: the public call, in a scratch directory
        here = os.getcwd()
        with tempfile.TemporaryDirectory() as scratch:
            os.chdir(scratch)
            try:
                return SymbolicShapeInference.infer_shapes(model, auto_merge=True, guess_output_rank=True)
            finally:
                os.chdir(here)


_SYMBOLIC = None


def _symbolic_module():
    """onnxruntime/tools/symbolic_shape_infer.py, loaded on its own: importing it as
    onnxruntime.tools.symbolic_shape_infer runs the package's __init__, which imports torch
    (a second and 250 MB on every call of trtattn where torch is installed)."""
    global _SYMBOLIC
    if _SYMBOLIC is None:
        import importlib.util
        import os

        import onnxruntime

        path = os.path.join(os.path.dirname(onnxruntime.__file__), "tools", "symbolic_shape_infer.py")
        spec = importlib.util.spec_from_file_location("trtattn._symbolic_shape_infer", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _SYMBOLIC = module
    return _SYMBOLIC


def _opset(graph: gs.Graph) -> int:
    return int(graph.opset or 0) if graph.opset else 17
