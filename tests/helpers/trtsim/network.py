"""The recorded INetworkDefinition: inputs, outputs and every add_* the builder calls, with TensorRT's shape and type rules."""

from __future__ import annotations

import warnings

import numpy as np

from . import dtypes, shapes
from .errors import (
    ArgumentError,
    NetworkError,
)
from .objects import LayerState, RecAttention, RecLayer, Recorded, RecTensor, SimWeights
from .values import SimDims


class RecNetwork(Recorded):
    def __init__(self, sim, builder, flags: int):
        super().__init__(sim, "INetworkDefinition")
        self._builder = builder
        self._flags = int(flags)
        self._layers: list[LayerState] = []
        self._inputs: list[RecTensor] = []
        self._outputs: list[RecTensor] = []
        self._props["name"] = "Unnamed Network 0"
        self._attention_count = 0

    def _label(self):
        return f"'{self._props['name']}'"

    # --- internals used by layers, the parser, validation and the executor
    def _add_layer(self, kind, inputs, n_outputs=1, props=None, strict=True) -> LayerState:
        for t in inputs:
            if t is not None and t._net is not self:
                raise NetworkError(f"{kind}: tensor {t!r} belongs to another network")
        st = LayerState(self, kind, inputs, n_outputs, props or {})
        self._layers.append(st)
        try:
            st.infer()
        except shapes.ShapeError:
            if strict:
                self._layers.pop()  # TensorRT returns no layer for an invalid add_* call
                raise
            for out in st.outputs:  # e.g. a concatenation whose axis is set next; checked again at build
                out._shape = None
        return st

    def _reinfer_from(self, index: int) -> None:
        """Shapes downstream of a change: the changed layer must infer; later ones may be mid-edit."""
        for st in self._layers[index:]:
            if st.kind == "ONNX":
                continue
            try:
                st.infer()
            except shapes.ShapeError:
                if st.index == index:
                    raise
                for out in st.outputs:
                    out._shape = None

    def _consumers(self, tensor):
        return [(st, i) for st in self._layers for i, t in enumerate(st.inputs) if t is tensor]

    def _new_input(self, name, dtype, shape) -> RecTensor:
        if not name:
            raise NetworkError("add_input: a network input needs a non-empty name")
        if any(t._name == name for t in self._inputs):
            raise NetworkError(f"add_input: the network already has an input named '{name}'")
        if any(int(d) < -1 for d in shape):
            raise NetworkError(f"add_input: '{name}' has invalid dimensions {tuple(shape)} (use -1 for dynamic)")
        tensor = RecTensor(self._sim, self, name, dtype, shape)
        self._inputs.append(tensor)
        return tensor

    def _layer_handle(self, kind, inputs, props=None, n_outputs=1, strict=True):
        return self._add_layer(kind, inputs, n_outputs, props, strict).handle

    def _add_generic(self, ret_cls: str, bound: dict):
        """Any other add_* call: recorded with its tensors as inputs; outputs of unknown shape."""
        inputs, props = [], {}
        for key, value in bound.items():
            if isinstance(value, RecTensor):
                inputs.append(value)
            elif isinstance(value, (list, tuple)) and value and all(isinstance(v, RecTensor) for v in value):
                inputs.extend(value)
            else:
                props[key] = value
        return self._layer_handle(ret_cls, inputs, props)

    # --- INetworkDefinition
    def _m_add_input(self, name, dtype, shape):
        return self._new_input(name, dtype, shape)

    def _m_mark_output(self, tensor):
        if tensor._net is not self:
            raise NetworkError(f"mark_output: {tensor!r} belongs to another network")
        if tensor not in self._outputs:
            self._outputs.append(tensor)

    def _m_unmark_output(self, tensor):
        if tensor in self._outputs:
            self._outputs.remove(tensor)
        else:
            self._sim.problem(self._builder, f"unmark_output: {tensor!r} is not a network output")

    def _m_remove_tensor(self, tensor):
        # The bindings: "It is illegal to remove a tensor that is the input or output of a layer.
        # If this method is called with such a tensor, a warning will be emitted on the log and the
        # call will be ignored."
        users = self._consumers(tensor)
        if tensor._producer is not None or users:
            where = [st.name for st, _ in users] + ([tensor._producer.name] if tensor._producer else [])
            self._sim.problem(self._builder, f"remove_tensor ignored: {tensor!r} is still used by {where}")
            return None
        if tensor in self._inputs:
            self._inputs.remove(tensor)
        if tensor in self._outputs:
            self._outputs.remove(tensor)
        tensor._removed = True
        return None

    def _m_get_input(self, index):
        index = int(index)
        return self._inputs[index] if 0 <= index < len(self._inputs) else None

    def _get_num_inputs(self):
        return len(self._inputs)

    def _m_get_output(self, index):
        index = int(index)
        return self._outputs[index] if 0 <= index < len(self._outputs) else None

    def _get_num_outputs(self):
        return len(self._outputs)

    def _m_get_layer(self, index):
        index = int(index)
        if not 0 <= index < len(self._layers):
            return None
        # The real binding returns an ILayer (the C++ object's most-derived type is not registered);
        # callers downcast with `layer.__class__ = trt.IShuffleLayer`, which trtsim checks.
        return RecLayer(self._sim, self._layers[index], "ILayer")

    def _get_num_layers(self):
        return len(self._layers)

    def _get_flags(self):
        return self._flags

    def _m_get_flag(self, flag):
        return bool(self._flags >> int(flag) & 1)

    def _get_has_implicit_batch_dimension(self):
        return False

    def _get_builder(self):
        return self._builder

    def _m_add_constant(self, shape, weights):
        array = weights._array if isinstance(weights, SimWeights) else np.asarray(weights)
        dtype = dtypes.from_numpy(self._sim.real, array.dtype)
        if dtype is None:
            raise ArgumentError(f"add_constant: numpy dtype {array.dtype} has no TensorRT DataType "
                                "(cast to float32/float16/int32/...)")
        expected = shapes.volume(shape)
        if expected is None:
            raise NetworkError(f"add_constant: shape {tuple(shape)} must be fully known")
        if array.size != expected:
            raise NetworkError(f"add_constant: {array.size} weights do not fill shape {tuple(shape)} ({expected} elements)")
        props = {"shape": SimDims(shape), "weights_array": array.copy(), "weights_dtype": dtype}
        return self._layer_handle("IConstantLayer", [], props)

    def _m_add_identity(self, input):
        return self._layer_handle("IIdentityLayer", [input])

    def _m_add_cast(self, input, to_type):
        return self._layer_handle("ICastLayer", [input], {"to_type": to_type})

    def _m_add_elementwise(self, input1, input2, op):
        return self._layer_handle("IElementWiseLayer", [input1, input2], {"op": op})

    def _m_add_unary(self, input, op):
        return self._layer_handle("IUnaryLayer", [input], {"op": op})

    def _m_add_shuffle(self, input):
        props = {"first_transpose": None, "second_transpose": None, "reshape_dims": None, "zero_is_placeholder": True}
        return self._layer_handle("IShuffleLayer", [input], props)

    def _m_add_slice(self, input, start, shape, stride):
        real = self._sim.real
        props = {"start": SimDims(start), "shape": SimDims(shape), "stride": SimDims(stride),
                 "mode": real.SampleMode.STRICT_BOUNDS, "axes": None}
        return self._layer_handle("ISliceLayer", [input], props)

    def _m_add_concatenation(self, inputs):
        if not inputs:
            raise NetworkError("add_concatenation: needs at least one input")
        rank = len(inputs[0]._shape) if inputs[0]._shape is not None else 0
        props = {"axis": shapes.default_concat_axis(rank)}
        return self._layer_handle("IConcatenationLayer", list(inputs), props, strict=False)

    def _m_add_select(self, condition, then_input, else_input):
        return self._layer_handle("ISelectLayer", [condition, then_input, else_input])

    def _m_add_shape(self, input):
        return self._layer_handle("IShapeLayer", [input])

    def _m_add_gather(self, input, indices, axis):
        props = {"axis": int(axis), "mode": self._sim.real.GatherMode.DEFAULT, "num_elementwise_dims": 0}
        return self._layer_handle("IGatherLayer", [input, indices], props)

    def _m_add_gather_v2(self, input, indices, mode):
        return self._layer_handle("IGatherLayer", [input, indices], {"axis": 0, "mode": mode, "num_elementwise_dims": 0})

    def _m_add_unsqueeze(self, input, axes):
        return self._layer_handle("IUnsqueezeLayer", [input, axes])

    def _m_add_squeeze(self, input, axes=None):
        return self._layer_handle("ISqueezeLayer", [input] + ([axes] if axes is not None else []))

    def _m_add_quantize(self, input, scale, output_type):
        return self._layer_handle("IQuantizeLayer", [input, scale], {"to_type": output_type})

    def _m_add_dequantize(self, input, scale, output_type):
        return self._layer_handle("IDequantizeLayer", [input, scale], {"to_type": output_type})

    def _m_add_attention_v2(self, query, key, value, norm_op, causal_kind):
        real = self._sim.real
        in_st = self._add_layer("IAttentionInputLayer", [query, key, value])
        out_st = self._add_layer("IAttentionOutputLayer", [in_st.outputs[0]])
        props = {
            "norm_op": norm_op,
            "causal_kind": causal_kind,
            "decomposable": False,
            "query_form": real.AttentionIOForm.PADDED_BHND,
            "key_value_form": real.AttentionIOForm.PADDED_BHND,
            "normalization_quantize_to_type": real.DataType.FLOAT,
            "num_ranks": 1,
        }
        attention = RecAttention(self._sim, self, in_st, out_st, props, f"(Unnamed Attention* {self._attention_count})")
        self._attention_count += 1
        in_st.attention = out_st.attention = attention
        return attention

    def _m_add_attention(self, query, key, value, norm_op, causal):
        warnings.warn("add_attention is deprecated; use add_attention_v2", DeprecationWarning, stacklevel=3)
        kinds = self._sim.real.CausalMaskKind
        return self._m_add_attention_v2(query, key, value, norm_op, kinds.UPPER_LEFT if causal else kinds.NONE)

    def _m_add_kv_cache_update(self, cache, update, write_indices, cache_mode):
        props = {"cache_mode": cache_mode, "update_form": self._sim.real.AttentionIOForm.PADDED_BHND}
        handle = self._layer_handle("IKVCacheUpdateLayer", [cache, update, write_indices], props)
        handle._st.outputs[0]._aliases = cache  # in place: the output shares the cache's memory
        return handle

    def _m_add_dist_collective(self, input, dist_collective_op, reduce_op, root, groups):
        """NvInfer.h addDistCollective: one input; `num_ranks` (an ILayer property, default 1) gives
        ALL_GATHER / REDUCE_SCATTER their output shape."""
        props = {"dist_collective_op": dist_collective_op, "reduce_op": reduce_op, "root": root,
                 "groups": None if groups is None else [int(g) for g in groups], "num_ranks": 1}
        return self._layer_handle("IDistCollectiveLayer", [input], props)

    def _m_add_rotary_embedding(self, input, cos_cache, sin_cache, interleaved, rotary_embedding_dim):
        if int(rotary_embedding_dim) < 0 or int(rotary_embedding_dim) % 2:
            raise NetworkError("add_rotary_embedding: rotary_embedding_dim must be non-negative and even, "
                               f"got {rotary_embedding_dim}")
        props = {"interleaved": bool(interleaved), "rotary_embedding_dim": int(rotary_embedding_dim)}
        return self._layer_handle("IRotaryEmbeddingLayer", [input, cos_cache, sin_cache], props)
