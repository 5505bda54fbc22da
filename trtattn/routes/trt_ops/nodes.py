"""Each planned layer of a form model as TensorRT's own ONNX custom op, in place of the ONNX nodes it
replaces (the plan's `region`), the way trt/lower.py builds it with the network API:

- IAttention -> `trt::TRT_Attention` (or `TRT_QuantizedAttention` when the plan quantizes the softmax
  output): Q multiplied by the softmax scale first (the op has no scale), [B, S, N*H] split into heads,
  packed tokens [1, N, T, H] as [T, N, H], lengths as INT32 (query and key/value lengths as two tensors,
  a reported TensorRT crash otherwise), an additive mask in the attention's dtype;
- IKVCacheUpdateLayer -> `trt::TRT_KVCacheUpdate`, the cache's capacity static (TensorRT requires it);
- IRotaryEmbeddingLayer: the standard ONNX RotaryEmbedding of the form stays (TensorRT's parser maps it).

Attribute and input names and values are the documented ones, taken from trtattn_plugins.schema; every
written node is checked against it by the caller.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from trtattn_plugins import schema

from ...errors import TrtattnError
from ...graph.emit import Emitter

IO_FORM = {"padded": "padded_bhnd", "packed": "packed_nhd"}
QUANTIZE_TO = {"fp8": schema.FP8, "int8": schema.INT8}  # normalization_quantize_to_type: an ONNX dtype


class OpWriter:
    """Rewrites one onnx-graphsurgeon graph of a form model; `types` are its tensor types (name -> (ONNX
    elem type, shape)) as shape inference gives them."""

    def __init__(self, graph: gs.Graph, types: dict):
        self.graph, self.types = graph, types
        self.tensors = graph.tensors()
        self.int32: dict[str, gs.Tensor] = {}  # lengths/indices already cast, by source tensor

    # ---------------------------------------------------------------- helpers
    def dtype(self, name: str):
        elem = self.types.get(name, (None, None))[0]
        if elem is None:
            t = self.tensors.get(name)
            return np.dtype(t.dtype) if t is not None and t.dtype is not None else np.dtype(np.float32)
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))

    def tensor(self, name: str, node: str) -> gs.Tensor:
        if name not in self.tensors:
            raise TrtattnError(f"{node}: the tensor {name} it reads is not in the form model")
        return self.tensors[name]

    def remove(self, region, node: str) -> None:
        names = set(region)
        missing = names - {n.name for n in self.graph.nodes}
        if missing:
            raise TrtattnError(f"{node}: the plan replaces nodes the form model does not have: {sorted(missing)[:3]}")
        for n in [n for n in self.graph.nodes if n.name in names]:
            n.inputs.clear()
            n.outputs.clear()
        self.graph.nodes = [n for n in self.graph.nodes if n.name not in names]

    def as_int32(self, name: str, emit: Emitter, node: str) -> gs.Tensor:
        if name not in self.int32:
            self.int32[name] = emit.cast(self.tensor(name, node), np.int32)
        return self.int32[name]

    @staticmethod
    def tokens(emit: Emitter, t: gs.Tensor, dtype) -> gs.Tensor:
        """Packed tokens as the form carries them, [1, N, T, H], to the op's [T, N, H]. (A site fused with
        batch and heads merged carries them as [N, 1, T, H]: the leading two axes are merged either way.)"""
        heads = emit("Reshape", [t, emit("Concat", [emit.const([-1], np.int64), emit.shape_slice(t, 2, 4)], {"axis": 0},
                                         dtype=np.int64)], dtype=dtype)
        return emit("Transpose", [heads], {"perm": [1, 0, 2]}, dtype=dtype, name="packed_nhd")

    @staticmethod
    def finish(emit: Emitter, y: gs.Tensor, steps: list, out: gs.Tensor) -> None:
        """Apply `steps` [(op, attrs, extra inputs)] to y, the last one writing `out`."""
        for op, attrs, extra in steps[:-1]:
            y = emit(op, [y, *extra], attrs, dtype=out.dtype)
        op, attrs, extra = steps[-1]
        emit.graph.nodes.append(gs.Node(op, f"{emit.prefix}/{op}_output", attrs, inputs=[y, *extra], outputs=[out]))

    # ---------------------------------------------------------------- attention
    def attention(self, p) -> gs.Node:
        if p.reason is not None:
            raise TrtattnError(f"site {p.site}: {p.reason}")
        quantized = p.normalization_quantize_to_type is not None
        self.remove(p.region, p.node)
        emit = Emitter(self.graph, p.layer)
        dtype = self.dtype(p.query)
        q, k, v = (self.tensor(n, p.node) for n in (p.query, p.key, p.value))
        out = self.tensor(p.output, p.node)
        if quantized:  # Q, K, V straight from their DequantizeLinear: the op scales and splits heads itself
            if "packed" in (p.query_form, p.kv_form):
                raise TrtattnError(f"site {p.site}: TRT_QuantizedAttention on packed tokens would need the Q/DQ "
                                   "after the packing; not written")
            return self._quantized(p, emit, q, k, v, out)
        post = []
        if p.rank == 3:  # [B, S, N*H] -> [B, N, S, H]
            q, k, v = (self._heads(emit, t, heads, p, dtype) for t, heads in
                       ((q, p.q_heads), (k, p.kv_heads), (v, p.kv_heads)))
            post = [("Transpose", {"perm": [0, 2, 1, 3]}, []),
                    ("Reshape", {}, [emit.const([0, 0, -1], np.int64)])]
        if abs(p.q_scale - 1.0) > 1e-12:
            q = emit("Mul", [q, emit.const(p.q_scale, dtype)], dtype=dtype, name="q_scale")
        if p.query_form == "packed":  # back to the form's layout, [1, N, T, Hv] (or [N, 1, T, Hv])
            layout = emit("Concat", [emit.shape_slice(q, 0, 3), emit.const([-1], np.int64)], {"axis": 0}, dtype=np.int64)
            q = self.tokens(emit, q, dtype)
            post = [("Transpose", {"perm": [1, 0, 2]}, []), ("Reshape", {}, [layout])] + post
        if p.kv_form == "packed":
            k, v = self.tokens(emit, k, dtype), self.tokens(emit, v, dtype)
        inputs = [q, k, v, self._mask(p, emit, dtype), *self._lengths(p, emit)]
        y = gs.Variable(f"{p.layer}/Y", dtype=dtype) if post else out
        node = self._op("TRT_Attention", p.layer, inputs, y,
                        {"query_form": IO_FORM[p.query_form], "kv_form": IO_FORM[p.kv_form],
                         "causal_kind": p.causal, "TRT_decomposable": int(p.decomposable)})
        if post:
            self.finish(emit, y, post, out)
        return node

    def _quantized(self, p, emit, q, k, v, out) -> gs.Node:
        if p.causal == "lower_right":
            raise TrtattnError(f"site {p.site}: TRT_QuantizedAttention has only is_causal (upper-left); this site "
                               "is lower-right causal")
        if p.normalization_quantize_to_type not in QUANTIZE_TO or p.normalization_quantize_scale is None:
            raise TrtattnError(f"site {p.site}: softmax quantized to {p.normalization_quantize_to_type!r} with scale "
                               f"{p.normalization_quantize_scale!r}; TensorRT takes fp8 or int8 with a scale")
        attrs = {"query_form": IO_FORM[p.query_form], "kv_form": IO_FORM[p.kv_form],
                 "is_causal": int(p.causal == "upper_left"), "scale": float(p.q_scale),
                 "normalization_quantize_to_type": int(QUANTIZE_TO[p.normalization_quantize_to_type]),
                 "TRT_decomposable": int(p.decomposable)}
        if p.rank == 3:
            attrs.update(q_num_heads=int(p.q_heads), kv_num_heads=int(p.kv_heads))
        dtype = self.dtype(p.query)
        scale = emit.const(np.float32(p.normalization_quantize_scale), np.float32)
        inputs = [q, k, v, self._mask(p, emit, dtype), scale, *self._lengths(p, emit)]
        return self._op("TRT_QuantizedAttention", p.layer, inputs, out, attrs)

    @staticmethod
    def _heads(emit, t, heads, p, dtype):
        if not heads or not p.head_size:
            raise TrtattnError(f"site {p.site}: [B, S, N*H] attention with unknown head counts")
        split = emit("Reshape", [t, emit.const([0, 0, heads, -1], np.int64)], dtype=dtype)  # V's head size may differ
        return emit("Transpose", [split], {"perm": [0, 2, 1, 3]}, dtype=dtype, name="bhnd")

    def _mask(self, p, emit, dtype) -> gs.Tensor:
        if not p.mask:
            return gs.Variable.empty()
        mask = self.tensor(p.mask, p.node)
        if p.mask_kind == "boolean":
            return mask
        # an fp16 form's mask is fp16 already, clamped by AutoCast (no zoo or hand-built model reaches a float32
        # mask into fp16 attention); were one cast here, its -3.4e38 would become -inf and fail the CPU check
        return emit.cast(mask, dtype) if self.dtype(p.mask) != dtype else mask

    def _lengths(self, p, emit) -> list[gs.Tensor]:
        q_lengths = self.as_int32(p.q_lengths, emit, p.node) if p.q_lengths else gs.Variable.empty()
        kv_lengths = gs.Variable.empty()
        if p.kv_lengths:
            kv_lengths = self.as_int32(p.kv_lengths, emit, p.node)
            if kv_lengths is q_lengths:  # each its own tensor
                kv_lengths = emit("Identity", [q_lengths], dtype=np.int32, name="kv_lengths")
        return [q_lengths, kv_lengths]

    def _op(self, op: str, name: str, inputs: list, y: gs.Tensor, attrs: dict) -> gs.Node:
        while inputs and not inputs[-1].name:  # optional inputs left out at the end
            inputs.pop()
        node = gs.Node(op, name, attrs, inputs=inputs, outputs=[y], domain=schema.DOMAIN)
        self.graph.nodes.append(node)
        return node

    # ---------------------------------------------------------------- KV-cache update
    def cache_update(self, p, capacity: int | None) -> gs.Node:
        self.remove(p.region or (p.node,), p.node)
        layer = f"trtattn/kv_cache/{p.node}"
        emit = Emitter(self.graph, layer)
        cache, out = self.tensor(p.cache, p.node), self.tensor(p.output, p.node)
        dtype = self.dtype(p.cache)
        update = self.tensor(p.update, p.node)
        if p.update_form == "packed":
            update = self.tokens(emit, update, dtype)
        if not p.write_indices:
            raise TrtattnError(f"{p.node}: a cache update without write indices; TensorRT's layer needs them")
        inputs = [cache, update, self.as_int32(p.write_indices, emit, p.node),
                  self.as_int32(p.update_lengths, emit, p.node) if p.update_lengths else gs.Variable.empty()]
        node = self._op("TRT_KVCacheUpdate", layer, inputs, out,
                        {"update_form": IO_FORM[p.update_form], "mode": "linear", "axis": -2})
        if capacity:  # TensorRT: the cache is a network input with a static sequence axis
            for t in (cache, out):
                if t.shape is not None and len(t.shape) == 4:
                    t.shape = [t.shape[0], t.shape[1], capacity, t.shape[3]]
        return node
