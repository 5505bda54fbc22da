"""Decoders shaped as ONNX Runtime GenAI's model builder writes them, built by hand with onnx.helper (no download,
no onnxruntime-genai), and the genai_config.json that goes beside them.

What the builder writes, and so what these carry:
- inputs `input_ids` [batch_size, sequence_length] (int64), `attention_mask` [batch_size, total_sequence_length]
  (int64), `past_key_values.N.key/value` [batch_size, kv_heads, past_sequence_length, kv_cache_dim] (the last dim
  symbolic: one export serves plain and quantized caches); outputs `logits` and `present.N.key/value`
  [batch_size, kv_heads, total_sequence_length, kv_cache_dim];
- seqlens_k and total_sequence_length computed from the mask as the builder does (ReduceSum(mask, 1) - 1 cast
  to int32; Shape(mask)[1] cast to int32);
- per layer com.microsoft GroupQueryAttention on Q, K and V packed in one input (one MatMul), rotary inside the op
  (do_rotary=1, cos/sin caches [context_length, head_size / 2]);
- with `window` and `sliding` (Gemma 2's alternate layers): those layers' GroupQueryAttention keeps a fixed
  window buffer (local_window_size=window, sliding_window_cache=1) with caches [.., past_sliding_length, ..] in
  and [.., total_sliding_length, ..] out, both `window` slots when run, and genai_config.json's
  decoder.sliding_window names them;
- RMS norms written as plain ONNX ops, or (`norms="microsoft"`) as the builder's SimplifiedLayerNormalization and
  com.microsoft SkipSimplifiedLayerNormalization.

ONNX Runtime runs them on CPU at a prefill (empty past: past_sequence_length 0) and at a decode step (batch 1 when
new tokens meet a past: the CPU kernel's rule). `genai_feeds` makes inputs for either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_EPS = 1e-5


@dataclass(frozen=True)
class GenaiSpec:
    """The sizes of one hand-built GenAI decoder (a builder model's config in small)."""

    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_size: int = 16
    hidden: int = 64
    intermediate: int = 128
    vocab: int = 96
    context_length: int = 128  # rows of the cos/sin caches and genai_config.json's context_length
    dtype: str = "float32"  # "float32" or "float16" (weights, caches and logits, as the builder's io_dtype)
    norms: str = "plain"  # "plain" (ReduceMean/Sqrt/Div) or "microsoft" (the builder's fused norm ops)
    static_head_dim: bool = False  # the cache's last dim written as head_size (older builders) not kv_cache_dim
    seed: int = 0
    window: int = 0  # the sliding layers' local_window_size (their buffer's slots)
    sliding: tuple[int, ...] = ()  # the layers that keep a window buffer

    @property
    def np_dtype(self) -> np.dtype:
        return np.dtype(self.dtype)

    @property
    def onnx_dtype(self) -> int:
        return helper.np_dtype_to_tensor_dtype(self.np_dtype)

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_size


def cache_shape(spec: GenaiSpec, length: str) -> list:
    return ["batch_size", spec.kv_heads, length, spec.head_size if spec.static_head_dim else "kv_cache_dim"]


class _Builder:
    """Nodes and initializers of one graph, with fresh names."""

    def __init__(self, spec: GenaiSpec):
        self.spec = spec
        self.rng = np.random.default_rng(spec.seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def weight(self, name: str, shape: tuple, scale: float, offset: float = 0.0) -> str:
        value = offset + self.rng.standard_normal(shape) * scale
        self.inits.append(numpy_helper.from_array(value.astype(self.spec.np_dtype), name))
        return name

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], name: str, outputs: int = 1, domain: str = "", **attrs) -> list[str]:
        outs = [f"{name}/output_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, domain=domain, **attrs))
        return outs

    def rms(self, x: str, name: str) -> str:
        """x / sqrt(mean(x^2) + eps) * w in plain ONNX ops."""
        w = self.weight(f"{name}.weight", (self.spec.hidden,), 0.1, offset=1.0)
        sq, = self.node("Mul", [x, x], f"{name}/Square")
        mean, = self.node("ReduceMean", [sq, "/model/constants/INT64/[-1]"], f"{name}/ReduceMean", keepdims=1)
        shifted, = self.node("Add", [mean, "/model/constants/eps"], f"{name}/AddEps")
        root, = self.node("Sqrt", [shifted], f"{name}/Sqrt")
        normed, = self.node("Div", [x, root], f"{name}/Div")
        return self.node("Mul", [normed, w], f"{name}/Scale")[0]


def genai_decoder(spec: GenaiSpec = GenaiSpec()) -> onnx.ModelProto:
    """A decoder-only LLM as the GenAI builder writes it (see the module doc), random weights."""
    b = _Builder(spec)
    b.const("/model/constants/INT64/[-1]", np.array([-1], np.int64))
    b.const("/model/constants/INT64/[1]", np.array([1], np.int64))
    b.const("/model/constants/INT64/1", np.array(1, np.int64))
    b.inits.append(numpy_helper.from_array(np.array(_EPS, spec.np_dtype), "/model/constants/eps"))
    _rotary_caches(b)
    seqlens, total = _mask_reformat(b)
    x, = b.node("Gather", [b.weight("model.embed_tokens.weight", (spec.vocab, spec.hidden), 1.0), "input_ids"],
                "/model/embed_tokens/Gather")
    skip = None
    for layer in range(spec.layers):
        x, skip = _layer(b, layer, x, skip, seqlens, total)
    normed = _final_norm(b, x, skip)
    b.nodes.append(helper.make_node("MatMul", [normed, b.weight("lm_head.weight", (spec.hidden, spec.vocab), 0.2)],
                                    ["logits"], name="/lm_head/MatMul"))
    return _model(b)


def _rotary_caches(b: _Builder) -> None:
    spec = b.spec
    inv = 1.0 / (10000 ** (np.arange(0, spec.head_size, 2) / spec.head_size))
    angles = np.arange(spec.context_length)[:, None] * inv[None]
    b.inits.append(numpy_helper.from_array(np.cos(angles).astype(spec.np_dtype), "cos_cache"))
    b.inits.append(numpy_helper.from_array(np.sin(angles).astype(spec.np_dtype), "sin_cache"))


def _mask_reformat(b: _Builder) -> tuple[str, str]:
    """seqlens_k = ReduceSum(mask, 1) - 1 and total_sequence_length = Shape(mask)[1], both int32 (the builder's
    attn_mask_reformat subgraph)."""
    base = "/model/attn_mask_reformat/attn_mask_subgraph"
    total_keys, = b.node("ReduceSum", ["attention_mask", "/model/constants/INT64/[1]"], f"{base}/ReduceSum", keepdims=0)
    last, = b.node("Sub", [total_keys, "/model/constants/INT64/[1]"], f"{base}/Sub")
    seqlens, = b.node("Cast", [last], f"{base}/Sub/Cast", to=TensorProto.INT32)
    shape, = b.node("Shape", ["attention_mask"], f"{base}/Shape")
    length, = b.node("Gather", [shape, "/model/constants/INT64/1"], f"{base}/Gather", axis=0)
    total, = b.node("Cast", [length], f"{base}/Gather/Cast", to=TensorProto.INT32)
    return seqlens, total


def _norm(b: _Builder, x: str, skip: str | None, name: str) -> tuple[str, str]:
    """The layer's input norm: (normed, the residual sum it read). With the builder's ops the residual is added
    inside SkipSimplifiedLayerNormalization; with plain ops by an Add."""
    if b.spec.norms == "microsoft":
        w = b.weight(f"{name}.weight", (b.spec.hidden,), 0.1, offset=1.0)
        if skip is None:
            normed, = b.node("SimplifiedLayerNormalization", [x, w], f"/{name}/SimplifiedLayerNorm", axis=-1,
                             epsilon=_EPS, stash_type=1)
            return normed, x
        outs = b.node("SkipSimplifiedLayerNormalization", [x, skip, w], f"/{name}/SkipLayerNorm", outputs=4,
                      domain="com.microsoft", epsilon=_EPS)
        return outs[0], outs[3]
    if skip is not None:
        x, = b.node("Add", [x, skip], f"/{name}/ResidualAdd")
    return b.rms(x, f"/{name}"), x


def _layer(b: _Builder, layer: int, x: str, skip: str | None, seqlens: str, total: str) -> tuple[str, str]:
    spec = b.spec
    base = f"model.layers.{layer}"
    normed, residual = _norm(b, x, skip, f"{base}/input_layernorm")
    qkv, = b.node("MatMul", [normed, b.weight(f"{base}.attn.qkv_proj.weight", (spec.hidden, spec.qkv_width), 0.2)],
                  f"/{base}/attn/qkv_proj/MatMul")
    present = [f"present.{layer}.key", f"present.{layer}.value"]
    name = f"/{base}/attn/GroupQueryAttention"
    window = {"local_window_size": spec.window, "sliding_window_cache": 1} if layer in spec.sliding else {
        "local_window_size": -1}
    b.nodes.append(helper.make_node(
        "GroupQueryAttention", [qkv, "", "", f"past_key_values.{layer}.key", f"past_key_values.{layer}.value", seqlens,
                                total, "cos_cache", "sin_cache"], [f"{name}/output_0", *present], name=name,
        domain="com.microsoft", num_heads=spec.heads, kv_num_heads=spec.kv_heads, do_rotary=1, rotary_interleaved=0,
        scale=float(spec.head_size ** -0.5)))
    b.nodes[-1].attribute.extend(helper.make_attribute(k, v) for k, v in window.items())
    attn, = b.node("MatMul", [f"{name}/output_0", b.weight(f"{base}.attn.o_proj.weight",
                                                           (spec.heads * spec.head_size, spec.hidden), 0.2)],
                   f"/{base}/attn/o_proj/MatMul")
    normed, residual = _norm(b, attn, residual, f"{base}/post_attention_layernorm")
    gate, = b.node("MatMul", [normed, b.weight(f"{base}.mlp.gate_proj.weight", (spec.hidden, spec.intermediate), 0.2)],
                   f"/{base}/mlp/gate_proj/MatMul")
    up, = b.node("MatMul", [normed, b.weight(f"{base}.mlp.up_proj.weight", (spec.hidden, spec.intermediate), 0.2)],
                 f"/{base}/mlp/up_proj/MatMul")
    sig, = b.node("Sigmoid", [gate], f"/{base}/mlp/act_fn/Sigmoid")
    silu, = b.node("Mul", [gate, sig], f"/{base}/mlp/act_fn/Mul")
    gated, = b.node("Mul", [silu, up], f"/{base}/mlp/Mul")
    down, = b.node("MatMul", [gated, b.weight(f"{base}.mlp.down_proj.weight", (spec.intermediate, spec.hidden), 0.2)],
                   f"/{base}/mlp/down_proj/MatMul")
    return down, residual


def _final_norm(b: _Builder, x: str, skip: str | None) -> str:
    return _norm(b, x, skip, "model.norm")[0]


def _model(b: _Builder) -> onnx.ModelProto:
    spec = b.spec
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])]
    outputs = [helper.make_tensor_value_info("logits", spec.onnx_dtype, ["batch_size", "sequence_length", spec.vocab])]
    for layer in range(spec.layers):
        past, total = ("past_sliding_length", "total_sliding_length") if layer in spec.sliding else (
            "past_sequence_length", "total_sequence_length")
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{layer}.{kind}", spec.onnx_dtype,
                                                        cache_shape(spec, past)))
            outputs.append(helper.make_tensor_value_info(f"present.{layer}.{kind}", spec.onnx_dtype,
                                                         cache_shape(spec, total)))
    read = {i for n in b.nodes for i in n.input}
    graph = helper.make_graph(b.nodes, "main_graph", inputs, outputs, [t for t in b.inits if t.name in read])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              producer_name="onnxruntime-genai")
    model.ir_version = 10
    return model


