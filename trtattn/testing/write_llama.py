#!/usr/bin/env python
"""Llama-shaped decoders written straight to ONNX with random weights: no torch, no download.

    python -m trtattn.testing.write_llama OUT.onnx --preset llama3-8b [--layers N] [--dtype float16|float32]
                                     [--form padded|cache] [--seed S] [--force]

The graph is what torch's TorchScript exporter writes for transformers' LlamaForCausalLM (eager
attention, position_ids as an input, as optimum exports decoders): the same ops, node names and
casts, so trtattn's matcher meets it as it meets a real export. Embedding Gather; RMSNorm as
Cast/Pow/ReduceMean/Add/Sqrt/Div/Mul/Cast/Mul; q/k/v/o as MatMul with [in, out] weights, Reshape and
Transpose into heads; rotate-half RoPE with cos/sin computed from position_ids; GQA's repeat_kv
(Unsqueeze/Expand/Reshape); Q.K^T, Mul by the scale, Add of the causal + padding mask built from
attention_mask (Range/LessOrEqual/And/Where, as the export builds it, minus torch's vmap indexing of
the mask), Softmax, the exporter's float Cast pair, MatMul with V; SwiGLU MLP; final norm; lm_head.

form="padded": input_ids, attention_mask, position_ids [batch, seq] -> logits [batch, seq, vocab].
form="cache":  as the zoo's llama-cache / llama-lm exports: attention_mask [batch, past+seq],
               past_key_values.{i}.key/value [batch, kv_heads, past, head] concatenated with the new
               K/V into present.{i}.key/value.
lm_head=False outputs last_hidden_state instead (LlamaModel, as the zoo's llama and the coverage
benchmark's > 2 GB model).

Weights are uniform with std 1/sqrt(fan_in) (norm weights near 1), drawn per tensor from a generator
seeded by (seed, tensor name), so a model with fewer layers has the same first layers. Each tensor
is generated in chunks and streamed into one external-data file (OUT.onnx.data) at a 4096-byte
aligned offset, which lets ONNX Runtime memory-map it: memory stays flat whatever the model's size.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

OPSET = 17  # what trtattn's zoo uses for TorchScript exports
ALIGN = 4096  # external-data offsets on page boundaries: ONNX Runtime memory-maps them
CHUNK = 8 << 20  # elements generated at once (32 MB of float32), whatever the tensor's size
INT64_MAX = np.iinfo(np.int64).max
DTYPES = {"float16": (np.float16, TensorProto.FLOAT16), "float32": (np.float32, TensorProto.FLOAT)}
FORMS = ("padded", "cache")
EXPORTER_STYLES = ("torchscript",)

PRESETS = {
    # Meta-Llama-3-8B's shapes (default RoPE: the graph is the same with Llama 3's frequency scaling)
    "llama3-8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, max_positions=8192,
                      rope_theta=500000.0, rms_eps=1e-5, dtype="float16"),
    # Meta-Llama-3-70B's shapes: for the tensor-parallel cost table (routes/parallel/cost.py), too large to write here
    "llama3-70b": dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256, max_positions=8192,
                       rope_theta=500000.0, rms_eps=1e-5, dtype="float16"),
    # benchmarks/fusion_coverage.py's > 2 GB model (LARGE_CONFIG): LlamaModel, 552 M parameters
    "llama-2gb": dict(layers=8, hidden=2048, heads=16, kv_heads=4, ffn=8192, vocab=32000, max_positions=512,
                      dtype="float32", lm_head=False),
    "tiny": dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, max_positions=64, dtype="float32"),
}
EXAMPLE_DIMS = {"batch": 2, "seq": 7, "past": 6}  # as the zoo's: what trtattn's input generator feeds


class _Nodes:
    """Nodes named as the TorchScript exporter names them: '<scope>/<Op>[_k]', output '<name>_output_0'."""

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []
        self._count: Counter[str] = Counter()

    def __call__(self, scope: str, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        key = f"{scope}/{op_type}"
        k = self._count[key]
        self._count[key] += 1
        name = key if k == 0 else f"{key}_{k}"
        out = out or f"{name}_output_0"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        return out

    def const(self, scope: str, value, dtype=np.int64) -> str:
        return self(scope, "Constant", value=numpy_helper.from_array(np.array(value, dtype=dtype)))

    def dims(self, scope: str, x: str, axes) -> list[str]:
        """x's sizes along `axes`, each a 1-D int64 tensor (Shape -> Gather -> Unsqueeze)."""
        shape = self(scope, "Shape", x)
        return [self(scope, "Unsqueeze", self(scope, "Gather", shape, self.const(scope, a), axis=0),
                     self.const(scope, [0])) for a in axes]


