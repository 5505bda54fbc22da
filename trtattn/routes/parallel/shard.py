"""One pass of the tensor-parallel split over a graph: given the products split by output columns (the
seeds), follow the sharded axis forward through every op until the partial sums meet (a product that
contracts the sharded axis against a weight: split by rows, then ALL_REDUCE) or a graph output (a rank's
KV cache keeps its slice; any other output is ALL_GATHERed).

A sharded tensor is described by a `Shard`: its axis and the product of the atoms ahead of the split
inside that axis (an axis merged from batch and heads splits in its middle). Each op's rule says where
the axis goes or that the op cannot take it (a reduction or softmax over it, a product contracting it
against an activation, a shape that does not split): `Unsplittable`, naming the node. Operands that meet
a sharded tensor are split too: a weight or constant by slicing it, a graph input by feeding each rank
its slice (past K/V: the rank's cache), an activation computed whole by a Slice in the rank's graph
(the finder first tries to split the product that computes it instead).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from .facts import Facts, RankValues, addressed_block, constant_value

UNARY = {"Cast", "Identity", "Sigmoid", "Tanh", "Relu", "Gelu", "Erf", "Neg", "Sqrt", "Exp", "Log", "Abs",
         "Reciprocal", "Softplus", "Softsign", "Sin", "Cos", "Not", "IsNaN", "IsInf", "HardSigmoid", "LeakyRelu",
         "Elu", "Selu", "Mish", "HardSwish", "Floor", "Ceil", "Round", "Sign", "CastLike", "Dropout", "Clip",
         "QuantizeLinear", "DequantizeLinear"}
ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Where", "Equal", "Less", "LessOrEqual", "Greater",
               "GreaterOrEqual", "And", "Or", "Xor", "Max", "Min", "Sum", "Mean", "Mod", "PRelu", "BitShift"}
REDUCE = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
          "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin"}
REGROUP = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}
NO_DATA = {"Shape", "Size"}  # read only the shape: its value on a rank is evaluated where it is used


@dataclass(frozen=True)
class Shard:
    axis: int
    outer: int = 1  # the axis is [outer, ranks, rest]: each rank holds one of the `ranks` blocks


class Unsplittable(Exception):
    def __init__(self, node: str, reason: str):
        super().__init__(f"node '{node}': {reason}")
        self.node = node
        self.reason = reason


class NeedsGroups(Unsplittable):
    """A Split into `groups` equal parts along the axis a product's columns shard: the product's columns are
    `groups` blocks (a fused QKV projection), each to be split on its own."""

    def __init__(self, node: str, groups: int):
        super().__init__(node, f"Split into {groups} parts along the sharded axis")
        self.groups = groups


@dataclass
class Split:
    """What one pass decided; node positions index the graph's toposorted node list."""

    ranks: int
    sharded: dict[str, Shard] = field(default_factory=dict)  # activations held in slices
    columns: set[int] = field(default_factory=set)  # products split by output columns (the seeds)
    rows: list[int] = field(default_factory=list)  # products split by input rows, ALL_REDUCE after
    constant_slices: dict[tuple[int, int], Shard] = field(default_factory=dict)  # (node, input) -> slice
    activation_slices: dict[tuple[int, int], Shard] = field(default_factory=dict)  # a Slice in the rank
    input_shards: dict[str, Shard] = field(default_factory=dict)  # graph inputs fed in slices
    shape_fixes: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # shape entries / ranks
    gathered: dict[str, Shard] = field(default_factory=dict)  # outputs ALL_GATHERed
    cached: dict[str, Shard] = field(default_factory=dict)  # outputs each rank keeps its slice of
    head_attrs: dict[int, tuple[str, ...]] = field(default_factory=dict)  # head-count attributes / ranks
    vocab: list[int] = field(default_factory=list)  # embedding lookups split by vocabulary, ALL_REDUCE after
    bias_after: list[int] = field(default_factory=list)  # row-split Gemms whose bias is added after the ALL_REDUCE
    groups: dict[int, int] = field(default_factory=dict)  # column splits in blocks (fused QKV): seed -> blocks
    index_shifts: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)  # ScatterND indices
    # (node, input) -> (component, block): the rank's slice of the indices addresses its own block of the
    # sharded axis; on rank r that component is shifted by -r * block (a cache update's head index)


def weight_operand(node: gs.Node) -> int | None:
    """The input index of a 2-D constant weight of a MatMul or Gemm (None: a product of activations)."""
    if node.op not in ("MatMul", "Gemm") or len(node.inputs) < 2:
        return None
    value = constant_value(node.inputs[1])
    return 1 if value is not None and value.ndim == 2 else None


