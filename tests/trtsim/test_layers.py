"""tests/trtsim, part 3b: trtsim's executor runs each basic layer the builder emits (elementwise, unary, shuffle,
slice, concatenation, gather, (un)squeeze, quantize/dequantize) as ONNX Runtime runs the matching ONNX op."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from trtsim.execute import (
    run,
)
from trtsim_cases import (
    TOL,
    add_inputs,
    new_network,
    ort_run,
)

conformance = pytest.mark.conformance
reference = pytest.mark.reference


def _elementwise(op):
    def build(trt, net, t):
        return net.add_elementwise(t["a"], t["b"], getattr(trt.ElementWiseOperation, op)).get_output(0)
    return build


def _unary(op):
    def build(trt, net, t):
        return net.add_unary(t["a"], getattr(trt.UnaryOperation, op)).get_output(0)
    return build


def _shuffle(trt, net, t):
    layer = net.add_shuffle(t["a"])
    layer.first_transpose = (0, 2, 1)
    layer.reshape_dims = (0, -1)
    layer.second_transpose = (1, 0)
    return layer.get_output(0)


def _dynamic_reshape(trt, net, t):
    layer = net.add_shuffle(t["a"])
    layer.set_input(1, t["shape"])
    return layer.get_output(0)


def _slice(trt, net, t):
    return net.add_slice(t["a"], (1, 3, 0), (1, 2, 3), (1, -1, 2)).get_output(0)


def _dynamic_slice(trt, net, t):
    layer = net.add_slice(t["a"], (0, 0, 0), (1, 1, 1), (1, 1, 1))
    layer.set_input(1, t["starts"])
    layer.set_input(2, t["sizes"])
    return layer.get_output(0)


def _concat(trt, net, t):
    layer = net.add_concatenation([t["a"], t["b"]])
    layer.axis = 1
    return layer.get_output(0)


def _gather(trt, net, t):
    return net.add_gather(t["a"], t["idx"], 1).get_output(0)


def _unsqueeze(trt, net, t):
    axes = net.add_constant((2,), np.array([0, 3], np.int64)).get_output(0)
    return net.add_unsqueeze(t["a"], axes).get_output(0)


def _squeeze(trt, net, t):
    axes = net.add_constant((1,), np.array([1], np.int64)).get_output(0)
    return net.add_squeeze(t["a"], axes).get_output(0)


def _quantize(to_type):
    def build(trt, net, t):
        return net.add_quantize(t["a"], t["scale"], getattr(trt, to_type)).get_output(0)
    return build


def _dequantize(trt, net, t):
    return net.add_dequantize(t["q"], t["scale"], trt.float32).get_output(0)


_RNG = np.random.default_rng(12)
_A = _RNG.standard_normal((2, 4, 6)).astype(np.float32)
_B = _RNG.standard_normal((2, 1, 6)).astype(np.float32) + 3
_POS = np.abs(_A) + 0.5
_I = _RNG.integers(-9, 9, (2, 4, 6)).astype(np.int32)
_J = _RNG.integers(1, 5, (2, 4, 6)).astype(np.int32) * np.where(_RNG.random((2, 4, 6)) < 0.5, -1, 1).astype(np.int32)
_HALVES = np.array([[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5]], np.float32)

SIMPLE_CASES = {
    "sum": (_elementwise("SUM"), [helper.make_node("Add", ["a", "b"], ["y"])], {"a": _A, "b": _B}),
    "prod": (_elementwise("PROD"), [helper.make_node("Mul", ["a", "b"], ["y"])], {"a": _A, "b": _B}),
    "sub": (_elementwise("SUB"), [helper.make_node("Sub", ["a", "b"], ["y"])], {"a": _A, "b": _B}),
    "div": (_elementwise("DIV"), [helper.make_node("Div", ["a", "b"], ["y"])], {"a": _A, "b": _B}),
    "div_int": (_elementwise("DIV"), [helper.make_node("Div", ["a", "b"], ["y"])], {"a": _I, "b": _J}),
    "max": (_elementwise("MAX"), [helper.make_node("Max", ["a", "b"], ["y"])], {"a": _A, "b": _B}),
    "min": (_elementwise("MIN"), [helper.make_node("Min", ["a", "b"], ["y"])], {"a": _A, "b": _B}),
    "pow": (_elementwise("POW"), [helper.make_node("Pow", ["a", "b"], ["y"])], {"a": _POS, "b": _B}),
    "and": (_elementwise("AND"), [helper.make_node("And", ["a", "b"], ["y"])], {"a": _A > 0, "b": _B > 3}),
    "or": (_elementwise("OR"), [helper.make_node("Or", ["a", "b"], ["y"])], {"a": _A > 0, "b": _B > 3}),
    "equal": (_elementwise("EQUAL"), [helper.make_node("Equal", ["a", "b"], ["y"])], {"a": _I, "b": _J}),
    "less": (_elementwise("LESS"), [helper.make_node("Less", ["a", "b"], ["y"])], {"a": _A, "b": _B - 3}),
    "greater": (_elementwise("GREATER"), [helper.make_node("Greater", ["a", "b"], ["y"])], {"a": _A, "b": _B - 3}),
    "exp": (_unary("EXP"), [helper.make_node("Exp", ["a"], ["y"])], {"a": _A}),
    "log": (_unary("LOG"), [helper.make_node("Log", ["a"], ["y"])], {"a": _POS}),
    "sqrt": (_unary("SQRT"), [helper.make_node("Sqrt", ["a"], ["y"])], {"a": _POS}),
    "recip": (_unary("RECIP"), [helper.make_node("Reciprocal", ["a"], ["y"])], {"a": _POS}),
    "neg": (_unary("NEG"), [helper.make_node("Neg", ["a"], ["y"])], {"a": _A}),
    "erf": (_unary("ERF"), [helper.make_node("Erf", ["a"], ["y"])], {"a": _A}),
    "round": (_unary("ROUND"), [helper.make_node("Round", ["a"], ["y"])], {"a": _HALVES}),
    "not": (_unary("NOT"), [helper.make_node("Not", ["a"], ["y"])], {"a": _A > 0}),
    "sign": (_unary("SIGN"), [helper.make_node("Sign", ["a"], ["y"])], {"a": _A}),
    "shuffle": (_shuffle, [helper.make_node("Transpose", ["a"], ["t"], perm=[0, 2, 1]),
                           helper.make_node("Reshape", ["t", "s"], ["r"]),
                           helper.make_node("Transpose", ["r"], ["y"], perm=[1, 0])],
                {"a": _A, "s": np.array([0, -1], np.int64)}),
    "dynamic_reshape": (_dynamic_reshape, [helper.make_node("Reshape", ["a", "shape"], ["y"])],
                        {"a": _A, "shape": np.array([4, 0, -1], np.int64)}),
    "slice": (_slice, [helper.make_node("Slice", ["a", "st", "en", "ax", "sp"], ["y"])],
              {"a": _A, "st": np.array([1, 3, 0], np.int64), "en": np.array([2, 1, 6], np.int64),
               "ax": np.array([0, 1, 2], np.int64), "sp": np.array([1, -1, 2], np.int64)}),
    "dynamic_slice": (_dynamic_slice, [helper.make_node("Slice", ["a", "starts", "ends"], ["y"])],
                      {"a": _A, "starts": np.array([0, 1, 2], np.int64), "sizes": np.array([2, 3, 3], np.int64),
                       "ends": np.array([2, 4, 5], np.int64)}),
    "concat": (_concat, [helper.make_node("Concat", ["a", "b"], ["y"], axis=1)], {"a": _A, "b": _B}),
    "select": (lambda trt, net, t: net.add_select(t["c"], t["a"], t["b"]).get_output(0),
               [helper.make_node("Where", ["c", "a", "b"], ["y"])], {"c": _A > 0, "a": _A, "b": _B}),
    "shape": (lambda trt, net, t: net.add_shape(t["a"]).get_output(0), [helper.make_node("Shape", ["a"], ["y"])],
              {"a": _A}),
    "gather": (_gather, [helper.make_node("Gather", ["a", "idx"], ["y"], axis=1)],
               {"a": _A, "idx": np.array([[0, -1], [2, 3]], np.int32)}),
    "unsqueeze": (_unsqueeze, [helper.make_node("Unsqueeze", ["a", "ax"], ["y"])],
                  {"a": _A, "ax": np.array([0, 3], np.int64)}),
    "squeeze": (_squeeze, [helper.make_node("Squeeze", ["a", "ax"], ["y"])],
                {"a": _B, "ax": np.array([1], np.int64)}),
    "cast": (lambda trt, net, t: net.add_cast(t["a"], trt.int32).get_output(0),
             [helper.make_node("Cast", ["a"], ["y"], to=TensorProto.INT32)], {"a": _A * 5}),
    "cast_half": (lambda trt, net, t: net.add_cast(t["a"], trt.float16).get_output(0),
                  [helper.make_node("Cast", ["a"], ["y"], to=TensorProto.FLOAT16)], {"a": _A}),
    "quantize_int8": (_quantize("int8"), [helper.make_node("QuantizeLinear", ["a", "scale", "zp"], ["y"])],
                      {"a": _A * 40, "scale": np.array(0.5, np.float32)}),
    "quantize_fp8": (_quantize("fp8"), [helper.make_node("QuantizeLinear", ["a", "scale", "zp"], ["y"])],
                     {"a": _A * 300, "scale": np.array(0.25, np.float32)}),
    "dequantize": (_dequantize, [helper.make_node("DequantizeLinear", ["q", "scale"], ["y"])],
                   {"q": _I.astype(np.int8), "scale": np.array(0.125, np.float32)}),
}

# Inputs only the ONNX side needs (constants in the TensorRT network or attributes there).
_ONNX_ONLY = {"s", "st", "en", "ax", "sp", "ends", "zp"}
_TRT_ONLY = {"sizes"}


@reference
@pytest.mark.parametrize("case", list(SIMPLE_CASES))
def test_simple_layers_match_onnx_ops(checked_trt, case):
    trt = checked_trt
    build, nodes, feeds = SIMPLE_CASES[case]
    _, net = new_network(trt)
    trt_feeds = {k: v for k, v in feeds.items() if k not in _ONNX_ONLY}
    out = build(trt, net, add_inputs(trt, net, trt_feeds))
    out.name = "y"
    net.mark_output(out)
    got = run(net, trt_feeds)["y"]
    onnx_feeds = {k: v for k, v in feeds.items() if k not in _TRT_ONLY}
    initializers = []
    if case.startswith("quantize"):  # the zero point fixes ONNX's output type (uint8 by default)
        zp_type = TensorProto.FLOAT8E4M3FN if case.endswith("fp8") else TensorProto.INT8
        initializers = [helper.make_tensor("zp", zp_type, [], [0])]
    want = ort_run(nodes, onnx_feeds, [("y", got.dtype)], opset=21, initializers=initializers)[0]
    if want.dtype == np.uint8 and got.dtype.itemsize == 1 and got.dtype != np.uint8:
        want = want.view(got.dtype)  # ONNX Runtime hands FP8 back as raw bytes
    assert got.dtype == want.dtype and got.shape == want.shape
    # The build-time shape the checker computed agrees with the run-time one (-1 = dynamic).
    assert len(out.shape) == got.ndim and all(d in (-1, n) for d, n in zip(out.shape, got.shape))
    if got.dtype.itemsize == 1 and got.dtype != np.bool_:  # int8 / fp8: compare the bytes
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    elif got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, **TOL)


