"""Optimisation profiles: trtexec-style --min/--opt/--max-shapes over defaults taken from the model.

The defaults come from what the model can run, never from the dims it was verified at:
- every symbolic dim at axis 0 of an input, and at no other axis, is a batch: 1 .. DEFAULT_MAX_BATCH;
- packed tokens (`total_tokens`) run to max batch x max positions;
- every other symbolic dim (a sequence, a past, an image side or audio length a user left dynamic) runs
  to the model's maximum positions: the `max_positions` the export recorded (metadata), else the context
  length of the genai_config.json beside it, else the rows of its learned position table or of its
  attention ops' rotary cache, else DEFAULT_MAX_POSITIONS (the plan says which);
- a preallocated cache's capacity is static: --max-cache, by default the maximum positions.
opt is half of max (at least 1). Expressions of dims ("past+seq", "batch+1") are evaluated from their
parts, so every input of one profile agrees. Profiles are [{input: {"min", "opt", "max"}}], one dict
per optimisation profile.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import onnx

from ..errors import TrtattnError

DEFAULT_MAX_BATCH = 8
DEFAULT_MAX_POSITIONS = 2048
TOKENS = "total_tokens"


class EngineInput(Protocol):
    """An engine input as the profiles read it (trt/plan.py's TensorIO; this module sits below the plan)."""

    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> list: ...


@dataclass(frozen=True)
class PlanLimits:
    """What a plan's default profiles and its caches' static capacity run to, and where the positions came from."""

    max_batch: int
    max_positions: int
    max_positions_from: str | None = None  # None: a rank form's plan, which takes the caller's number as given
    max_cache: int | None = None  # None: the form has no preallocated cache

    def to_json(self) -> dict:
        """The sidecar's and the plan's "limits": a rank form's plan says only what it was given."""
        if self.max_positions_from is None:
            return {"max_positions": self.max_positions, "max_batch": self.max_batch}
        return {"max_batch": self.max_batch, "max_positions": self.max_positions,
                "max_positions_from": self.max_positions_from, "max_cache": self.max_cache}


def parse_shapes(text: str | None) -> dict[str, tuple[int, ...]]:
    """trtexec style: 'input_ids:1x16,attention_mask:1x16' -> {name: (1, 16)}."""
    out = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, dims = part.rpartition(":")
        if not sep or not name:
            raise TrtattnError(f"bad shape '{part}': expected name:AxBxC")
        try:
            out[name] = tuple(int(d) for d in dims.split("x"))
        except ValueError:
            raise TrtattnError(f"bad shape '{part}': dimensions must be integers separated by 'x'") from None
    return out


def max_positions(model: onnx.ModelProto, source=None) -> tuple[int | None, str]:
    """The longest sequence the model takes, and where that came from: the export's metadata, the context length of
    the genai_config.json beside `source` (the model's file or folder: ONNX Runtime GenAI's builder writes it), the
    rows of a learned position table, the rows of the rotary cache an attention op rotates with."""
    for p in model.metadata_props:
        if p.key in ("trtattn.inputs", "trtattn.zoo"):
            try:
                value = json.loads(p.value).get("max_positions")
            except (ValueError, AttributeError):
                value = None
            if isinstance(value, int) and value > 0:
                return value, "the export's metadata (max_positions)"
    from ..runtime.genai_config import read_genai_config  # (a JSON reader: no runtime session)

    genai = read_genai_config(source)
    if genai is not None and genai.context_length:
        return genai.context_length, f"{genai.path.name} (context_length)"
    rows = _position_tables(model)
    if rows:
        return min(rows), "its learned position table"
    rotary = _rotary_rows(model)
    if rotary:
        return min(rotary), "the rows of its attention ops' rotary cache (cos_cache)"
    return None, "nothing in the model"


def _rotary_rows(model: onnx.ModelProto) -> list[int]:
    """Rows of the cos caches com.microsoft GroupQueryAttention rotates with inside the op (do_rotary, input 7):
    positions past them have no rotation."""
    inits = {i.name: i for i in model.graph.initializer}
    rows = []
    for n in model.graph.node:
        rotary = any(a.name == "do_rotary" and a.i for a in n.attribute)
        if n.op_type == "GroupQueryAttention" and rotary and len(n.input) > 7 and n.input[7] in inits:
            rows.append(int(inits[n.input[7]].dims[0]))
    return rows


def _position_tables(model: onnx.ModelProto) -> list[int]:
    """Rows of 2-D tables gathered by positions (a position_ids input, or a Range), minus a constant
    offset added to them (BART's learned positions start at 2)."""
    inits = {i.name: i for i in model.graph.initializer}
    consts = {n.output[0]: n.attribute[0].t for n in model.graph.node if n.op_type == "Constant" and n.attribute}
    producer = {o: n for n in model.graph.node for o in n.output}
    inputs = {i.name for i in model.graph.input}

    def positional(name, depth=0):
        node = producer.get(name)
        if name in inputs:
            return "position" in name.lower() or name.lower().startswith("pos")
        if name in inits or name in consts:  # a position buffer sliced to the length (BERT's position_ids)
            return _is_arange(inits[name] if name in inits else consts[name])
        if node is None or depth > 12:
            return False
        if node.op_type == "Range":
            return True
        if node.op_type in ("Cast", "Unsqueeze", "Expand", "Slice", "Reshape", "Add", "Identity", "Squeeze"):
            return positional(node.input[0], depth + 1)
        return False

    def offset(name) -> int:
        node = producer.get(name)
        if node is not None and node.op_type == "Add":
            for other in node.input[1:]:
                src = inits.get(other) or consts.get(other)
                if src is not None:
                    value = onnx.numpy_helper.to_array(src)
                    if value.size == 1 and np.issubdtype(value.dtype, np.integer):
                        return int(value.reshape(-1)[0])
        return 0

    rows = []
    for n in model.graph.node:
        if n.op_type not in ("Gather", "GatherND") or len(n.input) < 2:  # dynamo indexes tables with GatherND
            continue
        table = inits.get(n.input[0]) or consts.get(n.input[0])
        if table is not None and len(table.dims) == 2 and positional(n.input[1]):
            rows.append(int(table.dims[0]) - offset(n.input[1]))
    return [r for r in rows if r > 0]


def _is_arange(tensor: onnx.TensorProto) -> bool:
    """0, 1, 2, ... along its last axis: positions written into the model (never reads external data)."""
    if tensor.data_type not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) or not tensor.dims or \
            tensor.data_location == onnx.TensorProto.EXTERNAL or int(np.prod(tensor.dims)) != tensor.dims[-1] > 1:
        return False
    return bool(np.array_equal(onnx.numpy_helper.to_array(tensor).reshape(-1), np.arange(tensor.dims[-1])))


