"""Simulation: the checker behind every recorded object (member lookup against the real bindings, argument matching,
the call log, problems TensorRT would log)."""

from __future__ import annotations

import difflib
import inspect
import re

import numpy as np

from . import dtypes
from .errors import (
    ArgumentError,
    MissingMemberError,
    NetworkError,
    NotEmulatedError,
)
from .objects import RecLayer, Recorded, SimWeights, display_name
from .signatures import Signature, parse_signatures, sequence_item_type, short_type
from .values import (
    MISSING,
    SUCCESS_PREFIXES,
    ApiCall,
    SimDims,
    fmt,
    is_enum_class,
    is_enum_member,
)


class Simulation:
    """State shared by everything one `checked()` module creates: the real module, the call log,
    the problems TensorRT would only have logged, and the checking machinery."""

    def __init__(self, real):
        self.real = real
        self.version = getattr(real, "__version__", "?")
        self.log: list[ApiCall] = []
        self.problems: list[str] = []
        self._enum_by_name = self._index_enums()
        self.ILogger, self.Logger, self.IProgressMonitor = make_subclassable(self)

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
        attr = getattr(self.real_class(obj._cls), name, MISSING)
        if attr is MISSING:
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
        attr = getattr(self.real_class(obj._cls), name, MISSING)
        if attr is MISSING:
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
        old = obj._props.get(name, MISSING)
        obj._props[name] = value
        after = getattr(obj, "_after_set", None)
        if after is not None:
            try:
                after(name)
            except NetworkError:
                # A rejected value leaves the layer as it was (TensorRT rejects it at the call).
                if old is MISSING:
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
        if returns == "bool" and name.startswith(SUCCESS_PREFIXES):
            return True
        if owner == "INetworkDefinition" and name.startswith("add_") and hasattr(self.real, returns):
            return obj._add_generic(returns, bound)
        raise NotEmulatedError(f"trtsim does not emulate {owner}.{name} (valid in tensorrt {self.version}, "
                               f"returns {returns}); add it to the recorded class in tests/trtsim "
                               "(objects.py, network.py, builder.py)")

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


class SimClass:
    """Stands in for a real class: isinstance() works on recorded objects, class attributes (enums,
    constants) read through, and calling it constructs a recording object when trtsim can."""

    def __init__(self, sim: Simulation, name: str, factory=None):
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
        value = getattr(self._sim.real_class(self._name), name, MISSING)
        if value is MISSING:
            self._sim.missing(self._name, name)
        return value


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


def make_subclassable(sim: Simulation):
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
