"""The engine builder, checked without a GPU.

conformance: the whole build path (parse, lower, reconnect, config, profiles, progress monitor,
    build_serialized_network) runs against a stand-in for `tensorrt` that checks every class,
    method, property, enum member and argument list against the REAL TensorRT 11 bindings and
    records them. Nothing is built: build_serialized_network returns trtsim's NotAnEngine.
reference: the recorded network runs in trtsim's numpy executor (TensorRT's documented layer
    semantics; the parsed ONNX part on ONNX Runtime) and must equal ONNX Runtime on the original
    model, in padded, packed and KV-cache forms. This is a reference model of the layers, never a
    TensorRT result.
"""

import onnx
import numpy as np
import pytest
from graphs import attention_model

from trtattn import zoo
from trtattn.build import Limits, build, prepare
from trtattn.trt.network import build_network
from trtattn.rewrite.forms import form_adapter

CASES = [  # (zoo model, exporter, form): every site kind the zoo has
    ("bart", "torchscript", "padded"),  # self, causal self, cross; padding masks
    ("bart-sdpa", "dynamo", "padded"),  # ONNX Attention ops from the exporter
    ("t5", "torchscript", "padded"),  # relative position bias, unscaled
    ("swin", "torchscript", "padded"),  # window attention, bias + shift mask
    ("vit", "dynamo", "padded"),
    ("llama", "torchscript", "padded"),  # GQA, RoPE -> add_rotary_embedding, causal + padding
    ("llama", "dynamo", "padded"),  # the exporter's RotaryEmbedding ops
    ("gemma3", "torchscript", "padded"),  # head size 256, sliding window
    ("whisper", "torchscript", "padded"),  # Q pre-scaled before the head split
    ("llama-cache", "torchscript", "kv-cache"),  # add_kv_cache_update, lower-right, kv lengths
    ("llama-cache", "dynamo", "kv-cache"),
    ("whisper-decoder-cache", "torchscript", "kv-cache"),  # + static cross-attention cache
    ("bert", "torchscript", "packed"),  # PACKED_NHD with cumulative lengths
    ("gpt2", "torchscript", "packed"),  # packed causal
    ("llama", "torchscript", "packed"),  # packed + RoPE with position ids
]


LIMITS = Limits(max_batch=4, max_positions=64, max_cache=24)  # the zoo's configs; small caches for numpy


def _prepared(zoo_export, name, exporter, form, precision="fp32"):
    model = onnx.load(str(zoo_export(name, exporter)))
    return model, prepare(model, name=f"{name}_{exporter}", form=form, precision=precision, limits=LIMITS)


@pytest.mark.conformance
@pytest.mark.parametrize("name,exporter,form", CASES)
def test_build_path_conforms_to_the_real_bindings(checked_trt, zoo_export, tmp_path, name, exporter, form):
    trt = checked_trt
    _, prepared = _prepared(zoo_export, name, exporter, form, precision="fp16")
    blob, sidecar = build(prepared, trt, tmp_path, write=False, timing_cache=None, progress=True)
    assert type(blob).__name__ == "NotAnEngine"  # recorded, never built
    assert not trt.sim.problems, trt.sim.problems
    used = set(trt.sim.used())
    assert "INetworkDefinition.add_attention_v2" in used and "Builder.build_serialized_network" in used
    attentions = [c for c in trt.sim.log if c.member == "add_attention_v2" and c.kind == "call"]
    assert len(attentions) == zoo.get(name).expected_sites
    names = [c.args["value"] for c in trt.sim.log if c.owner == "IAttention" and c.member == "name" and c.kind == "set"]
    assert sorted(names) == sorted(s["layer"] for s in sidecar["sites"])
    if form == "kv-cache":
        assert "INetworkDefinition.add_kv_cache_update" in used and "IAttention.key_value_lengths" in used
    if form == "packed":
        assert "IAttention.query_lengths" in used and "IAttention.query_form" in used
    if prepared.plan.ropes:
        assert "INetworkDefinition.add_rotary_embedding" in used


