"""What a RotaryEmbedding op is, for every module that reads or writes one: the standard op (opset 23) and ONNX
Runtime's com.microsoft one, where each takes x, the cos and sin tables and the position ids (the two domains
order them differently), and its attributes (interleaved, rotary_embedding_dim: 0 when the whole head rotates,
num_heads for a 3-D x). match/rope.py and match/rotation.py read rotations into these, rewrite/rope.py and
routes/prepare/rope.py write them, trt/plan.py lowers them, graph/op_dims.py reads the tables' rows."""

from __future__ import annotations

from dataclasses import dataclass

OP = "RotaryEmbedding"
OPSET = 23  # the standard op's
# each domain's inputs -> their index
INPUTS = {"": {"x": 0, "cos": 1, "sin": 2, "position_ids": 3},
          "com.microsoft": {"x": 0, "position_ids": 1, "cos": 2, "sin": 3}}


def is_rotary(op: str, domain: str | None) -> bool:
    return op == OP and (domain or "").replace("ai.onnx", "") in INPUTS


def rotary_inputs(domain: str | None, inputs: list):
    """(x, cos, sin, position_ids) of a RotaryEmbedding's inputs (names or tensors) in `domain`'s order;
    position_ids None where the op is not given them (an absent input, or an empty name)."""
    index = INPUTS[(domain or "").replace("ai.onnx", "")]
    x, cos, sin = (inputs[index[k]] for k in ("x", "cos", "sin"))
    at = index["position_ids"]
    pos = inputs[at] if at < len(inputs) else None
    return x, cos, sin, pos if pos is not None and (pos if isinstance(pos, str) else pos.name) else None


@dataclass(frozen=True)
class RotaryAttrs:
    """A RotaryEmbedding op's attributes."""

    interleaved: bool = False
    rotary_embedding_dim: int = 0  # rotated lanes of each head; 0: the whole head
    num_heads: int = 0  # the heads folded into a 3-D x; 0 for a 4-D one

    @classmethod
    def of(cls, attrs: dict) -> RotaryAttrs:
        """The attributes of a node (a dict of name -> value, absent ones at the op's defaults)."""
        return cls(bool(attrs.get("interleaved", 0)), int(attrs.get("rotary_embedding_dim", 0)),
                   int(attrs.get("num_heads", 0)))

    @classmethod
    def for_head(cls, interleaved: bool, rotary_dim: int, head_size: int | None, num_heads: int = 0) -> RotaryAttrs:
        """A rotation of `rotary_dim` lanes of a head of `head_size`: 0 as the op's rotary_embedding_dim when it
        rotates the whole head (or `rotary_dim` is 0)."""
        return cls(interleaved, 0 if rotary_dim in (0, head_size) else rotary_dim, num_heads)

    def rotary_dim(self, head_size: int | None) -> int | None:
        """The rotated lanes of a head of `head_size`."""
        return self.rotary_embedding_dim or head_size

    def as_attrs(self) -> dict:
        """The node's attributes: num_heads only where a 3-D x has it (the op's default, 0, otherwise)."""
        attrs = {"interleaved": int(self.interleaved), "rotary_embedding_dim": self.rotary_embedding_dim}
        if self.num_heads:
            attrs["num_heads"] = self.num_heads
        return attrs
