"""`checked(real_trt)`: a stand-in for the `tensorrt` module that checks every use against the real
bindings and records it, so builder code can run (and be tested) on a machine without TensorRT.

- Enums and DataType members are the real ones (`trt.CausalMaskKind.LOWER_RIGHT` is a real member;
  a missing member raises AttributeError).
- Classes the builder instantiates or subclasses (Builder, Logger, ILogger, OnnxParser,
  IProgressMonitor, Weights, Dims*, Permutation) are recording fakes; every other class is a
  stand-in that supports isinstance() and class-attribute reads only.
- Every method call and property read or write on a recorded object (network, layers, tensors,
  attention, builder, config, profile, parser) is checked against the real class: the member must
  exist, a call must match one of the pybind11 overloads parsed from the real docstring (count,
  keyword names, types), a write must target a settable property with a value of its setter's type.
- Nothing real is ever called: the real module is only read (classes, enums, docstrings).

The network semantics (inputs, outputs, layers, their inputs and outputs, shapes, dtypes) are
emulated closely enough for `execute.run` to evaluate the network with numpy and ONNX Runtime.
`trt.sim` holds the call log (`trt.sim.log`, `trt.sim.used()`, `trt.sim.format_log()`) and the
problems TensorRT would only have logged (`trt.sim.problems`).
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
import warnings
from dataclasses import dataclass, field

import numpy as np

from . import dtypes, shapes
from .errors import ArgumentError, BuildValidationError, MissingMemberError, NetworkError, NotEmulatedError
from .signatures import Signature, parse_signatures, sequence_item_type, short_type


# --------------------------------------------------------------------------- small values


class SimDims(tuple):
    """What trtsim returns for Dims/Permutation: a tuple (len, indexing, iteration work as on Dims)."""

    def __repr__(self) -> str:
        return f"Dims{tuple(self)}"


class NotAnEngine:
    """Returned by build_serialized_network: trtsim records networks; it never builds engines.

    It is truthy (so "if engine is None" checks pass) but is not bytes-like, so it cannot be
    written to disk as if it were an engine.
    """

    def __init__(self, network, config):
        self.network = network
        self.config = config

    def __repr__(self) -> str:
        return "<NotAnEngine: trtsim records networks, it never builds engines>"

    def __bytes__(self):
        raise TypeError("NotAnEngine: trtsim never builds engines; there are no bytes to serialise")


class _LayerKindMarker:
    """`layer.type` of the opaque ONNX layer: TensorRT has no LayerType for it."""

    name = "ONNX_SUBGRAPH"

    def __repr__(self) -> str:
        return "<trtsim LayerType ONNX_SUBGRAPH (not a real trt.LayerType)>"


ONNX_SUBGRAPH = _LayerKindMarker()


def is_enum_class(obj) -> bool:
    return isinstance(obj, type) and hasattr(obj, "__members__")


def is_enum_member(obj) -> bool:
    return is_enum_class(type(obj))


def fmt(value) -> str:
    if isinstance(value, Recorded):
        return repr(value)
    if is_enum_member(value):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, np.ndarray):
        return f"array({value.dtype}, shape={value.shape})"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes>"
    if isinstance(value, SimDims):
        return repr(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(fmt(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    return repr(value)


@dataclass
class ApiCall:
    """One use of the TensorRT API. kind: new | call | get | set | missing."""

    owner: str
    member: str
    kind: str
    args: dict = field(default_factory=dict)
    result: object = None

    @property
    def api(self) -> str:
        return f"{self.owner}.{self.member}"

    def __str__(self) -> str:
        if self.kind == "get":
            return f"{self.api} -> {fmt(self.result)}"
        if self.kind == "set":
            return f"{self.api} = {fmt(self.args.get('value'))}"
        if self.kind == "missing":
            return f"{self.api}  !! no such member in TensorRT"
        args = ", ".join(f"{k}={fmt(v)}" for k, v in self.args.items())
        return f"{self.api}({args}) -> {fmt(self.result)}"


_MISSING = object()
_SUCCESS_PREFIXES = ("set_", "mark_", "unmark_", "clear_", "reset", "init_")


# --------------------------------------------------------------------------- recorded objects


class Recorded:
    """Base of every recording object. Public attribute access goes through the checker; the
    implementation lives in underscore members (_m_<method>, _get_<prop>, _set_<prop>)."""

    def __init__(self, sim: "Simulation", cls: str):
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
            raise ArgumentError(f"add_constant: numpy dtype {array.dtype} has no TensorRT DataType (cast to float32/float16/int32/...)")
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

    def _m_add_rotary_embedding(self, input, cos_cache, sin_cache, interleaved, rotary_embedding_dim):
        if int(rotary_embedding_dim) < 0 or int(rotary_embedding_dim) % 2:
            raise NetworkError(f"add_rotary_embedding: rotary_embedding_dim must be non-negative and even, got {rotary_embedding_dim}")
        props = {"interleaved": bool(interleaved), "rotary_embedding_dim": int(rotary_embedding_dim)}
        return self._layer_handle("IRotaryEmbeddingLayer", [input, cos_cache, sin_cache], props)


class RecProfile(Recorded):
    def __init__(self, sim):
        super().__init__(sim, "IOptimizationProfile")
        self._shapes: dict[str, tuple] = {}
        self._shape_values: dict[str, tuple] = {}

    def _m_set_shape(self, input, min, opt, max):
        dims = [tuple(int(d) for d in x) for x in (min, opt, max)]
        if len({len(d) for d in dims}) != 1:
            raise NetworkError(f"set_shape('{input}'): min/opt/max ranks differ: {dims}")
        if not all(a <= b <= c for a, b, c in zip(*dims)):
            raise NetworkError(f"set_shape('{input}'): need min <= opt <= max per axis, got {dims}")
        if any(d < 0 for d in dims[0]):
            raise NetworkError(f"set_shape('{input}'): profile dimensions must be non-negative, got {dims}")
        self._shapes[input] = tuple(SimDims(d) for d in dims)

    def _m_get_shape(self, input):
        return list(self._shapes[input]) if input in self._shapes else []

    def _m_set_shape_input(self, input, min, opt, max):
        self._shape_values[input] = (list(min), list(opt), list(max))

    def _m_get_shape_input(self, input):
        return list(self._shape_values.get(input, []))


class RecTimingCache(Recorded):
    def __init__(self, sim, data: bytes):
        super().__init__(sim, "ITimingCache")
        self._data = bytes(data)

    def _m_serialize(self):
        return NotAnEngine(None, None)  # nothing real to serialise; not bytes-like on purpose

    def _m_combine(self, input_cache, ignore_mismatch):
        return True

    def _m_reset(self):
        return True


class RecConfig(Recorded):
    def __init__(self, sim):
        super().__init__(sim, "IBuilderConfig")
        real = sim.real
        self._flags = 0
        self._pools = {}
        self._profiles: list[RecProfile] = []
        self._timing_cache = None
        self._preview = {}
        self._tactic_sources = None
        self._props.update(
            profiling_verbosity=real.ProfilingVerbosity.LAYER_NAMES_ONLY,  # NvInfer.h default
            builder_optimization_level=3,
            progress_monitor=None,
        )

    def _m_set_flag(self, flag):
        self._flags |= 1 << int(flag)

    def _m_clear_flag(self, flag):
        self._flags &= ~(1 << int(flag))

    def _m_get_flag(self, flag):
        return bool(self._flags >> int(flag) & 1)

    def _get_flags(self):
        return self._flags

    def _set_flags(self, value):
        self._flags = int(value)

    def _m_set_memory_pool_limit(self, pool, pool_size):
        if int(pool_size) < 0:
            raise ArgumentError(f"set_memory_pool_limit: pool size must be non-negative, got {pool_size}")
        self._pools[pool.name] = int(pool_size)

    def _m_get_memory_pool_limit(self, pool):
        if pool.name not in self._pools:
            raise NotEmulatedError(f"trtsim does not know the default {pool.name} pool limit (it depends on the GPU)")
        return self._pools[pool.name]

    def _m_add_optimization_profile(self, profile):
        self._profiles.append(profile)
        return len(self._profiles) - 1

    def _get_num_optimization_profiles(self):
        return len(self._profiles)

    def _m_create_timing_cache(self, serialized_timing_cache):
        return RecTimingCache(self._sim, bytes(serialized_timing_cache))

    def _m_set_timing_cache(self, cache, ignore_mismatch):
        self._timing_cache = cache
        return True

    def _m_get_timing_cache(self):
        return self._timing_cache

    def _m_set_preview_feature(self, feature, enable):
        self._preview[feature.name] = bool(enable)

    def _m_get_preview_feature(self, feature):
        if feature.name not in self._preview:
            raise NotEmulatedError(f"trtsim does not know the default of preview feature {feature.name}")
        return self._preview[feature.name]

    def _m_set_tactic_sources(self, tactic_sources):
        self._tactic_sources = int(tactic_sources)
        return True

    def _m_get_tactic_sources(self):
        if self._tactic_sources is None:
            raise NotEmulatedError("trtsim does not know the default tactic sources")
        return self._tactic_sources


class RecBuilder(Recorded):
    def __init__(self, sim, logger):
        super().__init__(sim, "Builder")
        self._logger = logger
        self._networks = []

    def _get_logger(self):
        return self._logger

    def _m_create_network(self, flags=0):
        known = sum(1 << int(m) for m in self._sim.real.NetworkDefinitionCreationFlag.__members__.values())
        if int(flags) & ~known:
            raise ArgumentError(f"create_network: flags {flags:#x} set bits that are not NetworkDefinitionCreationFlag values")
        network = RecNetwork(self._sim, self, flags)
        self._networks.append(network)
        return network

    def _m_create_builder_config(self):
        return RecConfig(self._sim)

    def _m_create_optimization_profile(self):
        return RecProfile(self._sim)

    def _m_build_serialized_network(self, network, config, kernel_text=None):
        from .validate import validate_build

        problems = validate_build(self._sim, network, config)
        if problems:
            for message in problems:
                self._sim.log_to(self._logger, "ERROR", message)
            raise BuildValidationError("the network would not build:\n  " + "\n  ".join(problems))
        monitor = config._props.get("progress_monitor")
        if monitor is not None:
            # Exercise the builder's monitor the way a build would (phase_start, step_complete, phase_finish).
            phase = "trtsim: recording only, nothing is built"
            monitor.phase_start(phase, None, 1)
            keep_going = monitor.step_complete(phase, 0)
            monitor.phase_finish(phase)
            if keep_going is False:
                return None  # a real build is cancelled when step_complete returns False
        return NotAnEngine(network, config)


class RecParserError(Recorded):
    def __init__(self, sim, code, desc, node=-1, node_name="", node_operator=""):
        super().__init__(sim, "ParserError")
        self._code, self._desc = code, desc
        self._node, self._node_name, self._node_operator = node, node_name, node_operator

    def _label(self):
        return f"{self._code.name}: {self._desc}"

    def __str__(self):
        return f"{self._code.name}: {self._desc}"

    def _m_code(self):
        return self._code

    def _m_desc(self):
        return self._desc

    def _m_file(self):
        return "trtsim"

    def _m_line(self):
        return 0

    def _m_func(self):
        return "parse"

    def _m_node(self):
        return self._node

    def _m_node_name(self):
        return self._node_name

    def _m_node_operator(self):
        return self._node_operator

    def _m_local_function_stack(self):
        return []

    def _m_local_function_stack_size(self):
        return 0


@dataclass
class OnnxPart:
    """A parsed ONNX model: the opaque layer's input i is graph input `inputs[i]`, output j is `outputs[j]`."""

    model: object  # onnx.ModelProto
    inputs: list[str]
    outputs: list[str]
    path: str | None = None
    input_types: dict = field(default_factory=dict)  # graph input name -> (DataType, dims)


