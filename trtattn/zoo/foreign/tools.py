"""Corpus files made from zoo exports by the tools users run on them (the main environment, plus
onnxconverter-common and onnxsim from the `foreign-tools` extra).

Each recipe takes the zoo's TorchScript export and returns (model, expected sites, source, what it
exercises). The zoo's own input roles (metadata "trtattn.inputs") are removed: a user's file carries none.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import onnx
from onnx import helper

BERT = {"num_heads": 4, "hidden_size": 64}  # trtattn.zoo.models.bert_config
GPT2 = {"num_heads": 4, "hidden_size": 64}


def _zoo(name: str, tmp: Path, *, opset: int | None = None) -> onnx.ModelProto:
    from .. import export

    path = tmp / f"{name}.{opset or 'default'}.onnx"
    export(name, "torchscript", path, opset=opset, force=True)
    return onnx.load(path)


def _strip(model: onnx.ModelProto) -> onnx.ModelProto:
    keep = [p for p in model.metadata_props if not p.key.startswith("trtattn.")]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    return model


def fp16_keep_io(tmp: Path):
    from onnxconverter_common import float16

    model = float16.convert_float_to_float16(_zoo("bert", tmp), keep_io_types=True)
    return model, 2, "zoo bert (TorchScript) through onnxconverter-common float16, keep_io_types=True", \
        ["fp16_casts", "io_types"]


def fp16(tmp: Path):
    from onnxconverter_common import float16

    model = float16.convert_float_to_float16(_zoo("bert", tmp), keep_io_types=False)
    return model, 2, "zoo bert (TorchScript) through onnxconverter-common float16, keep_io_types=False", ["fp16"]


def onnxsim_bert(tmp: Path):
    import onnxsim

    model, ok = onnxsim.simplify(_zoo("bert", tmp))
    assert ok, "onnxsim could not check its output"
    return model, 2, "zoo bert (TorchScript) through onnxsim.simplify", ["onnxsim"]


def onnxslim_llama(tmp: Path):
    import onnxslim

    return onnxslim.slim(_zoo("llama", tmp)), 2, "zoo llama (TorchScript) through onnxslim.slim", ["onnxslim", "gqa", "rope"]


def _ort_optimized(name: str, model_type: str, sizes: dict, tmp: Path) -> onnx.ModelProto:
    from onnxruntime.transformers import optimizer

    src, out = tmp / f"{name}.src.onnx", tmp / f"{name}.opt.onnx"
    onnx.save(_zoo(name, tmp), src)
    optimized = optimizer.optimize_model(str(src), model_type=model_type, opt_level=0, use_gpu=False, **sizes)
    optimized.save_model_to_file(str(out))  # as a user saves it: this adds the com.microsoft opset import
    return onnx.load(out)


def _quantize_dynamic(model: onnx.ModelProto, tmp: Path) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    src, out = tmp / "fp32.onnx", tmp / "qdyn.onnx"
    onnx.save(model, src)
    # the optimizer's contrib ops have no ONNX shape inference: their outputs are float, as a user tells it
    quantize_dynamic(src, out, weight_type=QuantType.QInt8, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return onnx.load(out)


def ort_bert(tmp: Path):
    return _ort_optimized("bert", "bert", BERT, tmp), 2, \
        "zoo bert through onnxruntime.transformers optimize_model(model_type='bert')", \
        ["com.microsoft:Attention", "SkipLayerNormalization", "FastGelu"]


def ort_bert_qdyn(tmp: Path):
    model = _quantize_dynamic(_ort_optimized("bert", "bert", BERT, tmp), tmp)
    return model, 2, "zoo bert through ORT optimize_model(bert), then quantize_dynamic (int8 weights)", \
        ["com.microsoft:QAttention", "DynamicQuantizeLinear", "SkipLayerNormalization", "FastGelu"]


def ort_gpt2_qdyn(tmp: Path):
    model = _quantize_dynamic(_ort_optimized("gpt2", "gpt2", GPT2, tmp), tmp)
    # the optimizer fuses the layer norms and GELU but not this export's attention (transformers 5's causal
    # mask): the products stay MatMul between MatMulInteger projections
    return model, 2, "zoo gpt2 through ORT optimize_model(gpt2), then quantize_dynamic (int8 weights)", \
        ["SkipLayerNormalization", "MatMulInteger", "DynamicQuantizeLinear", "causal"]


def bert_qdyn(tmp: Path):
    model = _quantize_dynamic(_zoo("bert", tmp), tmp)
    return model, 2, "zoo bert (TorchScript, not optimized) through quantize_dynamic: MatMulInteger products", \
        ["MatMulInteger", "DynamicQuantizeLinear"]


def inlined_softmax(tmp: Path):
    """Each Softmax as a call of a local function holding ONNX's own Softmax function body (the schema's
    context-dependent function for that node), then onnx.inliner: the normalization arrives as
    Exp(x - ReduceMax) / ReduceSum."""
    import onnx.inliner

    model = _zoo("bert", tmp)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    schema = onnx.defs.get_schema("Softmax", opset)
    float_type = helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, None).SerializeToString()
    for i, node in enumerate(n for n in model.graph.node if n.op_type == "Softmax"):
        body = onnx.FunctionProto()
        # onnx's stubs omit OpSchema.get_context_dependent_function, which its bindings define
        function = schema.get_context_dependent_function  # type: ignore[attr-defined]
        body.ParseFromString(function(node.SerializeToString(), [float_type]))
        body.domain, body.name = "trtattn.corpus", f"Softmax_{i}"
        del body.attribute[:]  # the node's axis is already in the body
        # the schema states the opset it wrote the body in (13); its ops mean the same at the model's
        # opset (17), and the inliner only inlines a body of the model's own opset
        del body.opset_import[:]
        body.opset_import.extend([helper.make_opsetid("", opset)])
        model.functions.append(body)
        del node.attribute[:]
        node.domain, node.op_type = body.domain, body.name
    model.opset_import.append(helper.make_opsetid("trtattn.corpus", 1))
    inlined = onnx.inliner.inline_local_functions(model)
    assert not any(n.domain == "trtattn.corpus" for n in inlined.graph.node)
    del inlined.functions[:]  # the inliner keeps the (now unused) definitions
    kept = [o for o in inlined.opset_import if o.domain != "trtattn.corpus"]
    del inlined.opset_import[:]
    inlined.opset_import.extend(kept)
    return inlined, 2, "zoo bert (TorchScript) with each Softmax inlined as ONNX's Softmax function body (onnx.inliner)", \
        ["softmax_function_body"]


def _low_opset(opset: int):
    def recipe(tmp: Path):
        return _zoo("bert", tmp, opset=opset), 2, f"zoo bert, TorchScript exporter at opset {opset}", \
            [f"opset{opset}", "flatten_softmax"]
    recipe.__name__ = f"bert_opset{opset}"
    return recipe


def _plain_attention():
    """A hand-written BERT-style self-attention layer (torch.nn.Linear, matmul, additive padding mask)."""
    import torch

    class SelfAttention(torch.nn.Module):
        def __init__(self, width=32, heads=4):
            super().__init__()
            self.heads, self.head = heads, width // heads
            self.q, self.k, self.v, self.o = (torch.nn.Linear(width, width) for _ in range(4))

        def split(self, t):
            b, s, _ = t.shape
            return t.view(b, s, self.heads, self.head).transpose(1, 2)

        def forward(self, x, mask):
            q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
            logits = torch.matmul(q, k.transpose(-1, -2)) / self.head ** 0.5
            logits = logits + (1.0 - mask[:, None, None, :].float()) * -10000.0
            y = torch.matmul(torch.softmax(logits, dim=-1), v).transpose(1, 2)
            return self.o(y.reshape(x.shape))

    torch.manual_seed(0)
    return SelfAttention().eval()


def _plain_low_opset(opset: int):
    def recipe(tmp: Path):
        import torch

        path = tmp / "plain.onnx"
        x, mask = torch.randn(2, 5, 32), torch.ones(2, 5, dtype=torch.int64)
        torch.onnx.export(_plain_attention(), (x, mask), str(path), input_names=["x", "mask"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch", 1: "seq"}, "mask": {0: "batch", 1: "seq"}},
                          opset_version=opset, dynamo=False)
        return onnx.load(path), 1, f"hand-written torch self-attention, TorchScript exporter at opset {opset}", \
            [f"opset{opset}", "flatten_softmax"]
    recipe.__name__ = f"plain_opset{opset}"
    return recipe


def _audio_export(model, path: Path, padding: bool) -> onnx.ModelProto:
    """A transformers audio encoder's last hidden state from 16 samples (and a padding mask), TorchScript."""
    import torch

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_values, *mask):
            return self.model(input_values=input_values, attention_mask=mask[0] if mask else None).last_hidden_state

    names = ["input_values"] + (["attention_mask"] if padding else [])
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 12:] = 0
    args = (torch.randn(2, 16),) + ((mask,) if padding else ())
    torch.onnx.export(Hidden(), args, str(path), input_names=names, output_names=["last_hidden_state"],
                      dynamic_axes={n: {0: "batch", 1: "samples"} for n in names}, opset_version=17, dynamo=False)
    return onnx.load(path)


