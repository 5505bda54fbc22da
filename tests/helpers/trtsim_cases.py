"""Helpers for the trtsim tests: ONNX Runtime references, small networks, random feeds."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

TOL = dict(rtol=1e-5, atol=1e-5)

def ort_run(nodes, feeds: dict, outputs: list[tuple[str, np.dtype]], opset: int = 23, initializers=()):
    def info(name, dtype, shape=None):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)

    graph = helper.make_graph(nodes, "reference", [info(n, a.dtype, a.shape) for n, a in feeds.items()],
                              [info(n, d) for n, d in outputs], initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run([n for n, _ in outputs], feeds)


def new_network(trt):
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    return builder, network


def trt_dtype(trt, dtype):
    return {"float32": trt.float32, "float16": trt.float16, "int32": trt.int32, "int64": trt.int64,
            "bool": trt.bool, "int8": trt.int8}[np.dtype(dtype).name]


def add_inputs(trt, network, feeds: dict, dynamic: bool = False):
    return {name: network.add_input(name, trt_dtype(trt, a.dtype), (-1,) * a.ndim if dynamic else a.shape)
            for name, a in feeds.items()}


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def onnx_attention(q, k, v, causal="NONE", mask=None, nonpad=None):
    """The standard ONNX Attention op on ONNX Runtime, scale 1 (TensorRT's IAttention has no scale).
    ONNX Runtime anchors is_causal at the top left without a past and at the bottom right with a past
    or nonpad_kv_seqlen, so LOWER_RIGHT is expressed with a past of length Skv - Sq."""
    names, feeds = ["Q", "K", "V"], {"Q": q, "K": k, "V": v}
    if mask is not None:
        feeds["M"] = mask
    past = k.shape[2] - q.shape[2]
    if causal == "LOWER_RIGHT" and nonpad is None and past:
        assert past > 0
        feeds.update(K=k[:, :, past:], V=v[:, :, past:], PK=k[:, :, :past], PV=v[:, :, :past])
    names += ["M" if "M" in feeds else "", "PK" if "PK" in feeds else "", "PV" if "PV" in feeds else ""]
    if nonpad is not None:
        feeds["NP"] = nonpad.astype(np.int64)
        names.append("NP")
    while names[-1] == "":
        names.pop()
    outputs = ["Y", "present_key", "present_value"] if "PK" in feeds else ["Y"]  # ORT wants presents with a past
    node = helper.make_node("Attention", names, outputs, scale=1.0, is_causal=int(causal != "NONE"))
    return ort_run([node], feeds, [(n, q.dtype) for n in outputs], opset=24 if nonpad is not None else 23)[0]


def attention_network(trt, feeds, causal="NONE", q_packed=False, kv_packed=False, dynamic=True):
    """q, k, v [, mask, query_lengths, key_value_lengths] from feeds -> network with one IAttention."""
    builder, net = new_network(trt)
    t = add_inputs(trt, net, feeds, dynamic=dynamic)
    attn = net.add_attention_v2(t["q"], t["k"], t["v"], trt.AttentionNormalizationOp.SOFTMAX,
                                getattr(trt.CausalMaskKind, causal))
    if "mask" in t:
        attn.mask = t["mask"]
    if q_packed:
        attn.query_form = trt.AttentionIOForm.PACKED_NHD
        attn.query_lengths = t["query_lengths"]
    if kv_packed:
        attn.key_value_form = trt.AttentionIOForm.PACKED_NHD
    if "key_value_lengths" in t:
        attn.key_value_lengths = t["key_value_lengths"]
    attn.decomposable = True
    out = attn.get_output(0)
    out.name = "out"
    net.mark_output(out)
    return builder, net, attn


def profile_for(builder, feeds):
    profile = builder.create_optimization_profile()
    for name, a in feeds.items():
        profile.set_shape(name, a.shape, a.shape, a.shape)
    return profile


def two_output_model():
    """x [N, 3] -> a = 2x (output); placeholder p [N, 3] -> y = p + x (output)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    p = helper.make_tensor_value_info("p", TensorProto.FLOAT, ["n", 3])
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    nodes = [helper.make_node("Mul", ["x", "two"], ["a"]), helper.make_node("Add", ["p", "x"], ["y"])]
    graph = helper.make_graph(nodes, "cut", [x, p], [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 3]),
                                                     helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
                              initializer=[two])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model