class RecParser(Recorded):
    """OnnxParser: adds ONE opaque layer per parsed model (see the module docstring)."""

    def __init__(self, sim, network, logger):
        super().__init__(sim, "OnnxParser")
        self._net = network
        self._logger = logger
        self._errors: list[RecParserError] = []
        self._props["flags"] = 0

    def _error(self, code: str, message: str, node=-1, node_name="", node_operator=""):
        err = RecParserError(self._sim, self._sim.real.ErrorCode.__members__[code], message, node, node_name, node_operator)
        self._errors.append(err)
        self._sim.log_to(self._logger, "ERROR", f"ONNX parser: {message}")
        return False

    def _m_parse(self, model, path=None):
        import onnx

        try:
            proto = onnx.load_from_string(bytes(model))
            if path:
                from onnx.external_data_helper import load_external_data_for_model

                load_external_data_for_model(proto, os.path.dirname(os.path.abspath(path)))
        except Exception as error:  # noqa: BLE001 - the parser reports, it does not raise
            return self._error("MODEL_DESERIALIZE_FAILED", f"cannot read the model: {error}")
        return self._add_model(proto, path)

    def _m_parse_from_file(self, model):
        try:
            with open(model, "rb") as f:
                data = f.read()
        except OSError as error:
            return self._error("MODEL_DESERIALIZE_FAILED", f"cannot read {model}: {error}")
        return self._m_parse(data, model)

    def _add_model(self, proto, path) -> bool:
        import onnx

        real = self._sim.real
        graph = proto.graph
        if any(not o.type.tensor_type.HasField("shape") for o in graph.output):
            try:
                proto = onnx.shape_inference.infer_shapes(proto)
                graph = proto.graph
            except Exception:  # noqa: BLE001 - outputs without shapes are reported below
                pass
        initializers = {init.name for init in graph.initializer}
        inputs = [vi for vi in graph.input if vi.name not in initializers]

        def describe(vi):
            tensor_type = vi.type.tensor_type
            dtype = dtypes.from_onnx(real, tensor_type.elem_type)
            if dtype is None:
                return None, None, f"tensor '{vi.name}' has element type {tensor_type.elem_type}, which TensorRT does not support"
            if not tensor_type.HasField("shape"):
                return None, None, f"tensor '{vi.name}' has no shape (TensorRT needs the rank)"
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim]
            return dtype, dims, None

        described = {}
        for vi in list(inputs) + list(graph.output):
            dtype, dims, problem = describe(vi)
            if problem:
                return self._error("UNSUPPORTED_GRAPH", problem)
            described[vi.name] = (dtype, dims)
        existing = {t._name for t in self._net._inputs}
        clash = [vi.name for vi in inputs if vi.name in existing]
        if clash:
            return self._error("INVALID_GRAPH", f"the network already has inputs named {clash}")

        tensors = [self._net._new_input(vi.name, *described[vi.name]) for vi in inputs]
        part = OnnxPart(proto, [vi.name for vi in inputs], [vo.name for vo in graph.output], path,
                        {vi.name: described[vi.name] for vi in inputs})
        st = self._net._add_layer("ONNX", tensors, n_outputs=len(graph.output))
        st.onnx = part
        st.name = f"ONNX subgraph '{graph.name}'"
        for out, vo in zip(st.outputs, graph.output):
            out._name = vo.name
            out._dtype, dims = described[vo.name]
            out._shape = tuple(dims)
            self._net._m_mark_output(out)
        return True

    def _get_num_errors(self):
        return len(self._errors)

    def _m_get_error(self, index):
        index = int(index)
        return self._errors[index] if 0 <= index < len(self._errors) else None

    def _m_clear_errors(self):
        self._errors.clear()

    def _m_set_flag(self, flag):
        self._props["flags"] |= 1 << int(flag)

    def _m_clear_flag(self, flag):
        self._props["flags"] &= ~(1 << int(flag))

    def _m_get_flag(self, flag):
        return bool(self._props["flags"] >> int(flag) & 1)


