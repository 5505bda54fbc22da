"""Small values of the checked stand-in: dims, the call record, formatting, the engine that is never built."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


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
    if hasattr(value, "_label"):  # a recorded object (objects.Recorded)
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


MISSING = object()
SUCCESS_PREFIXES = ("set_", "mark_", "unmark_", "clear_", "reset", "init_")