def genai_feeds(spec: GenaiSpec, *, batch: int = 1, new: int = 8, past: int = 0, padding: int = 0,
                seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of genai_decoder ONNX Runtime runs: `new` tokens after `past` cached ones (past 0: a prefill), the first
    `padding` keys of every row masked (left padding, as GenAI pads a batch); a sliding layer's buffer has
    `window` slots."""
    rng = np.random.default_rng(seed)
    total = past + new
    mask = np.ones((batch, total), np.int64)
    mask[:, :padding] = 0
    feeds = {"input_ids": rng.integers(0, spec.vocab, (batch, new), dtype=np.int64), "attention_mask": mask}
    for layer in range(spec.layers):
        for kind in ("key", "value"):
            slots = spec.window if layer in spec.sliding else past
            feeds[f"past_key_values.{layer}.{kind}"] = rng.standard_normal(
                (batch, spec.kv_heads, slots, spec.head_size)).astype(spec.np_dtype)
    return feeds


def genai_config(spec: GenaiSpec, *, filename: str = "model.onnx", share_buffer: bool = False) -> dict:
    """genai_config.json as the builder writes it for this decoder (the keys trtattn and ONNX Runtime GenAI read)."""
    return {
        "model": {
            "bos_token_id": 1, "context_length": spec.context_length, "eos_token_id": 2, "pad_token_id": 0,
            "type": "llama", "vocab_size": spec.vocab,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": filename, "head_size": spec.head_size, "hidden_size": spec.hidden,
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                           "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
                "num_attention_heads": spec.heads, "num_hidden_layers": spec.layers,
                "num_key_value_heads": spec.kv_heads,
                **({"sliding_window": {"window_size": spec.window, "slide_key_value_cache": False,
                                       "slide_inputs": False, "layers": list(spec.sliding), "cache_slack": 0}}
                   if spec.sliding else {}),
            },
        },
        "search": {"diversity_penalty": 0.0, "do_sample": False, "early_stopping": True, "length_penalty": 1.0,
                   "max_length": spec.context_length, "min_length": 0, "no_repeat_ngram_size": 0, "num_beams": 1,
                   "num_return_sequences": 1, "past_present_share_buffer": share_buffer, "repetition_penalty": 1.0,
                   "temperature": 1.0, "top_k": 50, "top_p": 1.0},
    }


def write_genai_config(folder: str | Path, spec: GenaiSpec, **kwargs) -> Path:
    path = Path(folder) / "genai_config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(genai_config(spec, **kwargs), indent=4))
    return path


def write_genai_folder(folder: str | Path, spec: GenaiSpec = GenaiSpec(), *, share_buffer: bool = False) -> Path:
    """`folder` with model.onnx (genai_decoder) and its genai_config.json, as the builder leaves an output folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(genai_decoder(spec), folder / "model.onnx")
    write_genai_config(folder, spec, share_buffer=share_buffer)
    return folder


def shared_buffer_logits(model: onnx.ModelProto, spec: GenaiSpec, prompt: list[int], steps: int, *,
                         window_slots: int | None = None) -> list[np.ndarray]:
    """The logits of a prefill of `prompt` then `steps` greedy decode steps, with each past and its present bound to
    one buffer as GenAI binds them under past_present_share_buffer (context_length slots; a sliding layer's
    `window_slots`, GenAI's window + 16 on CPU by default): what the runtime a shared-buffer folder is made for
    feeds the model, ONNX Runtime's own contract for GroupQueryAttention sharing its buffer."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    slots = window_slots or min(spec.window + 16, spec.context_length)
    arrays = {(layer, kind): np.zeros((1, spec.kv_heads, slots if layer in spec.sliding else spec.context_length,
                                       spec.head_size), spec.np_dtype)
              for layer in range(spec.layers) for kind in ("key", "value")}  # the buffers' memory, kept alive
    buffers = {key: ort.OrtValue.ortvalue_from_numpy(a) for key, a in arrays.items()}
    tokens, out = list(prompt), []
    for step in range(steps + 1):
        ids = np.array([tokens if step == 0 else tokens[-1:]], np.int64)
        binding = session.io_binding()
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("attention_mask", np.ones((1, len(tokens)), np.int64))
        for (layer, kind), buffer in buffers.items():
            binding.bind_ortvalue_input(f"past_key_values.{layer}.{kind}", buffer)
            binding.bind_ortvalue_output(f"present.{layer}.{kind}", buffer)
        binding.bind_output("logits")
        session.run_with_iobinding(binding)
        logits = binding.copy_outputs_to_cpu()[-1]
        out.append(logits[0, -1])
        tokens.append(int(np.argmax(logits[0, -1])))
    return out