# --------------------------------------------------------------------------- the module stand-in


class SimClass:
    """Stands in for a real class: isinstance() works on recorded objects, class attributes (enums,
    constants) read through, and calling it constructs a recording object when trtsim can."""

    def __init__(self, sim: "Simulation", name: str, factory=None):
        self._sim = sim
        self._name = name
        self._factory = factory

    def __repr__(self) -> str:
        return f"<trtsim stand-in for tensorrt.{self._name}>"

    def __call__(self, *args, **kwargs):
        sim = self._sim
        real = sim.real_class(self._name)
        if self._factory is None:
            if parse_signatures(getattr(real.__init__, "__doc__", None), "__init__"):
                raise NotEmulatedError(f"trtsim does not emulate constructing tensorrt.{self._name}")
            raise TypeError(f"tensorrt.{self._name}: No constructor defined! (TensorRT creates these objects)")
        sig, bound = sim.match(self._name, parse_signatures(real.__init__.__doc__, "__init__"), args, kwargs)
        call = sim.record(self._name, "__init__", "new", bound)
        call.result = self._factory(sig, **bound)
        return call.result

    def __instancecheck__(self, obj) -> bool:
        if not isinstance(obj, Recorded):
            return False
        return issubclass(self._sim.real_class(obj._cls), self._sim.real_class(self._name))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = getattr(self._sim.real_class(self._name), name, _MISSING)
        if value is _MISSING:
            self._sim.missing(self._name, name)
        return value


