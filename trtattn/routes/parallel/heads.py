"""The split's rules for ops that hold heads: ONNX's Attention and RotaryEmbedding (split by heads) and the
ScatterND of a cache update (heads addressed by index). KV heads fewer than the ranks are replicated as
TensorRT-LLM lays them out: each rank holds the one KV head its query heads use (`Shard.copies`)."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from .facts import Facts, addressed_block, constant_value
from .shards import Shard, Split, Unsplittable

KV_OPERANDS = (1, 2, 4, 5)  # Attention's key, value, past_key, past_value


class HeadRules:
    """Mixed into shard.Pass: what these rules use of it."""

    split: Split
    n: int
    facts: Facts

    def shape(self, t: gs.Tensor) -> tuple[int, ...]:
        raise NotImplementedError

    def _operand(self, i: int, node: gs.Node, k: int, shard: Shard) -> None:
        raise NotImplementedError

    def _set(self, node: gs.Node, t: gs.Tensor, shard: Shard) -> None:
        raise NotImplementedError

    def _heads_axis(self, t: gs.Tensor) -> int:
        return 2 if len(self.shape(t)) == 3 else 1

    def _heads_op(self, i: int, node: gs.Node, ins: list[tuple[int, Shard]]) -> None:
        """ONNX's Attention and RotaryEmbedding split by heads: 4-D operands along axis 1 (their heads),
        3-D ones along their hidden axis with the op's head-count attributes divided. Attention's K/V
        may be replicated (KV heads fewer than the ranks): each rank's then holds the one KV head its
        query heads use."""
        attention = node.op == "Attention"
        operands = (0, *KV_OPERANDS) if attention else (0,)
        where = dict(ins)
        for k, shard in ins:
            if k not in operands and not (attention and k == 3) or shard.outer != 1 or \
                    shard.axis != self._heads_axis(node.inputs[k]):
                raise Unsplittable(node.name, f"{node.op} input {k} sharded off its heads")
        if not attention:
            self._set(node, node.outputs[0], where[0])
            if len(self.shape(node.inputs[0])) == 3 and "num_heads" in node.attrs:
                self.split.head_attrs[i] = (("num_heads", where[0].blocks(self.n)),)
            return
        present = [k for k in operands if k < len(node.inputs) and node.inputs[k].name]
        q = where.get(0, Shard(self._heads_axis(node.inputs[0])))
        kv = next((where[k] for k in KV_OPERANDS if k in where), None) or self._kv_shard(node)
        if q.copies != 1 or where.get(3, q).copies != 1:
            raise Unsplittable(node.name, "Attention's query heads replicated")
        for k in present:
            want = (q if k == 0 else kv).at(self._heads_axis(node.inputs[k]))
            if k not in where:
                self._operand(i, node, k, want)
            elif where[k] != want:
                raise Unsplittable(node.name, f"Attention's inputs {sorted(where)} sharded differently")
        kv_heads = self._kv_heads(node)
        if kv.copies > 1 and kv_heads // kv.blocks(self.n) != 1:
            raise Unsplittable(node.name, f"{kv_heads} KV heads replicated over {self.n} ranks in blocks of more "
                                          "than one head")
        if len(node.inputs) > 3 and node.inputs[3].name and 3 not in where:
            mask = self.shape(node.inputs[3])
            if len(mask) == 4 and mask[1] > 1:
                self._operand(i, node, 3, Shard(1))
        if len(self.shape(node.inputs[0])) == 3:
            divisors = {"num_heads": self.n, "q_num_heads": self.n, "kv_num_heads": kv.blocks(self.n)}
            self.split.head_attrs[i] = tuple((a, d) for a, d in divisors.items() if a in node.attrs)
        for k, out in enumerate(node.outputs):  # Y and the QK product by the query heads, present K/V by K/V's
            if out.name:
                self._set(node, out, (kv if k in (1, 2) else q).at(self._heads_axis(out)))

    def _kv_heads(self, node: gs.Node) -> int:
        key = node.inputs[1]
        if len(self.shape(key)) == 4:
            return self.shape(key)[1]
        return int(node.attrs.get("kv_num_heads", node.attrs.get("q_num_heads", 0)))

    def _kv_shard(self, node: gs.Node) -> Shard:
        """Attention's K/V computed whole: split by KV heads, or replicated when fewer than the ranks."""
        heads, axis = self._kv_heads(node), self._heads_axis(node.inputs[1])
        if heads and heads % self.n and self.n % heads == 0:
            return Shard(axis, copies=self.n // heads)
        return Shard(axis)

    def _scatter(self, i: int, node: gs.Node, ins: list[tuple[int, Shard]]) -> None:
        """ScatterND(data, indices [..., k], updates): a data axis past k is the updates' axis at the same
        place from the end. A data axis the indices address (a cache update's heads) splits when, as
        measured, the ranks' slices of the indices along one of their axes address only the rank's block
        of it: the updates split along that axis and each rank's indices are shifted into its block."""
        where = dict(ins)
        if 1 in where or any(s.outer != 1 for s in where.values()) or len({s.copies for s in where.values()}) > 1:
            raise Unsplittable(node.name, "ScatterND with sharded indices, a merged axis or mixed copies")
        copies = ins[0][1].copies
        index_shape = self.shape(node.inputs[1])
        q, k = len(index_shape), index_shape[-1]
        lead = q - 1 - k  # updates axis = data axis + lead, for data axes past k
        if 0 in where and where[0].axis >= k or 2 in where and where[2].axis >= q - 1:
            a = where[0].axis if 0 in where else where[2].axis - lead
            j = a + lead
        else:
            blocks = ins[0][1].blocks(self.n)
            indices = self.facts.values.get(node.inputs[1].name)
            found = addressed_block(indices if indices is not None else constant_value(node.inputs[1]),
                                    self.shape(node.inputs[0]), blocks, where.get(0), where.get(2))
            if found is None:
                raise Unsplittable(node.name, "ScatterND: no axis of its indices gives each rank only its block "
                                              "of the sharded data axis (as measured)")
            a, j = found
            self._operand(i, node, 1, Shard(j, copies=copies))
            self.split.index_shifts[(i, 1)] = (a, self.shape(node.inputs[0])[a] // blocks, copies)
        for k_, axis in ((0, a), (2, j)):
            if k_ not in where:
                self._operand(i, node, k_, Shard(axis, copies=copies))
            elif where[k_].axis != axis:
                raise Unsplittable(node.name, "ScatterND data and updates sharded along axes that do not match")
        self._set(node, node.outputs[0], Shard(a, copies=copies))
