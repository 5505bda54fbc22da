"""A bf16 model emulated in fp32, for ONNX Runtime's CPU provider, which has no bf16 kernel for MatMul, Add,
Softmax, Attention... but casts to and from bf16.

    emulated = bf16_emulated(model)   # fp32 IO; every bf16 tensor of `model` rounded to bf16 where it is made

Every tensor the model holds in bf16 (inputs, initializers, node outputs) takes a bf16 value here too: each
node computes in fp32 from bf16 values and its bf16 outputs are rounded once (a Cast to bf16 and back), which is
what a kernel accumulating in fp32 and storing bf16 does (TensorRT's). It is not a run of bf16 kernels: a kernel
rounding inside an op (a bf16 accumulator) would differ from it.
"""

from __future__ import annotations

import copy

import onnx
from onnx import TensorProto

from .common import declared_types
from .widen import widened

EMULATION = ("the bf16 model emulated on ONNX Runtime (CPU): every bf16 tensor rounded to bf16, each op computed in "
             "fp32; no bf16 kernel run")


def bf16_emulated(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (not modified) with fp32 in place of bf16 and a rounding to bf16 after everything bf16 is made:
    graph inputs (fed as fp32, rounded on the way in) and node outputs; initializers are bf16 values already."""
    try:
        types = declared_types(onnx.shape_inference.infer_shapes(model))
    except Exception:  # a model shape inference refuses: the types the model states
        types = declared_types(model)
    bf16 = {t for t, d in types.items() if d == TensorProto.BFLOAT16}
    emulated, _ = widened(copy.deepcopy(model), "fp16")  # bf16 is the precision widened for an fp16 conversion
    graph = emulated.graph
    nodes: list[onnx.NodeProto] = []
    inputs = [v.name for v in graph.input if v.name in bf16]
    for name in inputs:  # its readers read the rounded value
        nodes += _rounding(name, f"{name}/bf16_value")
    renamed = {name: f"{name}/bf16_value" for name in inputs}
    for node in graph.node:
        node.input[:] = [renamed.get(t, t) for t in node.input]
        nodes.append(node)
        for i, t in enumerate(node.output):
            if t in bf16:
                node.output[i] = f"{t}/fp32"
                nodes += _rounding(f"{t}/fp32", t)
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.value_info[:]
    return emulated


def _rounding(source: str, target: str) -> list[onnx.NodeProto]:
    return [onnx.helper.make_node("Cast", [source], [f"{target}/bf16"], to=TensorProto.BFLOAT16,
                                  name=f"{target}/round_to_bf16"),
            onnx.helper.make_node("Cast", [f"{target}/bf16"], [target], to=TensorProto.FLOAT,
                                  name=f"{target}/bf16_to_fp32")]