class Simulation:
    """State shared by everything one `checked()` module creates: the real module, the call log,
    the problems TensorRT would only have logged, and the checking machinery."""

    def __init__(self, real):
        self.real = real
        self.version = getattr(real, "__version__", "?")
        self.log: list[ApiCall] = []
        self.problems: list[str] = []
        self._enum_by_name = self._index_enums()
        self.ILogger, self.Logger, self.IProgressMonitor = _make_subclassable(self)

    # --- reporting
    def record(self, owner, member, kind, args=None, result=None) -> ApiCall:
        call = ApiCall(owner, member, kind, dict(args or {}), result)
        self.log.append(call)
        return call

    def used(self) -> list[str]:
        """Every TensorRT API used ('Class.member'), sorted: the builder's API surface."""
        return sorted({c.api for c in self.log if c.kind != "missing"})

    def format_log(self) -> str:
        return "\n".join(str(c) for c in self.log)

    def log_to(self, logger, severity: str, message: str) -> None:
        if logger is not None and hasattr(logger, "log"):
            logger.log(self.real.ILogger.Severity.__members__[severity], message)

    def problem(self, builder, message: str) -> None:
        """Something TensorRT reports on its logger and then ignores."""
        self.problems.append(message)
        self.log_to(getattr(builder, "_logger", None), "WARNING", message)

    def missing(self, owner: str, name: str):
        self.record(owner, name, "missing")
        real = self.real_class(owner) if owner != "tensorrt" else self.real
        candidates = [n for n in dir(real) if not n.startswith("_")]
        close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
        hint = ""
        if close:
            kinds = ["property" if isinstance(getattr(real, c, None), property) else "member" for c in close]
            hint = "; did you mean " + " or ".join(f"the {k} '{c}'" for k, c in zip(kinds, close)) + "?"
        raise MissingMemberError(f"tensorrt {self.version}: {owner} has no attribute '{name}'{hint}")

    # --- real classes and enums
    def real_class(self, name: str):
        obj = self.real
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj

    def layer_type(self, kind: str):
        """IKVCacheUpdateLayer -> LayerType.KV_CACHE_UPDATE, by name with underscores ignored."""
        wanted = display_name(kind).replace("_", "").upper()
        for name, member in self.real.LayerType.__members__.items():
            if name.replace("_", "") == wanted:
                return member
        raise NotEmulatedError(f"no trt.LayerType matches {kind}")

    def _index_enums(self) -> dict:
        found = {}
        for name in dir(self.real):
            obj = getattr(self.real, name, None)
            if is_enum_class(obj):
                found[name] = obj
            elif isinstance(obj, type):
                for inner in vars(obj).values():
                    if is_enum_class(inner):
                        found.setdefault(inner.__name__, inner)
        return found

    def default_value(self, text: str):
        m = re.fullmatch(r"<(\w+)\.(\w+): -?\d+>", text)
        if m and m.group(1) in self._enum_by_name:
            return self._enum_by_name[m.group(1)].__members__[m.group(2)]
        literals = {"None": None, "True": True, "False": False}
        if text in literals:
            return literals[text]
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            return text.strip("'\"")

    # --- checking
    def accepts(self, type_str: str, value, allow_none: bool = False) -> str | None:
        """None when pybind11 would accept `value` for a parameter of `type_str`, else why not."""
        t = short_type(type_str)
        if value is None:
            return None if allow_none else "None is not accepted here"
        if t == "object":
            return None
        if t in ("typing.SupportsInt", "int"):
            if isinstance(value, (bool, np.bool_)):
                return f"got bool {value!r} where an int is expected"
            if is_enum_member(value):
                # pybind11 would take the enum's index; for bit-mask parameters that is a silent bug.
                return f"got enum member {fmt(value)} where an int is expected (flags are bit masks: 1 << int(flag))"
            return None if isinstance(value, (int, np.integer)) else f"got {type(value).__name__} where an int is expected"
        if t in ("typing.SupportsFloat", "float"):
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
                return f"got {type(value).__name__} where a float is expected"
            return None
        if t == "bool":
            return None if isinstance(value, (bool, np.bool_)) else f"got {type(value).__name__} where a bool is expected"
        if t == "str":
            return None if isinstance(value, str) else f"got {type(value).__name__} where a str is expected"
        if t in ("typing_extensions.Buffer", "bytes", "buffer"):
            return None if isinstance(value, (bytes, bytearray, memoryview, np.ndarray)) else (
                f"got {type(value).__name__} where a bytes-like object is expected")
        if t == "numpy.ndarray":
            return None if isinstance(value, np.ndarray) else f"got {type(value).__name__} where a numpy array is expected"
        item = sequence_item_type(t)
        if item is not None:
            if not isinstance(value, (list, tuple)):
                return f"got {type(value).__name__} where a sequence of {short_type(item)} is expected"
            for i, v in enumerate(value):
                reason = self.accepts(item, v)
                if reason:
                    return f"item {i}: {reason}"
            return None
        if t in ("Dims", "Dims2", "Dims3", "Dims4", "DimsHW", "Permutation"):
            if not isinstance(value, (tuple, list)) or any(
                    isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) for d in value):
                return f"got {fmt(value)} where {t} (a tuple of ints) is expected"
            rank = {"Dims2": 2, "Dims3": 3, "Dims4": 4, "DimsHW": 2}.get(t)
            if rank is not None and len(value) != rank:
                return f"{t} needs {rank} dimensions, got {len(value)}"
            return None
        if t == "Weights":
            if isinstance(value, SimWeights):
                return None
            if isinstance(value, np.ndarray):
                if value.dtype not in dtypes.WEIGHTS:
                    return (f"numpy dtype {value.dtype} cannot become Weights (the bindings take float32, float16, "
                            f"int64, int32, int8, bool and uint8 arrays; make a float32 constant and cast it)")
                return None
            return f"got {type(value).__name__} where Weights or a numpy array is expected"
        if t in ("ILogger", "Logger", "typing_extensions.CapsuleType"):
            return None if isinstance(value, self.ILogger) else f"got {type(value).__name__} where a tensorrt ILogger is expected"
        if t == "IProgressMonitor":
            return None if isinstance(value, self.IProgressMonitor) else (
                f"got {type(value).__name__} where a tensorrt IProgressMonitor subclass instance is expected")
        try:
            real = self.real_class(t) if "." in t or hasattr(self.real, t) else self._enum_by_name[t]
        except (AttributeError, KeyError):
            raise NotEmulatedError(f"trtsim cannot check values of type {type_str}") from None
        if is_enum_class(real):
            return None if isinstance(value, real) else f"got {fmt(value)} where a {t} member is expected"
        if isinstance(real, type):
            if isinstance(value, Recorded) and issubclass(self.real_class(value._cls), real):
                return None
            return f"got {fmt(value)} where a {t} is expected"
        raise NotEmulatedError(f"trtsim cannot check values of type {type_str}")

    def bind(self, sig: Signature, args, kwargs) -> dict:
        params = sig.params
        if len(args) > len(params):
            raise _Mismatch(f"takes {len(params)} arguments, got {len(args)}")
        bound, explicit = {}, set()
        for p, a in zip(params, args):
            bound[p.name] = a
            explicit.add(p.name)
        names = {p.name for p in params}
        for key, value in kwargs.items():
            if key not in names or key.startswith("arg"):
                raise _Mismatch(f"unexpected keyword argument '{key}'")
            if key in bound:
                raise _Mismatch(f"got multiple values for '{key}'")
            bound[key] = value
            explicit.add(key)
        for p in params:
            if p.name not in bound:
                if not p.has_default:
                    raise _Mismatch(f"missing argument '{p.name}'")
                bound[p.name] = self.default_value(p.default)
        for p in params:
            if p.name in explicit:
                reason = self.accepts(p.type, bound[p.name], allow_none=(p.default == "None"))
                if reason:
                    raise _Mismatch(f"argument '{p.name}': {reason}")
        return {p.name: bound[p.name] for p in params}

    def match(self, where: str, sigs: list[Signature], args, kwargs):
        if not sigs:
            raise NotEmulatedError(f"{where}: the bindings give no signature to check against")
        reasons = []
        for sig in sigs:
            try:
                return sig, self.bind(sig, args, kwargs)
            except _Mismatch as mismatch:
                reasons.append(f"{sig.text}\n      -> {mismatch}")
        given = ", ".join([fmt(a) for a in args] + [f"{k}={fmt(v)}" for k, v in kwargs.items()])
        raise ArgumentError(f"{where}(): incompatible arguments ({given}); tensorrt {self.version} accepts:\n  "
                            + "\n  ".join(reasons))

    # --- member access on recorded objects
    def get_member(self, obj: Recorded, name: str):
        attr = getattr(self.real_class(obj._cls), name, _MISSING)
        if attr is _MISSING:
            self.missing(obj._cls, name)
        if isinstance(attr, property):
            hook = getattr(obj, "_get_" + name, None)
            if hook is not None:
                value = hook()
            elif name in obj._props:
                value = obj._props[name]
            else:
                raise NotEmulatedError(f"trtsim does not know {obj._cls}.{name}: it was never set and trtsim "
                                       f"does not emulate its default")
            self.record(obj._cls, name, "get", result=value)
            return value
        if callable(attr) and not is_enum_class(attr):
            def method(*args, **kwargs):
                return self.call_member(obj, name, args, kwargs)

            method.__name__ = name
            method.__qualname__ = f"{obj._cls}.{name}"
            return method
        return attr  # class-level constants

    def set_member(self, obj: Recorded, name: str, value) -> None:
        attr = getattr(self.real_class(obj._cls), name, _MISSING)
        if attr is _MISSING:
            self.missing(obj._cls, name)
        if not isinstance(attr, property):
            raise MissingMemberError(f"tensorrt {self.version}: {obj._cls}.{name} is a method, not a property; call it")
        if attr.fset is None:
            raise MissingMemberError(f"tensorrt {self.version}: {obj._cls}.{name} is a read-only property")
        sigs = parse_signatures(attr.fset.__doc__)
        if not sigs or len(sigs[0].params) != 1:
            raise NotEmulatedError(f"{obj._cls}.{name}: the bindings give no setter signature to check against")
        type_str = sigs[0].params[0].type
        reason = self.accepts(type_str, value, allow_none=short_type(type_str) == "ITensor")
        if reason:
            raise ArgumentError(f"{obj._cls}.{name} = {fmt(value)}: {reason} ({short_type(type_str)})")
        if short_type(type_str) in ("Dims", "Permutation"):
            value = SimDims(int(d) for d in value)
        self.record(obj._cls, name, "set", {"value": value})
        hook = getattr(obj, "_set_" + name, None)
        if hook is not None:
            hook(value)
            return
        old = obj._props.get(name, _MISSING)
        obj._props[name] = value
        after = getattr(obj, "_after_set", None)
        if after is not None:
            try:
                after(name)
            except NetworkError:
                # A rejected value leaves the layer as it was (TensorRT rejects it at the call).
                if old is _MISSING:
                    del obj._props[name]
                else:
                    obj._props[name] = old
                after(name)
                raise

    def call_member(self, obj: Recorded, name: str, args, kwargs):
        owner = obj._cls
        attr = getattr(self.real_class(owner), name)
        sig, bound = self.match(f"{owner}.{name}", parse_signatures(attr.__doc__, name), args, kwargs)
        call = self.record(owner, name, "call", bound)
        impl = getattr(obj, "_m_" + name, None)
        if impl is not None:
            result = impl(**bound)
        else:
            result = self._unemulated_call(obj, owner, name, sig, bound)
        if isinstance(result, Recorded):
            # What trtsim returns must be what the binding declares (guards trtsim itself).
            declared = self.real_class(short_type(sig.returns))
            assert issubclass(self.real_class(result._cls), declared), f"{owner}.{name} returned {result!r}"
        call.result = result
        return result

    def _unemulated_call(self, obj, owner, name, sig, bound):
        returns = short_type(sig.returns)
        if returns == "None":
            return None  # recorded; no state trtsim models changes
        if returns == "bool" and name.startswith(_SUCCESS_PREFIXES):
            return True
        if owner == "INetworkDefinition" and name.startswith("add_") and hasattr(self.real, returns):
            return obj._add_generic(returns, bound)
        raise NotEmulatedError(f"trtsim does not emulate {owner}.{name} (valid in tensorrt {self.version}, "
                               f"returns {returns}); add it to tests/trtsim/checked.py")

    def recast(self, obj: Recorded, target) -> None:
        """`layer.__class__ = trt.IShuffleLayer`: the bindings' way to downcast a layer from get_layer."""
        name = target._name if isinstance(target, SimClass) else getattr(target, "__name__", None)
        if name is None or not hasattr(self.real, name):
            raise TypeError(f"__class__ must be set to a tensorrt class, got {target!r}")
        actual = obj._st.kind if isinstance(obj, RecLayer) else obj._cls
        if actual == "ONNX":
            actual = "ILayer"
        if not issubclass(self.real_class(actual), self.real_class(name)):
            raise TypeError(f"cannot view a {actual} as {name}")
        self.record(obj._cls, "__class__", "set", {"value": name})
        object.__setattr__(obj, "_cls", name)


