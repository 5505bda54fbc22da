"""Realistic inputs for verification: token ids inside the vocabulary, padding masks with real
padding, positions, caches, flags; fixed seed.

What each input means comes from the model's `trtattn.inputs` metadata (written by the zoo) or,
for other models, from its name, dtype and how the graph uses it: an integer input that indexes an
embedding table is token ids (the table's rows are the vocabulary); a mask is True at the padding
when the graph fills the logits where it is True (masked_fill), at the tokens when it keeps them.

Dims: every symbolic dim of the inputs gets a value. Dims written -1, '?' or '' are named after
their place (`input_ids[1]`); those and the exporters' own symbols (torch.export's `s33`, ONNX
Runtime's `unk__0`), which say nothing about which dims are equal, are unified by position: axis 0
of every input is the batch, axis 1 of 2-D token ids, masks and positions the sequence.
(graph/dims.py finds dims the model runs on when these do not fit.)
"""

from __future__ import annotations

import ast
import json
import operator
import re
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import TrtattnError
from .io import attach_weights, weights_aside

DEFAULT_DIMS = {"batch": 2, "batch_size": 2, "seq": 8, "sequence": 8, "sequence_length": 8, "past": 6,
                "past_sequence_length": 6, "dec_seq": 5, "max_cache": 256}
DEFAULT_DIM = 8
BATCH, SEQ = "batch", "seq"  # the names of the unified batch and sequence dims
SEQUENCE_KINDS = ("token_ids", "padding_mask", "position_ids")  # 2-D inputs whose axis 1 is the sequence
_ANONYMOUS = {"", "?", "-1"}
_EXPORTER_SYMBOL = re.compile(r"^(s\d+|unk__\d+)$")  # torch.export, ONNX Runtime's symbolic shape inference
_FILL = -1e4  # a constant at or below this, where a mask is True or False, masks the logits


@dataclass
class InputSpec:
    name: str
    dtype: np.dtype
    shape: list  # ints, dim names (str; anonymous dims named "input[axis]")
    role: dict = field(default_factory=dict)


def _metadata(model: onnx.ModelProto) -> dict:
    for p in model.metadata_props:
        if p.key == "trtattn.inputs":
            try:
                return json.loads(p.value)
            except ValueError:
                return {}
    return {}


def declared_dims(model: onnx.ModelProto) -> dict[str, int]:
    """The example dims the model's metadata declares (it was exported at them)."""
    return dict(_metadata(model).get("dims", {}))


