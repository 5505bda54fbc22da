"""Dims and sizes the model's own attention ops fix, read before any search (graph/dims.py uses them).

An op with a cache says, by its contract, what several input dims must be; guessing them (the default 8 for an
unnamed last dim) fails on the first run. Read here, in this order:
- the ops' attributes and contracts: com.microsoft GroupQueryAttention and MultiHeadAttention, and the standard
  Attention op, take past_key/past_value [batch, kv_heads, past, head_size]; the head size is the query's width
  over num_heads (GroupQueryAttention's packed QKV: (num_heads + 2 * kv_num_heads) * head_size); the total
  length the op reads (GroupQueryAttention's total_sequence_length, from Shape(attention_mask)[1] in GenAI's
  builder models; MultiHeadAttention's 2-D key padding mask) is the past plus the new tokens; GroupQueryAttention
  on CPU takes several new tokens over a past at batch 1 only;
- the weights' shapes: the query's width from its projection's weight where shapes are not written; the rotary
  caches' rows (cos_cache [max positions, rotary_dim / 2]) bound the total length;
- then the folder's config (genai_config.json beside the model, runtime/genai_config.py), where the ops leave a
  size unknown.
A fixed window buffer (GroupQueryAttention's sliding_window_cache, GenAI's Gemma 2/3 sliding layers) has
local_window_size slots, whatever the past: its length dim is fixed, it is no past length (a prefill keeps it)
and no part of the total; the kernel leaves the present's slots past the valid keys unspecified, so the total
length is at least the window (`floors`): every slot valid, the only lengths a comparison can be trusted at.
A cache length of 0 is a dim like any other: a prefill has an empty past (`prefill`), and a site reading a cache
is verified at an empty and a non-empty one (graph/dims.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from ..errors import TrtattnError
from . import rotary
from .dim_facts import ConfigSizes, Covers, Fixed, LengthSum, OpDims, head_size_by_contract
from .dim_names import names_in
from .roles import GraphUses, dim_name

_PASS = ("Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten")


@dataclass(frozen=True)
class CacheOp:
    """Where an attention op with a cache keeps its tensors (input indices) and head counts (attributes)."""

    past_key: int
    heads: str
    kv_heads: str | None
    key: int = 1
    total: int | None = None  # an input holding the total (past + new) length
    mask: int | None = None  # a 2-D key padding mask [batch, past + new]
    packed: bool = False  # Q, K and V packed in the query input when the key input is absent
    batch_one_with_past: bool = False  # several new tokens over a past at batch 1 only (the CPU kernel)
    self_only: bool = False  # key and value are the new tokens too: [batch, new, width] as the query


CACHE_OPS = {
    ("com.microsoft", "GroupQueryAttention"): CacheOp(3, "num_heads", "kv_num_heads", total=6, packed=True,
                                                      batch_one_with_past=True, self_only=True),
    ("com.microsoft", "MultiHeadAttention"): CacheOp(6, "num_heads", None, mask=4),
    ("", "Attention"): CacheOp(4, "q_num_heads", "kv_num_heads"),
}


# rotary ops -> the input index of their cos cache [max positions, rotary_dim / 2]
ROTARY_COS = {(domain, rotary.OP): index["cos"] for domain, index in rotary.INPUTS.items()}

# ops -> (an input holding one row per batch entry by the op's contract, the inputs whose axis 0 is the batch):
# GroupQueryAttention's seqlens_k [batch]; RotaryEmbedding's 2-D position_ids [batch, sequence]
BATCH_ROWS = {("com.microsoft", "GroupQueryAttention"): (5, (0, 1, 2, 3, 4)),
              ("com.microsoft", rotary.OP): (rotary.INPUTS["com.microsoft"]["position_ids"], (0,))}

# normalization ops -> the inputs of their scale, bias and skip bias: each shaped X.shape[axis:], so its last dim is
# the normalized input's last dim (ONNX Runtime's SimplifiedLayerNormalization is registered in the default domain)
NORM_PARAMS = {("", "LayerNormalization"): (1, 2), ("", "SimplifiedLayerNormalization"): (1,),
               ("", "RMSNormalization"): (1,), ("com.microsoft", "SkipLayerNormalization"): (2, 3, 4),
               ("com.microsoft", "SkipSimplifiedLayerNormalization"): (2, 3)}


def op_dims(model: onnx.ModelProto, config: ConfigSizes | None = None) -> OpDims:
    """The dims the model's cache-reading attention ops fix (see the module doc); `config`: the folder's config,
    read only for sizes the ops and weights leave unknown."""
    graph = model.graph
    nodes = [(n, CACHE_OPS[_key(n)]) for n in graph.node if _key(n) in CACHE_OPS]
    found = OpDims()
    if not nodes and not any(_key(n) in ROTARY_COS or _key(n) in NORM_PARAMS or _key(n) in BATCH_ROWS
                             for n in graph.node):
        return found
    inits = {i.name for i in graph.initializer}
    shapes = {vi.name: [dim_name(d, vi.name, a) for a, d in enumerate(vi.type.tensor_type.shape.dim)]
              for vi in graph.input if vi.name not in inits}
    uses = GraphUses(graph)
    widths = _Widths(model, uses)
    for node, op in nodes:
        _check_widths(node, op, widths)
        _read_node(found, node, op, shapes, uses, widths, config)
    for node in graph.node:
        _read_rotary(found, node, shapes, uses)
        _read_norm(found, node, shapes, uses, widths)
        _read_batch_rows(found, node, shapes, widths)
    _read_shape_only(found, graph, shapes, uses)
    return found


def _key(node: onnx.NodeProto) -> tuple[str, str]:
    return node.domain if node.domain != "ai.onnx" else "", node.op_type


def _where(node: onnx.NodeProto) -> str:
    return f"{node.op_type} '{node.name}'" if node.name else f"{node.op_type} (output '{node.output[0]}')"


class _Widths:
    """The last dim of a tensor: written in the graph, from its projection's weight, or inferred (once)."""

    def __init__(self, model: onnx.ModelProto, uses: GraphUses):
        self.model, self.uses = model, uses
        self._inferred: dict[str, tuple[int, list | None]] | None = None
        self.written = {vi.name: vi for vi in list(model.graph.value_info) + list(model.graph.input)}

    def of(self, name: str) -> int | None:
        vi = self.written.get(name)
        if vi is not None and vi.type.tensor_type.shape.dim and vi.type.tensor_type.shape.dim[-1].HasField("dim_value"):
            return int(vi.type.tensor_type.shape.dim[-1].dim_value)
        weight = self._projection(name)
        if weight is not None:
            return weight
        shape = self.inferred(name)
        return shape[-1] if shape and isinstance(shape[-1], int) else None

    def inferred(self, name: str, depth: int = 8) -> list | None:
        """`name`'s shape as inference gives it (run once, only where something asks); past an op inference does
        not know (ONNX Runtime's normalizations in the default domain), a normalization's output has its input's
        shape and a Transpose's is its input's permuted."""
        if self._inferred is None:
            from .shapes import tensor_types  # shape inference, only where the weights do not say

            self._inferred = tensor_types(self.model)
        shape = self._inferred.get(name, (0, None))[1]
        node = self.uses.producers.get(name)
        if shape is not None or node is None or depth == 0 or node.output[0] != name:
            return shape
        if _key(node) in NORM_PARAMS:
            return self.inferred(node.input[0], depth - 1)
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        given = self.inferred(node.input[0], depth - 1) if node.op_type == "Transpose" and perm else None
        return [given[p] for p in perm] if given and perm and len(given) == len(perm) else None

    def _projection(self, name: str) -> int | None:
        """The columns of the weight of the MatMul that computes `name` (through a bias Add)."""
        for _ in range(4):
            node = self.uses.producers.get(name)
            if node is None:
                return None
            if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in self.uses.inits:
                dims = self.uses.inits[node.input[1]].dims
                transposed = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
                return int(dims[0] if transposed else dims[-1]) if dims else None
            if node.op_type not in ("Add", "Cast", "Identity"):
                return None
            name = next((i for i in node.input if i not in self.uses.inits), node.input[0])
        return None


