"""Hand-built attention graphs for edge cases the zoo does not reach: other exporters' styles
(tf2onnx, paddle2onnx, older torch), opsets 11-23, fused QKV split by Slice or Split, Identity
and Cast in the chain, biases gathered from other inputs, NotEqual/Where masks, causal masks
from Trilu or Range comparisons, sliding windows.

`attention_model(...)` writes one self-attention block
    x[B,S,D] -> Q,K,V projections -> heads -> scores -> scale/mask -> Softmax -> P.V -> merge -> out
in the requested style. The model is the reference: tests fuse it and verify against itself.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _G:
    def __init__(self, opset):
        self.opset = opset
        self.nodes, self.inits, self.inputs, self.n = [], [], [], 0
        self.query: str | None = None  # the attention's query and head size, for the parts that read them
        self.head = 0

    def name(self, base):
        self.n += 1
        return f"{base}_{self.n}"

    def init(self, value, base="w"):
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op, inputs, outputs=1, name=None, **attrs):
        outs = [self.name(f"{op.lower()}_out") for _ in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name or self.name(op), **attrs))
        return outs[0] if outputs == 1 else outs

    def ints(self, values):
        return self.init(np.asarray(values, dtype=np.int64), "i")

    def scalar(self, v, dtype=np.float32):
        return self.init(np.asarray(v, dtype=dtype), "s")

    # version-dependent ops
    def unsqueeze(self, x, axes):
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.ints(axes)])
        return self.op("Unsqueeze", [x], axes=axes)

    def reduce_sum(self, x, axes):
        if self.opset >= 13:
            return self.op("ReduceSum", [x, self.ints(axes)], keepdims=0)
        return self.op("ReduceSum", [x], axes=axes, keepdims=0)

    def split3(self, x, d):
        if self.opset >= 18:
            return self.op("Split", [x, self.ints([d, d, d])], outputs=3, axis=-1)
        if self.opset >= 13:
            return self.op("Split", [x, self.ints([d, d, d])], outputs=3, axis=-1)
        return self.op("Split", [x], outputs=3, axis=-1, split=[d, d, d])

    def tail_shape(self, x, head: list, start: int):
        """Concat(head, Shape(x)[start:]): a Reshape target that follows the sequence length, as exporters
        write it (a hard-coded length would make the graph mean something else at other lengths)."""
        return self.op("Concat", [self.ints(head), self.op("Slice", [self.op("Shape", [x]), self.ints([start]),
                                                                     self.ints([2 ** 62])])], axis=0)

    def slice_last(self, x, start, end):
        if self.opset >= 10:
            return self.op("Slice", [x, self.ints([start]), self.ints([end]), self.ints([-1])])
        raise ValueError("opset < 10")


def attention_model(*, opset=17, batch=2, seq=6, heads=4, kv_heads=None, head=8, scale_style="div_after",
                    mask_style=None, k_style="bnsh", qkv_style="separate", rank=4, noise=False, seed=0,
                    window=3, extra_softmax=None, dtype=np.float32, cast_softmax=False, products="matmul",
                    softmax_style=None, shape_reader=False, softcap=None, qdq=None) -> onnx.ModelProto:
    """products: "matmul" | "einsum" (both products); softmax_style: None | "flatten" (Flatten -> Softmax ->
    Reshape(Shape(logits)), the version converter's opset-12 form) | "merged" (heads merged into the batch
    around the softmax); shape_reader: the output's head merge reads the batch from Shape(probs);
    softcap: cap * tanh(logits / cap) after the scale; qdq: "proj" | "qkv" | "probs" | "logits" Q/DQ pairs (int8/uint8)."""
    rng = np.random.default_rng(seed)
    g = _G(opset)
    kv_heads = kv_heads or heads
    d, dkv = heads * head, kv_heads * head
    scale = 1.0 / np.sqrt(head)
    x = "x"
    g.inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", d]))
    w = lambda r, c: (rng.standard_normal((r, c)) / np.sqrt(r)).astype(np.float32)  # noqa: E731
    b = lambda c: np.asarray(rng.standard_normal(c) * 0.1, np.float32)  # noqa: E731

    # ---- projections
    if qkv_style == "separate":
        q = g.op("Add", [g.op("MatMul", [x, g.init(w(d, d))]), g.init(b(d))])
        k = g.op("Add", [g.op("MatMul", [x, g.init(w(d, dkv))]), g.init(b(dkv))])
        v = g.op("Add", [g.op("MatMul", [x, g.init(w(d, dkv))]), g.init(b(dkv))])
    else:
        assert kv_heads == heads
        qkv = g.op("Add", [g.op("MatMul", [x, g.init(w(d, 3 * d))]), g.init(b(3 * d))])
        if qkv_style == "split":
            q, k, v = g.split3(qkv, d)
        else:  # slice
            q, k, v = (g.slice_last(qkv, i * d, (i + 1) * d) for i in range(3))
    if scale_style == "mul_q_proj":  # the scale on the projection output, before the head split (Whisper)
        q = g.op("Mul", [q, g.scalar(scale)])
    if qdq == "proj":  # int8 projections, then the head split in float (what ONNX Runtime propagates Q/DQ across)
        q, k, v = (_qdq(g, t, 0.05) for t in (q, k, v))

    qh, kt, vh = _heads(g, q, k, v, heads=heads, kv_heads=kv_heads, head=head, k_style=k_style, rank=rank)

    if scale_style == "mul_q":
        qh = g.op("Mul", [qh, g.scalar(scale)])
    elif scale_style == "mul_k":
        kt = g.op("Mul", [kt, g.scalar(scale)])
    elif scale_style == "sqrt_qk":
        qh = g.op("Mul", [qh, g.scalar(np.sqrt(scale))])
        kt = g.op("Mul", [kt, g.scalar(np.sqrt(scale))])
    if noise:
        qh = g.op("Identity", [qh])
    if qdq == "qkv":
        qh, kt, vh = (_qdq(g, t, 0.05) for t in (qh, kt, vh))
    g.query, g.head = qh, head
    if products == "einsum":  # K^T as BMM1 reads it: [.., H, S]
        eq1, eq2 = ("bnid,bndj->bnij", "bnij,bnjd->bnid") if rank == 4 else ("bid,bdj->bij", "bij,bjd->bid")
        s = g.op("Einsum", [qh, kt], equation=eq1)
    else:
        s = g.op("MatMul", [qh, kt])
    if noise:
        s = g.op("Cast", [g.op("Identity", [s])], to=TensorProto.FLOAT)
    if scale_style == "div_after":
        s = g.op("Div", [s, g.op("Sqrt", [g.scalar(float(head))])])
    elif scale_style == "mul_after":
        s = g.op("Mul", [s, g.scalar(scale)])
    if softcap is not None:  # Gemma 2: after the scale, before the mask
        s = g.op("Mul", [g.op("Tanh", [g.op("Div", [s, g.scalar(softcap)])]), g.scalar(softcap)])
    if qdq == "logits":
        s = _qdq(g, s, 0.1)

    # ---- masks
    s = _mask(g, s, mask_style, seq=seq, heads=heads, rank=rank, window=window, rng=rng)
    if cast_softmax:
        s = g.op("Cast", [s], to=TensorProto.FLOAT)
    p = _softmax(g, s, softmax_style, opset=opset, rank=rank, heads=heads)
    if noise:
        p = g.op("Dropout", [p])
    if qdq == "probs":
        p = _qdq(g, p, 1.0 / 255, np.uint8(0))
    o = g.op("Einsum", [p, vh], equation=eq2) if products == "einsum" else g.op("MatMul", [p, vh])
    if rank == 3:
        o = g.op("Reshape", [o, g.tail_shape(o, [-1, heads], 1)])
    if shape_reader:  # the batch for the head merge read from the probabilities' shape
        target = g.op("Concat", [g.op("Slice", [g.op("Shape", [p]), g.ints([0]), g.ints([1])]), g.ints([-1, d])], axis=0)
    else:
        target = g.ints([0, 0, d])
    o = g.op("Reshape", [g.op("Transpose", [o], perm=[0, 2, 1, 3]), target])
    out = g.op("MatMul", [o, g.init(w(d, d))])
    outputs = [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)]

    outputs += _extra_outputs(g, out, p, extra_softmax, opset=opset, w=w, d=d)
    return _model(g, outputs, opset, batch=batch, seq=seq)


def _heads(g: _G, q, k, v, *, heads, kv_heads, head, k_style, rank):
    """Q, K^T, V split into heads (BNSH, or [B*N, S, H] at rank 3), K^T as BMM1 reads it, KV heads repeated."""
    # ---- heads: [B,S,N*H] -> [B,S,N,H] -> BNSH
    def split_heads(t, n):
        return g.op("Reshape", [t, g.ints([0, -1, n, head])])

    qh = g.op("Transpose", [split_heads(q, heads)], perm=[0, 2, 1, 3])
    kh_bsnh = split_heads(k, kv_heads)
    vh = g.op("Transpose", [split_heads(v, kv_heads)], perm=[0, 2, 1, 3])
    if k_style == "bnsh":
        kh = g.op("Transpose", [kh_bsnh], perm=[0, 2, 1, 3])
        kt = None
    elif k_style == "bsnh":  # K^T straight from BSNH, as torch's TorchScript export writes it
        kh, kt = None, g.op("Transpose", [kh_bsnh], perm=[0, 2, 3, 1])
    else:
        raise ValueError(k_style)

    if kv_heads != heads:  # HF repeat_kv
        rep = heads // kv_heads

        def repeat(t):
            u = g.unsqueeze(t, [2])
            e = g.op("Expand", [u, g.ints([1, 1, rep, 1, 1])])
            return g.op("Reshape", [e, g.ints([0, heads, -1, head])])

        kh = repeat(kh)
        vh = repeat(vh)

    if rank == 3:  # [B*N, S, H] batched matmuls (older exports)
        qh, vh, kh = (g.op("Reshape", [t, g.tail_shape(t, [-1], 2)]) for t in (qh, vh, kh))
        kt = g.op("Transpose", [kh], perm=[0, 2, 1])
    elif kt is None:
        kt = g.op("Transpose", [kh], perm=[0, 1, 3, 2])
    return qh, kt, vh


def _softmax(g: _G, s, softmax_style, *, opset, rank, heads):
    """The softmax over the logits, in the form `softmax_style` names."""
    axis = -1 if opset >= 13 else (3 if rank == 4 else 2)
    if softmax_style == "flatten":  # what ONNX's version converter writes for an opset-12 Softmax
        flat = g.op("Flatten", [s], axis=rank - 1)
        p = g.op("Reshape", [g.op("Softmax", [flat], axis=-1, name="attn/Softmax"), g.op("Shape", [s])])
    elif softmax_style == "merged":  # [B, N, S, S] -> [B*N, S, S] around the softmax, back after
        merged = g.op("Reshape", [s, g.tail_shape(s, [-1], 2)])
        probs = g.op("Softmax", [merged], axis=-1, name="attn/Softmax")
        p = g.op("Reshape", [probs, g.tail_shape(merged, [-1, heads], 1)])
    else:
        p = g.op("Softmax", [s], axis=axis, name="attn/Softmax")
    return p


def _extra_outputs(g: _G, out, p, extra_softmax, *, opset, w, d) -> list:
    """The graph outputs beyond the attention block's own: another softmax, or the probabilities."""
    outputs = []
    if extra_softmax == "classifier":  # a classifier head: Softmax over logits -> graph output
        logits = g.op("MatMul", [g.op("ReduceMean", [out], axes=[1], keepdims=0) if opset < 18 else
                                 g.op("ReduceMean", [out, g.ints([1])], keepdims=0), g.init(w(d, 5))])
        probs = g.op("Softmax", [logits], axis=-1 if opset >= 13 else 1, name="classifier/Softmax")
        outputs.append(helper.make_tensor_value_info(probs, TensorProto.FLOAT, None))
    elif extra_softmax == "reduction":  # a softmax-weighted pooling: probabilities feed a reduction
        scores = g.op("MatMul", [out, g.init(w(d, 1))])
        weights = g.op("Softmax", [scores], axis=1, name="pool/Softmax")
        pooled = g.reduce_sum(g.op("Mul", [weights, out]), [1])
        outputs.append(helper.make_tensor_value_info(pooled, TensorProto.FLOAT, None))
    elif extra_softmax == "probs_output":  # attention whose probabilities are also a graph output
        outputs.append(helper.make_tensor_value_info(p, TensorProto.FLOAT, None))
    return outputs