class Pass:
    def __init__(self, graph: gs.Graph, nodes: list[gs.Node], facts: Facts, ranks: int, opset: int,
                 cache_names: set[str]):
        self.graph, self.nodes, self.facts, self.n, self.opset = graph, nodes, facts, ranks, opset
        self.cache_names = cache_names
        self.inputs = {t.name for t in graph.inputs}

    def shape(self, t: gs.Tensor) -> tuple[int, ...]:
        value = constant_value(t)
        if value is not None:
            return tuple(value.shape)
        if t.name not in self.facts.shapes:
            raise Unsplittable(t.name, "shape not measured")
        return self.facts.shapes[t.name]

    def rank_shape(self, name: str) -> tuple[int, ...]:
        shape = list(self.facts.shapes[name])
        shard = self.split.sharded.get(name)
        if shard is not None:
            shape[shard.axis] //= self.n
        return tuple(shape)

    def run(self, columns: set[int], input_shards: dict[str, Shard], groups: dict[int, int] | None = None) -> Split:
        self.split = Split(self.n, columns=set(columns), input_shards=dict(input_shards),
                           groups={i: g for i, g in (groups or {}).items() if i in columns})
        self.split.sharded.update(input_shards)
        self.values = RankValues(self.facts, self.rank_shape, self.opset)
        for i, node in enumerate(self.nodes):
            if i in columns:
                self._columns(i, node)
                continue
            ins = [(k, self.split.sharded[t.name]) for k, t in enumerate(node.inputs) if t.name in self.split.sharded]
            if ins and node.op not in NO_DATA:
                self._node(i, node, ins)
        for out in self.graph.outputs:
            shard = self.split.sharded.get(out.name)
            if shard is None:
                continue
            if out.name in self.cache_names:
                self.split.cached[out.name] = shard
            elif shard.outer == 1:
                self.split.gathered[out.name] = shard
            else:
                raise Unsplittable(out.name, "graph output sharded inside a merged axis")
        return self.split

    # -- helpers
    def _set(self, node: gs.Node, t: gs.Tensor, shard: Shard) -> None:
        size = self.shape(t)[shard.axis]
        if size % (shard.outer * self.n):
            raise Unsplittable(node.name, f"'{t.name}' axis {shard.axis} of {size} does not split into "
                                          f"{self.n} ranks" + (f" inside {shard.outer} groups" if shard.outer > 1 else ""))
        self.split.sharded[t.name] = shard

    def _operand(self, i: int, node: gs.Node, k: int, shard: Shard) -> None:
        """An operand held whole meets a sharded tensor along `shard`: give the rank its slice."""
        t = node.inputs[k]
        if constant_value(t) is not None:
            self.split.constant_slices[(i, k)] = shard
        elif t.name in self.inputs:
            self._set(node, t, shard)
            self.split.input_shards[t.name] = shard
        elif shard.outer == 1:
            self.split.activation_slices[(i, k)] = shard
        else:
            raise Unsplittable(node.name, f"'{t.name}' would be sliced inside a merged axis")
        if self.shape(t)[shard.axis] % (shard.outer * self.n):
            raise Unsplittable(node.name, f"'{t.name}' axis {shard.axis} does not split into {self.n} ranks")

    def _columns(self, i: int, node: gs.Node) -> None:
        if any(t.name in self.split.sharded for t in node.inputs):
            raise Unsplittable(node.name, "a column split of a sharded input")
        trans_b = node.op == "Gemm" and node.attrs.get("transB", 0)
        blocks = self.split.groups.get(i, 1)
        self.split.constant_slices[(i, 1)] = Shard(0 if trans_b else 1, blocks)
        out = node.outputs[0]
        rank = len(self.shape(out))
        if node.op == "Gemm" and len(node.inputs) > 2 and node.inputs[2].name:
            c = self.shape(node.inputs[2])
            if c and c[-1] > 1:
                self.split.constant_slices[(i, 2)] = Shard(len(c) - 1, blocks)
        self._set(node, out, Shard(rank - 1, blocks))

    def _node(self, i: int, node: gs.Node, ins: list[tuple[int, Shard]]) -> None:
        op = node.op
        if op in UNARY:
            if any(k for k, _ in ins):
                raise Unsplittable(node.name, f"{op} with a sharded parameter")
            for o in node.outputs[:1]:
                self._set(node, o, ins[0][1])
        elif op in ELEMENTWISE or op == "Concat":
            self._broadcast(i, node, ins)
        elif op in ("Softmax", "LogSoftmax", "Hardmax"):
            rank = len(self.shape(node.inputs[0]))
            if node.attrs.get("axis", -1) % rank == ins[0][1].axis:
                raise Unsplittable(node.name, f"{op} over the sharded axis")
            self._set(node, node.outputs[0], ins[0][1])
        elif op in REDUCE or op in ("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization"):
            self._reduce(node, ins)
        elif op == "Transpose":
            rank = len(self.shape(node.inputs[0]))
            perm = list(node.attrs.get("perm", list(range(rank))[::-1]))
            shard = ins[0][1]
            self._set(node, node.outputs[0], Shard(perm.index(shard.axis), shard.outer))
        elif op in REGROUP:
            self._regroup(i, node, ins)
        elif op == "Expand":
            self._expand(i, node, ins)
        elif op in ("Slice", "Split", "Gather"):
            self._select(i, node, ins)
        elif op in ("MatMul", "Gemm"):
            self._product(i, node, ins)
        elif op == "ScatterND":
            self._scatter(i, node, ins)
        elif op in ("Attention", "RotaryEmbedding") and (node.domain or "") in ("", "ai.onnx"):
            self._heads_op(i, node, ins)
        else:
            raise Unsplittable(node.name, f"{op} has no tensor-parallel rule")

    def _broadcast(self, i: int, node: gs.Node, ins: list[tuple[int, Shard]]) -> None:
        out = node.outputs[0]
        rank = len(self.shape(out))
        targets = {Shard(s.axis + rank - len(self.shape(node.inputs[k])), s.outer) for k, s in ins}
        if len(targets) > 1:
            raise Unsplittable(node.name, "operands sharded along different axes")
        target = targets.pop()
        if node.op == "Concat" and node.attrs["axis"] % rank == target.axis:
            raise Unsplittable(node.name, "Concat along the sharded axis")
        size = self.shape(out)[target.axis]
        sharded = {k for k, _ in ins}
        for k, t in enumerate(node.inputs):
            if k in sharded or not t.name:
                continue
            shape = self.shape(t)
            pos = target.axis - (rank - len(shape))
            if pos < 0 or shape[pos] == 1:
                continue
            if shape[pos] != size:
                raise Unsplittable(node.name, f"'{t.name}' has {shape[pos]} along the sharded axis, not {size}")
            self._operand(i, node, k, Shard(pos, target.outer))
        self._set(node, out, target)

    def _reduce(self, node: gs.Node, ins: list[tuple[int, Shard]]) -> None:
        shard = ins[0][1]
        if ins[0][0] != 0:
            raise Unsplittable(node.name, f"{node.op} with a sharded parameter")
        rank = len(self.shape(node.inputs[0]))
        if node.op in ("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization"):
            if shard.axis >= node.attrs.get("axis", -1) % rank:
                raise Unsplittable(node.name, f"{node.op} over the sharded axis")
            self._set(node, node.outputs[0], shard)
            return
        if "axes" in node.attrs:
            axes = list(node.attrs["axes"])
        elif node.op in ("ArgMax", "ArgMin"):
            axes = [node.attrs.get("axis", 0)]
        elif len(node.inputs) > 1 and node.inputs[1].name:
            axes = [int(a) for a in np.ravel(self.values.value(node.inputs[1]))]
        else:
            axes = list(range(rank))
        axes = [a % rank for a in axes]
        if shard.axis in axes:
            raise Unsplittable(node.name, f"{node.op} over the sharded axis")
        keep = node.attrs.get("keepdims", 1)
        axis = shard.axis if keep else shard.axis - sum(a < shard.axis for a in axes)
        self._set(node, node.outputs[0], Shard(axis, shard.outer))

    def _regroup(self, i: int, node: gs.Node, ins: list[tuple[int, Shard]]) -> None:
        """Follow the split blocks through a change of grouping by the measured shapes, row-major."""
        (k, shard), = ins
        if k != 0:
            raise Unsplittable(node.name, f"{node.op} reads a sharded shape")
        before, after = self.shape(node.inputs[0]), self.shape(node.outputs[0])
        lead = int(np.prod(before[:shard.axis], dtype=np.int64)) * shard.outer
        block = int(np.prod(before[shard.axis:], dtype=np.int64)) // (shard.outer * self.n)
        found = None
        for j, d in enumerate(after):
            ahead = int(np.prod(after[:j], dtype=np.int64))
            if d > 1 and lead % ahead == 0 and d % ((lead // ahead) * self.n) == 0:
                outer = lead // ahead
                if int(np.prod(after[j:], dtype=np.int64)) // (outer * self.n) == block:
                    found = Shard(j, outer)
                    break
        if found is None:
            raise Unsplittable(node.name, f"{node.op} {list(before)} -> {list(after)} does not keep the split "
                                          f"blocks of axis {shard.axis} whole")
        if node.op == "Reshape":
            self._fix_shape(i, node, found.axis, before, after, shard)
        self._set(node, node.outputs[0], found)

    def _fix_shape(self, i: int, node: gs.Node, j: int, before, after, shard: Shard) -> None:
        """Entry j of a shape operand: left as it is when it is -1 or the graph computes it from a sharded
        tensor's Shape (the rank's value is already a rank's), divided by the ranks when it is a constant."""
        t = node.inputs[1]
        whole = np.ravel(self._whole_value(t))
        here = np.ravel(self.values.value(t))
        entry = j - (len(after) - len(whole))
        if entry < 0:
            return
        a, b = int(whole[entry]), int(here[entry])
        if a == -1 or (a == 0 and not node.attrs.get("allowzero", 0) and j == shard.axis):
            return
        if b == a // self.n and b != a:
            return
        if b == a and a % self.n == 0:
            self.split.shape_fixes.setdefault((i, 1), []).append(entry)
            return
        raise Unsplittable(node.name, f"shape entry {entry} is {a} on the whole model and {b} on a rank")

    def _expand(self, i: int, node: gs.Node, ins: list[tuple[int, Shard]]) -> None:
        (k, shard), = ins
        if k != 0:
            raise Unsplittable(node.name, "Expand to a sharded shape")
        out = self.shape(node.outputs[0])
        axis = shard.axis + len(out) - len(self.shape(node.inputs[0]))
        target = Shard(axis, shard.outer)
        t = node.inputs[1]
        whole = np.ravel(self._whole_value(t))
        here = np.ravel(self.values.value(t))
        entry = axis - (len(out) - len(whole))
        if entry >= 0:
            a, b = int(whole[entry]), int(here[entry])
            if a != 1 and b == a and a % self.n == 0:
                self.split.shape_fixes.setdefault((i, 1), []).append(entry)
            elif a != 1 and b != a // self.n:
                raise Unsplittable(node.name, f"Expand entry {entry} is {a} whole and {b} on a rank")
        self._set(node, node.outputs[0], target)

    def _split_sizes(self, i: int, node: gs.Node) -> None:
        """A Split's sizes along the sharded axis are the rank's: constants divided by the ranks."""
        if "split" in node.attrs:
            raise Unsplittable(node.name, "Split with sizes as an attribute (opset < 13) along the sharded axis")
        if len(node.inputs) < 2 or not node.inputs[1].name:
            return  # equal parts of whatever the rank holds
        whole, here = np.ravel(self._whole_value(node.inputs[1])), np.ravel(self.values.value(node.inputs[1]))
        if all(b == a // self.n and b != a for a, b in zip(whole, here)):
            return
        if any(a % self.n for a in whole) or not all(b == a for a, b in zip(whole, here)):
            raise Unsplittable(node.name, f"Split sizes {whole.tolist()} do not split into {self.n} ranks")
        self.split.shape_fixes[(i, 1)] = list(range(len(whole)))

    def _select(self, i: int, node: gs.Node, ins: list[tuple[int, Shard]]) -> None:
        (k, shard), = ins
        if k != 0:
            raise Unsplittable(node.name, f"{node.op} with sharded indices")
        data = self.shape(node.inputs[0])
        rank = len(data)
        if node.op == "Gather":
            axis = node.attrs.get("axis", 0) % rank
            if axis == shard.axis:
                raise Unsplittable(node.name, "Gather along the sharded axis")
            out = shard.axis if shard.axis < axis else shard.axis + len(self.shape(node.inputs[1])) - 1
            self._set(node, node.outputs[0], Shard(out, shard.outer))
            return
        if node.op == "Split":
            if node.attrs.get("axis", 0) % rank != shard.axis:
                for o in node.outputs:
                    self._set(node, o, shard)
                return
            parts = len(node.outputs)
            if len({self.shape(o)[shard.axis] for o in node.outputs}) != 1:
                raise Unsplittable(node.name, "Split into unequal parts along the sharded axis")
            if shard.outer == parts:  # each part is one block: split on its own
                self._split_sizes(i, node)
                for o in node.outputs:
                    self._set(node, o, Shard(shard.axis))
                return
            if shard.outer == 1:
                raise NeedsGroups(node.name, parts)
            raise Unsplittable(node.name, f"Split into {parts} parts of an axis split in {shard.outer} blocks")
        self._slice(i, node, shard, data)

    def _slice(self, i: int, node: gs.Node, shard: Shard, data: tuple[int, ...]) -> None:
        """A Slice off the sharded axis passes it through; along it, one of `parts` equal blocks (a fused
        projection sliced into Q, K and V) is the rank's block of that part: its bounds divided by the ranks."""
        if len(node.inputs) < 3:
            raise Unsplittable(node.name, "Slice with its bounds as attributes (opset < 10)")
        rank = len(data)
        starts = np.ravel(self.values.value(node.inputs[1]))
        axes = (np.ravel(self.values.value(node.inputs[3])) if len(node.inputs) > 3 and node.inputs[3].name
                else np.arange(len(starts)))
        size, length = data[shard.axis], self.shape(node.outputs[0])[shard.axis]
        along = [j for j, a in enumerate(axes) if int(a) % rank == shard.axis]
        if not along or length == size:
            self._set(node, node.outputs[0], shard)
            return
        steps = np.ravel(self.values.value(node.inputs[4])) if len(node.inputs) > 4 and node.inputs[4].name else None
        (j,) = along
        first = int(np.clip(starts[j] if starts[j] >= 0 else starts[j] + size, 0, size))
        if steps is not None and steps[j] != 1 or length == 0 or size % length or first % length:
            raise Unsplittable(node.name, "Slice along the sharded axis")
        parts = size // length
        if shard.outer == 1:
            raise NeedsGroups(node.name, parts)
        if shard.outer != parts:
            raise Unsplittable(node.name, f"Slice of 1/{parts} of an axis split in {shard.outer} blocks")
        for k in (1, 2):  # starts and ends: the rank's (computed from a sharded Shape already, or constants)
            whole, here = int(np.ravel(self._whole_value(node.inputs[k]))[j]), int(np.ravel(self.values.value(node.inputs[k]))[j])
            if here == whole and abs(whole) < size * 4:
                self.split.shape_fixes.setdefault((i, k), []).append(j)
            elif here != whole // self.n and abs(whole) < size * 4:
                raise Unsplittable(node.name, f"Slice bound {whole} is {here} on a rank")
        self._set(node, node.outputs[0], Shard(shard.axis))

    def _product(self, i: int, node: gs.Node, ins: list[tuple[int, Shard]]) -> None:
        a_shape, b_shape = self.shape(node.inputs[0]), self.shape(node.inputs[1])
        out = self.shape(node.outputs[0])
        if node.op == "Gemm" or min(len(a_shape), len(b_shape)) < 2:
            return self._gemm(i, node, ins) if node.op == "Gemm" else self._fail(node, "a 1-D product")
        ra, rb, r = len(a_shape), len(b_shape), len(out)
        where = dict(ins)
        a, b = where.get(0), where.get(1)
        if a is not None and a.axis == ra - 1 or b is not None and b.axis == rb - 2:
            if a is None or a.axis != ra - 1 or a.outer != 1 or b is not None:
                raise Unsplittable(node.name, "MatMul contracts a sharded axis against an activation")
            if weight_operand(node) != 1:
                raise Unsplittable(node.name, "MatMul contracts a sharded axis against an activation")
            self.split.constant_slices[(i, 1)] = Shard(0)
            self.split.rows.append(i)
            return None
        # the sharded axis is a batch axis, A's rows or B's columns: it goes to the output
        targets = set()
        if a is not None:
            targets.add(Shard(r - 2 if a.axis == ra - 2 else a.axis + r - ra, a.outer))
        if b is not None:
            targets.add(Shard(r - 1 if b.axis == rb - 1 else b.axis + r - rb, b.outer))
        if len(targets) > 1:
            raise Unsplittable(node.name, "MatMul operands sharded along different axes")
        target = targets.pop()
        if target.axis < r - 2:  # a batch axis: the other operand must match it
            for k, shape in ((0, a_shape), (1, b_shape)):
                pos = target.axis - (r - len(shape))
                if k not in where and pos >= 0 and shape[pos] != 1:
                    self._operand(i, node, k, Shard(pos, target.outer))
        self._set(node, node.outputs[0], target)
        return None

    def _gemm(self, i: int, node: gs.Node, ins: list[tuple[int, Shard]]) -> None:
        (k, shard), = ins
        trans_a, trans_b = node.attrs.get("transA", 0), node.attrs.get("transB", 0)
        if k != 0 or shard.axis != (0 if trans_a else 1) or weight_operand(node) != 1:
            raise Unsplittable(node.name, "Gemm with a sharded operand it cannot split by rows")
        if len(node.inputs) > 2 and node.inputs[2].name:
            self.split.bias_after.append(i)  # added once, after the partial sums meet
        self.split.constant_slices[(i, 1)] = Shard(1 if trans_b else 0)
        self.split.rows.append(i)

    def _scatter(self, i: int, node: gs.Node, ins: list[tuple[int, Shard]]) -> None:
        """ScatterND(data, indices [..., k], updates): a data axis past k is the updates' axis at the same
        place from the end. A data axis the indices address (a cache update's heads) splits when, as
        measured, the ranks' slices of the indices along one of their axes address only the rank's block
        of it: the updates split along that axis and each rank's indices are shifted into its block."""
        where = dict(ins)
        if 1 in where or any(s.outer != 1 for s in where.values()):
            raise Unsplittable(node.name, "ScatterND with sharded indices or a merged axis")
        index_shape = self.shape(node.inputs[1])
        q, k = len(index_shape), index_shape[-1]
        lead = q - 1 - k  # updates axis = data axis + lead, for data axes past k
        if 0 in where and where[0].axis >= k or 2 in where and where[2].axis >= q - 1:
            a = where[0].axis if 0 in where else where[2].axis - lead
            j = a + lead
        else:
            indices = self.facts.values.get(node.inputs[1].name)
            found = addressed_block(indices if indices is not None else constant_value(node.inputs[1]),
                                    self.shape(node.inputs[0]), self.n, where.get(0), where.get(2))
            if found is None:
                raise Unsplittable(node.name, "ScatterND: no axis of its indices gives each rank only its block "
                                              "of the sharded data axis (as measured)")
            a, j = found
            self._operand(i, node, 1, Shard(j))
            self.split.index_shifts[(i, 1)] = (a, self.shape(node.inputs[0])[a] // self.n)
        for k_, axis in ((0, a), (2, j)):
            if k_ not in where:
                self._operand(i, node, k_, Shard(axis))
            elif where[k_].axis != axis:
                raise Unsplittable(node.name, "ScatterND data and updates sharded along axes that do not match")
        self._set(node, node.outputs[0], Shard(a))

    def _heads_op(self, i: int, node: gs.Node, ins: list[tuple[int, Shard]]) -> None:
        """ONNX's Attention and RotaryEmbedding split by heads: 4-D operands along axis 1 (their heads),
        3-D ones along their hidden axis with the op's head-count attributes divided."""
        three_d = len(self.shape(node.inputs[0])) == 3
        operands = (0, 1, 2, 4, 5) if node.op == "Attention" else (0,)
        for k, shard in ins:
            rank = len(self.shape(node.inputs[k]))
            if k not in operands and not (node.op == "Attention" and k == 3) or shard.outer != 1 or \
                    shard.axis != (2 if rank == 3 else 1):
                raise Unsplittable(node.name, f"{node.op} input {k} sharded off its heads")
        sharded = {k for k, _ in ins}
        for k in operands:
            if k < len(node.inputs) and node.inputs[k].name and k not in sharded:
                rank = len(self.shape(node.inputs[k]))
                self._operand(i, node, k, Shard(2 if rank == 3 else 1))
        if node.op == "Attention" and len(node.inputs) > 3 and node.inputs[3].name and 3 not in sharded:
            mask = self.shape(node.inputs[3])
            if len(mask) == 4 and mask[1] > 1:
                self._operand(i, node, 3, Shard(1))
        if three_d:
            self.split.head_attrs[i] = tuple(a for a in ("num_heads", "q_num_heads", "kv_num_heads") if a in node.attrs)
        for out in node.outputs:
            if out.name:
                rank = len(self.shape(out))
                self._set(node, out, Shard(2 if rank == 3 else 1))

    def _whole_value(self, t: gs.Tensor) -> np.ndarray:
        """A shape operand's value on the whole model (a constant, or as measured)."""
        value = constant_value(t)
        return self.facts.values[t.name] if value is None else value

    def _fail(self, node: gs.Node, reason: str) -> None:
        raise Unsplittable(node.name, reason)
