"""What each input of a model means (its role): token ids inside the vocabulary, padding masks and which
way they point, positions, caches, flags, plain floats.

The roles come from the model's `trtattn.inputs` metadata (written by the zoo) or, for other models,
from its name, dtype and how the graph uses it: an integer input that indexes an embedding table is
token ids (the table's rows are the vocabulary); a mask is True at the padding when the graph fills
the logits where it is True (masked_fill), at the tokens when it keeps them. Integer inputs that an
op reads as lengths are linked to the dims of the others (LINKED_LENGTHS): GroupQueryAttention's
total_sequence_length is the past plus the new tokens, its seqlens_k one less, whatever dims are run.
Each input's shape is read as ints and dim names; dims written -1, '?' or '' are named after their
place (`input_ids[1]`), for graph/dim_names.py to unify.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import TrtattnError

_ANONYMOUS = {"", "?", "-1"}
_FILL = -1e4  # a constant at or below this, where a mask is True or False, masks the logits


class RoleKind(str, enum.Enum):
    """What an input is (its role's "kind"). str-valued: a role dict keeps the string the metadata and the
    reports spell, and a role written here with a member serialises the same."""

    TOKEN_IDS = "token_ids"  # ids inside the vocabulary ("vocab": the embedding table's rows)
    PADDING_MASK = "padding_mask"  # [batch, key] ("true_at", "side"; measured: "key_axis", "batch_axis")
    ONES_MASK = "ones_mask"  # a mask the model is always given all ones (the zoo's decoder_attention_mask)
    MASK = "mask"  # graph/mask_reading.py: a mask with a query axis, or not on [batch, key]
    ADDITIVE_MASK = "additive_mask"  # graph/mask_reading.py: added to the logits
    FLOAT = "float"  # a plain float input (the default when a role names no kind)
    FLAG = "flag"  # a bool that decides an If ("value": the one it is run with)
    POSITION_IDS = "position_ids"  # ("offset": the dim the positions continue after)
    CACHE = "cache"  # a past key or value
    LENGTH = "length"  # linked to the dims (LINKED_LENGTHS: "of", "add")
    WRITE_INDEX = "write_index"  # trtattn's kv-cache form
    CU_SEQLENS = "cu_seqlens"  # trtattn's packed form

    def __str__(self) -> str:  # the string on every Python (3.11 changed format() of mixed-in enums)
        return str(self.value)


def role_kind(role: dict, name: str = "") -> RoleKind:
    """The kind a role dict names (FLOAT when it names none); a kind trtattn does not know is refused, naming
    the input, rather than read as a float."""
    kind = role.get("kind", RoleKind.FLOAT)
    try:
        return RoleKind(kind)
    except ValueError:
        known = ", ".join(k.value for k in RoleKind)
        raise TrtattnError(f"input '{name}': role kind {kind!r} is not one trtattn knows ({known})") from None


@dataclass
class InputSpec:
    name: str
    dtype: np.dtype
    shape: list  # ints, dim names (str; anonymous dims named "input[axis]")
    role: dict = field(default_factory=dict)

    @property
    def kind(self) -> RoleKind:
        return role_kind(self.role, self.name)

    @property
    def left_padded(self) -> bool:
        """A padding mask whose padding comes first in each row (its role's "side")."""
        return self.role.get("side") == "left"

    @property
    def true_at_padding(self) -> bool:
        """A mask that is True (1) at the padding, not at the tokens (its role's "true_at")."""
        return self.role.get("true_at") == "padding"


def _metadata(model: onnx.ModelProto) -> dict:
    for p in model.metadata_props:
        if p.key == "trtattn.inputs":
            try:
                return json.loads(p.value)
            except ValueError:
                return {}
    return {}


def declared_roles(model: onnx.ModelProto) -> dict[str, dict]:
    """Input name -> the role the model's metadata declares for it."""
    return dict(_metadata(model).get("inputs", {}))


def declared_dims(model: onnx.ModelProto) -> dict[str, int]:
    """The example dims the model's metadata declares (it was exported at them)."""
    return dict(_metadata(model).get("dims", {}))


# ---------------------------------------------------------------- how the graph uses an input
class GraphUses:
    """Consumers, producers and small constants of one graph and its subgraphs, indexed once."""

    PASS = ("Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Expand", "Flatten", "Transpose", "Slice", "Tile",
            "Gather", "GatherND", "GatherElements",
            "And", "Or", "Concat")

    def __init__(self, graph: onnx.GraphProto, opset: int = 13):
        self.opset = opset  # the default domain's (Softmax's default axis changed at 13)
        self.consumers: dict[str, list] = {}
        self.producers: dict[str, onnx.NodeProto] = {}
        self.inits: dict[str, onnx.TensorProto] = {}
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
        for n, i in self.reached(name, ("Cast", "Identity", "Reshape", "Unsqueeze", "Flatten", "Transpose")):
            if n.op_type == "Gather" and i == 1:
                table = n.input[0]
                while table in self.producers and self.producers[table].op_type in ("Identity", "Cast", "DequantizeLinear"):
                    table = self.producers[table].input[0]
                dims: Sequence[int] = self.inits[table].dims if table in self.inits else \
                    getattr(self.constant(table), "shape", ())
                if len(dims) >= 1:
                    return int(dims[0])
        return None

    def reached(self, name: str, passes):
        """(node, input index) of every node reading `name`, or what it becomes through nodes of `passes`
        (ops that carry their first input's values on)."""
        frontier, seen = [name], set()
        while frontier:
            t = frontier.pop()
            if t in seen:
                continue
            seen.add(t)
            for n, i in self.consumers.get(t, ()):
                yield n, i
                if n.op_type in passes and i == 0:
                    frontier.extend(n.output)

    def mask_true_at(self, name: str) -> str | None:
        """Where a mask input is True: 'padding' when the graph masks the logits where it is True
        (Where(mask, -inf, logits) as masked_fill writes it, logits - 1e30 * mask), 'tokens' when it
        keeps them there (Where(mask, logits, -inf), (1 - mask) * -big, ONNX Attention's boolean
        mask). Not, Equal(mask, 0), Less(mask, 1) and Sub(1, mask) flip the meaning on the way.
        None when the graph does not say, or says both."""
        boolean = self.dtypes.get(name) == onnx.TensorProto.BOOL
        votes: set[str] = set()
        seen: set[tuple[str, bool, bool, bool]] = set()
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


# Integer inputs an op reads as a length: (domain, op) -> {input index: what the length adds to past + new}.
# ONNX Runtime's GroupQueryAttention: total_sequence_length = past + new; seqlens_k = total - 1 per row.
LINKED_LENGTHS = {("com.microsoft", "GroupQueryAttention"): {5: -1, 6: 0}}
_LENGTH_PASS = ("Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Expand")


def _linked_length(uses: GraphUses, name: str, shapes: dict[str, list]) -> dict | None:
    """The role of an integer input an op reads as a length (LINKED_LENGTHS), through casts and reshapes:
    {"kind": "length", "of": [dims summed], "add": k}. The past is the op's past key (BNSH: axis 2) when
    that is an input, else none; the new tokens its query's axis 1 when that is an input, else the
    sequence of the token ids (a 2-D input that indexes an embedding table; "seq" when there is none)."""
    for n, i in uses.reached(name, _LENGTH_PASS):
        linked = LINKED_LENGTHS.get((n.domain or "", n.op_type), {})
        if i in linked:
            query, past = n.input[0], (n.input[3] if len(n.input) > 3 else "")
            new = shapes[query][1] if len(shapes.get(query, ())) > 1 else next(
                (shape[1] for other, shape in shapes.items() if len(shape) == 2 and uses.vocab(other)), "seq")
            of = [new] + ([shapes[past][2]] if len(shapes.get(past, ())) > 2 else [])
            return {"kind": RoleKind.LENGTH, "of": of, "add": linked[i]}
    return None


def _guess_role(uses: GraphUses, name: str, dtype: np.dtype, shape: list, shapes: dict[str, list]) -> dict:
    low = name.lower()
    if dtype.kind in "iu":
        linked = _linked_length(uses, name, shapes)
        if linked is not None:
            return linked
    if name == "cache_write_index":  # trtattn's kv-cache form
        return {"kind": RoleKind.WRITE_INDEX}
    if name == "cu_seqlens":  # trtattn's packed form
        return {"kind": RoleKind.CU_SEQLENS}
    single = all(isinstance(d, int) for d in shape) and int(np.prod(shape, dtype=np.int64)) <= 1
    if uses.is_condition(name) or (dtype == np.bool_ and single):
        return {"kind": RoleKind.FLAG}
    if "mask" in low:
        return _mask_role(uses, name)
    if "position" in low or low.startswith("pos"):
        return {"kind": RoleKind.POSITION_IDS}
    if "past" in low or "cache" in low:
        return {"kind": RoleKind.CACHE}
    if dtype.kind in "iu":
        return {"kind": RoleKind.TOKEN_IDS, "vocab": uses.vocab(name) or 2}
    if dtype == np.bool_:
        return _mask_role(uses, name)
    return {"kind": RoleKind.FLOAT}


def _mask_role(uses: GraphUses, name: str) -> dict:
    true_at = uses.mask_true_at(name)
    return {"kind": RoleKind.PADDING_MASK, **({"true_at": true_at} if true_at else {})}


def dim_name(d: onnx.TensorShapeProto.Dimension, input_name: str, axis: int):
    """A static int, or the dim's name (anonymous dims named after their place)."""
    if d.HasField("dim_value") and d.dim_value >= 0:
        return int(d.dim_value)
    name = d.dim_param.strip() if d.HasField("dim_param") else ""
    return f"{input_name}[{axis}]" if name in _ANONYMOUS else name


def input_specs(model: onnx.ModelProto) -> list[InputSpec]:
    meta = declared_roles(model)
    inits = {i.name for i in model.graph.initializer}
    uses = None
    inputs = [vi for vi in model.graph.input if vi.name not in inits]
    shapes = {vi.name: [dim_name(d, vi.name, axis) for axis, d in enumerate(vi.type.tensor_type.shape.dim)]
              for vi in inputs}
    specs = []
    for vi in inputs:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        role = meta.get(vi.name)
        if role is None:
            uses = uses or GraphUses(model.graph)
            role = _guess_role(uses, vi.name, dtype, shapes[vi.name], shapes)
        role_kind(role, vi.name)  # a declared kind trtattn does not know: refused here, naming the input
        specs.append(InputSpec(vi.name, dtype, shapes[vi.name], role))
    return specs


def kept_tokens(role: dict, mask: np.ndarray) -> np.ndarray:
    """A mask input's value as booleans True at the tokens to keep, whichever way the model writes it."""
    keep = np.asarray(mask) != 0
    return ~keep if role.get("true_at") == "padding" else keep