def _model(g: _G, outputs, opset, *, batch, seq) -> onnx.ModelProto:
    """The model, its IR version what ONNX Runtime reads at `opset`, the input roles and dims recorded."""
    graph = helper.make_graph(g.nodes, "attention", g.inputs, outputs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")
    model.ir_version = min(model.ir_version, 8 if opset <= 17 else 10)
    roles = {"attention_mask": {"kind": "padding_mask"}, "bias_index": {"kind": "token_ids", "vocab": 32}}
    meta = {"inputs": {i.name: roles[i.name] for i in g.inputs if i.name in roles} | {"x": {"kind": "float"}},
            "dims": {"batch": batch, "seq": seq}}
    model.metadata_props.add(key="trtattn.inputs", value=json.dumps(meta))
    return model


def _qdq(g: _G, t, scale, zero: np.integer | None = None):
    """A per-tensor QuantizeLinear -> DequantizeLinear pair, as ONNX Runtime's static quantization writes."""
    zero = np.int8(0) if zero is None else zero
    sc, zp = g.scalar(scale), g.init(np.asarray(zero), "zp")
    return g.op("DequantizeLinear", [g.op("QuantizeLinear", [t, sc, zp]), sc, zp])


def _mask(g: _G, s, style, *, seq, heads, rank, window, rng):
    if style is None:
        return s
    if style == "alibi":
        # ALiBi computed in the graph: -slope_h * |i - j| from Range over the scores' length (BLOOM, MPT)
        n = g.op("Squeeze", [g.op("Slice", [g.op("Shape", [s]), g.ints([-1]), g.ints([2 ** 62])]), g.ints([0])])
        idx = g.op("Cast", [g.op("Range", [g.init(np.asarray(0, np.int64), "zero"), n,
                                            g.init(np.asarray(1, np.int64), "one")])], to=TensorProto.FLOAT)
        dist = g.op("Abs", [g.op("Sub", [g.unsqueeze(idx, [1]), g.unsqueeze(idx, [0])])])
        slopes = g.init((-(2.0 ** (-8.0 * (np.arange(heads) + 1) / heads))).astype(np.float32).reshape(heads, 1, 1), "slopes")
        return g.op("Add", [s, g.op("Mul", [dist, slopes])])
    if style == "c2p":
        # DeBERTa's content-to-position term: Q times position keys projected from a table (weights only),
        # cut to the key length: a product of one activation with weights is a bias, not the logits
        table = g.init((rng.standard_normal((16, heads * g.head)) * 0.3).astype(np.float32), "rel_table")
        pos_k = g.op("Transpose", [g.op("Reshape", [table, g.ints([16, heads, g.head])])], perm=[1, 2, 0])  # [N, H, 16]
        c2p = g.op("MatMul", [g.query, pos_k])  # [B, N, S, 16]
        length = g.op("Slice", [g.op("Shape", [s]), g.ints([-1]), g.ints([2 ** 62])])
        c2p = g.op("Slice", [c2p, g.ints([0]), length, g.ints([-1])])
        return g.op("Add", [s, c2p])
    if style in ("additive_input", "tf_additive"):
        # tf2onnx / old BERT: (1 - mask) * -10000 added to the scores, mask [B, S] from an input
        g.inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT, ["batch", "seq"]))
        ext = g.unsqueeze(g.unsqueeze("attention_mask", [1]), [1])
        add = g.op("Mul", [g.op("Sub", [g.scalar(1.0), ext]), g.scalar(-10000.0)])
        return g.op("Add", [s, add])
    if style in ("bool_where", "notequal_where"):
        # a boolean padding mask: Where(mask, scores, -inf); NotEqual(mask, 0) builds it from ints
        if style == "bool_where":
            g.inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.BOOL, ["batch", "seq"]))
            cond = "attention_mask"
        else:
            g.inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]))
            # NotEqual is not an ONNX op: exporters write Not(Equal(mask, 0))
            cond = g.op("Not", [g.op("Equal", ["attention_mask", g.init(np.asarray(0, np.int64), "zero")])])
        cond = g.unsqueeze(g.unsqueeze(cond, [1]), [1])
        if rank == 3:
            raise ValueError("boolean masks are built for rank 4 here")
        return g.op("Where", [cond, s, g.scalar(-np.inf)])
    if style == "where_not":
        # Where(masked, fill, scores): the condition says where NOT to attend
        g.inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]))
        masked = g.op("Equal", ["attention_mask", g.init(np.asarray(0, np.int64), "zero")])
        masked = g.unsqueeze(g.unsqueeze(masked, [1]), [1])
        return g.op("Where", [masked, g.scalar(np.finfo(np.float32).min), s])
    if style in ("causal_trilu",):
        shape = g.op("Shape", [s])
        sq = g.op("Slice", [shape, g.ints([-2]), g.ints([-1])])
        sk = g.op("Slice", [shape, g.ints([-1]), g.ints([2 ** 62])])
        ones = g.op("ConstantOfShape", [g.op("Concat", [sq, sk], axis=0)],
                    value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]))
        tril = g.op("Cast", [g.op("Trilu", [ones], upper=0)], to=TensorProto.BOOL)
        return g.op("Where", [tril, s, g.scalar(-np.inf)])
    if style in ("causal_range", "window_range"):
        # q index >= k index from Range ops (what TensorRT reads as a causal mask)
        shape = g.op("Shape", [s])
        n = g.op("Squeeze", [g.op("Slice", [shape, g.ints([-1]), g.ints([2 ** 62])]), g.ints([0])])
        idx = g.op("Range", [g.init(np.asarray(0, np.int64), "zero"), n, g.init(np.asarray(1, np.int64), "one")])
        qi = g.unsqueeze(idx, [1])
        ki = g.unsqueeze(idx, [0])
        allowed = g.op("GreaterOrEqual", [qi, ki])
        if style == "window_range":
            near = g.op("Less", [g.op("Sub", [qi, ki]), g.init(np.asarray(window, np.int64), "w")])
            allowed = g.op("And", [allowed, near])
        bias = g.op("Where", [allowed, g.scalar(0.0), g.scalar(-np.inf)])
        return g.op("Add", [s, bias])
    if style == "bias_gather":
        # a relative-position bias gathered from a table by an index input (T5 / Swin style)
        g.inputs.append(helper.make_tensor_value_info("bias_index", TensorProto.INT64, ["seq", "seq"]))
        table = g.init((rng.standard_normal((32, heads)) * 0.5).astype(np.float32), "bias_table")
        gathered = g.op("Gather", [table, "bias_index"])  # [S, S, N]
        bias = g.op("Transpose", [gathered], perm=[2, 0, 1])  # [N, S, S]
        return g.op("Add", [s, bias])
    if style == "bias_and_mask":
        s = _mask(g, s, "bias_gather", seq=seq, heads=heads, rank=rank, window=window, rng=rng)
        return _mask(g, s, "additive_input", seq=seq, heads=heads, rank=rank, window=window, rng=rng)
    raise ValueError(style)


