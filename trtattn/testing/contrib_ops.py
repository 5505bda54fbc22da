"""Hand-built models of ONNX Runtime's ops around attention, as ONNX Runtime GenAI's builder writes them
(tests of rewrite/lower and of `--ops trt` / `build` on such models); ONNX Runtime runs them on CPU.

- `norm_model(op)`: one SkipLayerNormalization / SkipSimplifiedLayerNormalization / SimplifiedLayerNormalization
  over x [b, s, hidden] (and skip), its outputs `outputs` as graph outputs.
- `nbits_weights` / `matmul_nbits_model`: a random [K, N] weight quantized to 4 bits by blocks of K and packed as
  MatMulNBits reads it (low nibble first, zero points packed the same, or none: 8).
- `genai_layer`: token ids -> embedding -> SimplifiedLayerNormalization -> MatMulNBits (packed QKV) ->
  GroupQueryAttention with a past -> MatMulNBits -> SkipSimplifiedLayerNormalization (the residual sum an output).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSETS = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
NORM_INPUTS = {"SkipLayerNormalization": ("input", "skip", "gamma", "beta", "bias"),
               "SkipSimplifiedLayerNormalization": ("input", "skip", "gamma", "bias"),
               "SimplifiedLayerNormalization": ("input", "gamma")}


def _model(nodes, inputs, outputs, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "contrib_ops", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=10)


def norm_model(op: str, *, hidden: int = 16, bias: bool = True, outputs=(0, 3), seed: int = 0,
               **attributes) -> onnx.ModelProto:
    """`outputs`: the indices of the op's outputs that are graph outputs (0 output, 1 mean, 2 inv_std_var,
    3 input_skip_bias_sum; SimplifiedLayerNormalization: 0 Y, 1 inv_std_var)."""
    rng = np.random.default_rng(seed)
    names = [n for n in NORM_INPUTS[op] if bias or n != "bias"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "s", hidden]) for n in names
              if n in ("input", "skip")]
    inits = [numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), n) for n in names
             if n not in ("input", "skip")]
    count = max(outputs) + 1
    out_names = [f"out{i}" if i in outputs else "" for i in range(count)]
    domain = "" if op == "SimplifiedLayerNormalization" else "com.microsoft"
    node = helper.make_node(op, names, out_names, domain=domain, name=op.lower(), **attributes)
    return _model([node], inputs, [helper.make_tensor_value_info(f"out{i}", TensorProto.FLOAT, None) for i in outputs],
                  inits)


def nbits_weights(k: int, n: int, block: int, *, zero_points: bool, seed: int = 0, name: str = "w"):
    """(B, scales, zero_points or None) initializers of a random [K, N] weight as MatMulNBits packs it, and
    the weight they dequantize to ([K, N] float32)."""
    rng = np.random.default_rng(seed)
    blocks = -(-k // block)
    codes = rng.integers(0, 16, (n, blocks * block)).astype(np.uint8)
    scales = (rng.random((n, blocks)) * 0.1 + 0.01).astype(np.float32)
    zero = rng.integers(0, 16, (n, blocks)).astype(np.uint8) if zero_points else np.full((n, blocks), 8, np.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).reshape(n, blocks, block // 2)
    weight = ((codes.astype(np.float32) - zero.repeat(block, 1)) * scales.repeat(block, 1))[:, :k].T
    inits = [numpy_helper.from_array(packed, f"{name}.B"), numpy_helper.from_array(scales.reshape(-1), f"{name}.scales")]
    if zero_points:
        padded = np.pad(zero, [(0, 0), (0, blocks % 2)])
        inits.append(numpy_helper.from_array((padded[:, 0::2] | (padded[:, 1::2] << 4)).reshape(-1), f"{name}.zp"))
    return inits, weight


def matmul_nbits_node(a: str, y: str, k: int, n: int, block: int, *, zero_points: bool, bias: str = "",
                      accuracy_level: int = 4, name: str = "w") -> onnx.NodeProto:
    inputs = [a, f"{name}.B", f"{name}.scales", f"{name}.zp" if zero_points else ""]
    if bias:
        inputs += ["", bias]
    while not inputs[-1]:
        inputs.pop()
    return helper.make_node("MatMulNBits", inputs, [y], domain="com.microsoft", name=f"{name}/MatMulNBits", K=k, N=n,
                            bits=4, block_size=block, accuracy_level=accuracy_level)


def matmul_nbits_model(k: int = 40, n: int = 24, block: int = 16, *, zero_points: bool = False, bias: bool = False,
                       accuracy_level: int = 4, seed: int = 0) -> tuple[onnx.ModelProto, np.ndarray]:
    """A [b, s, K] @ the MatMulNBits weight (+ bias) model, and the weight it dequantizes to."""
    inits, weight = nbits_weights(k, n, block, zero_points=zero_points, seed=seed)
    if bias:
        inits.append(numpy_helper.from_array(np.random.default_rng(seed + 1).standard_normal(n).astype(np.float32),
                                             "bias"))
    node = matmul_nbits_node("a", "y", k, n, block, zero_points=zero_points, bias="bias" if bias else "",
                             accuracy_level=accuracy_level)
    return _model([node], [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["b", "s", k])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", n])], inits), weight


def genai_layer(*, vocab: int = 32, heads: int = 4, kv_heads: int = 2, head: int = 8, block: int = 16,
                seed: int = 0) -> onnx.ModelProto:
    """One decoder layer as ONNX Runtime GenAI writes it at int4 (module doc); inputs input_ids [b, s],
    past_key / past_value [b, kv_heads, past, head], seqlens_k [b], total_sequence_length []."""
    rng = np.random.default_rng(seed)
    hidden = heads * head
    qkv = (heads + 2 * kv_heads) * head
    inits = [numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "embed"),
             numpy_helper.from_array(rng.random(hidden).astype(np.float32) + 0.5, "ln1.gamma"),
             numpy_helper.from_array(rng.random(hidden).astype(np.float32) + 0.5, "ln2.gamma")]
    for name, n in (("qkv", qkv), ("o", hidden)):
        inits += nbits_weights(hidden, n, block, zero_points=name == "o", seed=seed + len(inits), name=name)[0]
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["h"], name="embed"),
             helper.make_node("SimplifiedLayerNormalization", ["h", "ln1.gamma"], ["h_norm"], epsilon=1e-6,
                              name="ln1"),
             matmul_nbits_node("h_norm", "qkv_out", hidden, qkv, block, zero_points=False, name="qkv"),
             helper.make_node("GroupQueryAttention", ["qkv_out", "", "", "past_key", "past_value", "seqlens_k",
                                                      "total_sequence_length"], ["attn", "present_key", "present_value"],
                              domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads, name="gqa"),
             matmul_nbits_node("attn", "o_out", hidden, hidden, block, zero_points=True, name="o"),
             helper.make_node("SkipSimplifiedLayerNormalization", ["o_out", "h", "ln2.gamma"],
                              ["out", "", "", "residual"], domain="com.microsoft", epsilon=1e-6, name="ln2")]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"]),
              helper.make_tensor_value_info("past_key", TensorProto.FLOAT, ["b", kv_heads, "past", head]),
              helper.make_tensor_value_info("past_value", TensorProto.FLOAT, ["b", kv_heads, "past", head]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["b"]),
              helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["b", "s", hidden]),
               helper.make_tensor_value_info("residual", TensorProto.FLOAT, ["b", "s", hidden]),
               helper.make_tensor_value_info("present_key", TensorProto.FLOAT, ["b", kv_heads, "total", head]),
               helper.make_tensor_value_info("present_value", TensorProto.FLOAT, ["b", kv_heads, "total", head])]
    return _model(nodes, inputs, outputs, inits)
