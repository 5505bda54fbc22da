"""What every lowering unit shares: the replacement it returns, the node's constants, and the bound its
check holds the lowered nodes to (check.py runs both on ONNX Runtime)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from ...errors import TrtattnError
from ...graph.external import data_dir, mapped

LOWERED_OPSET = 23  # RMSNormalization's; blocked int4 DequantizeLinear needs 21


class CannotLower(TrtattnError):
    """A contrib op whose configuration has no exact standard ONNX spelling here; names the node."""


# (the ONNX Runtime op's output values, the node's input values by input name) -> elementwise bound on the
# lowered nodes' error for each output, and why it is that
Bound = Callable[[list[np.ndarray], dict[str, np.ndarray]], list[np.ndarray]]


@dataclass
class Replacement:
    """Standard ONNX nodes computing a contrib node's outputs, with the weights they read."""

    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    bound: Bound | None = None  # None: rounding_bound
    why: str = "the op and its lowering both compute in fp32: a few units in the last place of each output"


class Constants:
    """The model's initializers by name, read (or memory-mapped from their file) only when asked for."""

    def __init__(self, model: onnx.ModelProto):
        self.tensors = {t.name: t for t in model.graph.initializer}
        self.folder = data_dir(model)

    def get(self, node: onnx.NodeProto, index: int, what: str) -> np.ndarray | None:
        """Input `index` of `node` as an array; None when the input is absent. A present input that is not
        a constant cannot be repacked: CannotLower naming it."""
        if index >= len(node.input) or not node.input[index]:
            return None
        tensor = self.tensors.get(node.input[index])
        if tensor is None:
            raise CannotLower(f"{node.op_type} node '{node.name}': its {what} '{node.input[index]}' is computed in "
                              "the graph, not a constant (a lowering must repack it)")
        if tensor.data_location == onnx.TensorProto.EXTERNAL and self.folder is not None:
            return np.asarray(mapped(tensor, self.folder))
        return numpy_helper.to_array(tensor)


def attribute(node: onnx.NodeProto, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def used(node: onnx.NodeProto, index: int, consumed: set[str]) -> bool:
    """Whether output `index` of `node` is there and read (by a node or as a graph output)."""
    return index < len(node.output) and bool(node.output[index]) and node.output[index] in consumed


def rounding_bound(outputs: list[np.ndarray], inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """A few units in the last place of each output's type at the output's largest magnitude (at least 1):
    both sides compute in fp32, in another order."""
    bounds = []
    for y in outputs:
        eps = float(np.finfo(y.dtype).eps) if np.issubdtype(y.dtype, np.floating) else 0.0
        scale = max(1.0, float(np.max(np.abs(y), initial=0.0)))
        bounds.append(np.full(y.shape, max(4 * eps, 64 * float(np.finfo(np.float32).eps)) * scale))
    return bounds