# ---------------------------------------------------------------- how the graph uses an input
class GraphUses:
    """Consumers, producers and small constants of one graph and its subgraphs, indexed once."""

    PASS = ("Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Expand", "Flatten", "Transpose", "Slice", "Tile",
            "Gather", "GatherND", "GatherElements",
            "And", "Or", "Concat")

    def __init__(self, graph: onnx.GraphProto):
        self.consumers: dict[str, list] = {}
        self.producers = {}
        self.inits = {}
        self._index(graph)
        self.dtypes = {v.name: v.type.tensor_type.elem_type for v in graph.input}

    def _index(self, graph: onnx.GraphProto) -> None:
        """Subgraphs too (If branches, Loop bodies): they read the outer graph's tensors by name."""
        self.inits.update((i.name, i) for i in graph.initializer)
        for n in graph.node:
            for i, t in enumerate(n.input):
                self.consumers.setdefault(t, []).append((n, i))
            for o in n.output:
                self.producers[o] = n
            if n.op_type in ("If", "Loop", "Scan"):
                for a in n.attribute:
                    for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs):
                        self._index(g)

    def constant(self, name: str) -> np.ndarray | None:
        """The value of a small constant (an initializer or Constant node, through Cast/Expand/...)."""
        for _ in range(8):
            if name in self.inits:
                t = self.inits[name]
                small = np.prod(t.dims, dtype=np.int64) <= 64 and t.data_location != onnx.TensorProto.EXTERNAL
                return numpy_helper.to_array(t) if small else None
            node = self.producers.get(name)
            if node is None:
                return None
            if node.op_type == "Constant":
                attr = next((a for a in node.attribute if a.name in ("value", "value_float", "value_int")), None)
                if attr is None:
                    return None
                return numpy_helper.to_array(attr.t) if attr.name == "value" else np.array(onnx.helper.get_attribute_value(attr))
            if node.op_type not in ("Cast", "Identity", "Expand", "Reshape", "Unsqueeze", "Squeeze"):
                return None
            name = node.input[0]
        return None

    def is_fill(self, name: str) -> bool:
        value = self.constant(name)
        return value is not None and value.size > 0 and np.issubdtype(value.dtype, np.floating) and bool((value <= _FILL).all())

    def vocab(self, name: str) -> int | None:
        """Rows of the embedding table an integer input indexes (Gather(table, ids))."""
        frontier, seen = [name], set()
        while frontier:
            t = frontier.pop()
            if t in seen:
                continue
            seen.add(t)
            for n, i in self.consumers.get(t, ()):
                if n.op_type == "Gather" and i == 1:
                    table = n.input[0]
                    while table in self.producers and self.producers[table].op_type in ("Identity", "Cast", "DequantizeLinear"):
                        table = self.producers[table].input[0]
                    dims = self.inits[table].dims if table in self.inits else getattr(self.constant(table), "shape", ())
                    if len(dims) >= 1:
                        return int(dims[0])
                elif n.op_type in ("Cast", "Identity", "Reshape", "Unsqueeze", "Flatten", "Transpose") and i == 0:
                    frontier.extend(n.output)
        return None

    def mask_true_at(self, name: str) -> str | None:
        """Where a mask input is True: 'padding' when the graph masks the logits where it is True
        (Where(mask, -inf, logits) as masked_fill writes it, logits - 1e30 * mask), 'tokens' when it
        keeps them there (Where(mask, logits, -inf), (1 - mask) * -big, ONNX Attention's boolean
        mask). Not, Equal(mask, 0), Less(mask, 1) and Sub(1, mask) flip the meaning on the way.
        None when the graph does not say, or says both."""
        boolean = self.dtypes.get(name) == onnx.TensorProto.BOOL
        votes, seen = set(), set()
        frontier = [(name, False, boolean, False)]  # tensor, flipped (truthy here: falsy at the input), bool, x big
        while frontier:
            state = frontier.pop()
            if state in seen or len(seen) > 512:
                continue
            seen.add(state)
            t, flipped, boolean, big = state
            for n, i in self.consumers.get(t, ()):
                op, ins = n.op_type, n.input
                other = self.constant(ins[1 - i]) if len(ins) == 2 else None
                scalar = float(other.reshape(-1)[0]) if other is not None and other.size == 1 else None
                masked, follow = None, None  # masked: the logits are masked where this tensor is truthy
                if op == "Where" and i == 0 and self.is_fill(ins[1]) != self.is_fill(ins[2]):
                    masked = self.is_fill(ins[1])  # the branch taken where the mask is truthy is the fill
                elif op == "Attention" and i == 3 and boolean:
                    masked = False  # ONNX Attention: True takes part
                elif op == "Mul" and scalar is not None and abs(scalar) >= -_FILL:
                    masked, follow = (True, None) if scalar < 0 else (None, (flipped, False, True))
                elif op == "Sub" and i == 1 and (big or other is not None):
                    masked, follow = (True, None) if big else (None, (not flipped, False, False))  # c - big*m; 1 - m
                elif op == "Not" or (op == "Less" and i == 0 and scalar is not None and 0 < scalar <= 1):
                    follow = (not flipped, True, False)
                elif op == "Equal" and scalar is not None:
                    follow = (flipped != (scalar == 0), True, False)
                elif op == "Greater" and i == 0 and scalar is not None and 0 <= scalar < 1:
                    follow = (flipped, True, False)
                elif op == "Cast":
                    follow = (flipped, onnx.helper.get_attribute_value(n.attribute[0]) == onnx.TensorProto.BOOL, big)
                elif op in self.PASS and (i == 0 or op in ("And", "Or", "Concat")):
                    follow = (flipped, boolean, big)
                if masked is not None:
                    votes.add("padding" if masked != flipped else "tokens")
                if follow is not None:
                    frontier.extend((o, *follow) for o in n.output)
        return votes.pop() if len(votes) == 1 else None

    def is_condition(self, name: str) -> bool:
        return any(n.op_type == "If" and i == 0 for n, i in self.consumers.get(name, ()))


def _guess_role(uses: GraphUses, name: str, dtype: np.dtype, shape: list) -> dict:
    low = name.lower()
    if name == "cache_write_index":  # trtattn's kv-cache form
        return {"kind": "write_index"}
    if name == "cu_seqlens":  # trtattn's packed form
        return {"kind": "cu_seqlens"}
    single = all(isinstance(d, int) for d in shape) and int(np.prod(shape, dtype=np.int64)) <= 1
    if uses.is_condition(name) or (dtype == np.bool_ and single):
        return {"kind": "flag"}
    if "mask" in low:
        return _mask_role(uses, name)
    if "position" in low or low.startswith("pos"):
        return {"kind": "position_ids"}
    if "past" in low or "cache" in low:
        return {"kind": "cache"}
    if dtype.kind in "iu":
        return {"kind": "token_ids", "vocab": uses.vocab(name) or 2}
    if dtype == np.bool_:
        return _mask_role(uses, name)
    return {"kind": "float"}


def _mask_role(uses: GraphUses, name: str) -> dict:
    true_at = uses.mask_true_at(name)
    return {"kind": "padding_mask", **({"true_at": true_at} if true_at else {})}