class _Mismatch(Exception):
    pass


def _check_overrides(sim, real_cls, cls) -> None:
    """A Python subclass of ILogger/IProgressMonitor must override real methods with matching arity."""
    for name, fn in vars(cls).items():
        if name.startswith("_") or not callable(fn):
            continue
        real_fn = getattr(real_cls, name, None)
        if real_fn is None:
            continue  # extra helpers are fine
        sigs = parse_signatures(real_fn.__doc__, name)
        arity = {len(s.params) for s in sigs}
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            continue
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        variadic = any(p.kind == p.VAR_POSITIONAL for p in params)
        required = [p for p in positional if p.default is p.empty]
        if not variadic and not any(len(required) - 1 <= n <= len(positional) - 1 for n in arity):
            raise ArgumentError(f"{cls.__name__}.{name}{inspect.signature(fn)} does not match tensorrt "
                                f"{real_cls.__name__}.{name}: {sigs[0].text if sigs else '?'}")


def _make_subclassable(sim: Simulation):
    """ILogger, Logger and IProgressMonitor: real Python classes the builder may subclass."""
    real = sim.real
    severity = real.ILogger.Severity

    class ILogger:
        Severity = severity

        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            _check_overrides(sim, real.ILogger, cls)

        def __init__(self):
            sim.record("ILogger", "__init__", "new", {}, self)

        def log(self, severity, msg):
            raise NotImplementedError("ILogger.log must be overridden")

    for key, member in severity.__members__.items():
        setattr(ILogger, key, member)

    class Logger(ILogger):
        """trt.Logger: keeps what TensorRT (or trtsim) logs in .messages instead of printing."""

        def __init__(self, min_severity=severity.WARNING):
            reason = sim.accepts("tensorrt_bindings.tensorrt.ILogger.Severity", min_severity)
            if reason:
                raise ArgumentError(f"Logger(min_severity={fmt(min_severity)}): {reason}")
            self.min_severity = min_severity
            self.messages: list[tuple] = []
            sim.record("Logger", "__init__", "new", {"min_severity": min_severity}, self)

        def log(self, severity, msg):
            self.messages.append((severity, msg))

        def __repr__(self):
            return f"<Logger min_severity={self.min_severity.name}>"

    class IProgressMonitor:
        def __init_subclass__(cls, **kwargs):
            super().__init_subclass__(**kwargs)
            _check_overrides(sim, real.IProgressMonitor, cls)

        def __init__(self):
            sim.record("IProgressMonitor", "__init__", "new", {}, self)

    for cls in (ILogger, Logger, IProgressMonitor):
        cls.__qualname__ = cls.__name__
        cls.__module__ = "trtsim.checked"
    return ILogger, Logger, IProgressMonitor