# audio encoders with one convolution of stride 1 (8 samples give 7 frames), 2 layers, hidden 32, 2 heads
_AUDIO: dict[str, Any] = dict(vocab_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
              conv_dim=(16,), conv_kernel=(2,), conv_stride=(1,), num_conv_pos_embeddings=4,
              num_conv_pos_embedding_groups=2, attn_implementation="eager")


def wavlm(tmp: Path):
    """WavLM: a relative-position bias gated per head by a sigmoid of the query (gru_rel_pos), added to the
    logits on heads merged into the batch ([B*N, T, T]), in torch's multi_head_attention_forward layout."""
    import torch
    import transformers as T

    cfg = T.WavLMConfig(**_AUDIO, num_buckets=16, max_bucket_distance=32)
    torch.manual_seed(0)
    model = T.WavLMModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # the gate and the bias table start at constants: make them matter
            p.normal_(0.0, 0.2)
    return _audio_export(model, tmp / "wavlm.onnx", padding=False), cfg.num_hidden_layers, \
        "transformers WavLM (2 layers, hidden 32, 2 heads, random weights), TorchScript exporter", \
        ["gated_position_bias", "layout3d", "bias_in_graph"]


def sew_d(tmp: Path):
    """SEW-D: DeBERTa's disentangled attention in an audio encoder, through XSoftmax's ONNX symbolic:
    Where(~mask, finfo.min, x) -> Softmax -> Where(~mask, 0, P) (issue 18 class 8: the probabilities feed Where)."""
    import torch
    import transformers as T

    cfg = T.SEWDConfig(**_AUDIO, squeeze_factor=1, max_position_embeddings=64, position_buckets=8)
    torch.manual_seed(0)
    model = T.SEWDModel(cfg).eval()
    return _audio_export(model, tmp / "sew-d.onnx", padding=True), cfg.num_hidden_layers, \
        "transformers SEW-D (2 layers, hidden 32, 2 heads, random weights) with a padding mask, TorchScript exporter", \
        ["xsoftmax", "probs_mask", "bias_in_graph"]


