"""Emitter: adds nodes to an onnx-graphsurgeon graph with unique, readable names, and the few shape
expressions every rewrite needs (slices of a shape, the logits' shape, a mask at Q's length)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_graphsurgeon as gs

from .view import export_graph


def onnx_dtype(dtype) -> int:
    """numpy dtype -> ONNX TensorProto data type."""
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


FLOAT_DTYPES = {"float32": np.float32, "float16": np.float16, "float64": np.float64, "bfloat16": ml_dtypes.bfloat16}


def float_dtype(name: str) -> np.dtype:
    """A site's float type (AttentionSite.dtype) as the numpy dtype its new tensors take (bf16: ml_dtypes');
    fp32 for anything else."""
    return np.dtype(FLOAT_DTYPES.get(name, np.float32))


class Emitter:
    """emit(op, inputs, attrs, dtype=..., name=...) appends a node named PREFIX/NAME_N and returns its
    output; emit.const(value, dtype) makes a named constant."""

    def __init__(self, graph: gs.Graph, prefix: str):
        self.graph = graph
        self.prefix = prefix
        self.count = 0

    def __call__(self, op: str, inputs: list, attrs: dict | None = None, dtype=None, name: str | None = None) -> gs.Variable:
        self.count += 1
        base = f"{self.prefix}/{name or op}_{self.count}"
        out = gs.Variable(base + "_out", dtype=dtype)
        self.graph.nodes.append(gs.Node(op, base, attrs or {}, inputs=inputs, outputs=[out]))
        return out

    def const(self, value, dtype) -> gs.Constant:
        self.count += 1
        return gs.Constant(f"{self.prefix}/c_{self.count}", np.asarray(value, dtype=dtype))

    def cast(self, t: gs.Tensor, dtype) -> gs.Tensor:
        """t as `dtype` (no node when it already is)."""
        if t.dtype is not None and np.dtype(t.dtype) == np.dtype(dtype):
            return t
        return self("Cast", [t], {"to": onnx_dtype(dtype)}, dtype=np.dtype(dtype))

    def shape_slice(self, t: gs.Tensor, start: int, end: int) -> gs.Tensor:
        """Shape(t)[start:end] as a 1-D int64 tensor."""
        shape = self("Shape", [t], dtype=np.int64)
        return self("Slice", [shape, self.const([start], np.int64), self.const([end], np.int64)], dtype=np.int64)

    def dim(self, t: gs.Tensor, axis: int) -> gs.Tensor:
        """Shape(t)[axis] as a 0-D int64 tensor."""
        return self("Gather", [self("Shape", [t], dtype=np.int64), self.const(axis, np.int64)], {"axis": 0},
                    dtype=np.int64)

    def score_shape(self, q: gs.Tensor, key: gs.Tensor, rank: int, key_seq_axis: int) -> gs.Tensor:
        """Shape of Q . K^T built from the operands' shapes: Q's [..., Sq] and the key's sequence length
        (axis rank-1 of K^T, rank-2 of a BNSH key)."""
        return self("Concat", [self.shape_slice(q, 0, rank - 1), self.shape_slice(key, key_seq_axis, key_seq_axis + 1)],
                    {"axis": 0}, dtype=np.int64)

    def full_query_rows(self, mask: gs.Tensor, q: gs.Tensor, keys: gs.Tensor | None = None) -> gs.Tensor:
        """The mask expanded to Q's length on its query axis (Q is [B, N, Sq, H]), and to `keys` (the total key
        length, 1-D) on its key axis where given: ONNX Runtime's Attention wants those axes at full length, though
        the spec allows broadcasting (a (1, 1) mask over every key of a decode step)."""
        target = self("Concat", [self.const([1, 1], np.int64), self.shape_slice(q, 2, 3),
                                 keys if keys is not None else self.const([1], np.int64)],
                      {"axis": 0}, dtype=np.int64)
        return self("Expand", [mask, target], dtype=mask.dtype, name="mask_rows")


def export_like(graph: gs.Graph, like: onnx.ModelProto, opset: int | None = None) -> onnx.ModelProto:
    """The rewritten graph as a model with the original's IR version and metadata (dead nodes removed,
    sorted), its default-domain opset raised to `opset` if given."""
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    model = export_graph(graph, like)  # weights left on disk stay references (view.import_graph)
    del model.metadata_props[:]
    model.metadata_props.extend(list(like.metadata_props))
    if opset:
        for imp in model.opset_import:
            if imp.domain in ("", "ai.onnx"):
                imp.version = max(imp.version, opset)
    return model