class _WeightFile:
    """Initializers streamed into one external-data file, never more than CHUNK elements in memory."""

    def __init__(self, path: Path, location: str, dtype: str, seed: int):
        self.path, self.location, self.seed = path, location, seed  # written to `path`, renamed to `location`
        self.np_dtype, self.onnx_dtype = DTYPES[dtype]
        self.file = open(path, "wb")
        self.tensors: list[TensorProto] = []

    def add(self, name: str, shape: tuple[int, ...], std: float, mean: float = 0.0) -> str:
        """Uniform values with mean `mean` and standard deviation `std`, written at an aligned offset."""
        offset = self.file.tell()
        self.file.write(b"\0" * (-offset % ALIGN))
        offset += -offset % ALIGN
        rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
        half_width = std * math.sqrt(3.0)
        total = math.prod(shape)
        for start in range(0, total, CHUNK):
            x = rng.random(min(CHUNK, total - start), dtype=np.float32)
            x -= 0.5
            x *= 2 * half_width
            x += mean
            self.file.write(x.astype(self.np_dtype, copy=False).data)
        tensor = TensorProto(name=name, dims=shape, data_type=self.onnx_dtype, raw_data=b"")
        set_external_data(tensor, self.location, offset, total * np.dtype(self.np_dtype).itemsize)
        tensor.ClearField("raw_data")  # set_external_data wants the field present; the bytes are in the file
        self.tensors.append(tensor)
        return name

    def linear(self, name: str, n_in: int, n_out: int) -> str:
        """A projection as the export stores it: torch's Linear weight transposed to [in, out]."""
        return self.add(f"{name}.weight.T", (n_in, n_out), n_in ** -0.5)

    def norm(self, name: str, size: int) -> str:
        return self.add(f"{name}.weight", (size,), 0.1, mean=1.0)


def _rms_norm(g: _Nodes, w: _WeightFile, scope: str, x: str, size: int, eps: float, dtype: int, out=None) -> str:
    xf = g(scope, "Cast", x, to=TensorProto.FLOAT)
    var = g(scope, "ReduceMean", g(scope, "Pow", xf, g.const(scope, 2.0, np.float32)), axes=[-1], keepdims=1)
    inv = g(scope, "Div", g.const(scope, 1.0, np.float32),
            g(scope, "Sqrt", g(scope, "Add", var, g.const(scope, eps, np.float32))))
    normed = g(scope, "Cast", g(scope, "Mul", xf, inv), to=dtype)
    return g(scope, "Mul", w.norm(scope[1:].replace("/", "."), size), normed, out=out)


def _rotary(g: _Nodes, position_ids: str, head: int, theta: float, dtype: int) -> tuple[str, str]:
    """cos/sin [batch, 1, seq, head] from position_ids, as transformers' LlamaRotaryEmbedding exports."""
    s = "/model/rotary_emb"
    inv_freq = 1.0 / (theta ** (np.arange(0, head, 2, dtype=np.int64).astype(np.float32) / head))
    pos = g(s, "Cast", g(s, "Unsqueeze", position_ids, g.const(s, [2])), to=TensorProto.FLOAT)
    freqs = g(s, "Mul", pos, g.const(s, inv_freq, np.float32))
    emb = g(s, "Concat", freqs, freqs, axis=-1)
    tables = []
    for op in ("Cos", "Sin"):
        scaled = g(s, "Mul", g(s, op, emb), g.const(s, 1.0, np.float32))  # the attention_scaling factor
        table = g(s, "Cast", scaled, to=dtype)
        tables.append(g("/model/layers.0/self_attn", "Unsqueeze", table, g.const("/model/layers.0/self_attn", [1])))
    return tables[0], tables[1]


