"""ONNX Runtime's MatMulNBits as standard ONNX: a blocked DequantizeLinear (opset 21 block quantization, int4
or uint4 weights, axis 0, block_size) of the weight as [K, N], then MatMul (+ bias): the weight-only int4
pattern TensorRT builds.

MatMulNBits (ONNX Runtime's contrib op schema): Y = A @ dequant(B)^T + bias, where B is [N, k_blocks, blob]
uint8 (blob = block_size * bits / 8 bytes; codes packed low bits first along K), scales [N * k_blocks] or
[N, k_blocks], zero_points either packed like B (uint8 [N * ceil(k_blocks * bits / 8)], low nibble first,
default 2^(bits - 1)) or in A's type, g_idx (deprecated: the block of each k) and bias [N]. K and N are
attributes; K need not be a multiple of block_size (B is padded). Without zero points, or when every zero
point is 2^(bits - 1), the codes minus it are signed (int4 / int8, no zero point: symmetric, as TensorRT
wants); other zero points stay unsigned (uint4 / uint8) with their zero points.

At accuracy_level 4 ONNX Runtime's CPU kernel may quantize A to int8 per block of K (absmax / 127 per
block): the lowered MatMul is then nearer the real product than the op itself, and the check allows that
rounding of A, evaluated from A's own values (`_bound`).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from .base import CannotLower, Constants, Replacement, attribute

_TYPES = {4: (ml_dtypes.int4, ml_dtypes.uint4), 8: (np.int8, np.uint8)}
INT8_ACTIVATIONS = 4  # the accuracy_level at which ONNX Runtime's CPU kernel quantizes A to int8


def _codes(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Unsigned codes from bytes packed low bits first along the last axis: [..., bytes] -> [..., count]."""
    per_byte = 8 // bits
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    codes = (packed[..., None] >> shifts) & ((1 << bits) - 1)
    return codes.reshape(*packed.shape[:-1], -1)[..., :count]


def _zero_points(node: onnx.NodeProto, zp: np.ndarray | None, bits: int, n: int, blocks: int) -> np.ndarray:
    """[N, k_blocks] integer zero points."""
    if zp is None:
        return np.full((n, blocks), 1 << (bits - 1), np.int32)
    if zp.dtype == np.uint8:
        return _codes(zp.reshape(n, -1), bits, blocks).astype(np.int32)
    values = zp.astype(np.float64).reshape(n, blocks)
    if not (np.array_equal(values, np.round(values)) and values.min() >= 0 and values.max() < (1 << bits)):
        raise CannotLower(f"MatMulNBits node '{node.name}': its zero points are {zp.dtype} values that are not "
                          f"{bits}-bit integers (DequantizeLinear's zero point is an integer of the weight's type)")
    return values.astype(np.int32)


