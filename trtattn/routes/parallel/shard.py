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

import numpy as np
import onnx_graphsurgeon as gs

from .facts import Facts, RankValues, constant_value
from .heads import HeadRules
from .shards import NeedsGroups, Shard, Split, Unsplittable, weight_operand

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


class Pass(HeadRules):
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
            shape[shard.axis] //= shard.blocks(self.n)
        return tuple(shape)

    def run(self, columns: set[int], input_shards: dict[str, Shard], groups: dict[int, int] | None = None,
            copies: dict[int, int] | None = None) -> Split:
        """`groups`: seeds whose columns are blocks (fused QKV); `copies`: seeds whose column blocks are
        replicated (K/V projections with fewer KV heads than ranks)."""
        self.split = Split(self.n, columns=set(columns), input_shards=dict(input_shards),
                           groups={i: g for i, g in (groups or {}).items() if i in columns})
        self.copies = {i: c for i, c in (copies or {}).items() if i in columns}
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
        if size % (shard.outer * shard.blocks(self.n)):
            raise Unsplittable(node.name, f"'{t.name}' axis {shard.axis} of {size} does not split into "
                                          f"{shard.blocks(self.n)} blocks"
                                          + (f" inside {shard.outer} groups" if shard.outer > 1 else ""))
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
        if self.shape(t)[shard.axis] % (shard.outer * shard.blocks(self.n)):
            raise Unsplittable(node.name, f"'{t.name}' axis {shard.axis} does not split into "
                                          f"{shard.blocks(self.n)} blocks")

    def _narrow(self, i: int, node: gs.Node, k: int, shard: Shard, copies: int) -> None:
        """A replicated operand (KV heads after GQA's repeat) meets one split finer: the rank reads the heads
        it needs of those it holds."""
        if shard.outer != 1 or shard.copies % copies:
            raise Unsplittable(node.name, f"'{node.inputs[k].name}' replicated in blocks that do not narrow")
        self.split.narrowed[(i, k)] = (shard, copies)

    def _meet(self, i: int, node: gs.Node, shards: dict[int, Shard], own: dict[int, Shard]) -> Shard:
        """The output's shard where operands `shards` (placed on the output's axes) meet: all along one
        axis; a replicated one is narrowed to the finest (`own`: each operand's shard on its own axes)."""
        if len({(s.axis, s.outer) for s in shards.values()}) > 1:
            raise Unsplittable(node.name, f"{node.op} operands sharded along different axes")
        target = min(shards.values(), key=lambda s: s.copies)
        for k, s in shards.items():
            if s.copies != target.copies:
                self._narrow(i, node, k, own[k], target.copies)
        return target

    def _columns(self, i: int, node: gs.Node) -> None:
        if any(t.name in self.split.sharded for t in node.inputs):
            raise Unsplittable(node.name, "a column split of a sharded input")
        trans_b = node.op == "Gemm" and node.attrs.get("transB", 0)
        blocks, copies = self.split.groups.get(i, 1), self.copies.get(i, 1)
        self.split.constant_slices[(i, 1)] = Shard(0 if trans_b else 1, blocks, copies)
        out = node.outputs[0]
        rank = len(self.shape(out))
        if node.op == "Gemm" and len(node.inputs) > 2 and node.inputs[2].name:
            c = self.shape(node.inputs[2])
            if c and c[-1] > 1:
                self.split.constant_slices[(i, 2)] = Shard(len(c) - 1, blocks, copies)
        self._set(node, out, Shard(rank - 1, blocks, copies))

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
            self._set(node, node.outputs[0], shard.at(perm.index(shard.axis)))
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
        target = self._meet(i, node, {k: s.at(s.axis + rank - len(self.shape(node.inputs[k]))) for k, s in ins},
                            dict(ins))
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
            self._operand(i, node, k, target.at(pos))
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
        self._set(node, node.outputs[0], shard.at(axis))

    def _regroup(self, i: int, node: gs.Node, ins: list[tuple[int, Shard]]) -> None:
        """Follow the split blocks through a change of grouping by the measured shapes, row-major."""
        (k, shard), = ins
        if k != 0:
            raise Unsplittable(node.name, f"{node.op} reads a sharded shape")
        before, after = self.shape(node.inputs[0]), self.shape(node.outputs[0])
        n = shard.blocks(self.n)
        lead = int(np.prod(before[:shard.axis], dtype=np.int64)) * shard.outer
        block = int(np.prod(before[shard.axis:], dtype=np.int64)) // (shard.outer * n)
        found = None
        for j, d in enumerate(after):
            ahead = int(np.prod(after[:j], dtype=np.int64))
            if d > 1 and lead % ahead == 0 and d % ((lead // ahead) * n) == 0:
                outer = lead // ahead
                if int(np.prod(after[j:], dtype=np.int64)) // (outer * n) == block:
                    found = Shard(j, outer, shard.copies)
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
        n = shard.blocks(self.n)
        if b == a // n and b != a:
            return
        if b == a and a % n == 0:
            self.split.shape_fixes.setdefault((i, 1), {})[entry] = n
            return
        raise Unsplittable(node.name, f"shape entry {entry} is {a} on the whole model and {b} on a rank")

    def _expand(self, i: int, node: gs.Node, ins: list[tuple[int, Shard]]) -> None:
        (k, shard), = ins
        if k != 0:
            raise Unsplittable(node.name, "Expand to a sharded shape")
        out = self.shape(node.outputs[0])
        axis = shard.axis + len(out) - len(self.shape(node.inputs[0]))
        target, n = shard.at(axis), shard.blocks(self.n)
        t = node.inputs[1]
        whole = np.ravel(self._whole_value(t))
        here = np.ravel(self.values.value(t))
        entry = axis - (len(out) - len(whole))
        if entry >= 0:
            a, b = int(whole[entry]), int(here[entry])
            if a != 1 and b == a and a % n == 0:
                self.split.shape_fixes.setdefault((i, 1), {})[entry] = n
            elif a != 1 and b != a // n:
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
        self.split.shape_fixes[(i, 1)] = dict.fromkeys(range(len(whole)), self.n)

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
            self._set(node, node.outputs[0], shard.at(out))
            return
        if node.op == "Split":
            if node.attrs.get("axis", 0) % rank != shard.axis:
                for o in node.outputs:
                    self._set(node, o, shard)
                return
            parts = len(node.outputs)
            if shard.copies != 1:
                raise Unsplittable(node.name, "Split along a replicated axis")
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
        if shard.copies != 1:
            raise Unsplittable(node.name, "Slice along a replicated axis")
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
                self.split.shape_fixes.setdefault((i, k), {})[j] = self.n
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
            if a is None or a.axis != ra - 1 or a.outer != 1 or a.copies != 1 or b is not None:
                raise Unsplittable(node.name, "MatMul contracts a sharded axis against an activation")
            if weight_operand(node) != 1:
                raise Unsplittable(node.name, "MatMul contracts a sharded axis against an activation")
            self.split.constant_slices[(i, 1)] = Shard(0)
            self.split.rows.append(i)
            return None
        # the sharded axis is a batch axis, A's rows or B's columns: it goes to the output
        targets = {}
        if a is not None:
            targets[0] = a.at(r - 2 if a.axis == ra - 2 else a.axis + r - ra)
        if b is not None:
            targets[1] = b.at(r - 1 if b.axis == rb - 1 else b.axis + r - rb)
        target = self._meet(i, node, targets, where)
        if target.axis < r - 2:  # a batch axis: the other operand must match it
            for k, shape in ((0, a_shape), (1, b_shape)):
                pos = target.axis - (r - len(shape))
                if k not in where and pos >= 0 and shape[pos] != 1:
                    self._operand(i, node, k, target.at(pos))
        self._set(node, node.outputs[0], target)
        return None

    def _gemm(self, i: int, node: gs.Node, ins: list[tuple[int, Shard]]) -> None:
        (k, shard), = ins
        trans_a, trans_b = node.attrs.get("transA", 0), node.attrs.get("transB", 0)
        if k != 0 or shard.axis != (0 if trans_a else 1) or shard.copies != 1 or weight_operand(node) != 1:
            raise Unsplittable(node.name, "Gemm with a sharded operand it cannot split by rows")
        if len(node.inputs) > 2 and node.inputs[2].name:
            self.split.bias_after.append(i)  # added once, after the partial sums meet
        self.split.constant_slices[(i, 1)] = Shard(1 if trans_b else 0)
        self.split.rows.append(i)

    def _whole_value(self, t: gs.Tensor) -> np.ndarray:
        """A shape operand's value on the whole model (a constant, or as measured)."""
        value = constant_value(t)
        return self.facts.values[t.name] if value is None else value

    def _fail(self, node: gs.Node, reason: str) -> None:
        raise Unsplittable(node.name, reason)