def luong_model(*, batch=2, seq=7, hidden=16, fill=float("-inf"), opset=17, seed=0) -> onnx.ModelProto:
    """One step of a recurrent decoder with Luong's general attention: one query position, no scale, a
    boolean mask True at padding used as masked_fill (Where(mask, fill, scores))."""
    rng = np.random.default_rng(seed)
    g = _G(opset)
    g.inputs += [helper.make_tensor_value_info("h", TensorProto.FLOAT, ["batch", 1, hidden]),
                 helper.make_tensor_value_info("encoder_outputs", TensorProto.FLOAT, ["batch", "seq", hidden]),
                 helper.make_tensor_value_info("src_key_padding_mask", TensorProto.BOOL, ["batch", "seq"])]
    w = g.init((rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32))
    keys = g.op("Transpose", [g.op("MatMul", ["encoder_outputs", w])], perm=[0, 2, 1])
    scores = g.op("MatMul", ["h", keys])  # [B, 1, S]
    scores = g.op("Where", [g.unsqueeze("src_key_padding_mask", [1]), g.scalar(fill), scores])
    p = g.op("Softmax", [scores], axis=-1, name="attn/Softmax")
    context = g.op("MatMul", [p, "encoder_outputs"])  # [B, 1, H]
    out = g.op("Tanh", [g.op("Concat", ["h", context], axis=-1)])
    graph = helper.make_graph(g.nodes, "luong", g.inputs, [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                              g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")
    model.ir_version = 8
    meta = {"inputs": {"h": {"kind": "float"}, "encoder_outputs": {"kind": "float"},
                       "src_key_padding_mask": {"kind": "padding_mask", "true_at": "padding"}},
            "dims": {"batch": batch, "seq": seq}}
    model.metadata_props.add(key="trtattn.inputs", value=json.dumps(meta))
    return model


def control_flow_model(kind: str = "if", **kwargs) -> onnx.ModelProto:
    """attention_model's block inside control flow: kind "if" puts it in both branches of an If on a flag
    input (the else branch without the bias of the projection: a different attention), "loop" in the body
    of a Loop that runs it twice (a scan output of the results)."""
    inner = attention_model(**kwargs)
    body = onnx.GraphProto()
    body.CopyFrom(inner.graph)
    out = body.output[0].name
    del body.input[:]  # x is read from the outer scope
    meta = json.loads(next(p.value for p in inner.metadata_props if p.key == "trtattn.inputs"))
    width = inner.graph.input[0].type.tensor_type.shape.dim[2].dim_value
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", width])
    if kind == "if":
        other = onnx.GraphProto()
        other.CopyFrom(body)
        other.name = "else"
        for n in other.node:  # a different attention in the other branch: its output scaled by 2
            if n.output[0] == out:
                n.output[0] = out + "_pre"
        two = numpy_helper.from_array(np.asarray(2.0, np.float32), "two_else")
        other.initializer.append(two)
        other.node.append(helper.make_node("Mul", [out + "_pre", "two_else"], [out], name="else/scale"))
        body.name = "then"
        node = helper.make_node("If", ["flag"], ["y"], name="branch", then_branch=body, else_branch=other)
        inputs = [x, helper.make_tensor_value_info("flag", TensorProto.BOOL, [])]
        meta["inputs"]["flag"] = {"kind": "flag"}
        outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
        nodes = [node]
        inits = []
    else:
        body.name = "body"
        body.input.extend([helper.make_tensor_value_info("i", TensorProto.INT64, []),
                           helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])])
        body.node.append(helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body/cond"))
        body.output.insert(0, helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []))
        trip = numpy_helper.from_array(np.asarray(2, np.int64), "trip")
        cond = numpy_helper.from_array(np.asarray(True), "cond")
        nodes = [helper.make_node("Loop", ["trip", "cond"], ["y"], name="loop", body=body)]
        inputs, inits = [x], [trip, cond]
        outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    graph = helper.make_graph(nodes, f"attention_in_{kind}", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=list(inner.opset_import), producer_name="tests")
    model.ir_version = inner.ir_version
    model.metadata_props.add(key="trtattn.inputs", value=json.dumps(meta))
    return model


