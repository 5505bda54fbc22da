"""Dim names and values of a model's inputs: every symbolic dim gets a value.

Dims written -1, '?' or '' (named after their place, `input_ids[1]`, by roles.py) and the exporters'
own symbols (torch.export's `s33`, ONNX Runtime's `unk__0`), which say nothing about which dims are
equal, are unified by position: axis 0 of every input is the batch, axis 1 of 2-D token ids, masks
and positions the sequence. (graph/dims.py finds dims the model runs on when these do not fit.)
"""

from __future__ import annotations

import ast
import operator
import re

import onnx

from .io import attach_weights, weights_aside
from .roles import InputSpec, RoleKind, declared_dims, dim_name, input_specs

DEFAULT_DIMS = {"batch": 2, "batch_size": 2, "seq": 8, "sequence": 8, "sequence_length": 8, "past": 6,
                "past_sequence_length": 6, "dec_seq": 5, "max_cache": 256}
DEFAULT_DIM = 8
BATCH, SEQ = "batch", "seq"  # the names of the unified batch and sequence dims
SEQUENCE_KINDS = (RoleKind.TOKEN_IDS, RoleKind.PADDING_MASK, RoleKind.POSITION_IDS)  # 2-D inputs whose axis 1 is the sequence
# torch.export, ONNX Runtime's symbolic shape inference and tf2onnx, paddle2onnx
_EXPORTER_SYMBOL = re.compile(r"^(s\d+|unk__\d+|DynamicDimension\.\d+)$")


def is_free(name: str) -> bool:
    """A dim name that says nothing about which dims are equal: anonymous or an exporter's symbol."""
    return name.endswith("]") or bool(_EXPORTER_SYMBOL.match(name))


def dim_classes(specs: list[InputSpec]) -> dict[str, str]:
    """Each free dim name -> the dim it stands for: the batch (axis 0 of any input), the sequence
    (axis 1 of 2-D token ids, masks and positions), or itself. The unified dims take the model's
    own name for that place when one input declares it (e.g. 'batch')."""
    parent: dict[str, str] = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    labels: dict[str, str] = {}
    for spec in specs:
        seq_axis = 1 if len(spec.shape) == 2 and spec.kind in SEQUENCE_KINDS else None
        for axis, d in enumerate(spec.shape):
            place = BATCH if axis == 0 else SEQ if axis == seq_axis else None
            if not isinstance(d, str):
                continue
            if not is_free(d):
                if place:
                    labels.setdefault(place, d)
                continue
            find(d)
            if place:
                parent[find(d)] = find("\0" + place)
    out = {}
    for name in parent:
        if name.startswith("\0"):
            continue
        root = find(name)
        out[name] = labels.get(root[1:], root[1:]) if root.startswith("\0") else root
    return out


def lengths_vary(specs: list[InputSpec]) -> bool:
    """Whether an input has a symbolic dim other than the batch (axis 0 of the inputs, and the dims unified
    with it): a length, a past length, an image size. Told by the model's inputs, not by the names shape
    inference gives the dims inside."""
    classes = dim_classes(specs)
    batch = {classes.get(s.shape[0], s.shape[0]) for s in specs if s.shape and isinstance(s.shape[0], str)}
    return any(isinstance(d, str) and classes.get(d, d) not in batch for s in specs for d in s.shape[1:])


def name_free_dims(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its inputs' free dims (-1, '?', unk__0, s33) written as the dims they stand
    for (batch, seq, ...), so that shape inference sees which dims are equal and -1 is gone; the
    model itself when there is nothing to name (never modified)."""
    classes = dim_classes(input_specs(model))
    if not classes or all(name == label for name, label in classes.items()):
        return model
    named = onnx.ModelProto()
    with weights_aside(model) as weights:  # copy the structure, not the weights
        named.CopyFrom(model)
    attach_weights(named, weights)
    inits = {i.name for i in named.graph.initializer}
    for vi in (v for v in named.graph.input if v.name not in inits):
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            name = dim_name(d, vi.name, axis)
            if isinstance(name, str) and name in classes:
                d.Clear()
                d.dim_param = classes[name]
    return named


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def evaluate(name: str, dims: dict[str, int], unknown: int | None = None) -> int | None:
    """A dim expression of known names ("past+seq", "((s50//80)-3)//2"), or None when it is not
    arithmetic or names a dim that is not in `dims` (those count as `unknown` when it is given)."""
    if name in dims:
        return dims[name]
    try:
        tree = ast.parse(name.replace(" ", ""), mode="eval").body
    except SyntaxError:
        return None

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and (node.id in dims or unknown is not None):
            return dims.get(node.id, unknown)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(name)

    try:
        return int(ev(tree))
    except (ValueError, ZeroDivisionError):
        return None


def names_in(dim: str) -> list[str]:
    """The dim names a symbolic dim stands on: the names in an arithmetic expression ("past+seq",
    "((s50//80)-3)//2"), else the dim itself, however it is spelled (paddle2onnx's "DynamicDimension.0")."""
    try:
        tree = ast.parse(dim.replace(" ", ""), mode="eval").body
    except SyntaxError:
        return [dim]
    nodes = list(ast.walk(tree))
    arithmetic = all(isinstance(n, (ast.Name, ast.BinOp, ast.Load, *_OPS)) or
                     (isinstance(n, ast.Constant) and isinstance(n.value, int)) for n in nodes)
    return list(dict.fromkeys(n.id for n in nodes if isinstance(n, ast.Name))) if arithmetic else [dim]


def dim_value(name: str | None, dims: dict[str, int]) -> int:
    """Value of a symbolic dim: a known name, or an expression of known names ("past+seq")."""
    if name is None:
        return DEFAULT_DIM
    value = evaluate(name, {**DEFAULT_DIMS, **dims}, unknown=DEFAULT_DIM)
    return value if value is not None else DEFAULT_DIMS.get(name, DEFAULT_DIM)


def resolve_dims(model: onnx.ModelProto, overrides: dict[str, int] | None = None, *,
                 specs: list[InputSpec] | None = None) -> dict[str, int]:
    """Every dim name the inputs use -> a value: the user's (`overrides`), the metadata's, the
    defaults. A value given for a unified dim, under its name or one of its members' names, holds
    for all its members. (`specs`: the model's input_specs, when the caller has them.)"""
    overrides = dict(overrides or {})
    declared = declared_dims(model)
    dims = {**DEFAULT_DIMS, **declared}
    specs = specs if specs is not None else input_specs(model)
    members: dict[str, list[str]] = {}
    for name, label in dim_classes(specs).items():
        members.setdefault(label, []).append(name)
    for label, names in members.items():
        value = next((src[k] for src in (overrides, declared) for k in [label, *names] if k in src),
                     DEFAULT_DIMS.get(label, DEFAULT_DIM))
        dims.update({k: value for k in [label, *names]})
    for d in (d for spec in specs for d in spec.shape if isinstance(d, str)):  # names in expressions too
        for name in ([d] if d in members or d in dims else names_in(d)):
            dims.setdefault(name, DEFAULT_DIM)
    dims.update(overrides)
    return dims