@pytest.mark.conformance
def test_every_tensorrt_api_the_builder_uses(checked_trt, zoo_export, tmp_path):
    """The union over the zoo cases: each name exists in the real bindings (the checker raised
    otherwise). Printed for the record."""
    used = set()
    for name, exporter, form in CASES:
        from trtsim.checked import checked

        trt = checked(checked_trt.sim.real)
        _, prepared = _prepared(zoo_export, name, exporter, form, precision="fp16")
        build(prepared, trt, tmp_path, write=False)
        used |= set(trt.sim.used())
    print("\nTensorRT APIs used by the builder:\n  " + "\n  ".join(sorted(used)))
    for api in ["INetworkDefinition.add_attention_v2", "INetworkDefinition.add_rotary_embedding",
                "INetworkDefinition.add_kv_cache_update", "IAttention.mask", "IAttention.key_value_lengths",
                "IAttention.query_lengths", "IAttention.query_form", "IAttention.key_value_form",
                "IAttention.decomposable", "IAttention.metadata", "IRotaryEmbeddingLayer.name",
                "IBuilderConfig.add_optimization_profile", "IOptimizationProfile.set_shape",
                "IBuilderConfig.progress_monitor", "INetworkDefinition.remove_tensor", "OnnxParser.parse"]:
        assert api in used, api


@pytest.mark.conformance
def test_a_method_the_bindings_lack_is_caught(checked_trt):
    """Published snippets call attn.set_query_lengths(t); TensorRT 11.4 has a property instead.
    compat takes the property; calling the method would be caught."""
    from trtattn.trt import compat

    trt = checked_trt
    net = trt.Builder(trt.Logger(trt.Logger.WARNING)).create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    q = net.add_input("q", trt.float16, (-1, 2, -1, 8))
    k = net.add_input("k", trt.float16, (-1, 2, -1, 8))
    lengths = net.add_input("lengths", trt.int32, (-1,))
    attn = compat.add_attention(trt, net, q, k, k, "lower_right")
    compat.set_key_value_lengths(attn, lengths)
    with pytest.raises(AttributeError, match="set_query_lengths"):
        attn.set_query_lengths(lengths)


def _reference(trt, prepared, original, dims=None, seed=0):
    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    network = build_network(trt, builder, trt.Logger(trt.Logger.WARNING), prepared.cut, prepared.plan)
    from trtsim.execute import run

    adapter = form_adapter(original, [i["name"] for i in prepared.plan.inputs],
                           [c.cache for c in prepared.plan.cache_updates], prepared.plan.limits.get("max_cache"))
    feeds = adapter.original_feeds(dims, seed)
    import onnxruntime as ort

    sess = ort.InferenceSession(original.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    out = run(network, adapter.feeds(feeds))
    ref, out = adapter.line_up(feeds, ref, out)
    return {k: max_abs_error(ref[k], out[k]) for k in ref if k in out}


def max_abs_error(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or (np.isnan(a) != np.isnan(b)).any():
        return float("inf")
    return float(np.nan_to_num(np.abs(a - b)).max()) if a.size else 0.0


@pytest.mark.reference
@pytest.mark.parametrize("name,exporter,form", CASES)
def test_lowered_network_equals_onnx_runtime(checked_trt, zoo_export, name, exporter, form):
    original, prepared = _prepared(zoo_export, name, exporter, form, precision="fp32")
    errors = _reference(checked_trt, prepared, original)
    assert errors and max(errors.values()) <= 1e-4, errors


@pytest.mark.reference
@pytest.mark.parametrize("name,exporter,form", [("llama", "torchscript", "padded"), ("bert", "torchscript", "packed")])
def test_fp16_attention_casts(checked_trt, zoo_export, name, exporter, form):
    """Attention in fp16 inside an fp32 network: casts around it, errors at fp16's size."""
    original, prepared = _prepared(zoo_export, name, exporter, form, precision="fp16")
    errors = _reference(checked_trt, prepared, original)
    assert errors and max(errors.values()) <= 2e-2, errors


@pytest.mark.reference
@pytest.mark.parametrize("kwargs", [{"rank": 3}, {"k_style": "bsnh", "mask_style": "bool_where"},
                                    {"kv_heads": 1, "mask_style": "causal_range"}, {"mask_style": "window_range"}])
def test_hand_built_edge_cases(checked_trt, kwargs):
    original = attention_model(**kwargs)
    prepared = prepare(original, name="edge", precision="fp32")
    errors = _reference(checked_trt, prepared, original)
    assert errors and max(errors.values()) <= 1e-4, errors