def _dim(d: onnx.TensorShapeProto.Dimension, input_name: str, axis: int):
    """A static int, or the dim's name (anonymous dims named after their place)."""
    if d.HasField("dim_value") and d.dim_value >= 0:
        return int(d.dim_value)
    name = d.dim_param.strip() if d.HasField("dim_param") else ""
    return f"{input_name}[{axis}]" if name in _ANONYMOUS else name


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    meta = _metadata(model).get("inputs", {})
    inits = {i.name for i in model.graph.initializer}
    uses = None
    specs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        shape = [_dim(d, vi.name, axis) for axis, d in enumerate(tt.shape.dim)]
        role = meta.get(vi.name)
        if role is None:
            uses = uses or GraphUses(model.graph)
            role = _guess_role(uses, vi.name, dtype, shape)
        specs.append(InputSpec(vi.name, dtype, shape, role))
    return specs


# ---------------------------------------------------------------- dims
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

    labels = {}
    for spec in specs:
        seq_axis = 1 if len(spec.shape) == 2 and spec.role.get("kind") in SEQUENCE_KINDS else None
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
            name = _dim(d, vi.name, axis)
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
        for name in ([d] if d in members or d in dims else re.findall(r"[A-Za-z_]\w*", d)):
            dims.setdefault(name, DEFAULT_DIM)
    dims.update(overrides)
    return dims


# ---------------------------------------------------------------- feeds
def make_feeds(model: onnx.ModelProto, *, dims: dict[str, int] | None = None, seed: int = 0,
               padding: bool = True, shapes: dict[str, list[int]] | None = None,
               specs: list[InputSpec] | None = None) -> dict[str, np.ndarray]:
    """One feed dict. `padding=False` gives masks without padding (used to probe what a mask means)."""
    rng = np.random.default_rng(seed)
    specs = specs if specs is not None else input_specs(model)
    dims = resolve_dims(model, dims, specs=specs)
    feeds = {}
    for spec in specs:
        if shapes and spec.name in shapes:
            shape = list(shapes[spec.name])
        else:
            shape = [d if isinstance(d, int) else dim_value(d, dims) for d in spec.shape]
        feeds[spec.name] = _value(spec, shape, rng, padding, dims)
        if spec.role.get("kind") == "flag" and "value" not in spec.role:
            # an If condition alternates with the seed, so that feeds of two seeds run both branches
            feeds[spec.name] = np.full(shape, seed % 2 == 0, dtype=spec.dtype)
    return feeds


def kept_tokens(role: dict, mask: np.ndarray) -> np.ndarray:
    """A mask input's value as booleans True at the tokens to keep, whichever way the model writes it."""
    keep = np.asarray(mask) != 0
    return ~keep if role.get("true_at") == "padding" else keep


def _value(spec: InputSpec, shape: list[int], rng: np.random.Generator, padding: bool, dims: dict) -> np.ndarray:
    kind = spec.role.get("kind", "float")
    dt = spec.dtype
    if kind == "token_ids":
        vocab = int(spec.role.get("vocab") or 2)
        low = 3 if vocab > 8 else 0  # keep clear of special tokens (pad/bos/eos) when there are many
        return rng.integers(low, vocab, size=shape).astype(dt)
    if kind in ("padding_mask", "ones_mask"):
        keep = np.ones(shape, dtype=bool)
        if kind == "padding_mask" and padding and len(shape) == 2 and shape[0] >= 2 and shape[1] >= 4:
            pad = max(1, shape[1] // 4)
            if spec.role.get("side") == "left":
                keep[-1, :pad] = False
            else:
                keep[-1, shape[1] - pad:] = False
        return (~keep if spec.role.get("true_at") == "padding" else keep).astype(dt)
    if kind == "flag":
        return np.full(shape, spec.role.get("value", True), dtype=dt)
    if kind == "write_index":  # every row appends after a cache of the past length
        return np.full(shape, dim_value("past", dims), dtype=dt)
    if kind == "cu_seqlens":  # rows of the sequence length, end to end
        return (np.arange(shape[0]) * dim_value("seq", dims)).astype(dt)
    if kind == "position_ids":  # positions continue after the cache ("offset": the past length dim)
        seq = shape[-1] if shape else 1
        offset = dim_value(spec.role["offset"], dims) if spec.role.get("offset") else 0
        return np.broadcast_to(np.arange(seq) + offset, shape).astype(dt).copy()
    if dt.kind in "iu":
        return rng.integers(0, 2, size=shape).astype(dt)
    if dt == np.bool_:
        return np.ones(shape, dtype=np.bool_)
    return rng.standard_normal(shape).astype(dt)


def parse_dims(text: str | None) -> dict[str, int]:
    """'batch=2,seq=16' -> {'batch': 2, 'seq': 16}."""
    out = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise TrtattnError(f"bad --dims entry '{part}': expected name=value")
        k, v = part.split("=", 1)
        try:
            out[k.strip()] = int(v)
        except ValueError:
            raise TrtattnError(f"bad --dims entry '{part}': {v!r} is not an integer") from None
        if out[k.strip()] < 1:
            raise TrtattnError(f"bad --dims entry '{part}': a dim is at least 1")
    return out