def _attr(node: onnx.NodeProto, name: str | None) -> int | None:
    return next((int(a.i) for a in node.attribute if a.name == name), None) if name else None


def _input(node: onnx.NodeProto, index: int | None) -> str:
    return node.input[index] if index is not None and index < len(node.input) else ""


def _read_node(found: OpDims, node: onnx.NodeProto, op: CacheOp, shapes: dict[str, list], uses: GraphUses,
               widths: _Widths, config: ConfigSizes | None) -> None:
    """What one op says: its cache's head size and heads, its past, new and total lengths, its batch rule."""
    where = _where(node)
    past = _graph_input(_input(node, op.past_key), shapes, uses)
    if past is None or len(shapes[past]) != 4:
        return
    batch, kv_axis, past_len, head_axis = shapes[past]
    heads, kv_heads = _attr(node, op.heads), _attr(node, op.kv_heads)
    kv_heads = kv_heads if kv_heads else heads
    head, how = _head_size(node, op, heads, kv_heads, widths)
    if head is None and config is not None and config.head_size:
        head, how = config.head_size, f"{config.source} says head_size {config.head_size}"
    if isinstance(head_axis, str) and head is not None:
        _fix(found, Fixed(head_axis, head, f"{where} reads a head size of {head}: {how}"))
    if isinstance(kv_axis, str) and kv_heads:
        _fix(found, Fixed(kv_axis, kv_heads, f"{where} has {kv_heads} key/value heads"))
    if not isinstance(past_len, str):
        return
    window = _window_buffer(node)
    if window:
        _fix(found, Fixed(past_len, window, f"{where} keeps a window buffer of local_window_size {window} slots "
                                            "(sliding_window_cache)"))
        found.windows.add(past_len)
    else:
        found.pasts.setdefault(past_len, node.name)
    if isinstance(batch, str):
        found.batches.add(batch)
    new = _new_length(node, op, shapes, uses, widths)
    if new is not None:
        found.news.add(new)
    if op.batch_one_with_past:
        found.batch_one = found.batch_one or where
    total = _total_length(node, op, shapes, uses)
    if window and total is not None and names_in(total) == [total]:
        floor = found.floors.get(total)
        if floor is None or floor.value < window:
            found.floors[total] = Fixed(total, window, f"{where}'s present has unspecified slots until its past and "
                                                       f"new tokens fill its {window}-slot window buffer")
    # a window buffer is no past length: the total is not the buffer plus the new tokens
    if not window and total is not None and new is not None and total not in (new, past_len) \
            and names_in(total) == [total]:
        if all(s.total != total for s in found.sums):
            found.sums.append(LengthSum(total, (past_len, new), f"{where} reads it as its past plus its new tokens"))
    rows = _rotary_rows(node, uses)
    if rows is not None and total is not None:
        found.limits.setdefault(total, Fixed(total, rows, f"{where}'s rotary cache has {rows} positions"))
    table = _rotary_input_rows(node, shapes, uses)
    if table is not None and new is not None and all(c.rows != table for c in found.covers):
        found.covers.append(Covers(table, (past_len, new), f"{where} rotates positions up to its past plus its new "
                                                          "tokens with its cos/sin cache inputs"))


