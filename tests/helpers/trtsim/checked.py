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

import inspect

import numpy as np

from . import dtypes
from .builder import RecBuilder
from .errors import (
    ArgumentError,
    NotEmulatedError,
)
from .objects import SimWeights
from .parser import RecParser
from .signatures import parse_signatures, short_type
from .simulation import SimClass, Simulation
from .values import (
    MISSING,
    SUCCESS_PREFIXES,
    SimDims,
    is_enum_class,
    is_enum_member,
)


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
        value = getattr(sim.real, name, MISSING)
        if value is MISSING or name.startswith("_"):
            if value is MISSING:
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
            if returns == "bool" and name.startswith(SUCCESS_PREFIXES):
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