def _trivial_groups(node: onnx.NodeProto, g_idx: np.ndarray | None, k: int, block: int) -> None:
    if g_idx is not None and not np.array_equal(g_idx.reshape(-1)[:k], np.arange(k) // block):
        raise CannotLower(f"MatMulNBits node '{node.name}': g_idx reorders K into blocks (act-order), which a "
                          "blocked DequantizeLinear cannot express")


def lower(node: onnx.NodeProto, constants: Constants, consumed: set[str]) -> Replacement:
    k, n = attribute(node, "K", None), attribute(node, "N", None)
    bits, block = attribute(node, "bits", 4), attribute(node, "block_size", None)
    if k is None or n is None or block is None:
        raise CannotLower(f"MatMulNBits node '{node.name}' lacks its K, N or block_size attribute")
    if bits not in _TYPES:
        raise CannotLower(f"MatMulNBits node '{node.name}': {bits}-bit weights (DequantizeLinear lowers 4 and 8)")
    packed = constants.get(node, 1, "weight")
    scales = constants.get(node, 2, "scales")
    if packed is None or scales is None:
        raise CannotLower(f"MatMulNBits node '{node.name}' has no weight or scales")
    blocks = -(-k // block)
    codes = _codes(np.asarray(packed, np.uint8).reshape(n, blocks, -1), bits, block).reshape(n, blocks * block)[:, :k]
    zero = _zero_points(node, constants.get(node, 3, "zero points"), bits, n, blocks)
    _trivial_groups(node, constants.get(node, 4, "g_idx"), k, block)
    name = f"trtattn/lowered/{node.name or node.output[0]}"
    signed, unsigned = _TYPES[bits]
    inits = [numpy_helper.from_array(np.ascontiguousarray(scales.reshape(n, blocks).T), f"{name}/scales")]
    dq_inputs = [f"{name}/weight", f"{name}/scales"]
    symmetric = bool((zero == 1 << (bits - 1)).all())  # the codes minus their zero point: the signed weight
    if symmetric:
        weight = (codes.T.astype(np.int32) - (1 << (bits - 1))).astype(signed)  # [K, N]
    else:
        weight = codes.T.astype(unsigned)
        inits.append(numpy_helper.from_array(np.ascontiguousarray(zero.T.astype(unsigned)), f"{name}/zero_points"))
        dq_inputs.append(f"{name}/zero_points")
    inits.insert(0, numpy_helper.from_array(np.ascontiguousarray(weight), f"{name}/weight"))
    bias = node.input[5] if len(node.input) > 5 and node.input[5] else ""
    product = f"{name}/product" if bias else node.output[0]
    nodes = [helper.make_node("DequantizeLinear", dq_inputs, [f"{name}/dequantized"], axis=0, block_size=block,
                              name=f"{name}/DequantizeLinear"),
             helper.make_node("MatMul", [node.input[0], f"{name}/dequantized"], [product], name=f"{name}/MatMul")]
    if bias:
        nodes.append(helper.make_node("Add", [product, bias], [node.output[0]], name=f"{name}/bias"))
    offset = 0 if symmetric else zero.T.repeat(block, 0)[:k]
    dequantized = (weight.astype(np.float64) - offset) * scales.reshape(n, blocks).T.astype(np.float64).repeat(block, 0)[:k]
    level = attribute(node, "accuracy_level", 0)
    return Replacement(nodes, inits, bound=_bound(node.input[0], dequantized, block, level),
                       why=_why(level))


def _why(level: int) -> str:
    rounding = "fp32 rounding of each product (64 units in the last place of sum |a| |w|)"
    if level != INT8_ACTIVATIONS:
        return rounding
    return (f"accuracy_level {level}: ONNX Runtime's CPU kernel may round A to int8 per block of K (absmax / 127), "
            f"so each output may be off by sum over blocks of absmax / 254 * sum |w|, plus the {rounding}")


def _bound(a_name: str, weight: np.ndarray, block: int, level: int):
    """The elementwise error the lowered MatMul may differ from ONNX Runtime's op by, from A's values."""
    abs_weight = np.abs(weight)

    def bound(outputs, inputs):
        a = np.asarray(inputs[a_name], np.float64)
        eps = float(np.finfo(outputs[0].dtype).eps)
        limit = max(64 * float(np.finfo(np.float32).eps), 4 * eps) * (np.abs(a) @ abs_weight) \
            + 4 * eps * np.abs(outputs[0].astype(np.float64))
        if level == INT8_ACTIVATIONS:
            k = a.shape[-1]
            pad = (-k) % block
            blocks = np.pad(np.abs(a), [(0, 0)] * (a.ndim - 1) + [(0, pad)]).reshape(*a.shape[:-1], -1, block)
            step = blocks.max(axis=-1) / 254  # half the int8 step of each block
            per_block = np.pad(abs_weight, [(0, pad), (0, 0)]).reshape(-1, block, abs_weight.shape[1]).sum(axis=1)
            limit = limit + step @ per_block
        return [limit]

    return bound