def _window_buffer(node: onnx.NodeProto) -> int:
    """local_window_size when the op keeps a fixed window buffer (GroupQueryAttention's sliding_window_cache), else 0."""
    if node.op_type != "GroupQueryAttention" or not _attr(node, "sliding_window_cache"):
        return 0
    return max(_attr(node, "local_window_size") or 0, 0)


def _check_widths(node: onnx.NodeProto, op: CacheOp, widths: _Widths) -> None:
    """Key and value of one width, where the op takes both as [batch, new, kv_heads * head_size]: static widths
    that differ make a model no size runs (a packed QKV sliced off the head boundary), said before any search."""
    key, value = _input(node, op.key), _input(node, op.key + 1)
    if not op.self_only or not key or not value:
        return
    key_width, value_width = widths.of(key), widths.of(value)
    if key_width is not None and value_width is not None and key_width != value_width:
        raise TrtattnError(f"{_where(node)} takes a key {key_width} wide and a value {value_width} wide, where both "
                           f"are kv_num_heads * head_size: ONNX Runtime runs it at no size")


def _fix(found: OpDims, fixed: Fixed) -> None:
    known = found.fixed.get(fixed.name)
    if known is not None and known.value != fixed.value:
        raise TrtattnError(f"{fixed.name}: {known.why}, but {fixed.why}: the model cannot run at any {fixed.name}")
    found.fixed.setdefault(fixed.name, fixed)


