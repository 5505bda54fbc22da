"""ONNX Runtime's layer norms as standard ONNX: SimplifiedLayerNormalization -> RMSNormalization (opset 23);
SkipLayerNormalization / SkipSimplifiedLayerNormalization -> Add (input + skip, + bias) then LayerNormalization /
RMSNormalization over the last axis.

Their outputs (ONNX Runtime's contrib op schemas; checked on its CPU kernels):
- SimplifiedLayerNormalization (default domain): Y, inv_std_var; attributes axis (-1), epsilon (1e-5), stash_type.
- SkipLayerNormalization: output, mean, inv_std_var, input_skip_bias_sum (the residual the next layer reads);
  inputs input, skip, gamma, beta, bias; epsilon (1e-12).
- SkipSimplifiedLayerNormalization: output, mean (ONNX Runtime writes zeros: refused when read), inv_std_var,
  input_skip_bias_sum; inputs input, skip, gamma, bias; epsilon (1e-12).
mean and inv_std_var keep the normalized axes as 1 ([..., 1]), as LayerNormalization's Mean and InvStdDev do.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .base import CannotLower, Constants, Replacement, attribute, used

SKIP_EPSILON = 1e-12  # SkipLayerNormalization's and SkipSimplifiedLayerNormalization's default
SIMPLIFIED_EPSILON = 1e-5  # SimplifiedLayerNormalization's default


def _names(node: onnx.NodeProto):
    prefix = f"trtattn/lowered/{node.name or node.output[0]}"
    return lambda what: f"{prefix}/{what}"


def _inv_std(x: str, axis: int, epsilon: float, out: str, name, mean: str | None = None) -> tuple[list, list]:
    """1 / sqrt(mean((x - mean)^2) + epsilon) over the axes from `axis` on, kept as 1 (x's own mean square
    without `mean`: the RMS norm's)."""
    centred = x
    nodes = []
    if mean is not None:
        centred = name("centred")
        nodes.append(helper.make_node("Sub", [x, mean], [centred], name=centred))
    axes = numpy_helper.from_array(np.asarray([axis], np.int64), name("axis"))
    eps = numpy_helper.from_array(np.asarray(epsilon, np.float32), name("epsilon"))
    nodes += [helper.make_node("Mul", [centred, centred], [name("square")], name=name("square")),
              helper.make_node("ReduceMean", [name("square"), axes.name], [name("mean_square")], keepdims=1,
                               name=name("mean_square")),
              helper.make_node("CastLike", [eps.name, name("mean_square")], [name("eps")], name=name("eps")),
              helper.make_node("Add", [name("mean_square"), name("eps")], [name("variance")], name=name("variance")),
              helper.make_node("Sqrt", [name("variance")], [name("std")], name=name("std")),
              helper.make_node("Reciprocal", [name("std")], [out], name=out)]
    return nodes, [axes, eps]


def simplified(node: onnx.NodeProto, constants: Constants, consumed: set[str]) -> Replacement:
    name = _names(node)
    axis = attribute(node, "axis", -1)
    epsilon = attribute(node, "epsilon", SIMPLIFIED_EPSILON)
    nodes = [helper.make_node("RMSNormalization", list(node.input[:2]), [node.output[0]], axis=axis, epsilon=epsilon,
                              stash_type=attribute(node, "stash_type", 1), name=name("RMSNormalization"))]
    inits: list = []
    if used(node, 1, consumed):
        more, inits = _inv_std(node.input[0], axis, epsilon, node.output[1], name)
        nodes += more
    return Replacement(nodes, inits)


def _residual(node: onnx.NodeProto, bias_index: int, name) -> tuple[list, str]:
    """input + skip (+ bias): the sum ONNX Runtime normalizes and returns as input_skip_bias_sum."""
    wanted = node.output[3] if len(node.output) > 3 and node.output[3] else name("input_skip_bias_sum")
    has_bias = len(node.input) > bias_index and bool(node.input[bias_index])
    first = name("input_skip") if has_bias else wanted
    nodes = [helper.make_node("Add", [node.input[0], node.input[1]], [first], name=name("input_skip"))]
    if has_bias:
        nodes.append(helper.make_node("Add", [first, node.input[bias_index]], [wanted], name=name("bias")))
    return nodes, wanted


def skip_simplified(node: onnx.NodeProto, constants: Constants, consumed: set[str]) -> Replacement:
    if used(node, 1, consumed):
        raise CannotLower(f"SkipSimplifiedLayerNormalization node '{node.name}': its output 1 ('mean', which "
                          "ONNX Runtime's kernel leaves zero) is read")
    name = _names(node)
    epsilon = attribute(node, "epsilon", SKIP_EPSILON)
    nodes, total = _residual(node, 3, name)
    nodes.append(helper.make_node("RMSNormalization", [total, node.input[2]], [node.output[0]], axis=-1,
                                  epsilon=epsilon, name=name("RMSNormalization")))
    inits: list = []
    if used(node, 2, consumed):
        more, inits = _inv_std(total, -1, epsilon, node.output[2], name)
        nodes += more
    return Replacement(nodes, inits)


def skip_layer(node: onnx.NodeProto, constants: Constants, consumed: set[str]) -> Replacement:
    name = _names(node)
    epsilon = attribute(node, "epsilon", SKIP_EPSILON)
    nodes, total = _residual(node, 4, name)
    beta = node.input[3] if len(node.input) > 3 else ""
    outputs = [node.output[0], node.output[1] if used(node, 1, consumed) else "",
               node.output[2] if used(node, 2, consumed) else ""]
    while outputs[-1] == "":
        outputs.pop()
    nodes.append(helper.make_node("LayerNormalization", [total, node.input[2], *([beta] if beta else [])], outputs,
                                  axis=-1, epsilon=epsilon, name=name("LayerNormalization")))
    return Replacement(nodes)