_SYMBOL = re.compile(r"[A-Za-z_][\w.]*")


def _parts(dim: str) -> set[str]:
    """The symbols of a dim name: itself, or those of an expression ("past+seq", "s2 + s50", "batch+1")."""
    return set(_SYMBOL.findall(dim)) or {dim}


def _value(dim: str, values: dict[str, int]) -> int:
    if dim in values:
        return values[dim]
    expr = _SYMBOL.sub(lambda m: str(values[m.group(0)]), dim)
    tree = ast.parse(expr.replace(" ", ""), mode="eval")
    ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        raise TrtattnError(f"cannot evaluate the dim expression '{dim}'")

    return int(ev(tree.body))


def _symbols(inputs: Sequence[EngineInput]) -> tuple[set[str], set[str]]:
    """(batch symbols, all symbols) of the inputs' dynamic dims. A batch is a symbol alone at axis 0 and at
    no other axis of any input: a [Sq, Skv] mask's axis 0 is a sequence, which its axis 1 (or the tokens') says."""
    first, later, names = set(), set(), set()
    for io in inputs:
        for axis, d in enumerate(io.shape):
            if isinstance(d, str):
                names |= _parts(d)
                if axis == 0:
                    first.update({d} if _parts(d) == {d} else set())
                else:
                    later |= _parts(d)
    return first - later, names


def default_profiles(inputs: Sequence[EngineInput], limits: PlanLimits, fixed: dict[str, int] | None = None) -> list[dict]:
    """One profile over the inputs' dynamic dims (see module doc); static inputs have none. `fixed`: symbolic dims
    the model's ops fix (graph/op_dims.py: a cache's head size written kv_cache_dim) at their one value."""
    batch, names = _symbols(inputs)
    positions, max_batch = limits.max_positions, limits.max_batch
    fixed = {n: v for n, v in (fixed or {}).items() if n in names}
    high = {n: max_batch if n in batch else max_batch * positions if n == TOKENS else positions for n in names}
    values = {"min": {n: 1 for n in names}, "opt": {n: max(1, v // 2) for n, v in high.items()}, "max": high}
    for row in values.values():
        row.update(fixed)
    profile = {}
    for io in inputs:
        if all(isinstance(d, int) for d in io.shape):
            continue
        profile[io.name] = {key: [d if isinstance(d, int) else _value(d, dims) for d in io.shape]
                               for key, dims in values.items()}
    return [profile] if profile else []


def apply_overrides(profiles: list[dict], minimum: dict, optimum: dict, maximum: dict) -> list[dict]:
    """trtexec's --min/--opt/--max-shapes replace an input's row in every profile; min <= opt <= max."""
    names = {n for p in profiles for n in p}
    for key, table in (("min", minimum), ("opt", optimum), ("max", maximum)):
        for name, shape in table.items():
            if name not in names:
                raise TrtattnError(f"--{key}-shapes names '{name}', which is not a dynamic engine input "
                                   f"({', '.join(sorted(names)) or 'none'})")
            for p in profiles:
                if len(shape) != len(p[name][key]):
                    raise TrtattnError(f"--{key}-shapes gives '{name}' {len(shape)} dims; it has {len(p[name][key])}")
                p[name][key] = list(shape)
    for p in profiles:
        for name, row in p.items():
            if not all(a <= b <= c for a, b, c in zip(row["min"], row["opt"], row["max"])):
                raise TrtattnError(f"profile for '{name}': min {row['min']} <= opt {row['opt']} <= max {row['max']} "
                                   "does not hold")
    return profiles


def describe(profiles: list[dict]) -> list[str]:
    return [f"profile {i}: {name} min {row['min']} opt {row['opt']} max {row['max']}"
            for i, p in enumerate(profiles) for name, row in p.items()]