def _mask(g: _Nodes, emb: str, attention_mask: str, past_key: str | None, np_dtype) -> str:
    """Additive causal + padding mask [batch, 1, seq, past+seq]: 0 where allowed, the dtype's min elsewhere."""
    s = "/model"
    keep = g(s, "Cast", attention_mask, to=TensorProto.BOOL)
    seq = g(s, "Gather", g(s, "Shape", emb), g.const(s, 1), axis=0)
    q_pos = g(s, "Range", g.const(s, 0), seq, g.const(s, 1))
    if past_key is None:
        total = g(s, "Gather", g(s, "Shape", keep), g.const(s, 1), axis=0)
    else:  # the new tokens sit after the cache (transformers' cache_position)
        past = g(s, "Gather", g(s, "Shape", past_key), g.const(s, 2), axis=0)
        q_pos = g(s, "Add", q_pos, past)
        total = g(s, "Add", past, seq)
    kv_pos = g(s, "Range", g.const(s, 0), total, g.const(s, 1))
    causal = g(s, "LessOrEqual", g(s, "Unsqueeze", kv_pos, g.const(s, [0, 1, 2])),
               g(s, "Unsqueeze", q_pos, g.const(s, [0, 1, 3])))
    allowed = g(s, "And", causal, g(s, "Unsqueeze", keep, g.const(s, [1, 2])))
    return g(s, "Where", allowed, g.const(s, 0.0, np_dtype), g.const(s, np.finfo(np_dtype).min, np_dtype))