def _graph_input(name: str, shapes: dict, uses: GraphUses) -> str | None:
    """The graph input `name` is, through casts and identities; None when it is computed."""
    for _ in range(4):
        if name in shapes:
            return name
        node = uses.producers.get(name)
        if node is None or node.op_type not in ("Cast", "Identity"):
            return None
        name = node.input[0]
    return None


def _head_size(node: onnx.NodeProto, op: CacheOp, heads: int | None, kv_heads: int | None,
               widths: _Widths) -> tuple[int | None, str]:
    """The head size and how the op tells it (dim_facts.head_size_by_contract), from the widths of its query and key."""
    key = _input(node, op.key)
    return head_size_by_contract(widths.of(node.input[0]), widths.of(key) if key else None, heads, kv_heads,
                                 op.packed and not key)


def _new_length(node: onnx.NodeProto, op: CacheOp, shapes: dict, uses: GraphUses, widths: _Widths) -> str | None:
    """The name of the new tokens' length: axis 1 of the query, or of the key or value where the op takes those as
    the same new tokens, when one is an input (a query computed from a normalization keeps it unread); else the
    token ids' (a 2-D integer input that indexes an embedding table); else the query's inferred axis 1, where it
    is an input's dim (Q, K and V sliced from a packed input)."""
    for index in (0, op.key, op.key + 1) if op.self_only else (0,):
        given = _graph_input(_input(node, index), shapes, uses)
        if given is not None and len(shapes[given]) == 3 and isinstance(shapes[given][1], str):
            return shapes[given][1]
    ids = [s[1] for n, s in shapes.items() if len(s) == 2 and isinstance(s[1], str) and uses.vocab(n)]
    if len(set(ids)) == 1:
        return ids[0]
    inferred = widths.inferred(node.input[0])
    length = inferred[1] if inferred and len(inferred) == 3 else None
    return length if isinstance(length, str) and any(length in s for s in shapes.values()) else None


def _total_length(node: onnx.NodeProto, op: CacheOp, shapes: dict, uses: GraphUses) -> str | None:
    """The dim an op reads as its total length: the input dim its total-length input is the Shape of (Shape(mask)
    gathered at 1, as GenAI's builder computes total_sequence_length), or its 2-D key padding mask's axis 1."""
    total = _input(node, op.total)
    if total:
        source = _shape_of(total, uses)
        if source is not None and source[0] in shapes and source[1] < len(shapes[source[0]]):
            dim = shapes[source[0]][source[1]]
            return dim if isinstance(dim, str) else None
    mask = _graph_input(_input(node, op.mask), shapes, uses)
    if mask is not None and len(shapes[mask]) == 2 and isinstance(shapes[mask][1], str):
        return shapes[mask][1]
    return None


def _shape_of(name: str, uses: GraphUses) -> tuple[str, int] | None:
    """(tensor, axis) when `name` is one dim of a tensor's shape: Gather(Shape(x), k) or Shape(x, start=k, end=k+1),
    through casts and reshapes."""
    for _ in range(6):
        node = uses.producers.get(name)
        if node is None:
            return None
        if node.op_type in _PASS:
            name = node.input[0]
            continue
        if node.op_type == "Gather" and len(node.input) == 2:
            shape, index = uses.producers.get(node.input[0]), uses.constant(node.input[1])
            if shape is not None and shape.op_type == "Shape" and index is not None and index.size == 1:
                return shape.input[0], (_attr(shape, "start") or 0) + int(index.reshape(-1)[0])
            return None
        if node.op_type == "Shape":
            start, end = _attr(node, "start"), _attr(node, "end")
            return (node.input[0], start) if start is not None and end == start + 1 else None
        return None
    return None


def _rotary_rows(node: onnx.NodeProto, uses: GraphUses) -> int | None:
    """Rows of GroupQueryAttention's cos cache (input 7, rotary inside the op): the most positions it rotates."""
    if node.op_type != "GroupQueryAttention" or not _attr(node, "do_rotary"):
        return None
    cos = _input(node, 7)
    table = uses.inits.get(cos)
    return int(table.dims[0]) if table is not None and table.dims else None


def _rotary_input_rows(node: onnx.NodeProto, shapes: dict, uses: GraphUses) -> str | None:
    """The symbolic rows of GroupQueryAttention's cos cache when it is a graph input (rotary inside the op)."""
    if node.op_type != "GroupQueryAttention" or not _attr(node, "do_rotary"):
        return None
    cos = _graph_input(_input(node, 7), shapes, uses)
    rows = shapes[cos][0] if cos is not None and shapes[cos] else None
    return rows if isinstance(rows, str) else None