def two_attentions(second: dict | None = None, **first) -> onnx.ModelProto:
    """Two attention blocks in a row (attention_model's): the second reads the first's output as its x.
    `second` gives the second block's keyword arguments (a site that cannot fuse, say)."""
    a, b = attention_model(**first), attention_model(seed=1, **(second or {}))
    x_b = a.graph.output[0].name
    rename = lambda n: x_b if n == "x" else (f"b2/{n}" if n else n)  # noqa: E731
    for n in b.graph.node:
        n.input[:] = [rename(i) for i in n.input]
        n.output[:] = [rename(o) for o in n.output]
        n.name = f"b2/{n.name}"
    for t in list(b.graph.initializer):
        t.name = rename(t.name)
    for o in b.graph.output:
        o.name = rename(o.name)
    extra = [i for i in b.graph.input if i.name != "x" and i.name not in {j.name for j in a.graph.input}]
    for i in extra:
        i.name = rename(i.name)
    graph = helper.make_graph(list(a.graph.node) + list(b.graph.node), "two_attentions",
                              list(a.graph.input) + extra, list(b.graph.output),
                              list(a.graph.initializer) + list(b.graph.initializer))
    model = helper.make_model(graph, opset_imports=list(a.opset_import), producer_name="tests")
    model.ir_version = a.ir_version
    model.metadata_props.extend(a.metadata_props)
    return model