def in_projection(tmp: Path):
    """nn.MultiheadAttention-style code (as text recognisers write it): one in-projection sliced into Q, K, V at an
    end computed from its shape, the head size read off the Q slice and the logits divided by its square root;
    [L, B, E] with both dims free. TorchScript writes the scale as Pow(Cast(Div(Gather(Shape(Slice(proj, 0, end)),
    2), heads)), 0.5), which shape inference does not follow (the Slice's end is computed)."""
    import torch

    class InProjection(torch.nn.Module):
        def __init__(self, embed=32, heads=4):
            super().__init__()
            self.in_proj, self.out_proj, self.heads = torch.nn.Linear(embed, 3 * embed), torch.nn.Linear(embed, embed), heads

        def forward(self, x):  # [L, B, E]
            length, batch = x.shape[0], x.shape[1]
            proj = self.in_proj(x)
            embed = proj.size(-1) // 3
            q, k, v = proj[:, :, :embed], proj[:, :, embed:2 * embed], proj[:, :, 2 * embed:]
            head = q.size(2) // self.heads
            q, k, v = (t.contiguous().view(length, batch * self.heads, head).transpose(0, 1) for t in (q, k, v))
            scores = torch.bmm(q, k.transpose(1, 2)) / (head ** 0.5)
            o = torch.bmm(torch.softmax(scores, dim=-1), v).transpose(0, 1).contiguous().view(length, batch, -1)
            return self.out_proj(o)

    torch.manual_seed(0)
    path = tmp / "in_projection.onnx"
    torch.onnx.export(InProjection().eval(), (torch.randn(5, 2, 32),), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "L", 1: "B"}}, opset_version=17, dynamo=False)
    return onnx.load(path), 1, "nn.MultiheadAttention-style packed in-projection, [L, B, E], TorchScript (opset 17): " \
        "the scale computed from the shape of a Slice whose end is computed", ["scale_from_shape", "length_first"]