class CheckedTensorRT:
    """The module stand-in returned by checked(); `trt.sim` is the Simulation behind it."""

    def __init__(self, real):
        sim = Simulation(real)
        self.__dict__["sim"] = sim
        self.__dict__["__version__"] = sim.version
        self.__dict__["__name__"] = "trtsim.checked"
        factories = {
            "Builder": lambda sig, logger: RecBuilder(sim, logger),
            "OnnxParser": lambda sig, network, logger: RecParser(sim, network, logger),
            "Weights": self._weights,
            "Permutation": lambda sig, **b: SimDims(int(d) for d in (b.get("arg0") or ())),
        }
        for name, rank in (("Dims", None), ("Dims2", 2), ("Dims3", 3), ("Dims4", 4), ("DimsHW", 2)):
            factories[name] = self._dims_factory(name, rank)
        self.__dict__["_factories"] = factories
        self.__dict__["_cache"] = {"ILogger": sim.ILogger, "Logger": sim.Logger, "IProgressMonitor": sim.IProgressMonitor}

    def _weights(self, sig, **bound):
        sim = self.sim
        if "a" in bound:
            if np.asarray(bound["a"]).dtype not in dtypes.WEIGHTS:
                raise ArgumentError(f"Weights({np.asarray(bound['a']).dtype} array): the bindings convert only float32, "
                                    "float16, int64, int32, int8, bool and uint8 arrays")
            return SimWeights(sim, bound["a"])
        if "ptr" in bound:
            raise NotEmulatedError("Weights(type, ptr, count) reads raw memory; pass a numpy array instead")
        return SimWeights(sim, np.zeros(0, dtype=dtypes.to_numpy(bound["type"])))

    @staticmethod
    def _dims_factory(name, rank):
        def make(sig, **bound):
            dims = SimDims(int(d) for d in (bound["shape"] if "shape" in bound else bound.values()))
            if rank is not None and len(dims) != rank and bound:
                raise ArgumentError(f"{name} needs {rank} dimensions, got {tuple(dims)}")
            return dims
        return make

    def __getattr__(self, name):
        cache = self.__dict__["_cache"]
        if name in cache:
            return cache[name]
        sim = self.sim
        value = getattr(sim.real, name, _MISSING)
        if value is _MISSING or name.startswith("_"):
            if value is _MISSING:
                sim.missing("tensorrt", name)
            return value
        if inspect.ismodule(value):
            raise NotEmulatedError(f"trtsim does not expose tensorrt.{name} (a module: its functions would run for real)")
        if is_enum_class(value) or is_enum_member(value) or inspect.isfunction(value) or isinstance(value, (str, int)):
            result = value  # real enums and pure-Python helpers (volume, nptype) are safe to hand out
        elif isinstance(value, type):
            result = SimClass(sim, name, self._factories.get(name))
        elif callable(value):
            result = self._module_function(name, value)
        else:
            result = value
        cache[name] = result
        return result

    def _module_function(self, name, real_fn):
        sim = self.sim

        def function(*args, **kwargs):
            sig, bound = sim.match(name, parse_signatures(real_fn.__doc__, name), args, kwargs)
            call = sim.record("tensorrt", name, "call", bound)
            returns = short_type(sig.returns)
            if returns == "bool" and name.startswith(_SUCCESS_PREFIXES):
                call.result = True
                return True
            raise NotEmulatedError(f"trtsim does not emulate tensorrt.{name} (returns {returns})")

        function.__name__ = name
        return function

    def __setattr__(self, name, value):
        raise AttributeError(f"trtsim: do not assign tensorrt.{name}; the checked module is read-only")

    def __repr__(self) -> str:
        return f"<checked tensorrt {self.__version__} (trtsim: records, never builds)>"


def aliased_inputs(network) -> dict[str, str]:
    """Output name -> the input whose memory it reuses (the KV-cache update writes in place), like
    ICudaEngine.get_aliased_input_tensor for networks whose cache input is a network input."""
    found = {}
    for t in network._outputs:
        source = t._aliases
        while source is not None and source._aliases is not None:
            source = source._aliases
        if source is not None and source in network._inputs:
            found[t._name] = source._name
    return found


def checked(real_trt) -> CheckedTensorRT:
    """A fresh checked, recording stand-in for `real_trt` (the module from bindings.load_bindings)."""
    return CheckedTensorRT(real_trt)
