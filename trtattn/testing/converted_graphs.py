"""Attention graphs shaped like those converters and ONNX Runtime's optimizer generators write, built by hand
(issue 34): a Conformer-style self-attention (SkipLayerNormalization, Q/K/V with Add(bias, x), a key/value cache
concatenated on the sequence axis, an additive position bias, the context reshaped by a runtime-computed shape)
and a tf2onnx-style Einsum attention ('BTNH,BFNH->BNFT', mask as (1 - m) * fill added to the scores).

    model = conformer_attention(shared_qk=True)
    model = einsum_attention(fill=-1e9)
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def _weights(rng, **shapes) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array((rng.standard_normal(s) * 0.3).astype(np.float32), n) for n, s in shapes.items()]


def _ints(**values) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in values.items()]


def _conformer_nodes(heads: int, shared_qk: bool) -> list[onnx.NodeProto]:
    node = helper.make_node
    nodes = [node("Shape", ["x0"], ["shape"]), node("Gather", ["shape", "i0"], ["b"], axis=0),
             node("Gather", ["shape", "i1"], ["s"], axis=0), node("Concat", ["b", "s", "hidden"], ["bsd"], axis=0),
             node("SkipLayerNormalization", ["x0", "x1", "ln.w", "ln.b"], ["ln", "", "", "res"],
                  domain="com.microsoft", epsilon=1e-5)]
    for t, shape in (("q", "bsnh"), ("k", "kv_bsnh"), ("v", "kv_bsnh")):
        weight = "q.w" if shared_qk and t == "k" else f"{t}.w"  # ONNX Runtime's generator projects K with Q's weight
        nodes += [node("MatMul", ["ln", weight], [f"{t}.mm"]), node("Add", [f"{t}.b", f"{t}.mm"], [f"{t}.add"]),
                  node("Reshape", [f"{t}.add", shape], [f"{t}.r"]),
                  node("Transpose", [f"{t}.r"], [f"{t}.t"], perm=[0, 2, 1, 3])]
    return nodes + [
        node("Div", ["q.t", "sqrt_head"], ["q.s"]),
        node("Concat", ["cache_k", "k.t"], ["out_cache_k"], axis=2),
        node("Concat", ["cache_v", "v.t"], ["out_cache_v"], axis=2),
        node("Transpose", ["out_cache_k"], ["k.T"], perm=[0, 1, 3, 2]),
        node("MatMul", ["q.s", "k.T"], ["qk"]), node("Add", ["qk", "pos"], ["qk.pos"]),
        node("Softmax", ["qk.pos"], ["probs"], axis=-1), node("MatMul", ["probs", "out_cache_v"], ["ctx"]),
        node("Transpose", ["ctx"], ["ctx.t"], perm=[0, 2, 1, 3]), node("Reshape", ["ctx.t", "bsd"], ["attn"]),
        node("MatMul", ["attn", "o.w"], ["o.mm"]), node("Add", ["o.b", "o.mm"], ["o.add"]),
        node("SkipLayerNormalization", ["res", "o.add", "ln.w", "ln.b"], ["output_0", "", "", "output_1"],
             domain="com.microsoft", epsilon=1e-5)]


def conformer_attention(*, hidden: int = 16, heads: int = 2, past: int = 6, seq: int = 8, shared_qk: bool = False,
                        seed: int = 0) -> onnx.ModelProto:
    """One Conformer-style self-attention with a cache of `past` positions, at opset 16 as the generator writes."""
    head = hidden // heads
    rng = np.random.default_rng(seed)
    inits = _weights(rng, **{"q.w": (hidden, hidden), "q.b": (hidden,), "k.w": (hidden, hidden), "k.b": (hidden,),
                             "v.w": (hidden, hidden), "v.b": (hidden,), "o.w": (hidden, hidden), "o.b": (hidden,),
                             "ln.w": (hidden,), "ln.b": (hidden,)})
    inits += _ints(bsnh=[0, 0, heads, head], kv_bsnh=[0, -1, heads, head], i0=[0], i1=[1], hidden=[hidden])
    inits.append(numpy_helper.from_array(np.array([np.sqrt(head)], np.float32), "sqrt_head"))
    info = helper.make_tensor_value_info
    inputs = [info("x0", F, ["batch", seq, hidden]), info("x1", F, ["batch", seq, hidden]),
              info("cache_k", F, ["batch", heads, past, head]), info("cache_v", F, ["batch", heads, past, head]),
              info("pos", F, ["batch", heads, seq, past + seq])]
    outputs = [info("output_0", F, ["batch", seq, hidden]), info("output_1", F, ["batch", seq, hidden]),
               info("out_cache_k", F, ["batch", heads, past + seq, head]),
               info("out_cache_v", F, ["batch", heads, past + seq, head])]
    graph = helper.make_graph(_conformer_nodes(heads, shared_qk), "conformer_attention", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=8)


def einsum_attention(*, hidden: int = 16, heads: int = 2, fill: float = -10000.0, seed: int = 0) -> onnx.ModelProto:
    """tf2onnx's Keras MultiHeadAttention: Einsum projections and scores, a float mask m added as (1 - m) * fill."""
    head = hidden // heads
    rng = np.random.default_rng(seed)
    inits = _weights(rng, **{"q.w": (hidden, heads, head), "k.w": (hidden, heads, head),
                             "v.w": (hidden, heads, head), "o.w": (heads, head, hidden)})
    inits += [numpy_helper.from_array(np.array(v, np.float32), n)
              for n, v in (("one", 1.0), ("fill", fill), ("scale", 1 / np.sqrt(head)))]
    inits += _ints(axes=[1, 2])
    node = helper.make_node
    nodes = [node("Einsum", ["x", f"{t}.w"], [t], equation="BFD,DNH->BFNH") for t in "qkv"]
    nodes += [node("Mul", ["q", "scale"], ["q.s"]), node("Einsum", ["k", "q.s"], ["scores"], equation="BTNH,BFNH->BNFT"),
              node("Sub", ["one", "mask"], ["inverse"]), node("Mul", ["inverse", "fill"], ["adder"]),
              node("Unsqueeze", ["adder", "axes"], ["adder4"]), node("Add", ["scores", "adder4"], ["masked"]),
              node("Softmax", ["masked"], ["probs"], axis=3),
              node("Einsum", ["probs", "v"], ["ctx"], equation="BNFT,BTNH->BFNH"),
              node("Einsum", ["ctx", "o.w"], ["output"], equation="BFNH,NHD->BFD")]
    info = helper.make_tensor_value_info
    inputs = [info("x", F, ["batch", "seq", hidden]), info("mask", F, ["batch", "seq"])]
    graph = helper.make_graph(nodes, "einsum_attention", inputs, [info("output", F, ["batch", "seq", hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _gpt2_layers(config) -> int:
    return int(config.n_layer)  # one attention site per layer


def slimmed_fp16_gpt2(*, cache: bool) -> onnx.ModelProto:
    """The zoo's tiny random GPT-2 (with `cache`: past_key_values inputs and present outputs, use_cache=True)
    exported by TorchScript, slimmed with onnxslim (else onnxconverter-common keeps the exporter's no-op Casts), then
    converted to fp16 by onnxconverter-common with keep_io_types=True, as a user does (issue 34). Needs torch,
    transformers, onnxslim and onnxconverter-common."""
    import tempfile
    from pathlib import Path

    import onnxslim
    from onnxconverter_common import float16

    from ..zoo import ZooEntry
    from ..zoo.torch_export import export_entry

    builder = "gpt2_cache" if cache else "gpt2"
    entry = ZooEntry(builder, "gpt2", "eager", "GPT-2 (issue 34's fp16 conversion)", builder, _gpt2_layers)
    with tempfile.TemporaryDirectory() as tmp:
        path = export_entry(entry, "torchscript", Path(tmp) / "model.onnx")
        exported = onnx.load(path)
    return float16.convert_float_to_float16(onnxslim.slim(exported), keep_io_types=True)