RECIPES = {
    "bert-fp16-keepio.converter.onnx": fp16_keep_io,
    "bert-fp16.converter.onnx": fp16,
    "bert.onnxsim.onnx": onnxsim_bert,
    "llama.onnxslim.onnx": onnxslim_llama,
    "bert.ort-optimizer.onnx": ort_bert,
    "bert.ort-optimizer-qdyn.onnx": ort_bert_qdyn,
    "gpt2.ort-optimizer-qdyn.onnx": ort_gpt2_qdyn,
    "bert.ort-qdyn.onnx": bert_qdyn,
    "bert-inlined-softmax.inliner.onnx": inlined_softmax,
    "bert-opset10.torchscript.onnx": _low_opset(10),
    "bert-opset11.torchscript.onnx": _low_opset(11),
    "plain-opset9.torchscript.onnx": _plain_low_opset(9),
    "plain-opset7.torchscript.onnx": _plain_low_opset(7),
    "wavlm.torchscript.onnx": wavlm,
    "sew-d.torchscript.onnx": sew_d,
    "in-projection.torchscript.onnx": in_projection,
}


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("onnx", "onnxruntime", "onnxconverter-common", "onnxsim", "onnxslim", "torch", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


EXPORTER = {  # file -> the package whose version the manifest records
    "converter": "onnxconverter-common", "onnxsim": "onnxsim", "onnxslim": "onnxslim", "ort-optimizer": "onnxruntime",
    "ort-optimizer-qdyn": "onnxruntime", "ort-qdyn": "onnxruntime", "inliner": "onnx", "torchscript": "torch",
}


def make(out: Path, only: list[str] | None = None) -> list[dict]:
    rows = []
    have = versions()
    for name, recipe in RECIPES.items():
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            model, sites, source, exercises = recipe(Path(tmp))
        onnx.save(_strip(model), out / name)
        tool = name.split(".")[-2]
        package = EXPORTER[tool]
        rows.append({"file": name, "exporter": package, "exporter_version": have.get(package),
                     "framework": f"torch {have.get('torch')}, transformers {have.get('transformers')}",
                     "source": source, "expected_sites": sites, "exercises": exercises})
    return rows
