"""What a tensor-parallel split is made of: a sharded tensor's `Shard`, one pass's decisions (`Split`), and
why a region cannot split (`Unsplittable`, naming the node)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import onnx_graphsurgeon as gs

from .facts import constant_value


@dataclass(frozen=True)
class Shard:
    axis: int
    outer: int = 1  # the axis is [outer, blocks, rest]: each rank holds one of the blocks
    copies: int = 1  # ranks holding each block: the axis splits in ranks // copies blocks, rank r holds
    # block r // copies (TensorRT-LLM's layout of KV heads fewer than the ranks: each rank the one it uses)

    def blocks(self, ranks: int) -> int:
        return ranks // self.copies

    def block_of(self, rank: int) -> int:
        return rank // self.copies

    def at(self, axis: int) -> Shard:
        return replace(self, axis=axis)


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
    shape_fixes: dict[tuple[int, int], dict[int, int]] = field(default_factory=dict)  # entry -> its divisor
    gathered: dict[str, Shard] = field(default_factory=dict)  # outputs ALL_GATHERed
    cached: dict[str, Shard] = field(default_factory=dict)  # outputs each rank keeps its slice of
    head_attrs: dict[int, tuple[tuple[str, int], ...]] = field(default_factory=dict)  # (attribute, divisor)
    vocab: list[int] = field(default_factory=list)  # embedding lookups split by vocabulary, ALL_REDUCE after
    bias_after: list[int] = field(default_factory=list)  # row-split Gemms whose bias is added after the ALL_REDUCE
    groups: dict[int, int] = field(default_factory=dict)  # column splits in blocks (fused QKV): seed -> blocks
    index_shifts: dict[tuple[int, int], tuple[int, int, int]] = field(default_factory=dict)  # ScatterND indices
    # (node, input) -> (component, block, copies): the rank's slice of the indices addresses its own block of
    # the sharded axis; on rank r that component is shifted by -(r // copies) * block (a cache update's heads)
    narrowed: dict[tuple[int, int], tuple[Shard, int]] = field(default_factory=dict)  # (node, input) ->
    # (its shard, copies wanted): a replicated operand (KV heads) narrowed on the rank to the heads it reads


def weight_operand(node: gs.Node) -> int | None:
    """The input index of a 2-D constant weight of a MatMul or Gemm (None: a product of activations)."""
    if node.op not in ("MatMul", "Gemm") or len(node.inputs) < 2:
        return None
    value = constant_value(node.inputs[1])
    return 1 if value is not None and value.ndim == 2 else None
