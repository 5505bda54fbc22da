"""A model holding floats in the other low precision (fp16 for a bf16 conversion, bf16 for fp16) brought to fp32
for AutoCast, and its input and output types put back afterwards.

AutoCast converts between fp32 and one low precision: it casts every graph output of a low-precision node up
to fp32, so an fp16 output of a model converted to bf16 comes out fp32 and its keep_io_types check stops
("Cannot restore public graph output metadata for Y: element type changed"); a fp16 tensor feeding a bf16 node
would be an fp16/bf16 mix no op accepts. Widening first is exact (every fp16 and bf16 value is an fp32 value) and
leaves the choice of what computes in the low precision to AutoCast's classifier, as for an fp32 model.

    wide, io = widened(model, "bf16")   # io: {graph input/output: its original element type}, {} when unchanged
    ... AutoCast on `wide` with keep_io_types ...
    narrow_io(converted, io)            # the original fp16 inputs and outputs again, through Casts
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from .common import PrecisionError

LOW = {"fp16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16}
TYPE_ATTRIBUTES = ("to", "dtype", "output_dtype")  # Cast, Random*/EyeLike, DequantizeLinear: an output's type


def foreign_type(precision: str) -> int:
    """The low precision that is not `precision`: what AutoCast cannot carry through a conversion to it."""
    return next(t for p, t in LOW.items() if p != precision)


def widened(model: onnx.ModelProto, precision: str, weights_dir: Path | None = None
            ) -> tuple[onnx.ModelProto, dict[str, int]]:
    """`model` (modified in place, returned) with every float of the other low precision in fp32: graph inputs,
    outputs and value_info, initializers (read from `weights_dir` when external), Constant values and the type
    attributes of Cast and the ops that make a typed tensor; and {graph input or output: its original type}."""
    old = foreign_type(precision)
    old_name = next(p for p, t in LOW.items() if t == old)
    graph = model.graph
    io = {v.name: old for v in [*graph.input, *graph.output] if v.type.tensor_type.elem_type == old}
    for value in [*graph.input, *graph.output, *graph.value_info]:
        if value.type.tensor_type.elem_type == old:
            value.type.tensor_type.elem_type = TensorProto.FLOAT
    for i, init in enumerate(graph.initializer):
        if init.data_type == old:
            graph.initializer[i].CopyFrom(_fp32(init, weights_dir))
    if any(s.values.data_type == old for s in graph.sparse_initializer):
        raise PrecisionError(f"a sparse initializer is {old_name}: make it dense to convert the model "
                             f"to {precision}")
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == old:  # Constant, ConstantOfShape
                a.t.CopyFrom(_fp32(a.t, weights_dir))
            elif a.type == onnx.AttributeProto.INT and a.name in TYPE_ATTRIBUTES and a.i == old:
                a.i = TensorProto.FLOAT
            elif a.type == onnx.AttributeProto.TENSORS and any(t.data_type == old for t in a.tensors):
                raise PrecisionError(f"node {node.name} ({node.op_type}) holds {old_name} tensors in its "
                                     f"attribute '{a.name}', which trtattn cannot widen to fp32 before converting "
                                     f"to {precision}")
    return model, io


def _fp32(tensor: onnx.TensorProto, weights_dir: Path | None) -> onnx.TensorProto:
    if tensor.data_location == TensorProto.EXTERNAL and weights_dir is None:
        raise PrecisionError(f"initializer {tensor.name}: its external data is not at hand to widen it to fp32")
    array = numpy_helper.to_array(tensor, str(weights_dir) if weights_dir else "")
    return numpy_helper.from_array(np.asarray(array, np.float32), tensor.name)


def widened_feeds(feeds: Mapping, io: dict[str, int]) -> dict:
    """The feeds of the widened model: the inputs it now takes in fp32."""
    return {k: (np.asarray(v, np.float32) if k in io else v) for k, v in feeds.items()}


def narrow_io(model: onnx.ModelProto, io: dict[str, int]) -> None:
    """The graph inputs and outputs `widened` took to fp32 in their original type again (in place), through
    Casts: an input is cast to fp32 for the nodes that read it (a Cast reads it directly: it casts to its own
    type); an output is cast from what computes it (the Cast AutoCast put before it now casts to the type)."""
    graph = model.graph
    readers: dict[str, list[onnx.NodeProto]] = {}  # tensor -> nodes reading it
    producer: dict[str, onnx.NodeProto] = {}
    for n in graph.node:
        for t in n.input:
            readers.setdefault(t, []).append(n)
        for t in n.output:
            producer[t] = n
    inputs = {v.name for v in graph.input}
    added = []
    for value in graph.input:
        if value.name not in io:
            continue
        value.type.tensor_type.elem_type = io[value.name]
        wide = f"{value.name}/fp32"
        users = [n for n in readers.get(value.name, []) if n.op_type != "Cast"]
        for n in users:
            n.input[:] = [wide if t == value.name else t for t in n.input]
        if users:
            added.append(onnx.helper.make_node("Cast", [value.name], [wide], to=TensorProto.FLOAT,
                                               name=f"{value.name}/to_fp32"))
    for value in graph.output:
        if value.name not in io:
            continue
        value.type.tensor_type.elem_type = io[value.name]
        made = producer.get(value.name)
        if made is None:
            if value.name not in inputs:
                raise PrecisionError(f"graph output {value.name} has no producer")
            continue  # an input passed through: typed as the input
        if made.op_type == "Cast" and not readers.get(value.name):
            for a in made.attribute:
                if a.name == "to":
                    a.i = io[value.name]
            continue
        wide = f"{value.name}/fp32"
        made.output[:] = [wide if t == value.name else t for t in made.output]
        for n in readers.get(value.name, []):
            n.input[:] = [wide if t == value.name else t for t in n.input]
        graph.node.append(onnx.helper.make_node("Cast", [wide], [value.name], to=io[value.name],
                                                name=f"{value.name}/from_fp32"))
    for i, n in enumerate(added):  # before every reader
        graph.node.insert(i, n)
    kept = [v for v in graph.value_info if v.name not in io]
    del graph.value_info[:]
    graph.value_info.extend(kept)