def _read_rotary(found: OpDims, node: onnx.NodeProto, shapes: dict, uses: GraphUses) -> None:
    """A rotary op's cos cache given as a graph input with symbolic rows: the rows reach every position, so at least
    the past plus the new tokens where a cache op names them, else every other length of the inputs together (a
    decoder step's positions are below their sum)."""
    index = ROTARY_COS.get(_key(node))
    cos = _graph_input(_input(node, index), shapes, uses) if index is not None else None
    rows = shapes[cos][0] if cos is not None and shapes[cos] else None
    if not isinstance(rows, str) or any(c.rows == rows for c in found.covers):
        return
    batches = {s[0] for s in shapes.values() if s and isinstance(s[0], str)}  # axis 0 of an input: a batch
    lengths = sorted({d for n, s in shapes.items() if n != cos for d in s[1:] if isinstance(d, str)
                      and d != rows and d not in found.fixed and names_in(d) == [d]} - batches)
    parts = tuple(sorted(found.pasts)) + tuple(sorted(found.news)) if found.pasts and found.news else tuple(lengths)
    if parts:
        where = _where(node)
        found.covers.append(Covers(rows, parts, f"{where} reads positions up to {' + '.join(parts)} in its cos/sin "
                                                "cache inputs"))


def _read_norm(found: OpDims, node: onnx.NodeProto, shapes: dict, uses: GraphUses, widths: _Widths) -> None:
    """A normalization's scale or bias given as a graph input with a symbolic last dim (a per-head RMS norm's
    [head_size] weight, as Gemma's and Qwen3's query/key norms are written): it is the normalized input's last dim,
    read from the weights or the shapes, never a guess the op then refuses."""
    params = NORM_PARAMS.get(_key(node), ())
    named = [(p, shapes[p][-1]) for p in (_graph_input(_input(node, i), shapes, uses) for i in params)
             if p is not None and shapes[p] and isinstance(shapes[p][-1], str) and names_in(shapes[p][-1]) ==
             [shapes[p][-1]]]
    width = widths.of(node.input[0]) if named else None
    if width is None:
        return
    where = _where(node)
    for param, dim in named:
        _fix(found, Fixed(dim, width, f"{where} normalizes a last axis of {width}, the size of its '{param}'"))


def _read_batch_rows(found: OpDims, node: onnx.NodeProto, shapes: dict, widths: _Widths) -> None:
    """An input with one row per batch entry whose row count the graph fixes (seqlens_k or position_ids computed
    from Range(past, past + new): one row): the batch is that count, where the batched input's axis 0 is an input
    dim."""
    where = BATCH_ROWS.get(_key(node))
    if where is None or not _input(node, where[0]):
        return
    rows_of, batched_inputs = _input(node, where[0]), where[1]
    rows = widths.inferred(rows_of)
    if not rows or not isinstance(rows[0], int) or (_key(node)[1] == "RotaryEmbedding" and len(rows) != 2):
        return
    for name in (_input(node, i) for i in batched_inputs):
        batched = shapes.get(name) or (widths.inferred(name) if name else None)
        if batched and isinstance(batched[0], str) and any(batched[0] in s for s in shapes.values()):
            why = f"{_where(node)} takes '{rows_of}' of {rows[0]} row(s), one per batch entry"
            return _fix(found, Fixed(batched[0], rows[0], why))


def _read_shape_only(found: OpDims, graph: onnx.GraphProto, shapes: dict, uses: GraphUses) -> None:
    """A cache-shaped input [batch, heads, length, head size] the graph reads only through Shape (a past that only
    offsets positions and masks, its values never read): its length is a past the ops did not name, so an empty one
    is tried first and verified beside the others."""
    for name, dims in shapes.items():
        readers = uses.consumers.get(name, [])
        if len(dims) != 4 or not isinstance(dims[2], str) or dims[2] in found.pasts or not readers:
            continue
        if all(n.op_type == "Shape" for n, _ in readers) and names_in(dims[2]) == [dims[2]]:
            found.pasts[dims[2]] = readers[0][0].name or f"Shape of '{name}'"