def _rotate_half(g: _Nodes, s: str, x: str, cos: str, sin: str, head: int) -> str:
    first = g(s, "Slice", x, g.const(s, [0]), g.const(s, [head // 2]), g.const(s, [3]), g.const(s, [1]))
    second = g(s, "Slice", x, g.const(s, [head // 2]), g.const(s, [INT64_MAX]), g.const(s, [3]), g.const(s, [1]))
    rotated = g(s, "Concat", g(s, "Neg", second), first, axis=-1)
    return g(s, "Add", g(s, "Mul", x, cos), g(s, "Mul", rotated, sin))


def _repeat_kv(g: _Nodes, s: str, x: str, n_rep: int) -> str:
    """[b, kv, t, h] -> [b, kv * n_rep, t, h], as transformers' repeat_kv (nothing when n_rep is 1)."""
    if n_rep == 1:
        return x
    b, n, t, h = g.dims(s, x, range(4))
    expanded = g(s, "Expand", g(s, "Unsqueeze", x, g.const(s, [2])),
                 g(s, "Concat", b, n, g.const(s, [n_rep]), t, h, axis=0))
    return g(s, "Reshape", expanded, g(s, "Concat", b, g(s, "Mul", n, g.const(s, [n_rep])), t, h, axis=0))


def _attention(g: _Nodes, w: _WeightFile, cfg: dict, i: int, x: str, rope: tuple[str, str], mask: str,
               cache: bool) -> str:
    s = f"/model/layers.{i}/self_attn"
    hidden, heads, kv_heads = cfg["hidden"], cfg["heads"], cfg["kv_heads"]
    head = hidden // heads
    np_dtype, dtype = DTYPES[cfg["dtype"]]
    b, t = g.dims(s, x, (0, 1))
    split = g(s, "Concat", b, t, g.const(s, [-1]), g.const(s, [head]), axis=0)

    def project(proj: str, n_heads: int) -> str:  # [b, t, n*h] -> [b, n, t, h]
        y = g(f"{s}/{proj}", "MatMul", x, w.linear(f"model.layers.{i}.self_attn.{proj}", hidden, n_heads * head))
        return g(s, "Transpose", g(s, "Reshape", y, split), perm=[0, 2, 1, 3])

    q, k, v = project("q_proj", heads), project("k_proj", kv_heads), project("v_proj", kv_heads)
    q, k = (_rotate_half(g, s, y, *rope, head) for y in (q, k))
    if cache:
        k = g(s, "Concat", f"past_key_values.{i}.key", k, axis=-2, out=f"present.{i}.key")
        v = g(s, "Concat", f"past_key_values.{i}.value", v, axis=-2, out=f"present.{i}.value")
    k, v = (_repeat_kv(g, s, y, heads // kv_heads) for y in (k, v))
    logits = g(s, "MatMul", q, g(s, "Transpose", k, perm=[0, 1, 3, 2]))
    logits = g(s, "Add", g(s, "Mul", logits, g.const(s, head ** -0.5, np_dtype)), mask)
    probs = g(s, "Softmax", logits, axis=-1)
    # softmax(dtype=float32).to(dtype): the exporter casts after the Softmax, and back
    probs = g(s, "Cast", g(s, "Cast", probs, to=TensorProto.FLOAT), to=dtype)
    out = g(s, "Transpose", g(s, "MatMul", probs, v), perm=[0, 2, 1, 3])
    out = g(s, "Reshape", out, g(s, "Concat", b, t, g.const(s, [-1]), axis=0))
    return g(f"{s}/o_proj", "MatMul", out, w.linear(f"model.layers.{i}.self_attn.o_proj", heads * head, hidden))


def _mlp(g: _Nodes, w: _WeightFile, cfg: dict, i: int, x: str) -> str:
    s, name = f"/model/layers.{i}/mlp", f"model.layers.{i}.mlp"
    hidden, ffn = cfg["hidden"], cfg["ffn"]
    gate = g(f"{s}/gate_proj", "MatMul", x, w.linear(f"{name}.gate_proj", hidden, ffn))
    act = g(f"{s}/act_fn", "Mul", gate, g(f"{s}/act_fn", "Sigmoid", gate))
    up = g(f"{s}/up_proj", "MatMul", x, w.linear(f"{name}.up_proj", hidden, ffn))
    return g(f"{s}/down_proj", "MatMul", g(s, "Mul", act, up), w.linear(f"{name}.down_proj", ffn, hidden))


def _check(cfg: dict) -> None:
    if cfg["dtype"] not in DTYPES:
        raise ValueError(f"dtype {cfg['dtype']!r}: use one of {', '.join(DTYPES)}")
    if cfg["form"] not in FORMS:
        raise ValueError(f"form {cfg['form']!r}: use one of {', '.join(FORMS)}")
    if cfg["exporter_style"] not in EXPORTER_STYLES:
        raise ValueError(f"exporter_style {cfg['exporter_style']!r}: only {', '.join(EXPORTER_STYLES)} is written")
    if min(cfg[k] for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_positions")) < 1:
        raise ValueError(f"every size must be positive: {cfg}")
    if cfg["hidden"] % cfg["heads"] or (cfg["hidden"] // cfg["heads"]) % 2:
        raise ValueError(f"hidden {cfg['hidden']} must split into {cfg['heads']} heads of an even size (RoPE)")
    if cfg["heads"] % cfg["kv_heads"]:
        raise ValueError(f"{cfg['heads']} query heads do not share {cfg['kv_heads']} KV heads evenly")


def _graph_io(cfg: dict) -> tuple[list, list, dict]:
    """Inputs, outputs and the input roles trtattn's input generator reads, named as the zoo's exports."""
    cache, head = cfg["form"] == "cache", cfg["hidden"] // cfg["heads"]
    onnx_dtype = DTYPES[cfg["dtype"]][1]
    total = "past+seq" if cache else "seq"
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", total]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"])]
    roles = {"input_ids": {"kind": "token_ids", "vocab": cfg["vocab"]},
             "attention_mask": {"kind": "padding_mask", **({"side": "left"} if cache else {})},
             "position_ids": {"kind": "position_ids", **({"offset": "past"} if cache else {})}}
    final = ("logits", cfg["vocab"]) if cfg["lm_head"] else ("last_hidden_state", cfg["hidden"])
    outputs = [helper.make_tensor_value_info(final[0], onnx_dtype, ["batch", "seq", final[1]])]
    for i in range(cfg["layers"] if cache else 0):
        for part in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{part}", onnx_dtype,
                                                        ["batch", cfg["kv_heads"], "past", head]))
            roles[f"past_key_values.{i}.{part}"] = {"kind": "cache"}
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{part}", onnx_dtype,
                                                         ["batch", cfg["kv_heads"], total, head]))
    return inputs, outputs, roles


def write_llama(path, *, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int,
                max_positions: int, dtype: str = "float16", form: str = "padded",
                exporter_style: str = "torchscript", seed: int = 0, rope_theta: float = 10000.0,
                rms_eps: float = 1e-6, lm_head: bool = True) -> Path:
    """Write the model to `path` and its weights to `path`.data (both replaced if they exist).

    max_positions is recorded with the config (metadata `write_llama.config`): positions are an input,
    so the graph has no position table."""
    cfg = dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn, vocab=vocab,
               max_positions=max_positions, dtype=dtype, form=form, exporter_style=exporter_style, seed=seed,
               rope_theta=rope_theta, rms_eps=rms_eps, lm_head=lm_head)
    _check(cfg)
    path = Path(path)
    data = path.with_name(path.name + ".data")
    head, cache = hidden // heads, form == "cache"
    np_dtype, onnx_dtype = DTYPES[dtype]
    inputs, outputs, roles = _graph_io(cfg)
    final = outputs[0].name

    g, w = _Nodes(), _WeightFile(data.with_name(data.name + ".partial"), data.name, dtype, seed)
    try:
        x = g("/model/embed_tokens", "Gather", w.add("model.embed_tokens.weight", (vocab, hidden), hidden ** -0.5),
              "input_ids")
        mask = _mask(g, x, "attention_mask", "past_key_values.0.key" if cache else None, np_dtype)
        rope = _rotary(g, "position_ids", head, rope_theta, onnx_dtype)
        for i in range(layers):
            s = f"/model/layers.{i}"
            normed = _rms_norm(g, w, f"{s}/input_layernorm", x, hidden, rms_eps, onnx_dtype)
            x = g(s, "Add", x, _attention(g, w, cfg, i, normed, rope, mask, cache))
            normed = _rms_norm(g, w, f"{s}/post_attention_layernorm", x, hidden, rms_eps, onnx_dtype)
            x = g(s, "Add", x, _mlp(g, w, cfg, i, normed))
        x = _rms_norm(g, w, "/model/norm", x, hidden, rms_eps, onnx_dtype, out=None if lm_head else final)
        if lm_head:
            g("/lm_head", "MatMul", x, w.linear("lm_head", hidden, vocab), out=final)
    except BaseException:
        w.file.close()
        w.path.unlink()
        raise
    w.file.close()

    graph = helper.make_graph(g.nodes, "llama", inputs, outputs, initializer=w.tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8,
                              producer_name="trtattn.testing.write_llama")
    dims = {k: v for k, v in EXAMPLE_DIMS.items() if cache or k != "past"}
    meta = {"exporter": exporter_style, "expected_sites": layers, "inputs": roles, "dims": dims}
    helper.set_model_props(model, {"trtattn.inputs": json.dumps(meta), "write_llama.config": json.dumps(cfg)})
    os.replace(w.path, data)
    onnx.save_model(model, path)
    return path


def main(argv=None) -> int:
    from ..host_memory import peak_rss

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the .onnx file; the weights go to OUT.data beside it")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--layers", type=int, help="override the preset's layer count")
    ap.add_argument("--dtype", choices=sorted(DTYPES))
    ap.add_argument("--form", choices=FORMS, default="padded")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="replace an existing OUT")
    args = ap.parse_args(argv)
    if args.out.exists() and not args.force:
        print(f"{args.out} exists; pass --force to replace it", file=sys.stderr)
        return 1
    cfg: dict = dict(PRESETS[args.preset])
    cfg.update({k: v for k, v in (("layers", args.layers), ("dtype", args.dtype)) if v is not None})
    start = time.perf_counter()
    write_llama(args.out, form=args.form, seed=args.seed, **cfg)
    seconds = time.perf_counter() - start
    model = onnx.load(args.out, load_external_data=False)
    params = sum(math.prod(t.dims) for t in model.graph.initializer)
    size = os.path.getsize(args.out.with_name(args.out.name + ".data"))
    print(f"{args.out}: {args.preset} ({cfg['layers']} layers, {cfg['dtype']}, {args.form}), "
          f"{params:,} parameters, {size / 2**30:.2f} GiB of weights, {len(model.graph.node)} nodes, "
          f"written in {seconds:.1f} s, peak RSS {(peak_rss() or 0) / 2**20:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
