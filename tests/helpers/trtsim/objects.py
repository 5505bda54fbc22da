"""Recorded objects: weights, tensors, layers and IAttention, each checked against the real class it stands for."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import numpy as np

from . import dtypes, shapes
from .errors import (
    NetworkError,
    NotEmulatedError,
)
from .values import ONNX_SUBGRAPH, SimDims, fmt

if TYPE_CHECKING:  # the checker behind every object (simulation.py imports this module)
    from .simulation import Simulation


class Recorded:
    """Base of every recording object. Public attribute access goes through the checker; the
    implementation lives in underscore members (_m_<method>, _get_<prop>, _set_<prop>)."""

    def __init__(self, sim: Simulation, cls: str):
        object.__setattr__(self, "_sim", sim)
        object.__setattr__(self, "_cls", cls)
        object.__setattr__(self, "_props", {})

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return self._sim.get_member(self, name)

    def __setattr__(self, name, value):
        if name == "__class__":
            self._sim.recast(self, value)
        elif name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self._sim.set_member(self, name, value)

    def __enter__(self):
        # The real bindings keep deprecated context managers on a few classes only.
        if not hasattr(self._sim.real_class(self._cls), "__enter__"):
            raise TypeError(f"'{self._cls}' object does not support the context manager protocol")
        warnings.warn("Context managers for TensorRT types are deprecated.", DeprecationWarning, stacklevel=2)
        return self

    def __exit__(self, *exc):
        return None

    def __repr__(self) -> str:
        label = self._label()
        return f"<{self._cls}{' ' + label if label else ''}>"

    def _label(self) -> str:
        return ""


class SimWeights(Recorded):
    def __init__(self, sim, array: np.ndarray):
        super().__init__(sim, "Weights")
        self._array = np.array(array, copy=True)  # TensorRT keeps a pointer; a copy is the safe model

    def _label(self):
        return fmt(self._array)

    def _get_dtype(self):
        return dtypes.from_numpy(self._sim.real, self._array.dtype)

    def _get_size(self):
        return int(self._array.size)

    def _get_nbytes(self):
        return int(self._array.nbytes)

    def _m_numpy(self):
        return self._array


class RecTensor(Recorded):
    def __init__(self, sim, net, name, dtype, shape, producer=None):
        super().__init__(sim, "ITensor")
        self._net = net
        self._name = name
        self._dtype = dtype
        self._shape = None if shape is None else tuple(int(d) for d in shape)
        self._producer = producer  # LayerState or None
        self._dim_names = {}
        self._aliases = None  # the input tensor whose memory this output reuses (KV cache update)

    def _label(self):
        dtype = self._dtype.name if self._dtype is not None else "?"
        shape = "?" if self._shape is None else tuple(self._shape)
        return f"'{self._name}' {dtype} {shape}"

    def _get_name(self):
        return self._name

    def _set_name(self, value):
        self._name = value

    def _get_shape(self):
        if self._shape is None:
            raise NotEmulatedError(
                f"trtsim cannot tell the shape of tensor '{self._name}' (output of a layer it does not emulate, "
                f"or data-dependent)")
        return SimDims(self._shape)

    def _set_shape(self, value):
        if self not in self._net._inputs:
            raise NetworkError(f"ITensor.shape can only be set on network inputs; '{self._name}' is not one")
        self._shape = tuple(int(d) for d in value)
        self._net._reinfer_from(0)

    def _get_dtype(self):
        return self._dtype

    def _get_is_network_input(self):
        return self in self._net._inputs

    def _get_is_network_output(self):
        return self in self._net._outputs

    def _m_set_dimension_name(self, index, name):
        self._dim_names[int(index)] = name

    def _m_get_dimension_name(self, index):
        return self._dim_names.get(int(index))


def display_name(kind: str) -> str:
    if kind == "ONNX":
        return "ONNX"
    name = kind[1:] if kind.startswith("I") else kind
    return name[:-5] if name.endswith("Layer") else name


# Layers whose optional inputs set_input may append (NvInfer.h / the bindings' set_input docs).
MAX_INPUTS = {
    "IShuffleLayer": 2,
    "ISliceLayer": 6,
    "IRotaryEmbeddingLayer": 4,
    "IKVCacheUpdateLayer": 4,
    "IAttentionInputLayer": 7,
    "IQuantizeLayer": 3,
    "IDequantizeLayer": 3,
    "ISqueezeLayer": 2,
    "IUnsqueezeLayer": 2,
    "IFillLayer": 3,
}


class LayerState:
    """One layer of a recorded network. RecLayer handles (typed views) all point at one of these."""

    def __init__(self, net, kind: str, inputs: list, n_outputs: int, props: dict):
        self.net = net
        self.kind = kind  # the real class name, or "ONNX" for a parsed ONNX subgraph
        self.inputs = list(inputs)
        self.props = dict(props)
        self.index = len(net._layers)
        self.name = f"(Unnamed Layer* {self.index}) [{display_name(kind)}]"
        self.metadata = ""
        self.attention = None  # RecAttention for attention boundary layers
        self.onnx = None  # OnnxPart for parsed ONNX subgraphs
        sim = net._sim
        suffix = (lambda i: "_output") if n_outputs == 1 else (lambda i: f"_output_{i}")
        self.outputs = [RecTensor(sim, net, self.name + suffix(i), None, None, producer=self) for i in range(n_outputs)]
        self.handle = RecLayer(sim, self, "ILayer" if kind == "ONNX" else kind)

    def __repr__(self) -> str:
        return f"<layer {self.index} {self.kind} '{self.name}'>"

    def slot(self, index: int):
        return self.inputs[index] if index < len(self.inputs) else None

    def set_input(self, index: int, tensor) -> None:
        index = int(index)
        limit = MAX_INPUTS.get(self.kind, len(self.inputs))
        if not 0 <= index < limit:
            raise NetworkError(f"{self.kind} '{self.name}': set_input index {index} is outside [0, {limit})")
        if tensor is not None and tensor._net is not self.net:
            raise NetworkError(f"{self.kind} '{self.name}': tensor {tensor!r} belongs to another network")
        while len(self.inputs) <= index:
            self.inputs.append(None)
        self.inputs[index] = tensor
        self.net._reinfer_from(self.index)

    def infer(self) -> None:
        shapes.infer(self, self.net._sim.real)


class RecLayer(Recorded):
    """A handle on a LayerState, typed as the real class it is viewed as (see get_layer)."""

    def __init__(self, sim, st: LayerState, cls: str):
        super().__init__(sim, cls)
        object.__setattr__(self, "_st", st)
        object.__setattr__(self, "_props", st.props)

    def __eq__(self, other):
        return isinstance(other, RecLayer) and other._st is self._st

    def __hash__(self):
        return id(self._st)

    def _label(self):
        return f"'{self._st.name}'"

    def _after_set(self, name):
        self._st.net._reinfer_from(self._st.index)

    def _get_name(self):
        return self._st.name

    def _set_name(self, value):
        self._st.name = value

    def _get_metadata(self):
        return self._st.metadata

    def _set_metadata(self, value):
        self._st.metadata = value

    def _get_type(self):
        if self._st.kind == "ONNX":
            return ONNX_SUBGRAPH
        return self._sim.layer_type(self._st.kind)

    def _get_num_inputs(self):
        return len(self._st.inputs)

    def _get_num_outputs(self):
        return len(self._st.outputs)

    def _get_num_ranks(self):
        return self._st.props.get("num_ranks", 1)

    def _m_get_input(self, index):
        return self._st.slot(int(index))

    def _m_get_output(self, index):
        index = int(index)
        return self._st.outputs[index] if 0 <= index < len(self._st.outputs) else None

    def _m_get_output_type(self, index):
        return self._st.outputs[int(index)]._dtype

    def _m_set_input(self, index, tensor):
        self._st.set_input(index, tensor)

    def _get_attention(self):
        return self._st.attention

    # Layer-specific properties whose value lives elsewhere or has a computed default.
    def _get_first_transpose(self):
        return SimDims(self._st.props.get("first_transpose") or range(8))  # identity over Dims.MAX_DIMS

    def _get_second_transpose(self):
        return SimDims(self._st.props.get("second_transpose") or range(8))

    def _get_weights(self):
        return self._st.props["weights_array"]

    def _set_weights(self, value):
        array = value._array if isinstance(value, SimWeights) else np.asarray(value)
        self._st.props.update(weights_array=array.copy(), weights_dtype=dtypes.from_numpy(self._sim.real, array.dtype))

    def _get_update_lengths(self):
        return self._st.slot(3)

    def _set_update_lengths(self, tensor):
        self._st.set_input(3, tensor)


class RecAttention(Recorded):
    """IAttention: not a layer itself; it owns an ATTENTION_INPUT and an ATTENTION_OUTPUT layer
    (NvInfer.h, IAttentionBoundaryLayer). Its optional tensors are inputs 3..6 of the input layer."""

    SLOTS = {"mask": 3, "normalization_quantize_scale": 4, "query_lengths": 5, "key_value_lengths": 6}

    def __init__(self, sim, net, in_st: LayerState, out_st: LayerState, props: dict, name: str):
        super().__init__(sim, "IAttention")
        self._net = net
        self._in = in_st
        self._out = out_st
        self._props.update(props)
        self._name = name
        self._metadata = ""

    def _label(self):
        return f"'{self._name}'"

    def slot(self, name):
        return self._in.slot(self.SLOTS[name])

    def _get_mask(self):
        return self.slot("mask")

    def _set_mask(self, tensor):
        self._in.set_input(3, tensor)

    def _get_normalization_quantize_scale(self):
        return self.slot("normalization_quantize_scale")

    def _set_normalization_quantize_scale(self, tensor):
        self._in.set_input(4, tensor)

    def _get_query_lengths(self):
        return self.slot("query_lengths")

    def _set_query_lengths(self, tensor):
        self._in.set_input(5, tensor)

    def _get_key_value_lengths(self):
        return self.slot("key_value_lengths")

    def _set_key_value_lengths(self, tensor):
        self._in.set_input(6, tensor)

    def _get_causal(self):
        return self._props["causal_kind"].name != "NONE"

    def _set_causal(self, value):
        # Deprecated in 10.16: true maps to UPPER_LEFT, false to NONE (NvInfer.h).
        warnings.warn("IAttention.causal is deprecated; use causal_kind", DeprecationWarning, stacklevel=3)
        kinds = self._sim.real.CausalMaskKind
        self._props["causal_kind"] = kinds.UPPER_LEFT if value else kinds.NONE

    def _get_name(self):
        return self._name

    def _set_name(self, value):
        self._name = value

    def _get_metadata(self):
        return self._metadata

    def _set_metadata(self, value):
        self._metadata = value

    def _get_num_inputs(self):
        return 3

    def _get_num_outputs(self):
        return 1

    def _m_get_input(self, index):
        index = int(index)
        return self._in.slot(index) if 0 <= index < 3 else None

    def _m_set_input(self, index, tensor):
        index = int(index)
        if not 0 <= index < 3:
            return False  # the C++ API returns false; 3.. are set through properties
        self._in.set_input(index, tensor)
        return True

    def _m_get_output(self, index):
        return self._out.outputs[0] if int(index) == 0 else None
