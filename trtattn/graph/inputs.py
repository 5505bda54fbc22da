"""Realistic inputs for verification: token ids inside the vocabulary, padding masks with real
padding, positions, caches; fixed seed.

What each input means comes from the model's `trtattn.inputs` metadata (written by the zoo) or,
for other models, from its name, dtype and how the graph uses it (an integer input that indexes
an embedding table is token ids, and the table's rows are the vocabulary).
"""

from __future__ import annotations

import ast
import json
import operator
from dataclasses import dataclass, field

import numpy as np
import onnx

from ..errors import TrtattnError

DEFAULT_DIMS = {"batch": 2, "batch_size": 2, "seq": 8, "sequence": 8, "sequence_length": 8, "past": 6,
                "past_sequence_length": 6, "dec_seq": 5, "max_cache": 256}
DEFAULT_DIM = 8


@dataclass
class InputSpec:
    name: str
    dtype: np.dtype
    shape: list  # ints, dim names (str) or None
    role: dict = field(default_factory=dict)


def _metadata(model: onnx.ModelProto) -> dict:
    for p in model.metadata_props:
        if p.key == "trtattn.inputs":
            try:
                return json.loads(p.value)
            except ValueError:
                return {}
    return {}


def _vocab_of(model: onnx.ModelProto, name: str) -> int | None:
    """Rows of the embedding table an integer input indexes (Gather(table, ids))."""
    inits = {i.name: i for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    consts = {}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute:
            consts[n.output[0]] = n.attribute[0].t
    frontier, seen = [name], set()
    while frontier:
        t = frontier.pop()
        if t in seen:
            continue
        seen.add(t)
        for n in model.graph.node:
            if t not in n.input:
                continue
            if n.op_type == "Gather" and len(n.input) > 1 and n.input[1] == t:
                table = n.input[0]
                while table in producers and producers[table].op_type in ("Identity", "Cast"):
                    table = producers[table].input[0]
                src = inits.get(table) or consts.get(table)
                if src is not None and len(src.dims) >= 1:
                    return int(src.dims[0])
            elif n.op_type in ("Cast", "Identity", "Reshape", "Unsqueeze", "Flatten") and n.input[0] == t:
                frontier.extend(n.output)
    return None


def _guess_role(model: onnx.ModelProto, name: str, dtype: np.dtype) -> dict:
    low = name.lower()
    if name == "cache_write_index":  # trtattn's kv-cache form
        return {"kind": "write_index"}
    if name == "cu_seqlens":  # trtattn's packed form
        return {"kind": "cu_seqlens"}
    if "mask" in low:
        return {"kind": "padding_mask"}
    if "position" in low or low.startswith("pos"):
        return {"kind": "position_ids"}
    if "past" in low or "cache" in low:
        return {"kind": "cache"}
    if dtype.kind in "iu":
        vocab = _vocab_of(model, name)
        if vocab:
            return {"kind": "token_ids", "vocab": vocab}
        return {"kind": "token_ids", "vocab": 2}
    if dtype == np.bool_:
        return {"kind": "padding_mask"}
    return {"kind": "float"}


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    meta = _metadata(model).get("inputs", {})
    inits = {i.name for i in model.graph.initializer}
    specs = []
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
        role = meta.get(vi.name) or _guess_role(model, vi.name, dtype)
        specs.append(InputSpec(vi.name, dtype, shape, role))
    return specs


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def dim_value(name: str | None, dims: dict[str, int]) -> int:
    """Value of a symbolic dim: a known name, or an expression of known names ("past+seq")."""
    if name is None:
        return DEFAULT_DIM
    if name in dims:
        return dims[name]
    try:
        tree = ast.parse(name.replace(" ", ""), mode="eval").body
    except SyntaxError:
        return DEFAULT_DIMS.get(name, DEFAULT_DIM)

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in dims:
                return dims[node.id]
            return DEFAULT_DIMS.get(node.id, DEFAULT_DIM)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(name)

    try:
        return int(ev(tree))
    except (ValueError, ZeroDivisionError):
        return DEFAULT_DIMS.get(name, DEFAULT_DIM)


def resolve_dims(model: onnx.ModelProto, overrides: dict[str, int] | None = None) -> dict[str, int]:
    dims = dict(DEFAULT_DIMS)
    dims.update(_metadata(model).get("dims", {}))
    dims.update(overrides or {})
    return dims


def make_feeds(model: onnx.ModelProto, *, dims: dict[str, int] | None = None, seed: int = 0,
               padding: bool = True, shapes: dict[str, list[int]] | None = None) -> dict[str, np.ndarray]:
    """One feed dict. `padding=False` gives masks without padding (used to probe what a mask means)."""
    rng = np.random.default_rng(seed)
    dims = resolve_dims(model, dims)
    feeds = {}
    for spec in input_specs(model):
        if shapes and spec.name in shapes:
            shape = list(shapes[spec.name])
        else:
            shape = [d if isinstance(d, int) else dim_value(d, dims) for d in spec.shape]
        feeds[spec.name] = _value(spec, shape, rng, padding, dims)
    return feeds


def _value(spec: InputSpec, shape: list[int], rng: np.random.Generator, padding: bool, dims: dict) -> np.ndarray:
    kind = spec.role.get("kind", "float")
    dt = spec.dtype
    if kind == "token_ids":
        vocab = int(spec.role.get("vocab") or 2)
        low = 3 if vocab > 8 else 0  # keep clear of special tokens (pad/bos/eos) when there are many
        return rng.integers(low, vocab, size=shape).astype(dt)
    if kind in ("padding_mask", "ones_mask"):
        m = np.ones(shape, dtype=np.int64)
        if kind == "padding_mask" and padding and len(shape) == 2 and shape[0] >= 2 and shape[1] >= 4:
            pad = max(1, shape[1] // 4)
            if spec.role.get("side") == "left":
                m[-1, :pad] = 0
            else:
                m[-1, shape[1] - pad:] = 0
        return m.astype(dt)
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
    scale = 1.0 if kind != "cache" else 1.0
    return (rng.standard_normal(shape) * scale).astype(dt)


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
    return out
