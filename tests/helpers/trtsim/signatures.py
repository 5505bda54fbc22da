"""pybind11 signatures of the real TensorRT bindings, parsed from their docstrings.

pybind11 writes every overload's signature as the first line of the docstring:
    add_attention_v2(self: tensorrt_bindings.tensorrt.INetworkDefinition, query: ...ITensor, ...) -> ...IAttention
and for overloaded functions one numbered line per overload after "Overloaded function.". Property
getters and setters carry "(arg0: Owner, arg1: Type) -> None". That is enough to check a call the
way pybind11 would dispatch it: argument count, keyword names and types.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PREFIX = "tensorrt_bindings.tensorrt."
_LINE = re.compile(r"^(?:\d+\.\s+)?(?P<name>[A-Za-z_]\w*)?\((?P<params>.*)\)\s*->\s*(?P<ret>.+)$")


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    has_default: bool = False
    default: str | None = None


@dataclass(frozen=True)
class Signature:
    name: str
    params: tuple[Param, ...]  # without self / arg0
    returns: str
    text: str = field(compare=False)

    def __str__(self) -> str:
        return self.text


def short_type(type_str: str) -> str:
    """'tensorrt_bindings.tensorrt.ILogger.Severity' -> 'ILogger.Severity'; C++ names that pybind11
    did not know at docstring time ('nvinfer1::v_1_0::IErrorRecorder') -> 'IErrorRecorder'."""
    type_str = type_str.strip()
    if type_str.startswith(PREFIX):
        return type_str[len(PREFIX):]
    if "::" in type_str:
        name = type_str.rsplit("::", 1)[1]
        return {"IBuilder": "Builder", "IParserError": "ParserError"}.get(name, name)
    return type_str


def _split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside brackets: defaults like <DataType.FLOAT: 0> and Sequence[X] stay whole."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "[(<":
            depth += 1
        elif ch in "])>":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    tail = text[start:]
    if tail.strip():
        parts.append(tail)
    return [p.strip() for p in parts]


def _parse_param(text: str) -> Param:
    name, _, rest = text.partition(":")
    type_str, eq, default = rest.partition(" = ")
    return Param(name.strip(), type_str.strip(), bool(eq), default.strip() if eq else None)


def parse_line(line: str) -> Signature | None:
    m = _LINE.match(line.strip())
    if not m:
        return None
    params = [_parse_param(p) for p in _split_top_level(m.group("params"))]
    if params and params[0].name in ("self", "arg0"):
        params = params[1:]
    return Signature(m.group("name") or "", tuple(params), m.group("ret").strip(), line.strip())


def parse_signatures(doc: str | None, name: str | None = None) -> list[Signature]:
    """Every overload in a pybind11 docstring (empty when there is none)."""
    if not doc:
        return []
    lines = doc.splitlines()
    if len(lines) > 1 and lines[1].strip() == "Overloaded function.":
        found = []
        for line in lines[2:]:
            if re.match(r"^\d+\.\s", line.strip()):
                sig = parse_line(line)
                if sig and (name is None or sig.name == name):
                    found.append(sig)
        return found
    sig = parse_line(lines[0])
    return [sig] if sig else []


def sequence_item_type(type_str: str) -> str | None:
    m = re.match(r"^(?:collections\.abc\.Sequence|list|typing\.List|collections\.abc\.Iterable)\[(.*)\]$", type_str)
    return m.group(1) if m else None
