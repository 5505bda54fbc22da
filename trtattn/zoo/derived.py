"""Zoo entries made from a zoo export by the tools users run on exports (issue 10): the attention is
the base model's, the class comes from the tool.

opset12         the TorchScript exporter at opset 12: Softmax has its opset < 13 meaning (a 2-D
                softmax over the dims from `axis` on), which ONNX's version converter wraps in
                Flatten -> Softmax -> Reshape when the model is raised to opset 13 or later
int8_qdq        ONNX Runtime's quantize_static (QDQ format, int8 activations and weights, MinMax
                calibration on the zoo's own verification inputs): Q/DQ pairs on the inputs of both
                attention products and after the softmax. Verified within a quantization tolerance
                only: int8 moves the output by up to ~30% of its range on these random weights.
merged_decoder  optimum's merged decoder: the without-cache and with-cache Llama decoders as the two
                branches of If(use_cache_branch), weights deduplicated into the outer graph, scalar and
                1-D integer initializers kept in the branches (optimum's merge_decoders; merge_decoders
                merges any pair, a seq2seq decoder's cross-attention presents empty in the cache branch)
external_data   the model with its weights in model.onnx.data next to it
foreign_dims    the input dims as other exporters write them: -1 (paddle2onnx), '?' and a fresh name
                per input and axis (tf2onnx's unk__N), so that the same batch has two names
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tempfile
from pathlib import Path

import onnx

from ..graph import io as onnxio
from .torch_export import ExportError, export_entry, export_target

CALIBRATION_SAMPLES = 8


def export_derived(entry, base, exporter: str, path, *, force: bool = False) -> Path:
    """Export `base` (the entry's base zoo entry) with `exporter`, apply the entry's tool, save with the
    entry's metadata."""
    path = export_target(entry, exporter, path, force)
    with tempfile.TemporaryDirectory() as tmp:
        model = globals()[entry.builder](base, exporter, Path(tmp))
    meta = _metadata(model)
    meta.update(zoo=entry.name, expected_sites=entry.expected_sites, classes=list(entry.classes_for(exporter)))
    del model.metadata_props[:]
    if "dims" in entry.classes:  # as a user's export: only our record, no input roles or dims
        model.metadata_props.add(key="trtattn.zoo", value=json.dumps(
            {k: meta[k] for k in ("zoo", "exporter", "expected_sites", "classes")}))
    else:
        model.metadata_props.add(key="trtattn.inputs", value=json.dumps(meta))
    return onnxio.save(model, path, external_data="external_data" in entry.classes)


_exports: dict[tuple, bytes] = {}  # base exports of this process: several entries start from the same one


def _export(entry, exporter: str, tmp: Path, *, opset: int | None = None) -> onnx.ModelProto:
    key = (entry.name, entry.builder, exporter, opset)
    if key not in _exports:
        out = tmp / f"{entry.name}.{exporter}.onnx"
        export_entry(entry, exporter, out, opset=opset, force=True)
        _exports[key] = onnxio.load(out).SerializeToString()
    return onnx.load_from_string(_exports[key])


def _metadata(model: onnx.ModelProto) -> dict:
    props = {p.key: p.value for p in model.metadata_props}
    return json.loads(props.get("trtattn.inputs", "{}"))


# ---------------------------------------------------------------- opset 12
OLD_OPSET = 12


def opset12(base, exporter: str, tmp: Path) -> onnx.ModelProto:
    model = _export(base, exporter, tmp, opset=OLD_OPSET)
    written = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if written > OLD_OPSET:  # the dynamo exporter keeps its own minimum rather than fail
        raise ExportError(f"the {exporter} exporter wrote opset {written} when asked for {OLD_OPSET}")
    return model


# ---------------------------------------------------------------- int8 Q/DQ
def int8_qdq(base, exporter: str, tmp: Path) -> onnx.ModelProto:
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from ..graph.feeds import make_feeds

    model = _export(base, exporter, tmp)
    src, out = tmp / "fp32.onnx", tmp / "int8.onnx"
    onnxio.save(model, src)
    feeds = [make_feeds(model, seed=s) for s in range(CALIBRATION_SAMPLES)]
    # In a fresh process: ModelOpt's quantizer patches onnxruntime.quantization for the rest of the process
    # it runs in (its calibrators then refuse this model), and the tests run both in one process.
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        pool.submit(_ort_quantize_static, str(src), str(out), feeds).result()
    quantized = onnxio.load(out)
    quantized.metadata_props.extend(model.metadata_props)
    return quantized


def _ort_quantize_static(src: str, out: str, feeds: list[dict]) -> None:
    """ONNX Runtime's quantize_static, MinMax-calibrated on the given feeds."""
    import logging

    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Feeds(CalibrationDataReader):
        def __init__(self):
            self.batches = iter(feeds)

        def get_next(self):
            return next(self.batches, None)

    logging.getLogger().setLevel(logging.ERROR)  # "consider pre-processing": its symbolic shape inference fails on these
    quantize_static(src, out, Feeds(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8)


# ---------------------------------------------------------------- optimum's merged decoder
def merged_decoder(base, exporter: str, tmp: Path) -> onnx.ModelProto:
    """The two decoders share their weights (one seeded model); merged as optimum's merge_decoders."""
    no_past = _export(dataclasses.replace(base, name="llama-no-past", module="derived", builder="llama_no_past"),
                      exporter, tmp)
    with_past = _export(dataclasses.replace(base, name="llama-with-past", module="derived", builder="llama_with_past"),
                        exporter, tmp)
    meta = _metadata(with_past)
    if [o.name for o in no_past.graph.output] != [o.name for o in with_past.graph.output]:
        raise ExportError("the decoders without and with a cache have different outputs")
    merged = merge_decoders(no_past, with_past)
    meta["inputs"]["use_cache_branch"] = {"kind": "flag", "value": True}
    meta["dims"]["attention_mask_sequence_length"] = meta["dims"]["past"] + meta["dims"]["seq"]
    merged.metadata_props.add(key="trtattn.inputs", value=json.dumps(meta))
    return merged


def merge_decoders(no_past: onnx.ModelProto, with_past: onnx.ModelProto) -> onnx.ModelProto:
    """Optimum's merge_decoders: If(use_cache_branch) with `with_past` as the then branch and `no_past` as the
    else branch, the inputs of both, weights deduplicated into the outer graph. An output of `no_past` that
    `with_past` lacks (a seq2seq decoder's cross-attention presents) is an empty constant in the cache branch;
    an input whose dims differ between the two (the mask: [batch, seq] against [batch, past + seq]) gets a dim
    of its own. Neither model is modified."""
    no_past, with_past = onnx.load_from_string(no_past.SerializeToString()), onnx.load_from_string(
        with_past.SerializeToString())
    made = {o.name for o in with_past.graph.output}
    if not made <= {o.name for o in no_past.graph.output}:
        raise ExportError(f"the decoder with a cache has outputs the first step lacks: "
                          f"{sorted(made - {o.name for o in no_past.graph.output})}")
    outputs = list(no_past.graph.output)
    for out in outputs:  # the placeholder: the output's static dims (heads, head size), 0 for the others
        if out.name not in made:
            dims = [d.dim_value if d.HasField("dim_value") else 0 for d in out.type.tensor_type.shape.dim]
            empty = onnx.helper.make_tensor(out.name, out.type.tensor_type.elem_type, dims if 0 in dims else
                                            [0] * len(dims), [])
            with_past.graph.node.append(onnx.helper.make_node("Constant", [], [out.name], value=empty,
                                                              name=f"{out.name}/empty"))
    order = {o.name: o for o in with_past.graph.output}
    order.update({o.name: o for o in outputs if o.name not in made})
    del with_past.graph.output[:]
    with_past.graph.output.extend(order[o.name] for o in outputs)
    inputs: dict[str, onnx.ValueInfoProto] = {}
    for model in (no_past, with_past):
        for vi in model.graph.input:
            if vi.name not in inputs:
                inputs[vi.name] = vi
                continue
            mine, theirs = inputs[vi.name].type.tensor_type.shape.dim, vi.type.tensor_type.shape.dim
            for k, (a, b) in enumerate(zip(mine, theirs)):
                if a != b:  # optimum names the mask's "attention_mask_sequence_length"
                    a.Clear()
                    a.dim_param = f"{vi.name}_sequence_length" if k == 1 else f"{vi.name}_dim_{k}"
    shared = _share_initializers([no_past, with_past], suffix="merged")
    use_cache = onnx.helper.make_tensor_value_info("use_cache_branch", onnx.TensorProto.BOOL, [1])
    if_node = onnx.helper.make_node(
        "If", ["use_cache_branch"], [o.name for o in outputs], name="optimum::if",
        then_branch=_branch(with_past.graph, "with_past"), else_branch=_branch(no_past.graph, "no_past"))
    graph = onnx.helper.make_graph([if_node], "merged", [*inputs.values(), use_cache], outputs, initializer=shared)
    opsets: dict[str, onnx.OperatorSetIdProto] = {}
    for model in (no_past, with_past):
        for o in model.opset_import:
            opsets.setdefault(o.domain, o)
    return onnx.helper.make_model(graph, opset_imports=list(opsets.values()), ir_version=with_past.ir_version)


def _kept_in_branch(t: onnx.TensorProto) -> bool:
    return len(t.dims) == 0 or (len(t.dims) == 1 and t.data_type in (onnx.TensorProto.INT32, onnx.TensorProto.INT64))


def _share_initializers(models: list[onnx.ModelProto], suffix: str) -> list[onnx.TensorProto]:
    """One outer-graph initializer per distinct content, renamed NAME_SUFFIX_K (two exports may give one
    name to different data), the models' nodes pointed at it."""
    by_content: dict[tuple, str] = {}
    shared: list[onnx.TensorProto] = []
    used: dict[str, int] = {}
    for model in models:
        rename = {}
        for t in model.graph.initializer:
            if _kept_in_branch(t):
                continue
            data = onnx.numpy_helper.to_array(t)
            key = (t.data_type, tuple(t.dims), hashlib.sha256(data.tobytes()).hexdigest())
            if key not in by_content:
                used[t.name] = used.get(t.name, 0) + 1
                by_content[key] = f"{t.name}_{suffix}_{used[t.name]}"
                copy = onnx.TensorProto()
                copy.CopyFrom(t)
                copy.name = by_content[key]
                shared.append(copy)
            rename[t.name] = by_content[key]
        for node in model.graph.node:
            for i, name in enumerate(node.input):
                node.input[i] = rename.get(name, name)
        kept = [t for t in model.graph.initializer if _kept_in_branch(t)]
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)
    return shared


def _branch(graph: onnx.GraphProto, name: str) -> onnx.GraphProto:
    return onnx.helper.make_graph(list(graph.node), name, [], list(graph.output), initializer=list(graph.initializer),
                                  value_info=list(graph.value_info))


def llama_no_past_config(impl: str):
    from .models import llama_config

    return llama_config(impl)


llama_with_past_config = llama_no_past_config


def _seeded_llama(cfg):
    import torch
    import transformers as T

    from .models import _randomize

    torch.manual_seed(0)
    return _randomize(T.LlamaModel(cfg)).eval()


def llama_no_past(cfg):
    """optimum's decoder_model: no past inputs, present K/V outputs."""
    import torch

    from .models import BATCH, PADDING, SEQ, TOKENS, Built, _ids, _padding_mask, _Wrapper

    model = _seeded_llama(cfg)
    inputs = {"input_ids": _ids(BATCH, SEQ), "attention_mask": _padding_mask(BATCH, SEQ),
              "position_ids": torch.arange(SEQ).unsqueeze(0).expand(BATCH, SEQ).contiguous()}

    def fn(m, input_ids, attention_mask, position_ids):
        out = m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True)
        return (out.last_hidden_state, *[t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)])

    axes = {name: {0: "batch", 1: "seq"} for name in inputs}
    roles: dict[str, dict] = {"input_ids": TOKENS, "attention_mask": PADDING, "position_ids": {"kind": "position_ids"}}
    outputs = ["last_hidden_state"] + [f"present.{i}.{p}" for i in range(cfg.num_hidden_layers) for p in ("key", "value")]
    return Built(_Wrapper(model, fn, list(inputs)), inputs, axes, roles, outputs, {"batch": BATCH, "seq": SEQ}, cfg)


