"""Attention forms written into an existing model (a hand-built graph or a zoo export), for the tests of the
forms other exporters and model code write: a mask multiplied into the logits (issue 18, class 11), a mask
re-applied to the probabilities (class 12), attention sinks (class 9). Each edits every Softmax of the model
and returns a new model; the input is not modified."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs


class _Edit:
    """Nodes added to an imported copy of `model` under one name prefix, then written back with the
    original's IR version and metadata."""

    def __init__(self, model: onnx.ModelProto, prefix: str):
        self.like = model
        self.graph = gs.import_onnx(model)
        self.prefix = prefix
        self.made: list[gs.Node] = []
        self.constants = 0

    def op(self, kind: str, inputs: list, dtype=None, **attrs) -> gs.Variable:
        name = f"{self.prefix}/{kind}_{len(self.made)}"
        out = gs.Variable(name, dtype)
        self.made.append(gs.Node(kind, name, attrs, inputs, [out]))
        return out

    def const(self, name: str, value, dtype) -> gs.Constant:
        self.constants += 1  # names unique even when a form writes the same constant once per Softmax
        return gs.Constant(f"{self.prefix}/{name}_{self.constants}", np.asarray(value, dtype))

    def input(self, name: str) -> gs.Variable:
        return next(i for i in self.graph.inputs if i.name == name)

    def softmaxes(self) -> list[gs.Node]:
        return [n for n in self.graph.nodes if n.op == "Softmax"]

    def model(self) -> onnx.ModelProto:
        self.graph.nodes.extend(self.made)
        self.graph.toposort()
        out = gs.export_onnx(self.graph)
        out.ir_version = self.like.ir_version
        out.metadata_props.extend(self.like.metadata_props)
        return out


def _keys_mask(e: _Edit, mask: gs.Tensor) -> gs.Variable:
    """A [batch, seq] mask as [B, 1, 1, S] floats: one value per key."""
    return e.op("Unsqueeze", [e.op("Cast", [mask], np.float32, to=onnx.TensorProto.FLOAT),
                              e.const("axes", [1, 2], np.int64)], np.float32)


def _as_bool(e: _Edit, m: gs.Tensor) -> gs.Variable:
    return e.op("Cast", [m], np.bool_, to=onnx.TensorProto.BOOL)


def reapply(model: onnx.ModelProto, form: str, mask_input: str | None) -> onnx.ModelProto:
    """`model` with the [batch, seq] input `mask_input` (None: a new one) applied again to the probabilities
    of every Softmax, written as `form`: "mul" (P * m, Keras 3 and flax), "where" (Where(m, P, 0)) or
    "where_not" (masked_fill(P, ~m, 0), DeBERTa's XSoftmax)."""
    e = _Edit(model, "reapplied")
    if mask_input is None:
        mask = gs.Variable("other_mask", np.float32, ["batch", "seq"])
        e.graph.inputs.append(mask)
    else:
        mask = e.input(mask_input)
    m = _keys_mask(e, mask)
    zero = e.const("zero", 0.0, np.float32)
    for sm in e.softmaxes():
        probs = sm.outputs[0]
        consumer = probs.outputs[0]
        if form == "mul":
            out = e.op("Mul", [probs, m], np.float32)
        elif form == "where":
            out = e.op("Where", [_as_bool(e, m), probs, zero], np.float32)
        else:  # where_not: masked_fill(P, ~mask, 0)
            out = e.op("Where", [e.op("Not", [_as_bool(e, m)], np.bool_), zero, probs], np.float32)
        consumer.inputs[consumer.inputs.index(probs)] = out
    return e.model()


def multiplied(model: onnx.ModelProto, form: str, mask_input: str, offset=True) -> onnx.ModelProto:
    """Each Softmax's input S becomes S * m + (1 - m) * -1e9 (form "mul") or Where(m, S, 0) + ... ("where",
    TF's SelectV2), m = the [batch, seq] input `mask_input` as [B, 1, 1, S] floats; offset=False leaves the
    product alone (which zeroes logits without masking them)."""
    e = _Edit(model, "mulmask")
    m = _keys_mask(e, e.input(mask_input))
    big = e.op("Mul", [e.op("Sub", [e.const("one", 1.0, np.float32), m], np.float32),
                       e.const("big", -1e9, np.float32)], np.float32)
    for sm in e.softmaxes():
        s = sm.inputs[0]
        if form == "mul":
            kept = e.op("Mul", [s, m], np.float32)
        else:
            kept = e.op("Where", [_as_bool(e, m), s, e.const("zero", 0.0, np.float32)], np.float32)
        sm.inputs[0] = e.op("Add", [kept, big], np.float32) if offset else kept
    return e.model()


def with_sinks(model: onnx.ModelProto, heads: int, *, shift=False, first=False, slice_wrong=False,
               drop_first=None) -> onnx.ModelProto:
    """Every Softmax of `model` over [logits, sink column] (sinks [1, heads, 1, 1]), its last (or first) column
    dropped after; shift: the gpt-oss form, logits - max(logits) before the softmax. slice_wrong, drop_first:
    a slice after the softmax that is not the sink's column."""
    e = _Edit(model, "sink")
    i64 = lambda name, v: e.const(name, v, np.int64)  # noqa: E731
    sinks = gs.Constant("sinks", np.random.default_rng(0).standard_normal((1, heads, 1, 1)).astype(np.float32))
    for sm in e.softmaxes():
        s, p = sm.inputs[0], sm.outputs[0]
        shape = e.op("Concat", [e.op("Slice", [e.op("Shape", [s]), i64("lo", [0]), i64("hi", [3])]), i64("one", [1])],
                     axis=0)
        column = e.op("Expand", [sinks, shape])
        both = e.op("Concat", [column, s] if first else [s, column], axis=-1)
        if shift:
            top = e.op("ReduceMax", [both, i64("axes", [-1])], keepdims=1) if int(e.graph.opset) >= 18 else \
                e.op("ReduceMax", [both], axes=[-1], keepdims=1)
            both = e.op("Sub", [both, top])
        sm.inputs[0] = both
        wide = gs.Variable(f"{p.name}_with_sink")
        sm.outputs[0] = wide
        start, end = ([1], [2 ** 62]) if (first if drop_first is None else drop_first) else ([0], [-1])
        if slice_wrong:
            start, end = [0], [-2]
        e.made.append(gs.Node("Slice", f"sink/drop_{len(e.made)}", {},
                              [wide, i64("s", start), i64("e", end), i64("a", [-1])], [p]))
    return e.model()


def anonymous_dims(model: onnx.ModelProto) -> onnx.ModelProto:
    """The input dims as paddle2onnx and tf2onnx may write them (axis 0 -1, the others '?'), and no
    intermediate shapes: what ONNX Runtime's symbolic inference once gave up on. Edits `model` in place."""
    for vi in model.graph.input:
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.dim_param:
                d.Clear()
                if axis == 0:
                    d.dim_value = -1
                else:
                    d.dim_param = "?"
    del model.graph.value_info[:]
    return model