def unit_axis_model(*, unit="trailing", batch=2, seq=5, heads=4, head=8, opset=17, seed=0) -> onnx.ModelProto:
    """Heads split with a unit axis, as tf2onnx lowers Keras' Einsums: [B,S,N,H,1] (unit "trailing"),
    [B,S,1,N,H] ("middle") or [1,B,S,N,H] ("leading"), N and H read from the shape of the [D, N, H] kernel;
    batched [B*N, S, H] products whose Reshape targets come from ReduceProd and Max over Shape slices;
    logits reshaped back to 5-D with the unit axis and normalised there. Shape inference names none of
    these dims (fresh unk__N), nor the input's. opset >= 12 (Max of int64 dims); at 12 the Softmax normalises
    from its axis on (Softmax-1's 2-D coercion), which is that axis alone since the axes after it are units."""
    if opset < 12:
        raise ValueError(f"unit_axis_model: opset {opset} has no Max of int64 (the broadcast of the batch dims); use 12+")
    rng = np.random.default_rng(seed)
    g = _G(opset)
    d = heads * head
    g.inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT, ["unk__1", "unk__2", d]))
    w = lambda *shape: (rng.standard_normal((d, *shape)) / np.sqrt(d)).astype(np.float32)  # noqa: E731
    dims = lambda t, idx: g.op("Gather", [g.op("Shape", [t]), g.ints(idx)])  # noqa: E731
    prod = lambda t, idx: g.op("ReduceProd", [dims(t, idx)], keepdims=1)  # noqa: E731
    cat = lambda *parts: g.op("Concat", list(parts), axis=0)  # noqa: E731
    x = "x"
    batch_seq = lambda: dims(x, [0, 1])  # noqa: E731
    # the 5-D head split with its unit axis, and the perm from there to [B, N, S, 1, H]
    split, perm = {"trailing": (lambda nh: cat(batch_seq(), nh, g.ints([1])), [0, 2, 1, 4, 3]),
                   "middle": (lambda nh: cat(batch_seq(), g.ints([1]), nh), [0, 3, 1, 2, 4]),
                   "leading": (lambda nh: cat(g.ints([1]), batch_seq(), nh), [1, 3, 2, 0, 4])}[unit]

    def heads_3d(kernel):  # x [B, S, D] . kernel [D, N, H] -> 5-D -> [B, N, S, 1, H] -> [B*N, S, H]
        t = g.op("MatMul", [x, g.op("Reshape", [kernel, g.ints([d, -1])])])
        five = g.op("Transpose", [g.op("Reshape", [t, split(dims(kernel, [1, 2]))])], perm=perm)
        return five, g.op("Reshape", [five, cat(prod(five, [0, 1]), g.ints([-1]), dims(five, [4]))])

    (q5, q), (k5, k), (_, v) = (heads_3d(g.init(w(heads, head))) for _ in range(3))
    s = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 2, 1])]), g.scalar(1.0 / np.sqrt(head))])
    bn = g.op("Max", [dims(q5, [0, 1]), dims(k5, [0, 1])])  # tf2onnx's broadcast of the batch dims
    sq, sk = dims(q5, [2]), dims(k5, [2])
    one = g.ints([1])
    five, axis = {"trailing": ([bn, sq, sk, one], 3), "middle": ([bn, one, sq, sk], 4), "leading": ([one, bn, sq, sk], 4)}[unit]
    p5 = g.op("Softmax", [g.op("Reshape", [s, cat(*five)])], axis=axis, name="attn/Softmax")
    p = g.op("Reshape", [p5, cat(prod(q5, [0, 1]), g.ints([-1]), dims(p5, [axis]))])
    o = g.op("Reshape", [g.op("MatMul", [p, v]), cat(bn, g.ints([-1, head]))])  # [B, N, S, H]
    o = g.op("Reshape", [g.op("Transpose", [o], perm=[0, 2, 1, 3]), g.ints([0, 0, d])])
    out = g.op("MatMul", [o, g.init(w(d))])
    graph = helper.make_graph(g.nodes, "unit_axis", g.inputs,
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="tests")
    model.ir_version = min(model.ir_version, 8 if opset <= 17 else 10)
    model.metadata_props.add(key="trtattn.inputs", value=json.dumps(
        {"inputs": {"x": {"kind": "float"}}, "dims": {"unk__1": batch, "unk__2": seq}}))
    return model