def llama_with_past(cfg):
    """optimum's decoder_with_past_model: the zoo's llama-cache step, on the same weights."""
    from .models import _with_past, _Wrapper

    return _with_past(_seeded_llama(cfg), cfg, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads,
                      wrap=lambda m, fn, inputs: _Wrapper(m, fn, list(inputs)))


# ---------------------------------------------------------------- external data
def external_data(base, exporter: str, tmp: Path) -> onnx.ModelProto:
    return _export(base, exporter, tmp)  # export_derived saves it with external data


# ---------------------------------------------------------------- foreign dims
def foreign_dims(base, exporter: str, tmp: Path) -> onnx.ModelProto:
    """input_ids [-1, '?'] and every other dynamic dim a fresh unk__N; intermediate shapes dropped, as
    the exporters that write such dims leave them."""
    model = _export(base, exporter, tmp)
    fresh = iter(range(1000))
    for vi in list(model.graph.input) + list(model.graph.output):
        for axis, dim in enumerate(vi.type.tensor_type.shape.dim):
            if not dim.dim_param:
                continue
            dim.Clear()
            if vi.name == "input_ids":
                if axis == 0:
                    dim.dim_value = -1
                else:
                    dim.dim_param = "?"
            else:
                dim.dim_param = f"unk__{next(fresh)}"
    del model.graph.value_info[:]
    return model

